"""Freshness benchmark (issue 12): how long a change takes from Kafka to a committed Delta version.

    .venv/bin/python bench/freshness.py [--rate 2000] [--duration 300] [--keys 100000] [--no-graph]
        [--broker real|embedded]
    .venv/bin/python bench/freshness.py --quick     # smoke run: 6 s at 200 events/s, 2,000 keys
    .venv/bin/python bench/freshness.py --join [--orders N] [--mirrors own_query|with_graph] [--quick]
    .venv/bin/python bench/freshness.py --consistency offset|transaction|both [...]
    .venv/bin/python bench/freshness.py --join [--shape full|no-top3|join-only] --stages [--conf KEY=VALUE ...]

**What runs.** A Kafka broker (``--broker``, bench/common.py, printed by the run: Apache Kafka from the
project's ``kafka`` JVM set where it is installed, else librdkafka's mock cluster); a producer process that writes
Debezium JSON changes of a ``products`` table (MySQL connector envelope, 8 columns) at a steady
``--rate`` for ``--duration`` seconds over ``--topics`` topics of 4 partitions (a key always goes
to the same topic and partition; ``--linger`` ms per producer batch, see below); and, in this process, the service pipeline as ``changelake run``
runs it (``PipelineRunner``, ``trigger_interval: 1 second``, embedded defaults: ``local[2]``,
delta-rs) with two tables:

* ``products``: the mirror of the source (upserts keyed by ``id``);
* ``category_stock`` (unless ``--no-graph``): a graph table, ``GROUP BY category`` with
  ``count(*)`` and ``sum(stock)`` over the same source (``normalize: false``, as Flink's
  ``cdc-events-duplicate`` default).

With ``--join`` (issue 29's graph), a second source, ``orders`` (``order_id``, ``product_id``, ``quantity``,
``purchaser``; ``--orders`` keys, default ``--keys``), on topics of its own and mirrored into ``orders``,
takes ``ORDER_SHARE`` (3/4) of the steady changes (a new quantity, a tenth of them another product, 5%
deletes); the views are ``orders JOIN products`` and, per category, an aggregate (``category_sales``:
count, sum of quantity) and a Top-3 of the order lines by quantity (``category_top3``, keyed by category
and rank). ``--mirrors`` sets ``pipeline.mirrors``: the mirrors in a streaming query of their own
(``own_query``) or in the graph's (``with_graph``, the default); each table's changes are placed in
the batches of the query that writes it (its checkpoint). Freshness is given per table (a mirror: its
own source's changes; a graph table: every change) and per kind, mirrors and graph tables (each change
once per table of the kind); the "where the time goes" figures are the mirrors'.

Before the timed phase the producer writes a snapshot of every key (``op: r``) and the pipeline
catches up on it, so Spark's start-up and first micro-batch are not in the figures. Then the
steady phase: each change picks a key uniformly; a live key is updated (new price and stock, a
fifth of them a new category) or, 5% of the time, deleted; a deleted key is inserted again.

**How freshness is measured, per change of the steady phase.**

* *Kafka append time*: when the broker acknowledged the append (the producer's delivery report,
  served every few milliseconds), a wall-clock time of this machine: the append happened before
  it, and after the producer was handed the record; the run prints the gap between the two
  (``produce -> ack``: linger, compression, round trip) so the bound is visible. (The mock broker
  stamps records with a fixed LogAppendTime, so the record's own timestamp cannot serve; the same
  rule is kept on the real broker, so the two compare.)
* *Which micro-batch read it*: Spark's checkpoint writes, before batch N runs, the end offset of
  every partition it reads (``offsets/N``; batch N reads [end of N-1, end of N)). A change at
  (topic, partition, offset) was read by the first batch whose end offset for that partition is
  above its offset. The pipeline keeps every ``offsets/N`` file for the run
  (``spark.sql.streaming.minBatchesToRetain``).
* *Which Delta version holds it*: every commit of the sink carries a Delta app transaction
  ``(changelake:<pipeline>:<table>, batch id)``, the sink's idempotence key. Reading the table's
  ``_delta_log/*.json`` gives per version its ``txn`` batch id and its ``commitInfo.timestamp``
  (what ``DeltaTable.history()`` reports). A change is visible in a table from the first version
  whose batch id is at least the batch that read it; for the mirror that is the commit of that
  very batch, for the graph table too whenever the batch changed the aggregate.
* A graph table commits only when its rows change: the changes read after its last commit (say, updates
  that left every category's Top-3 as it was) show in no version. When the table equals the source at the
  end they are counted apart ("read after the last change"), not as "not committed", which fails the run.
* *Freshness* = that version's commit timestamp - the append time. p50, p99 and max are over all
  changes of the steady phase, per table. This is exact per change, without sampling: no change
  is left out, and nothing is inferred from the table's contents (which keep only a key's latest
  row).

**The broker's message sets.** (The embedded broker.) The mock broker finds the message set holding a fetch offset by
walking the partition's sets from the oldest (a real broker has an offset index). With sets of
one or two records, as a producer lingering 5 ms writes at 150 records/s per partition, reads
slow down as the log grows (one consumer read ~20,000 records/s from sets of 4 records here,
~1 M/s from sets of 10,000), and the benchmark measured the mock, not the pipeline: at 10,000
events/s the mirror's batches took 36-52 s instead of ~1 s. The producer therefore lingers
``--linger`` = 100 ms, so that a set holds tens of records. The linger is not in the figures:
freshness counts from the append.

**Where the time goes.** Each mirror change's freshness is split at the start of the batch that read it
(``batchTimestampMs`` in ``offsets/N``, the batch's trigger time): append -> that start (waiting for the
running batch to end, then for the trigger) and that start -> the mirror's commit (its own batch); the
run prints both (p50, p99), the batches that held the slowest 1% of changes, and how far apart batches
started while producing.

**The per-stage cost of a steady micro-batch** (``--stages``, issue 29). Spark's event log is on for the
run; per micro-batch that started while the producer ran, the table gives, median (p90) over those batches,
each stage of the batch's job (the source tasks: Kafka read, decode and routing; each stateful operator, one
``transformWithStateInPandas`` per level of the graph, the last with Deliver and the collect): wall time,
tasks, task time, Python time and the state store's commit and update times (summed over the tasks); then
the whole job, the driver part (Delta commits) and the parts of Spark's progress (``durationMs``: planning,
offsets, the batch). ``--shape`` removes graph nodes (``no-top3``: the Top-3, which shares its level with
the aggregate; ``join-only``: both, the join's output a table of its own), so that the cost of a stateful
node is the difference of two runs. ``CHANGELAKE_STEP_PROFILE=<dir>`` (``changelake.spark.binding.StepClock``)
adds the Python workers' CPU per bucket step and phase.

**``--consistency transaction``** (issue 31): the sources take ``consistency: transaction``; each steady change
is a source transaction of its own (the change carries Debezium's ``transaction`` block, and its END, counting
one event of the change's topic, goes to ``bench.transaction``, one partition). The gate applies a transaction
once its END and its change are read, in END order, so a change is visible from the batch that read the last of
the ENDs and changes up to its own (:func:`released_batches`); with views they run on the driver behind the gate.
``both`` runs offset, then transaction, with the same settings, and prints each table's p50/p99 side by side:
compare the ratio, as the machine is shared.

**Other figures.** Records/s offered (produced) and sustained (committed to the mirror while the
producer ran, and the time to drain the rest after it stopped); the backlog (acknowledged minus
committed changes) over time: at the end of production, its maximum, and its trend over the
second half of the run (events/s; about 0 when the pipeline keeps up). The run checks that no
offset expired in the broker (the mock keeps 5 MB per partition), that the log holds each change once
(below), that every change was committed, and that both tables equal the final state of the source (the
graph table: DuckDB's GROUP BY over it). Targets (issue 12, printed beside the figures, not asserted):
mirror p99 <= 3 s at 10,000 events/s; graph p99 <= 5 s at 2,000 events/s, with no growing backlog.

**Each change once in the log.** The graph's sources run ``normalize: false``, which is right only when the
log holds no change twice (docs/pipelines.md, "ChangelogNormalize"). The producer is therefore idempotent
(``enable.idempotence``): on a loaded machine the broker acknowledged appends 30-70 s late, past librdkafka's
``request.timeout.ms`` (30 s), and a plain producer sent such a request again although the broker had
appended it, so those changes were in the log twice, back to back. ``--join`` run 1 with ``own_query`` (docs/
benchmarks.md) read 27 such records; two of them were deletes of orders, and the join, which passes a
retraction on even when it finds no stored row (as Flink's), retracted both orders from ``category_sales`` a
second time. The mirrors were exact (their ``_seq`` guard ignores a change already applied). The run counts
the records in each partition that no delivery report names (:func:`written_twice`: the log's end, as the
pipeline read it, minus the acknowledged records of the snapshot and the steady phase; must be 0).
"""

from __future__ import annotations

import argparse
import array
import functools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PeakMemory, add_broker_option, machine, open_broker
from bench.gen import debezium_envelope
from bench.spark_timing import BatchClock, batch_stages, stage_table

CATEGORIES = ["tools", "garden", "kitchen", "toys", "sports", "office", "auto", "outdoor", "books", "music"]
COLUMNS = {"id": "bigint", "name": "string", "description": "string", "category": "string",
           "weight": "double", "price": "double", "stock": "int", "active": "boolean"}
ORDER_COLUMNS = {"order_id": "bigint", "product_id": "bigint", "quantity": "int", "purchaser": "bigint"}
#: source table -> its topics' names (``n``: the topic's number)
TOPICS = {"products": "bench.fresh.products.{n}", "orders": "bench.fresh.orders.{n}"}
TOPIC = TOPICS["products"]
#: --consistency transaction: the transaction metadata topic (one partition; one END per steady change)
TXN_TOPIC = "bench.transaction"
PIPELINE_ID = "bench-freshness"
MIRROR, GRAPH = "products", "category_stock"
ORDERS = "orders"
#: the --join graph's tables: orders JOIN products, then per category an aggregate and a Top-3
SALES, TOP3 = "category_sales", "category_top3"
#: --shape join-only: the join's output as a table of its own (keyed by order)
LINES = "order_lines"
#: --join's graph shapes (--shape): the graph tables each writes; full is issue 29's graph
SHAPES = {"full": (SALES, TOP3), "no-top3": (SALES,), "join-only": (LINES,)}
#: the share of --join's steady changes that are orders' (the rest are products')
ORDER_SHARE = 0.75
TARGETS = {MIRROR: "p99 <= 3 s at 10,000 events/s", GRAPH: "p99 <= 5 s at 2,000 events/s, no growing backlog",
           ORDERS: "p99 <= 3 s at 2,000 events/s (issue 29)", SALES: "p99 <= 3 s at 2,000 events/s (issue 29)",
           TOP3: "p99 <= 3 s at 2,000 events/s (issue 29)", LINES: "p99 <= 3 s at 2,000 events/s (issue 29)"}


# -- the source database --------------------------------------------------------------------------------
class Changes:
    """A products table's Debezium history: a snapshot of ``keys`` rows, then changes one at a time; with
    ``orders`` (--join), also an orders table of that many rows, each naming a product, whose changes are
    ``ORDER_SHARE`` of the steady phase. Both tables share one binlog."""

    def __init__(self, keys: int, seed: int = 12, *, orders: int = 0) -> None:
        self.keys = keys
        self.order_keys = orders
        self.rng = random.Random(seed)
        self.live: dict[int, dict] = {}
        self.orders: dict[int, dict] = {}
        self.pos = 154
        self.ts = 1_700_000_000_000

    def _row(self, i: int) -> dict:
        rng = self.rng
        return {"id": i, "name": f"product {i}", "description": f"a fine product number {i} of its kind",
                "category": rng.choice(CATEGORIES), "weight": round(rng.uniform(0.1, 50), 3),
                "price": round(rng.uniform(1, 999), 2), "stock": rng.randint(0, 5000), "active": rng.random() < 0.9}

    def _order(self, i: int) -> dict:
        rng = self.rng
        return {"order_id": i, "product_id": rng.randint(1, self.keys), "quantity": rng.randint(1, 1000),
                "purchaser": rng.randint(1, 50_000)}

    def _envelope(self, op: str, before: dict | None, after: dict | None, table: str = "products") -> bytes:
        self.pos += 200
        self.ts += 1
        return debezium_envelope(op, before, after, table=table, pos=self.pos, ts=self.ts,
                                 snapshot="true" if op == "r" else "false")

    def snapshot(self):
        """(table, key, value) of every row, products first."""
        for i in range(1, self.keys + 1):
            self.live[i] = self._row(i)
            yield "products", i, self._envelope("r", None, self.live[i])
        for i in range(1, self.order_keys + 1):
            self.orders[i] = self._order(i)
            yield "orders", i, self._envelope("r", None, self.orders[i], "orders")

    def next(self) -> tuple[str, int, bytes]:
        rng = self.rng
        if self.order_keys and rng.random() < ORDER_SHARE:
            return self._next_order()
        k = rng.randint(1, self.keys)
        before = self.live.get(k)
        if before is None:
            self.live[k] = self._row(k)
            return "products", k, self._envelope("c", None, self.live[k])
        if rng.random() < 0.05:
            del self.live[k]
            return "products", k, self._envelope("d", before, None)
        after = dict(before, price=round(rng.uniform(1, 999), 2), stock=rng.randint(0, 5000))
        if rng.random() < 0.2:
            after["category"] = rng.choice(CATEGORIES)
        self.live[k] = after
        return "products", k, self._envelope("u", before, after)

    def _next_order(self) -> tuple[str, int, bytes]:
        """An order's change: a new quantity (a tenth of them another product), 5% deletes, a deleted one
        inserted again."""
        rng = self.rng
        k = rng.randint(1, self.order_keys)
        before = self.orders.get(k)
        if before is None:
            self.orders[k] = self._order(k)
            return "orders", k, self._envelope("c", None, self.orders[k], "orders")
        if rng.random() < 0.05:
            del self.orders[k]
            return "orders", k, self._envelope("d", before, None, "orders")
        after = dict(before, quantity=rng.randint(1, 1000))
        if rng.random() < 0.1:
            after["product_id"] = rng.randint(1, self.keys)
        self.orders[k] = after
        return "orders", k, self._envelope("u", before, after, "orders")


# -- the producer process -------------------------------------------------------------------------------
def produce_main(args: argparse.Namespace) -> int:
    """The producer process: the snapshot as fast as it goes ("SNAPSHOT n"), then, on "GO" from stdin,
    the steady phase at ``--rate``; writes its delivery reports and the final state to ``--out``."""
    from confluent_kafka import Producer

    out = Path(args.out)
    tables = ["products", "orders"] if args.join else ["products"]
    topics = [TOPICS[t].format(n=n) for t in tables for n in range(args.topics)]
    topic_no = {t: i for i, t in enumerate(topics)}
    # delivery reports of the steady phase: topic, partition, offset, handed to the producer (s), ack (s).
    # (The mock broker stamps every record with LogAppendTime 1234 ms, so the ack is the append time here.)
    rep_topic, rep_part, rep_off = array.array("b"), array.array("b"), array.array("q")
    rep_sent, rep_acked = array.array("d"), array.array("d")
    rep_txn = array.array("q")          # --consistency transaction: the change's transaction number (else -1)
    snapshot_acked: dict[tuple[int, int], int] = {}     # (topic, partition) -> snapshot records acknowledged
    failed = [0]
    steady = [False]

    def delivered(sent: float, txn: int, err, msg) -> None:
        if err is not None:
            failed[0] += 1
            return
        if steady[0]:
            rep_acked.append(time.time())
            rep_sent.append(sent)
            rep_txn.append(txn)
            rep_topic.append(topic_no[msg.topic()])
            rep_part.append(msg.partition())
            rep_off.append(msg.offset())
        else:
            at = (topic_no[msg.topic()], msg.partition())
            snapshot_acked[at] = snapshot_acked.get(at, 0) + 1

    # idempotent: a retried request is not appended twice (module docstring, "Each change once in the log")
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": args.linger, "compression.type": "zstd",
                         "enable.idempotence": True, "batch.num.messages": 10_000,
                         "queue.buffering.max.messages": 1_000_000,
                         "log_level": 3})

    # --consistency transaction: each steady change is a source transaction of its own (the ``transaction``
    # block in the change, an END on TXN_TOPIC after it); the END's offsets by transaction number
    transactional = args.consistency == "transaction"
    end_offsets: dict[int, int] = {}

    def end_delivered(txn: int, err, msg) -> None:
        if err is not None:
            failed[0] += 1
        else:
            end_offsets[txn] = msg.offset()

    def produce(topic: str, key: bytes | None, value: bytes, callback, **partition) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value, on_delivery=callback, **partition)
                return
            except BufferError:
                producer.poll(0.01)

    def send(table: str, key: int, value: bytes) -> None:
        topic = TOPICS[table].format(n=key % args.topics)
        txn = pending_ends[0] if transactional and steady[0] else None
        if txn is not None:
            body = orjson.loads(value)
            body["transaction"] = {"id": f"tx{txn}", "total_order": 1, "data_collection_order": 1}
            value = orjson.dumps(body)
        produce(topic, (b'{"id":%d}' if table == "products" else b'{"order_id":%d}') % key, value,
                functools.partial(delivered, time.time(), -1 if txn is None else txn))
        if txn is not None:
            end = {"status": "END", "id": f"tx{txn}", "event_count": 1,
                   "data_collections": [{"data_collection": topic.split(".", 1)[1], "event_count": 1}]}
            pending_ends[0] += 1
            # partition 0 only: the ENDs in commit order (the topic is auto-created with several partitions)
            produce(TXN_TOPIC, None, orjson.dumps(end), functools.partial(end_delivered, txn), partition=0)

    pending_ends = [0]

    changes = Changes(args.keys, seed=args.seed, orders=args.orders if args.join else 0)
    n = 0
    for table, key, value in changes.snapshot():
        send(table, key, value)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
    if producer.flush(120) or failed[0]:
        raise SystemExit(f"producer: the snapshot was not delivered ({failed[0]} failed)")
    print(f"SNAPSHOT {n}", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return 1
    steady[0] = True
    n = 0
    start = time.monotonic()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= args.duration:
            break
        due = int(args.rate * elapsed)
        while n < due:
            send(*changes.next())
            n += 1
        producer.poll(0)
        time.sleep(0.002)
    produced_s = time.monotonic() - start
    if producer.flush(120) or failed[0]:
        raise SystemExit(f"producer: {failed[0]} changes were not delivered")
    np.savez(out / "deliveries.npz", topic=np.frombuffer(rep_topic, np.int8), partition=np.frombuffer(rep_part, np.int8),
             offset=np.frombuffer(rep_off, np.int64), sent=np.frombuffer(rep_sent, np.float64),
             acked=np.frombuffer(rep_acked, np.float64), topics=np.array(topics),
             txn=np.frombuffer(rep_txn, np.int64),
             snapshot_topic=np.array([t for t, _ in snapshot_acked], np.int8),
             snapshot_partition=np.array([p for _, p in snapshot_acked], np.int8),
             snapshot_acked=np.array(list(snapshot_acked.values()), np.int64),
             end_offset=np.array([end_offsets.get(i, -1) for i in range(pending_ends[0])], np.int64))
    (out / "final_state.json").write_bytes(orjson.dumps({"products": list(changes.live.values()),
                                                         "orders": list(changes.orders.values())}))
    print(f"PRODUCED {n} {produced_s:.3f} {time.process_time():.3f}", flush=True)
    return 0


# -- reading what the pipeline did ----------------------------------------------------------------------
def batch_end_offsets(checkpoint: Path) -> dict[int, dict[str, dict[str, int]]]:
    """batch id -> the source's end offsets (topic -> partition -> next offset) from Spark's offset log."""
    out = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            lines = f.read_text().splitlines()
            if len(lines) >= 3:                      # v1, batch metadata, one line per source
                out[int(f.name)] = json.loads(lines[2])
    return out


def batch_starts(checkpoint: Path) -> dict[int, float]:
    """batch id -> when the batch started (s): its trigger time, ``batchTimestampMs`` of ``offsets/N``."""
    out = {}
    for f in (checkpoint / "offsets").iterdir():
        if f.name.isdigit():
            lines = f.read_text().splitlines()
            if len(lines) >= 2:
                out[int(f.name)] = json.loads(lines[1])["batchTimestampMs"] / 1000
    return out


def committed_batches(checkpoint: Path) -> list[int]:
    """Batch ids Spark recorded as done (``commits/N``, written after foreachBatch returned)."""
    d = checkpoint / "commits"
    return sorted(int(f.name) for f in d.iterdir() if f.name.isdigit()) if d.exists() else []


def delta_commits(table: Path) -> tuple[np.ndarray, np.ndarray]:
    """(batch ids, commit timestamps in s) of a table's versions that carry a sink transaction, by batch id."""
    batches, stamps = [], []
    for f in sorted((table / "_delta_log").glob("*.json")):
        txn = stamp = None
        for line in f.read_bytes().splitlines():
            action = orjson.loads(line)
            if "txn" in action:
                txn = action["txn"]["version"]
            elif "commitInfo" in action:
                stamp = action["commitInfo"]["timestamp"] / 1000
        if txn is not None and stamp is not None:
            batches.append(txn)
            stamps.append(stamp)
    order = np.argsort(batches, kind="stable")
    return np.asarray(batches, np.int64)[order], np.asarray(stamps, np.float64)[order]


def read_batches(topics: list[str], topic: np.ndarray, partition: np.ndarray, offset: np.ndarray,
                 ends: dict[int, dict[str, dict[str, int]]]) -> np.ndarray:
    """Per change, the id of the micro-batch that read it (-1: none yet)."""
    ids = np.array(sorted(ends), np.int64)
    out = np.full(len(offset), -1, np.int64)
    for t, name in enumerate(topics):
        for p in np.unique(partition[topic == t]):
            mine = (topic == t) & (partition == p)
            edge = np.array([ends[b].get(name, {}).get(str(p), 0) for b in ids], np.int64)
            edge = np.maximum.accumulate(edge) if len(edge) else edge
            at = np.searchsorted(edge, offset[mine], side="right")     # first batch whose end > offset
            out[mine] = np.where(at < len(ids), ids[np.minimum(at, len(ids) - 1)], -1)
    return out


def log_ends(checkpoints: Iterable[Path]) -> dict[str, dict[str, int]]:
    """Per topic and partition, the furthest end offset any of the queries' last batches read (topic ->
    partition -> next offset): the log's end once the pipeline has read everything."""
    out: dict[str, dict[str, int]] = {}
    for checkpoint in checkpoints:
        ends = batch_end_offsets(checkpoint)
        for name, parts in (ends[max(ends)] if ends else {}).items():
            mine = out.setdefault(name, {})
            for p, end in parts.items():
                mine[p] = max(mine.get(p, 0), int(end))
    return out


def written_twice(deliveries: Mapping[str, np.ndarray], ends: dict[str, dict[str, int]]) -> dict[str, int]:
    """Per partition (``topic[partition]``) with any, the records of its log that no delivery report names:
    a produce request the broker appended but answered too late, which the producer sent again, so its
    changes are in the log twice. Every topic starts empty, so a partition's log holds ``ends`` records;
    the acknowledged ones are the snapshot's (``snapshot_*``; an older run without them: counted from the
    first offset of its steady phase) and the steady phase's (``topic``, ``partition``, ``offset``)."""
    topics = [str(t) for t in deliveries["topics"]]
    steady = Counter(zip(deliveries["topic"].tolist(), deliveries["partition"].tolist()))
    first: dict[tuple[int, int], int] = {}
    for t, p, o in zip(deliveries["topic"].tolist(), deliveries["partition"].tolist(),
                       deliveries["offset"].tolist()):
        first[(t, p)] = min(first.get((t, p), o), o)
    if "snapshot_acked" in deliveries:
        snapshot = dict(zip(zip(deliveries["snapshot_topic"].tolist(), deliveries["snapshot_partition"].tolist()),
                            deliveries["snapshot_acked"].tolist()))
    else:
        snapshot = first
    out = {}
    for name, parts in ends.items():
        if name not in topics:
            continue
        t = topics.index(name)
        for p, end in parts.items():
            at = (t, int(p))
            if at not in snapshot and at not in steady:
                continue
            twice = int(end) - snapshot.get(at, 0) - steady.get(at, 0)
            if twice > 0:
                out[f"{name}[{p}]"] = twice
    return out


def released_batches(d: Mapping[str, np.ndarray], read: np.ndarray, ends: dict[int, dict[str, dict[str, int]]]
                     ) -> np.ndarray:
    """--consistency transaction: per change, the batch that applied it: the gate releases the transactions in
    END order, each once its END and its change are read, so transaction n goes in with the batch that read the
    last of the ENDs and changes of transactions 0..n (-1: not yet)."""
    n = len(d["end_offset"])
    end_read = read_batches([TXN_TOPIC], np.zeros(n, np.int8), np.zeros(n, np.int8), d["end_offset"], ends)
    change_read = np.full(n, -1, np.int64)
    change_read[d["txn"]] = read
    both = np.maximum(end_read, change_read)
    unread = (end_read < 0) | (change_read < 0) | (d["end_offset"] < 0)
    both[unread] = np.iinfo(np.int64).max
    released = np.maximum.accumulate(both)
    out = released[d["txn"]]
    return np.where(out == np.iinfo(np.int64).max, -1, out)


def compare_consistency(argv: list[str]) -> int:
    """--consistency both: a run with offset, then one with transaction (same settings, one after the other on
    this machine), each printed as it goes; then each table's p50/p99 side by side with their ratio."""
    rest = [a for i, a in enumerate(argv) if a != "--consistency" and (i == 0 or argv[i - 1] != "--consistency")
            and not a.startswith("--consistency=")]
    figures: dict[str, dict[str, tuple[float, float]]] = {}
    failed = 0
    for mode in ("offset", "transaction"):
        print(f"\n===== consistency: {mode} =====", flush=True)
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *rest, "--consistency", mode],
                                stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| ") and len(cells) >= 4 and cells[2].endswith(" s") and cells[3].endswith(" s"):
                figures.setdefault(cells[0], {})[mode] = (float(cells[2][:-2]), float(cells[3][:-2]))
        failed |= proc.wait()
    print("\n| table | p50 offset | p50 transaction | p99 offset | p99 transaction | p99 ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for table, by in figures.items():
        if len(by) == 2:
            (o50, o99), (t50, t99) = by["offset"], by["transaction"]
            print(f"| {table} | {o50:.2f} s | {t50:.2f} s | {o99:.2f} s | {t99:.2f} s | {t99 / o99:.2f} |")
    return 1 if failed else 0


def visible_at(batch: np.ndarray, commits: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per change, the timestamp of the table's first version whose batch id >= the batch that read it
    (NaN: not committed)."""
    ids, stamps = commits
    at = np.searchsorted(ids, batch, side="left")
    ok = (batch >= 0) & (at < len(ids))
    out = np.full(len(batch), np.nan)
    out[ok] = stamps[at[ok]]
    return out


# -- the run --------------------------------------------------------------------------------------------
def config(args: argparse.Namespace, bootstrap: str, work: Path):
    from changelake.service.config import parse_config

    raw = {
        "pipeline": {"id": PIPELINE_ID, "checkpoint": str(work / "checkpoint"), "trigger_interval": args.trigger,
                     "read_tasks": 2,
                     "spark_conf": {"spark.sql.streaming.minBatchesToRetain": "1000000",
                                    **dict(c.split("=", 1) for c in args.conf)}},
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": [{"name": "products", "topic_pattern": TOPIC.format(n="").replace(".", r"\.") + r"\d+",
                     "format": "debezium-json", "columns": COLUMNS, "table": MIRROR, "primary_key": ["id"],
                     "normalize": False}],
        "tables": [{"name": MIRROR, "primary_key": ["id"]}],
        "storage": {"root": str(work / "lake")},
        "metrics": {"port": 0},
    }
    if args.join:
        raw["sources"].append({"name": "orders", "topic_pattern": TOPICS["orders"].format(n="").replace(".", r"\.")
                               + r"\d+", "format": "debezium-json", "columns": ORDER_COLUMNS, "table": ORDERS,
                               "primary_key": ["order_id"], "normalize": False})
        raw["tables"].append({"name": ORDERS, "primary_key": ["order_id"]})
        views = {
            LINES: {"name": "order_lines", "join": {"left": "orders", "right": "products",
                                                     "on": {"product_id": "id"}}},
            SALES: {"name": "sales", "from": "order_lines", "group_by": ["category"],
                    "aggregates": {"orders": "count(*)", "units": "sum(quantity)"}},
            TOP3: {"name": "top3", "from": "order_lines",
                   "top_n": {"n": 3, "order_by": ["quantity desc", "order_id asc"], "partition_by": ["category"],
                             "rank_column": "rank"}}}
        tables = {LINES: {"name": LINES, "from": "order_lines", "primary_key": ["order_id"]},
                  SALES: {"name": SALES, "from": "sales", "primary_key": ["category"]},
                  TOP3: {"name": TOP3, "from": "top3", "primary_key": ["category", "rank"]}}
        wanted = SHAPES[args.shape]
        raw["views"] = [views[LINES]] + [views[t] for t in wanted if t != LINES]
        raw["tables"] += [tables[t] for t in wanted]
    elif args.graph:
        raw["views"] = [{"name": "by_category", "from": "products", "group_by": ["category"],
                         "aggregates": {"products": "count(*)", "stock": "sum(stock)"}}]
        raw["tables"].append({"name": GRAPH, "from": "by_category", "primary_key": ["category"]})
    if args.mirrors:
        raw["pipeline"]["mirrors"] = args.mirrors
    if args.consistency == "transaction":
        for source in raw["sources"]:
            source.update(consistency="transaction", transaction_topic=TXN_TOPIC)
    return parse_config(orjson.dumps(raw).decode())


def query_checkpoint(cfg, table: str) -> str:
    """The checkpoint of the streaming query that writes ``table`` (the mirrors may run in their own)."""
    from changelake.service.split import query_checkpoint as of_table

    return of_table(cfg, table)


def wait_committed(checkpoint: Path, records: int, *, timeout_s: float, alive) -> bool:
    """Wait until the batches Spark committed read at least ``records`` records in all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        done = committed_batches(checkpoint)
        if done:
            ends = batch_end_offsets(checkpoint).get(done[-1], {})
            if sum(int(o) for parts in ends.values() for o in parts.values()) >= records:
                return True
        time.sleep(0.5)
    return False


def verify(cfg, final: dict[str, list[dict]], tables: list[str]) -> dict[str, str]:
    """Each table against the source's final state: the mirrors row by row, the graph tables against DuckDB's
    query over the final state."""
    import duckdb
    import pyarrow as pa

    from changelake.connectors.delta_read import read_delta

    def compare(table: str, key: tuple[str, ...], columns: tuple[str, ...], want_rows: list[tuple]) -> str:
        got = read_delta(cfg.table_path(table), columns=list(columns)).to_pylist()
        n = len(key)
        have = {tuple(r[c] for c in key): tuple(r[c] for c in columns[n:]) for r in got}
        want = {r[:n]: tuple(r[n:]) for r in want_rows}
        if have == want and len(got) == len(have):
            return "ok"
        differ = sum(have.get(k) != v for k, v in want.items())
        return f"MISMATCH: {len(got)} rows, {len(want)} expected, {differ} differ or missing"

    con = duckdb.connect()
    for name, rows in final.items():       # (by register only: DuckDB would read a local variable of the name)
        if rows:
            con.register(name, pa.Table.from_pylist(rows))
    queries = {
        MIRROR: (("id",), ("id", "category", "price", "stock"), "SELECT id, category, price, stock FROM products"),
        ORDERS: (("order_id",), ("order_id", "product_id", "quantity"),
                 "SELECT order_id, product_id, quantity FROM orders"),
        GRAPH: (("category",), ("category", "products", "stock"),
                "SELECT category, count(*), sum(stock) FROM products GROUP BY category"),
        SALES: (("category",), ("category", "orders", "units"),
                "SELECT category, count(*), sum(quantity) FROM orders JOIN products ON product_id = id "
                "GROUP BY category"),
        LINES: (("order_id",), ("order_id", "category", "quantity"),
                "SELECT order_id, category, quantity FROM orders JOIN products ON product_id = id"),
        TOP3: (("category", "rank"), ("category", "rank", "order_id", "quantity"),
               "SELECT category, rank, order_id, quantity FROM (SELECT category, order_id, quantity, row_number() OVER "
               "(PARTITION BY category ORDER BY quantity DESC, order_id ASC) AS rank FROM orders JOIN products "
               "ON product_id = id) WHERE rank <= 3"),
    }
    out = {}
    for t in tables:
        key, columns, sql = queries[t]
        want = [tuple(int(v) if isinstance(v, (int, np.integer)) else v for v in row)
                for row in con.sql(sql).fetchall()]
        out[t] = compare(t, key, columns, want)
    con.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=2_000, help="change events per second in the steady phase")
    ap.add_argument("--duration", type=float, default=300, help="seconds of steady production")
    ap.add_argument("--keys", type=int, default=100_000, help="product keys (all written by the snapshot)")
    ap.add_argument("--topics", type=int, default=4, help="topics of 4 partitions (the mock keeps 5 MB/partition)")
    ap.add_argument("--linger", type=float, default=100,
                    help="the producer's linger.ms: how long it gathers records into one message set")
    ap.add_argument("--trigger", default="1 second", help="the pipeline's trigger_interval")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="the mirror table only")
    ap.add_argument("--join", action="store_true",
                    help="issue 29's graph: products and orders mirrored, orders JOIN products, per category an "
                         "aggregate and a Top-3 (ORDER_SHARE of the changes are orders')")
    ap.add_argument("--shape", choices=tuple(SHAPES), default="full",
                    help="--join's graph: full (join, aggregate, Top-3), no-top3 (join, aggregate), join-only "
                         "(the join's output as a table): the cost of a stateful node, by difference")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the pipeline (pipeline.spark_conf); repeatable")
    ap.add_argument("--stages", action="store_true",
                    help="Spark's event log on: print the per-stage cost of the steady micro-batches")
    ap.add_argument("--orders", type=int, default=None, help="order keys with --join (default: --keys)")
    ap.add_argument("--mirrors", choices=("own_query", "with_graph"), default=None,
                    help="the pipeline's pipeline.mirrors (default: the service's default)")
    ap.add_argument("--consistency", choices=("offset", "transaction", "both"), default="offset",
                    help="the sources' consistency; transaction: each steady change is a source transaction of its "
                         "own with its END on a transaction metadata topic; both: a run with each, one after the "
                         "other, and their p99s side by side")
    ap.add_argument("--drain", type=float, default=None,
                    help="seconds to wait for the pipeline to commit the rest after production (default: "
                         "max(60, duration))")
    ap.add_argument("--quick", action="store_true", help="smoke run: 6 s at 200 events/s over 2,000 keys "
                                                         "(--join: 1,000 keys, 2,000 orders, 1 topic per table)")
    ap.add_argument("--workdir", help="keep the run here (default: a temporary directory, removed)")
    ap.add_argument("--seed", type=int, default=12)
    add_broker_option(ap)
    ap.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)   # the producer process
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.rate, args.duration, args.keys, args.topics = 200, 6, 2_000, 2
        if args.join:
            args.keys, args.orders, args.topics = 1_000, 2_000, 1
    if args.orders is None:
        args.orders = args.keys
    if args.join:
        args.graph = True
    if args.produce:
        return produce_main(args)
    if args.consistency == "both":
        return compare_consistency(argv if argv is not None else sys.argv[1:])
    drain_s = args.drain if args.drain is not None else max(60.0, args.duration)

    work = Path(args.workdir).absolute() if args.workdir else Path(tempfile.mkdtemp(prefix="bench-freshness-"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if args.stages:
        (work / "eventlog").mkdir()
        args.conf += [f"spark.eventLog.dir={work / 'eventlog'}", "spark.eventLog.enabled=true",
                      "spark.eventLog.compress=false", "spark.eventLog.rolling.enabled=false"]
    load0 = os.getloadavg()
    mirrors = [MIRROR, ORDERS] if args.join else [MIRROR]
    graph_tables = list(SHAPES[args.shape]) if args.join else [GRAPH] if args.graph else []
    tables = mirrors + graph_tables
    print(f"freshness: {args.rate:,.0f} events/s for {args.duration:.0f} s over {args.keys:,} keys, "
          f"{args.topics} topics x 4 partitions, producer linger {args.linger:g} ms, trigger {args.trigger}, tables {tables}; {machine()}; "
          f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)

    from changelake.service.runner import PipelineRunner

    ok = True
    with open_broker(args.broker, quick=args.quick) as broker:
        cfg = config(args, broker.bootstrap_servers, work)
        checkpoint = Path(cfg.pipeline.checkpoint)
        #: the checkpoint of the query that writes each table (the mirrors may run in a query of their own)
        checkpoints = {t: Path(query_checkpoint(cfg, t)) for t in tables}
        producer = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--produce", "--bootstrap", broker.bootstrap_servers,
             "--out", str(work), "--rate", str(args.rate), "--duration", str(args.duration), "--keys", str(args.keys),
             "--topics", str(args.topics), "--seed", str(args.seed), "--linger", str(args.linger),
             "--orders", str(args.orders), "--consistency", args.consistency, *(["--join"] if args.join else [])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        # the pipeline's memory: this process, its Spark JVM and Python workers; not the broker, not the producer
        mem = PeakMemory(exclude=(broker.pid, producer.pid), pss=False).__enter__()
        try:
            line = producer.stdout.readline()
            if not line.startswith("SNAPSHOT "):
                raise SystemExit(f"the producer did not write the snapshot: {line!r}")
            snapshot = int(line.split()[1])
            print(f"snapshot: {snapshot:,} events produced; starting the pipeline", flush=True)

            runner = PipelineRunner(cfg, serve_http=False)
            clock = BatchClock()          # per micro-batch: Spark action and driver (Delta) seconds
            outcome: dict = {}

            def run() -> None:
                try:
                    with clock:
                        outcome["result"] = runner.run(install_signal_handlers=False)
                except BaseException as exc:          # noqa: BLE001 - reported by the main thread
                    outcome["error"] = exc

            thread = threading.Thread(target=run, name="pipeline", daemon=True)
            t_start = time.monotonic()
            thread.start()
            if not all(wait_committed(c, snapshot, timeout_s=600, alive=thread.is_alive)
                       for c in set(checkpoints.values())):
                raise SystemExit(f"the pipeline did not catch up on the snapshot: {outcome.get('error')!r}")
            print(f"pipeline caught up on the snapshot in {time.monotonic() - t_start:.1f}s (Spark start-up "
                  "included); steady phase starts", flush=True)
            warmup_batches = len(clock.batches)
            producer.stdin.write("GO\n")
            producer.stdin.flush()
            line = producer.stdout.readline()
            if producer.wait() != 0 or not line.startswith("PRODUCED "):
                raise SystemExit(f"the producer failed: {line!r}")
            produced, produced_s, producer_cpu = int(line.split()[1]), float(line.split()[2]), float(line.split()[3])
            print(f"produced {produced:,} changes in {produced_s:.1f}s (the producer process used {producer_cpu:.1f} "
                  "CPU-s of the machine's cores); waiting for the pipeline to commit them", flush=True)
            t_drain = time.monotonic()
            ends_too = produced if args.consistency == "transaction" else 0       # one END per change
            drained = all(wait_committed(c, snapshot + produced + ends_too, timeout_s=drain_s, alive=thread.is_alive)
                          for c in set(checkpoints.values()))
            drain_wait = time.monotonic() - t_drain
            runner.request_stop()
            thread.join(timeout=300)
        finally:
            mem.__exit__(None, None, None)
            if producer.poll() is None:
                producer.kill()
                producer.wait()
        if "error" in outcome:
            raise outcome["error"]
        result = outcome.get("result")
        load1 = os.getloadavg()

        # -- per change: which batch read it, when each table made it visible ------------------------------
        d = np.load(work / "deliveries.npz")
        topics = [str(t) for t in d["topics"]]
        acked, sent = d["acked"], d["sent"]
        batches = {c: read_batches(topics, d["topic"], d["partition"], d["offset"], batch_end_offsets(c))
                   for c in set(checkpoints.values())}
        if args.consistency == "transaction":       # a change goes in with the batch that releases its transaction
            batches = {c: released_batches(d, b, batch_end_offsets(c)) for c, b in batches.items()}
        batch = batches[checkpoints[MIRROR]]
        starts = batch_starts(checkpoints[MIRROR])
        visible = {t: visible_at(batches[checkpoints[t]], delta_commits(Path(cfg.table_path(t)))) for t in tables}
        # the changes each table shows: a mirror its own source's, a graph table every source's
        source_topics = {t: np.array([topics.index(n) for n in topics if n.startswith(TOPICS[t].format(n=""))])
                         for t in mirrors}
        feeds = {t: np.isin(d["topic"], source_topics[t]) if t in mirrors else np.ones(len(acked), bool)
                 for t in tables}
        # a graph table commits only when its rows change: a change read after its last commit (a Top-N whose
        # top rows stayed) shows nothing, and is not "not committed" when the table equals the source
        no_effect = {t: np.zeros(len(acked), bool) for t in tables}
        for t in graph_tables:
            ids = delta_commits(Path(cfg.table_path(t)))[0]
            read_by = batches[checkpoints[t]]
            no_effect[t] = np.isnan(visible[t]) & (read_by >= 0) & (read_by > (ids.max() if len(ids) else -1))
        final = orjson.loads((work / "final_state.json").read_bytes())
        checks = verify(cfg, final, tables)
        doubled = written_twice(d, log_ends(set(checkpoints.values())))

    t0, t1 = acked.min(), acked.max()
    expired = result.totals.expired if result else -1
    print(f"\nsteady phase: {len(acked):,} changes acknowledged over {t1 - t0:.1f}s "
          f"({len(acked) / max(t1 - t0, 1e-9):,.0f} events/s offered); produce -> ack "
          f"p50 {np.percentile(acked - sent, 50) * 1000:.0f} ms, p99 {np.percentile(acked - sent, 99) * 1000:.0f} ms")
    print(f"load average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    print(f"broker: {broker.kind}, {broker.label}")
    print("pipeline peak RSS: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in mem.peak_mb.items())
          + f"; total {mem.total_mb:,.0f} MB")
    print("\n| table | changes | freshness p50 | p99 | max | not committed | read after the last change | target |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    settled = {t: no_effect[t] & (checks.get(t) == "ok") for t in tables}
    rows = [(t, visible[t][feeds[t]] - acked[feeds[t]], settled[t][feeds[t]], TARGETS[t]) for t in tables]
    if args.join:       # each change once per kind of table: when every mirror (graph table) showed it
        rows += [(f"{label} (all)", np.concatenate([visible[t][feeds[t]] - acked[feeds[t]] for t in group]),
                  np.concatenate([settled[t][feeds[t]] for t in group]), "")
                 for label, group in (("mirrors", mirrors), ("graph tables", graph_tables))]
    for t, lat, after_last, target in rows:
        done = lat[~np.isnan(lat)]
        missing = int((np.isnan(lat) & ~after_last).sum())
        ok &= missing == 0
        p50, p99 = np.percentile(done, [50, 99]) if len(done) else (float("nan"),) * 2
        mx = done.max() if len(done) else float("nan")
        print(f"| {t} | {len(lat):,} | {p50:.2f} s | {p99:.2f} s | {mx:.2f} s | {missing:,} | "
              f"{int(after_last.sum()):,} | {target} |")

    # where a change's time goes: waiting for the batch that reads it to start (the running batch, then the
    # trigger), then that batch until the mirror's commit
    # per change, when its mirror showed it (each change has one mirror)
    mirror = visible[MIRROR].copy()
    for t in mirrors[1:]:
        mirror[feeds[t]] = visible[t][feeds[t]]
    commit_of: dict[int, float] = {}
    for t in mirrors:
        for b, stamp in zip(*delta_commits(Path(cfg.table_path(t)))):
            commit_of[int(b)] = min(commit_of.get(int(b), stamp), stamp)
    start_of = np.array([starts.get(int(b), np.nan) for b in batch])
    wait, own = start_of - acked, mirror - start_of
    split = ~np.isnan(wait) & ~np.isnan(own)
    if split.any():
        (w50, w99), (o50, o99) = np.percentile(wait[split], [50, 99]), np.percentile(own[split], [50, 99])
        print(f"\n{'mirrors' if args.join else MIRROR}: append -> start of the batch that read it p50 {w50:.2f} s, "
              f"p99 {w99:.2f} s; "
              f"that batch's start -> its commit p50 {o50:.2f} s, p99 {o99:.2f} s")
        slow = np.argsort(-(mirror - acked))[: max(1, len(acked) // 100)]    # the slowest 1%
        ids, counts = np.unique(batch[slow], return_counts=True)
        print("the slowest 1% of changes were read by batches " + "; ".join(
            f"{b} ({c:,} of them; it started {starts[b] - t0:.1f}s into the steady phase, "
            f"{starts[b] - starts.get(b - 1, np.nan):.2f}s after the one before, and committed "
            f"{commit_of.get(b, np.nan) - starts[b]:.2f}s later)"
            for b, c in sorted(((int(b), int(c)) for b, c in zip(ids, counts)), key=lambda x: -x[1])[:5]))
        span = sorted(b for b, t in starts.items() if t0 <= t <= t1)
        gaps = np.diff([starts[b] for b in span])
        if len(gaps):
            print(f"batch starts while producing: every {np.median(gaps):.2f}s (median; p99 {np.percentile(gaps, 99):.2f}s, "
                  f"max {gaps.max():.2f}s)")

    committed_in = np.count_nonzero(mirror <= t1)
    sustained = committed_in / max(t1 - t0, 1e-9)
    last = np.nanmax(mirror) if np.isfinite(mirror).any() else float("nan")
    stamps = np.array(sorted(commit_of.values()))
    steady = stamps[(stamps >= t0) & (stamps <= t1)]
    gaps = np.diff(steady)
    print(f"\nrecords/s: offered {len(acked) / max(t1 - t0, 1e-9):,.0f}; committed to the mirror while producing "
          f"{sustained:,.0f}; the rest committed {max(last - t1, 0):.1f}s after production stopped")
    print(f"mirror commits while producing: {len(steady)}, every {np.median(gaps) if len(gaps) else float('nan'):.2f}s "
          f"(median; p90 {np.percentile(gaps, 90) if len(gaps) else float('nan'):.2f}s), "
          f"{len(acked) / max(len(steady), 1):,.0f} changes per commit")
    timed = np.array(clock.batches[warmup_batches:]).reshape(-1, 2)
    if len(timed):
        (a50, d50), (a90, d90) = np.percentile(timed, [50, 90], axis=0)
        print(f"micro-batches after the snapshot: {len(timed)}; Spark action (read, decode, operators, collect) "
              f"median {a50:.2f}s (p90 {a90:.2f}s), driver (Delta commits) median {d50:.2f}s (p90 {d90:.2f}s)")
    if args.stages and result is not None:
        # the steady batches: those that started while the producer ran (after the snapshot's catch-up)
        steady_ids = sorted(b for b, t in starts.items() if t0 <= t <= t1)
        drivers = [d for _, d in clock.batches[warmup_batches:]]
        print(f"\nper-stage cost of the steady micro-batches ({args.shape if args.join else 'one source'}):")
        print(stage_table(batch_stages(work / "eventlog"), steady_ids, drivers, result.progress))
    grid = np.arange(t0, t1 + 1e-9, 1.0)
    backlog = (np.searchsorted(np.sort(acked), grid, side="right")
               - np.searchsorted(np.sort(mirror[~np.isnan(mirror)]), grid, side="right"))
    half = grid >= t0 + (t1 - t0) / 2
    slope = np.polyfit(grid[half] - t0, backlog[half], 1)[0] if half.sum() >= 2 else 0.0
    trend = "growing" if slope > 0.02 * args.rate else "not growing"
    print(f"backlog (acknowledged - committed to the mirror): at the end of production {int(backlog[-1]):,} "
          f"changes, max {int(backlog.max()):,}, median {int(np.median(backlog)):,}; trend over the second half "
          f"{slope:+,.1f} changes/s ({trend}; growing means above 2% of the rate)")
    lag = sum(result.lag.values()) if result else -1
    print(f"lag at the end: {lag:,} records (Spark progress); committed within the drain wait of {drain_s:.0f}s: "
          f"{drained} ({drain_wait:.1f}s waited; the batch running then was finished); expired offsets "
          f"(must be 0): {expired}")
    print(f"records in the log twice (a producer's retried request, appended both times; must be 0): "
          f"{sum(doubled.values()):,}" + (f" ({', '.join(f'{k}: {n}' for k, n in sorted(doubled.items()))}; "
                                        "the graph sources' normalize: false counts them twice)" if doubled else ""))
    for t, verdict in checks.items():
        print(f"verification of {t} against the source's final state: {verdict}")
    ok &= expired == 0 and not doubled and all(v == "ok" for v in checks.values())
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print(f"freshness run {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
