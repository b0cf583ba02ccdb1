"""Commit only complete source transactions (``sources[].consistency: transaction``).

A micro-batch is a cut of Kafka offsets, not of transactions: one transaction's changes to two tables
(two topics), or to two keys of one table (two partitions), can fall into different batches. The gate
sits where a batch's rows are assembled per table, before the Delta sinks, and lets through only the rows
of transactions read in full, in the order the source committed them; the rows of the others are held,
in the checkpoint, until a later batch completes them.

================================================  =========================================================
a row                                             in this batch
================================================  =========================================================
of no transaction (snapshot, other sources)       applied
of a transaction in the released prefix           applied
of a transaction split by the limit earlier       applied (the transaction is already visible in part)
of any other transaction                          held (with the rows held before)
================================================  =========================================================

The released prefix: the transactions whose END was read, taken in END order (the transaction metadata
topic's order: the order the database committed them) from the oldest, as long as every one of them is
complete: for each data collection the pipeline reads, as many events read as its END counts. A
transaction that is complete but has an older incomplete one before it waits too, so that every table
only ever moves from the state after one source transaction to the state after a later one.

Held rows beyond ``pipeline.max_held_rows`` split: every held row is applied, every transaction not
complete is marked split (its later events are applied as they come, its END is dropped), logged as a
warning and counted (``changelake_transactions_split_total``).

Restart: the gate's state after batch ``b`` (held rows, ENDs waiting, events counted) is written to
``<checkpoint>/transactions/<b>/`` before the batch's Delta commits, and batch ``b`` starts from the
newest state of an earlier batch, so a batch replayed after a crash holds and releases exactly what its
first run did: the held rows are never lost, though Spark's offsets pass them.

Views: the rows of the sources a pipeline's views read go through the gate too, and the views' operators
run behind it on the released rows (:mod:`changelake.service.driver_graph`); their state goes into the same
checkpoint entry, so a view's table, like a mirror, only moves between states after whole transactions.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from changelake import metrics
from changelake.changelog import OFFSET, PARTITION, TOPIC
from changelake.connectors.consistency import ConsistencyLog, Cut
from changelake.durations import parse_duration
from changelake.errors import ConfigError
from changelake.formats.transactions import BOUNDARIES_SCHEMA, EVENTS_SCHEMA

log = logging.getLogger(__name__)

#: the column that carries a held row's transaction in the checkpoint
TXN = "__txn"
#: transaction ids remembered as released or split (an event of theirs that comes later is applied)
REMEMBERED = 10_000
#: the gate's states kept in the checkpoint (the newest ones)
STATES_KEPT = 3
STATE_DIR = "transactions"
#: the gate's name for a graph source's rows (table names cannot start with it)
FEED = "@source:"


@dataclass
class GateState:
    """What the gate carries from one batch to the next (all of it JSON but the held rows)."""

    #: ENDs read, not released yet, in commit order: [txn, {collection: events}, position]
    pending: list[list] = field(default_factory=list)
    #: events read per transaction not released: txn -> collection -> count
    seen: dict[str, dict[str, int]] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)      # the newest REMEMBERED, oldest first
    split: list[str] = field(default_factory=list)
    committed: int = 0                                      # transactions released so far
    last_txn: str | None = None
    last_position: str | None = None
    held: dict[str, pa.Table] = field(default_factory=dict)   # table -> rows (with TXN)
    #: transactions waiting -> the batch clock (epoch seconds) of the batch that first held them
    held_since: dict[str, float] = field(default_factory=dict)
    clock: float = 0.0                                      # the clock of the batch that wrote this state
    #: the operators' state after the batch (``changelake.service.driver_graph``; None: no views)
    graph: dict[str, bytes] | None = None

    def to_json(self) -> dict:
        return {"pending": self.pending, "seen": self.seen, "released": self.released, "split": self.split,
                "committed": self.committed, "last_txn": self.last_txn, "last_position": self.last_position,
                "held_since": self.held_since, "clock": self.clock}

    @classmethod
    def from_json(cls, data: dict, held: dict[str, pa.Table], graph: dict[str, bytes] | None = None) -> "GateState":
        return cls(pending=data["pending"], seen=data["seen"], released=data["released"], split=data["split"],
                   committed=data["committed"], last_txn=data["last_txn"], last_position=data["last_position"],
                   held=held, graph=graph, held_since=data.get("held_since", {}), clock=data.get("clock", 0.0))


@dataclass(frozen=True)
class GateResult:
    rows: dict[str, pa.Table]        # table -> rows to apply in this batch
    released: int                    # transactions released by this batch
    held_transactions: int
    held_rows: int
    split: int                       # transactions the limit split in this batch
    last_txn: str | None
    last_position: str | None


class TransactionGate:
    """The gate's rule on Arrow tables (no I/O): :meth:`apply` takes one batch and the state before it.

    ``collection_of(topic)``: the data collection a change topic holds (None: not a tracked topic);
    ``tracked(collection)``: whether the pipeline reads that collection (ENDs count only those).
    """

    def __init__(self, *, collection_of: Callable[[str], str | None], tracked: Callable[[str], bool],
                 max_held_rows: int, max_hold_seconds: float | None = None) -> None:
        self.collection_of = collection_of
        self.tracked = tracked
        self.max_held_rows = max_held_rows
        self.max_hold_seconds = max_hold_seconds

    def apply(self, state: GateState, rows: Mapping[str, Sequence[pa.Table]], events: pa.Table,
              boundaries: pa.Table, *, batch_id: int, now: float = 0.0) -> tuple[GateResult, GateState]:
        """``rows``: the batch's changelog rows per gated table (with ``_topic``, ``_partition``, ``_offset``);
        ``events`` (:data:`~changelake.formats.transactions.EVENTS_SCHEMA`): the transaction of each change
        record read; ``boundaries`` (``BOUNDARIES_SCHEMA``): the END events read; ``now``: the batch's clock
        (epoch seconds; a replayed batch gets its first run's). Returns what to apply and the state after the
        batch (``state`` itself is not changed)."""
        released_ids = list(state.released)
        split_ids = list(state.split)
        done = set(released_ids) | set(split_ids)
        pending = [list(p) for p in state.pending]
        seen = {t: dict(c) for t, c in state.seen.items()}
        # 1. count the events of transactions still open
        for topic, txn, last in zip(events["topic"].to_pylist(), events["txn"].to_pylist(),
                                    events["last"].to_pylist()):
            if txn in done:
                continue
            collection = self.collection_of(topic)
            if collection is None:
                continue
            counts = seen.setdefault(txn, {})
            counts[collection] = counts.get(collection, 0) + 1
        # 2. the ENDs, in commit order; Maxwell's last change of a transaction is its END
        if boundaries.num_rows and pc.max(boundaries["partition"]).as_py() > 0:
            raise ConfigError(f"transaction metadata topic {boundaries['topic'][0].as_py()!r} has more than one "
                              "partition, so its END events are not in commit order; recreate it with one partition "
                              "(Debezium: topic.creation.<group>.partitions: 1 for it), or set consistency: offset")
        ends = boundaries.sort_by([("partition", "ascending"), ("offset", "ascending")]).to_pylist()
        for end in ends:
            if end["txn"] in done:
                continue
            counts = {c["collection"]: c["event_count"] for c in end["collections"] if self.tracked(c["collection"])}
            pending.append([end["txn"], counts, f"{end['topic']}:{end['partition']}:{end['offset']}"])
        for topic, partition, offset, txn, last in zip(*(events[c].to_pylist() for c in events.column_names)):
            if last and txn not in done:
                collection = self.collection_of(topic)
                pending.append([txn, {collection: seen.get(txn, {}).get(collection, 0)},
                                f"{topic}:{partition}:{offset}"])
        # 3. the time bound: an incomplete transaction held longer than max_hold goes as it is (split); a
        #    complete one waiting behind it goes in full once it is gone
        complete = {p[0] for p in pending if all(seen.get(p[0], {}).get(c, 0) >= n for c, n in p[1].items())}
        expired = sorted(t for t, since in state.held_since.items()
                         if self.max_hold_seconds is not None and now - since >= self.max_hold_seconds
                         and t not in done and t not in complete)
        for t in expired:
            end = next((p for p in pending if p[0] == t), None)
            log.warning("batch %d: source transaction %s held for %.0fs, longer than pipeline.max_hold (%.0fs): "
                        "applying its rows as they are (split); %s, events read %s. The tables show part of it "
                        "until its remaining events come", batch_id, t, now - state.held_since[t],
                        self.max_hold_seconds, "its BEGIN/changes read but no END" if end is None else
                        f"its END read (counts {end[1]})", seen.get(t, {}))
            seen.pop(t, None)
        if expired:
            metrics.TRANSACTIONS_EXPIRED.inc(len(expired))
            pending = [p for p in pending if p[0] not in set(expired)]
            split_ids = (split_ids + expired)[-REMEMBERED:]
            done |= set(expired)
        # 4. release the complete prefix
        released: list[list] = []
        while pending and all(seen.get(pending[0][0], {}).get(c, 0) >= n for c, n in pending[0][1].items()):
            released.append(pending.pop(0))
        go = {p[0] for p in released} | done
        # 5. tag the rows with their transaction, add the held ones, keep back what may not go yet
        out: dict[str, pa.Table] = {}
        held: dict[str, pa.Table] = {}
        lookup = _position_keys(events["topic"], events["partition"], events["offset"])
        for table in sorted(set(rows) | set(state.held)):
            parts = [t.append_column(TXN, pc.take(events["txn"], pc.index_in(
                _position_keys(t[TOPIC], t[PARTITION], t[OFFSET]), value_set=lookup))) for t in rows.get(table, ())]
            if table in state.held:
                parts.insert(0, state.held[table])
            if not parts:
                continue
            both = pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]
            txn = both[TXN]
            ok = pc.or_kleene(pc.is_null(txn), pc.is_in(txn, value_set=pa.array(sorted(go), pa.string())))
            ok = pc.fill_null(ok, True)
            out[table] = both.filter(ok).drop_columns([TXN])
            keep = both.filter(pc.invert(ok))
            if keep.num_rows:
                held[table] = keep
        # 6. the limit: apply everything held, split every transaction not complete
        held_rows = _held_count(held)
        split_now: list[str] = []
        if held_rows > self.max_held_rows:
            open_ids = {p[0] for p in pending} | set(seen) - {p[0] for p in released}
            open_ids |= {t for h in held.values() for t in pc.unique(h[TXN]).to_pylist()}
            split_now = sorted(open_ids)
            log.warning("batch %d: %d held row(s) exceed pipeline.max_held_rows (%d): applying %d incomplete "
                        "source transaction(s) as they are (split; e.g. %s); the tables show part of them until "
                        "their remaining events come", batch_id, held_rows, self.max_held_rows, len(split_now),
                        split_now[:3])
            metrics.TRANSACTIONS_SPLIT.inc(len(split_now))
            for table, keep in held.items():
                rest = keep.drop_columns([TXN])
                out[table] = pa.concat_tables([out[table], rest], promote_options="permissive") \
                    if table in out else rest
            held, pending, held_rows = {}, [], 0
            split_ids = (split_ids + split_now)[-REMEMBERED:]
        for p in released:
            seen.pop(p[0], None)
        for t in split_now:
            seen.pop(t, None)
        released_ids = (released_ids + [p[0] for p in released])[-REMEMBERED:]
        waiting = {p[0] for p in pending} | {t for h in held.values() for t in pc.unique(h[TXN]).to_pylist()}
        if held:
            oldest = pending[0] if pending else None
            detail = "" if oldest is None else (f"; oldest with its END read: {oldest[0]} (events read "
                                                f"{seen.get(oldest[0], {})}, END counts {oldest[1]})")
            log.info("batch %d: holding %d row(s) of %d incomplete source transaction(s) for a later batch%s",
                     batch_id, held_rows, len(waiting), detail)
        after = GateState(pending=pending, seen=seen, released=released_ids, split=split_ids,
                          committed=state.committed + len(released),
                          last_txn=released[-1][0] if released else state.last_txn,
                          last_position=released[-1][2] if released else state.last_position, held=held,
                          held_since={t: state.held_since.get(t, now) for t in sorted(waiting | set(seen))},
                          clock=now)
        metrics.TRANSACTIONS_RELEASED.inc(len(released))
        metrics.TRANSACTIONS_HELD.set(len(waiting))
        metrics.HELD_ROWS.set(held_rows)
        return GateResult(rows=out, released=len(released), held_transactions=len(waiting), held_rows=held_rows,
                          split=len(split_now), last_txn=after.last_txn, last_position=after.last_position), after


def _held_count(held: Mapping[str, pa.Table]) -> int:
    """The changelog rows held, each source change once: a source both mirrored and read by the views holds
    its rows twice, as its table's and as the views' feed (``FEED`` + source); a feed's row at a position
    that a held table row has is not counted again."""
    tables = [t for name, t in held.items() if not name.startswith(FEED)]
    count = sum(t.num_rows for t in tables)
    feeds = [t for name, t in held.items() if name.startswith(FEED)]
    if not feeds:
        return count
    counted = pa.concat_arrays([_position_keys(t[TOPIC], t[PARTITION], t[OFFSET]) for t in tables]) \
        if tables else pa.array([], pa.string())
    for feed in feeds:
        keys = _position_keys(feed[TOPIC], feed[PARTITION], feed[OFFSET])
        count += len(keys) - pc.sum(pc.is_in(keys, value_set=counted)).as_py() if len(keys) else 0
    return count


def _position_keys(topic: pa.ChunkedArray | pa.Array, partition: pa.ChunkedArray | pa.Array,
                   offset: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One string per Kafka position, to match rows with the records they were decoded from."""
    key = pc.binary_join_element_wise(pc.cast(topic, pa.string()), pc.cast(partition, pa.string()),
                                      pc.cast(offset, pa.string()), "\x00")
    return key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key


class GateBook:
    """The gate's states in the checkpoint: ``<checkpoint>/transactions/<batch id>/`` (``state.json`` and one
    Arrow IPC file of held rows per table), written before the batch's commits."""

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint

    def _ids(self) -> tuple[object, str, list[int]]:
        from pyarrow import fs as pafs

        from changelake.spark.checkpoint import filesystem

        fs, root = filesystem(self.checkpoint)
        root = f"{root}/{STATE_DIR}"
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        ids = sorted((int(i.base_name) for i in infos if i.type == pafs.FileType.Directory and i.base_name.isdigit()),
                     reverse=True)
        return fs, root, ids

    def before(self, batch_id: int) -> GateState:
        """The state a batch starts from: the newest one written by an earlier batch (a fresh one if none)."""
        import pyarrow.ipc as ipc

        fs, root, ids = self._ids()
        earlier = next((i for i in ids if i < batch_id), None)
        if earlier is None:
            return GateState()
        with fs.open_input_stream(f"{root}/{earlier}/state.json") as f:
            data = json.loads(f.read())
        held = {}
        for i, table in enumerate(data.pop("tables")):
            with fs.open_input_file(f"{root}/{earlier}/{i}.arrow") as f:
                held[table] = ipc.open_file(f).read_all()
        graph = None
        if data.get("nodes") is not None:
            graph = {}
            for i, node in enumerate(data.pop("nodes")):
                with fs.open_input_stream(f"{root}/{earlier}/graph/{i}.bin") as f:
                    graph[node] = f.read()
        data.pop("nodes", None)
        return GateState.from_json(data, held, graph)

    def clock_of(self, batch_id: int) -> float | None:
        """The clock batch ``batch_id`` ran with, when an earlier run of it wrote its state (None: none did)."""
        fs, root, ids = self._ids()
        if batch_id not in ids:
            return None
        with fs.open_input_stream(f"{root}/{batch_id}/state.json") as f:
            return json.loads(f.read()).get("clock")

    def write(self, batch_id: int, state: GateState) -> None:
        import pyarrow.ipc as ipc

        fs, root, ids = self._ids()
        tmp = f"{root}/.{batch_id}.tmp"
        fs.create_dir(tmp, recursive=True)
        tables = sorted(state.held)
        for i, table in enumerate(tables):
            with fs.open_output_stream(f"{tmp}/{i}.arrow") as f, ipc.new_file(f, state.held[table].schema) as w:
                w.write_table(state.held[table])
        nodes = None if state.graph is None else sorted(state.graph)
        if nodes:
            fs.create_dir(f"{tmp}/graph", recursive=True)
        for i, node in enumerate(nodes or ()):
            with fs.open_output_stream(f"{tmp}/graph/{i}.bin") as f:
                f.write(state.graph[node])
        with fs.open_output_stream(f"{tmp}/state.json") as f:
            f.write(json.dumps({**state.to_json(), "tables": tables, "nodes": nodes}).encode())
        if batch_id in ids:
            fs.delete_dir(f"{root}/{batch_id}")
        fs.move(tmp, f"{root}/{batch_id}")
        for old in [i for i in ids if i != batch_id][STATES_KEPT - 1:]:
            try:
                fs.delete_dir(f"{root}/{old}")
            except OSError:
                pass


def transaction_gate(config: Any, routes: Sequence[Any]) -> TransactionGate | None:
    """The gate of a pipeline whose sources have ``consistency: transaction`` (None when none has).

    A Debezium change topic is ``<prefix>.<collection>``, its transaction metadata topic
    ``<prefix>.transaction``: a topic's collection is its name after the prefix, and an END's collection
    counts when a source with ``consistency: transaction`` reads ``<prefix>.<collection>``. Maxwell's
    transactions end at their ``commit`` change: their events are counted under one collection ("").
    """
    gated = [r for r in routes if r.spec.consistency == "transaction"]
    if not gated:
        return None
    prefixes = sorted({t.removesuffix(".transaction") for t in
                       (r.spec.transaction_topic_name() for r in gated) if t is not None})
    maxwell = [r for r in gated if r.spec.format == "maxwell-json"]

    def collection_of(topic: str) -> str | None:
        for r in maxwell:
            if r.matches(topic):
                return ""
        for prefix in prefixes:
            if topic.startswith(prefix + "."):
                return topic[len(prefix) + 1:]
        return None

    def tracked(collection: str) -> bool:
        return any(r.matches(f"{prefix}.{collection}") for prefix in prefixes for r in gated)

    return TransactionGate(collection_of=collection_of, tracked=tracked,
                           max_held_rows=config.pipeline.max_held_rows,
                           max_hold_seconds=None if config.pipeline.max_hold is None
                           else parse_duration(config.pipeline.max_hold))


class TransactionCommits:
    """A pipeline's consistency: the gate (None without ``consistency: transaction``) with its states in the
    checkpoint, and the progress table (None unless ``config.writes_consistency_table()``)."""

    def __init__(self, config: Any, routes: Sequence[Any]) -> None:
        self.gate = transaction_gate(config, routes)
        self.book = GateBook(config.pipeline.checkpoint)
        self.cuts = ConsistencyLog(config.consistency_table_path(), pipeline_id=config.pipeline.id,
                                   storage_options=config.storage.plain_options()) \
            if config.writes_consistency_table() else None
        self._after: tuple[int, GateState] | None = None       # the state the last batch left, in memory

    @property
    def active(self) -> bool:
        return self.gate is not None or self.cuts is not None

    def hold(self, per_table: dict[str, list[pa.Table]], gated: set[str], events: Sequence[pa.Table],
             boundaries: pa.Table | None, *, batch_id: int, generation: int,
             feeds: dict[str, list[pa.Table]] | None = None, graph: Any = None) -> tuple[Cut, dict[str, pa.Table]]:
        """The rows of the ``gated`` tables in ``per_table`` replaced (in place) by those of complete
        transactions; the gate's state after the batch written to the checkpoint (before the commits: a
        replay starts from the state before it). ``feeds``: the batch's rows of the sources ``graph`` reads
        (a :class:`~changelake.service.driver_graph.DriverGraph`), gated alike and run through it: its state
        after the batch goes with the gate's. Returns the batch's cut, its table versions to come, and the
        graph tables' changes."""
        if self.gate is None:
            return Cut(batch_id=batch_id, generation=generation, tables={}), {}
        rows = {t: per_table.pop(t) for t in list(per_table) if t in gated}
        rows.update({FEED + s: parts for s, parts in (feeds or {}).items()})
        found = pa.concat_tables(events) if events else EVENTS_SCHEMA.empty_table()
        ends = boundaries if boundaries is not None else BOUNDARIES_SCHEMA.empty_table()
        cached, self._after = self._after, None       # unknown until this batch's state is written
        if cached is not None and cached[0] == batch_id - 1:
            before = cached[1]
        else:               # a restart, or a replayed batch: the state an earlier batch wrote
            before = self.book.before(batch_id)
            if graph is not None:
                graph.restore(before.graph)
        now = self.book.clock_of(batch_id)        # a replayed batch: its first run's clock, so it decides alike
        now = time.time() if now is None else now
        result, after = self.gate.apply(before, rows, found, ends, batch_id=batch_id, now=now)
        changes: dict[str, pa.Table] = {}
        if graph is not None:
            changes = graph.step({t[len(FEED):]: [kept] for t, kept in result.rows.items() if t.startswith(FEED)},
                                 now_ms=int(now * 1000))
            after = dataclasses.replace(after, graph=graph.snapshot())
        self.book.write(batch_id, after)
        self._after = (batch_id, after)
        for table, kept in result.rows.items():
            if kept.num_rows and not table.startswith(FEED):
                per_table[table] = [kept]
        return Cut(batch_id=batch_id, generation=generation, tables={}, transactions=after.committed,
                   last_transaction=result.last_txn, source_position=result.last_position,
                   held_transactions=result.held_transactions, held_rows=result.held_rows,
                   released=result.released, split=result.split), changes

    def record(self, cut: Cut, versions: Mapping[str, int | None], *, position: int) -> None:
        """The batch's row of the progress table, with each existing table's version."""
        if self.cuts is not None:
            self.cuts.record(dataclasses.replace(cut, tables={n: v for n, v in versions.items() if v is not None}),
                             version=position)
