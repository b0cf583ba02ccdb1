"""Operator benchmark (issue 4): changelake against PyFlink 2.3.0 on the same data, same run.

    nice -n 19 /tmp/venv/bin/python bench/operators.py [--events 1000000] [--keys 200000]
        [--order-events N] [--order-keys N] [--quick] [--changelake auto|spark|local|none]
        [--broker real|embedded] [--skip-pyflink] [--flink-python /tmp/venv-flink/bin/python]

Queries, parallelism 2 on both systems:

* (a) ``SELECT category, COUNT(*), SUM(price) FROM products GROUP BY category``
* (b) ``SELECT p.category, COUNT(*), SUM(p.price) FROM orders o JOIN products p
  ON o.product_id = p.id GROUP BY p.category`` (inner join; SUM of the product's price per
  joined order, as in the changelake YAML ``aggregates: {orders: count(*), revenue: sum(price)}``)

Data (bench/gen.py's Debezium JSON envelope, MySQL binlog positions, one log for both tables):
a snapshot (``op: r``) of all ``--keys`` products and of half the ``--order-keys`` orders, then
the change events of both tables interleaved. Products: 90% updates (new price; a fifth of
them also move the product to another category) and 10% deletes, each of a product drawn
uniformly among the live ones, so the mix among the changes after the snapshot really is
90/10 (1M events, 200k keys: 200k snapshot inserts + 720k updates + 80k deletes). Orders:
inserts of new order ids (enough to reach ``--order-keys``), 10% deletes, the rest updates
(new qty; a tenth move the order to another product); product ids drawn among all products,
so some orders reference deleted products and drop out of the inner join.

The events go to a Kafka broker (``--broker``, bench/common.py; the run prints which): 4 topics
per table of 4 partitions each, keyed by primary key, so per-key order is kept; the run checks that
no offset expired. Both systems are measured from Kafka to the result:

==============  ===================================================================================
``--broker``    what each system reads
==============  ===================================================================================
``real``        Apache Kafka (the project's ``kafka`` JVM set; the default where it is installed):
                changelake and PyFlink read the same topics. PyFlink through Flink's Kafka connector
                (the ``flink-kafka`` JVM set), ``format = 'debezium-json'``, from the earliest offset,
                bounded at the latest (``scan.bounded.mode = 'latest-offset'``), so its job ends
``embedded``    librdkafka's mock cluster, for changelake only; PyFlink reads the same bytes from
                Debezium JSON files (filesystem source, two files per table split by key): its
                figures then leave Kafka out. The older figures of docs/benchmarks.md were taken so
==============  ===================================================================================

* **PyFlink** 2.3.0 (bench/pyflink_ops_job.py, its own venv): one timed run per query into a
  blackhole sink, one untimed run into a collecting sink for the result.
* **changelake, Spark** (the product path): the service pipeline (``changelake.service``) with
  the YAML printed by ``--print-yaml`` (sources with ``primary_key`` and ``normalize: false``,
  ``views``, a table keyed by category), ``available_now``, timed from query start to end with
  the Spark session start reported separately; the result is read from the Delta table.
  Batch and set-up times come from ``bench/spark_timing.py``'s ``BatchClock``, stage times from
  Spark's event log. ``auto`` falls back, where the Spark executor is missing, to:
* **changelake, in-process** (``LocalRunner``): the same plan, records consumed back from the
  broker, decoded, fed in micro-batches of ``--batch`` records. It proves the comparison and the
  plan's semantics; its time is NOT a product figure (no Spark, no Delta, one process).

Both systems run the same plan: PyFlink's ``table.exec.source.cdc-events-duplicate`` stays at
its default (false: no ChangelogNormalize) and the changelake sources say ``normalize: false``.
Every result (category -> count, sum) is checked against DuckDB over the final source state.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (DEFAULT_FLINK_PYTHON, PeakMemory, add_broker_option, machine, open_broker, run_python_job,
                          skip_pyflink)
from bench.gen import debezium_envelope
from bench.spark_timing import BatchClock, spark_stages

CATEGORIES = ["tools", "garden", "kitchen", "toys", "sports", "office", "auto", "outdoor", "books", "music"]
PRODUCT_COLUMNS = {"id": "bigint", "category": "string", "price": "bigint"}
ORDER_COLUMNS = {"order_id": "bigint", "product_id": "bigint", "qty": "int"}
TOPIC = "bench.ops.{table}.{n}"
FLINK_JOB = Path(__file__).resolve().parent / "pyflink_ops_job.py"
#: changelake / PyFlink throughput issue 29 asks for at 1 M events, same run, same data (issue 12 asked 1.0 and 0.6)
TARGETS = {"a": 1.2, "b": 1.2}

QUERIES = {
    "a": {"label": "(a) products GROUP BY category COUNT(*), SUM(price)", "sources": ("products",),
          "table": "category_totals", "columns": ("products", "total_price")},
    "b": {"label": "(b) orders JOIN products ON product_id = id, GROUP BY category COUNT(*), SUM(price)",
          "sources": ("orders", "products"), "table": "category_sales", "columns": ("orders", "revenue")},
}
Result = dict[str, tuple[int, int]]       # category -> (count, sum)


# -- data ---------------------------------------------------------------------------------------------
class _Live:
    """Live rows by key, with uniform choice and removal in O(1)."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}
        self._keys: list[int] = []
        self._pos: dict[int, int] = {}

    def put(self, key: int, row: dict) -> None:
        if key not in self.rows:
            self._pos[key] = len(self._keys)
            self._keys.append(key)
        self.rows[key] = row

    def pop(self, key: int) -> dict:
        i, last = self._pos.pop(key), self._keys.pop()
        if last != key:
            self._keys[i], self._pos[last] = last, i
        return self.rows.pop(key)

    def choice(self, rng: random.Random) -> int:
        return self._keys[int(rng.random() * len(self._keys))]

    def __len__(self) -> int:
        return len(self._keys)


@dataclass
class Workload:
    events: dict[str, int]
    keys: dict[str, int]
    final: dict[str, dict[int, dict]] = field(default_factory=dict)
    ops: dict[str, Counter] = field(default_factory=dict)


def changes(w: Workload, seed: int = 4):
    """Yields (table, key, op, before, after) in log order; fills ``w.final`` and ``w.ops``."""
    rng = random.Random(seed)
    n_products, n_orders = w.keys["products"], w.keys["orders"]
    products, orders = _Live(), _Live()

    def product(i: int) -> dict:
        return {"id": i, "name": f"product {i}", "category": rng.choice(CATEGORIES),
                "price": rng.randrange(100, 100_000), "stock": rng.randrange(5000)}

    def order(i: int) -> dict:
        return {"order_id": i, "product_id": rng.randint(1, n_products), "qty": rng.randint(1, 10),
                "status": "open"}

    if w.events["products"] < n_products:
        raise SystemExit(f"--events ({w.events['products']}) must be at least --keys ({n_products}): "
                         "every product is inserted by the snapshot")
    for i in range(1, n_products + 1):
        products.put(i, product(i))
        yield "products", i, "r", None, products.rows[i]
    snapshot = min(n_orders // 2, w.events["orders"])
    for i in range(1, snapshot + 1):
        orders.put(i, order(i))
        yield "orders", i, "r", None, orders.rows[i]
    left = {"products": w.events["products"] - n_products, "orders": w.events["orders"] - snapshot}
    insert_share = (n_orders - snapshot) / max(left["orders"], 1)
    next_order = snapshot + 1
    while left["products"] or left["orders"]:
        table = "products" if rng.random() * (left["products"] + left["orders"]) < left["products"] else "orders"
        left[table] -= 1
        live, r = (products, orders)[table == "orders"], rng.random()
        if table == "orders" and r < insert_share and next_order <= n_orders or not live:
            if table == "products":          # only when every product was deleted
                raise SystemExit("all products were deleted; use fewer events per key")
            orders.put(next_order, order(next_order))
            yield table, next_order, "c", None, orders.rows[next_order]
            next_order += 1
        elif r > 0.9:
            k = live.choice(rng)
            yield table, k, "d", live.pop(k), None
        else:
            k = live.choice(rng)
            before = live.rows[k]
            if table == "products":
                after = dict(before, price=rng.randrange(100, 100_000))
                if rng.random() < 0.2:
                    after["category"] = rng.choice(CATEGORIES)
            else:
                after = dict(before, qty=rng.randint(1, 10), status="changed")
                if rng.random() < 0.1:
                    after["product_id"] = rng.randint(1, n_products)
            live.put(k, after)
            yield table, k, "u", before, after
    w.final = {"products": products.rows, "orders": orders.rows}


def write_and_produce(w: Workload, bootstrap: str, data: Path, *, topics: int, flink_files: int) -> float:
    """Generate the events into the broker and, when ``flink_files``, into that many Debezium JSON files per
    table (PyFlink's filesystem source); seconds."""
    from confluent_kafka import Producer

    start = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                         "batch.size": 4_000_000, "compression.type": "zstd",
                         "queue.buffering.max.messages": 1_000_000, "log_level": 3})
    w.ops = {"products": Counter(), "orders": Counter()}
    pos, ts = 154, 1_700_000_000_000
    with ExitStack() as stack:
        files = {}
        for table in ("products", "orders"):
            (data / table).mkdir(parents=True)
            files[table] = [stack.enter_context(open(data / table / f"part-{i}.json", "wb"))
                            for i in range(flink_files)]
        for table, key, op, before, after in changes(w):
            pos += 200
            ts += 1
            w.ops[table][op] += 1
            value = debezium_envelope(op, before, after, table=table, pos=pos, ts=ts,
                                      snapshot="true" if op == "r" else "false")
            if flink_files:
                files[table][key % flink_files].write(value + b"\n")
            topic = TOPIC.format(table=table, n=key % topics)
            while True:
                try:
                    producer.produce(topic, key=b'{"id":%d}' % key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
    if producer.flush(300):
        raise RuntimeError("the producer could not deliver every event to the broker")
    return time.perf_counter() - start


def check_retention(bootstrap: str, w: Workload, topics: int) -> None:
    """Every produced event is still in the broker (the mock keeps at most 5 MB per partition)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ops-check", "log_level": 3})
    try:
        for table, produced in w.events.items():
            low_total = high_total = 0
            for n in range(topics):
                topic = TOPIC.format(table=table, n=n)
                for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
                    low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    low_total += low
                    high_total += high
            if low_total or high_total != produced:
                raise SystemExit(f"{table}: the broker dropped events (low watermarks sum {low_total}, "
                                 f"{high_total:,} of {produced:,} kept); use more --topics")
    finally:
        c.close()


# -- the oracle ---------------------------------------------------------------------------------------
def generate_apart(w: Workload, bootstrap: str, data: Path, *, topics: int, flink_files: int
                   ) -> tuple[float, Workload, dict[str, int], dict[str, Result]]:
    """:func:`write_and_produce` and the DuckDB :func:`oracle` in a forked child: the generator's objects (~300 MB,
    which Python's allocator keeps after they are freed) never enter this process, whose memory is then the
    driver's alone. Returns the seconds, the workload's counts (its final state left in the child), each table's
    live rows and the oracle's results."""
    import multiprocessing

    def child(conn) -> None:
        secs = write_and_produce(w, bootstrap, data, topics=topics, flink_files=flink_files)
        live = {t: len(rows) for t, rows in w.final.items()}
        conn.send((secs, Workload(w.events, w.keys, ops=w.ops), live, oracle(w)))
        conn.close()

    ctx = multiprocessing.get_context("fork")
    parent, end = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=child, args=(end,))
    proc.start()
    end.close()
    try:
        out = parent.recv()
    except EOFError:
        proc.join()
        raise SystemExit(f"the data generator failed (exit code {proc.exitcode}); see its traceback above") from None
    proc.join()
    return out


def oracle(w: Workload) -> dict[str, Result]:
    """Both queries in DuckDB over the final state of the sources."""
    import duckdb

    con = duckdb.connect()
    for table, columns in (("products", PRODUCT_COLUMNS), ("orders", ORDER_COLUMNS)):
        rows = list(w.final[table].values())
        con.register(table, pa.table({c: [r[c] for r in rows] for c in columns}))
    sql = {"a": "SELECT category, COUNT(*), SUM(price) FROM products GROUP BY category",
           "b": "SELECT p.category, COUNT(*), SUM(p.price) FROM orders o JOIN products p ON o.product_id = p.id "
                "GROUP BY p.category"}
    return {q: {k: (int(c), int(s)) for k, c, s in con.sql(text).fetchall()} for q, text in sql.items()}


# -- PyFlink ------------------------------------------------------------------------------------------
@dataclass
class Timing:
    seconds: float            # start-up included
    startup: float            # Spark session / Flink TableEnvironment (gateway JVM)
    result: Result
    peak_mb: float = 0.0      # peak of the summed RSS (pages shared copy-on-write counted once per process)
    peak_pss_mb: float = 0.0  # peak of the summed PSS (shared pages split between their processes)
    note: str = ""
    extra: dict = field(default_factory=dict)


def flink_source(broker, data: Path, topics: int) -> list[str]:
    """The source arguments of bench/pyflink_ops_job.py: the broker's topics (real broker) or the files."""
    from changelake import jvm_deps

    if broker.kind != "real":
        return ["files", str(data)]
    spec = ",".join(f"{t}=" + ";".join(TOPIC.format(table=t, n=n) for n in range(topics))
                    for t in ("products", "orders"))
    return ["kafka", broker.bootstrap_servers, spec, ";".join(str(j) for j in jvm_deps.jars("flink-kafka"))]


def run_pyflink(python: str, source: list[str], query: str) -> Timing:
    timed = run_python_job(python, FLINK_JOB, [query, "blackhole", *source])
    startup = float(next(l.split()[1] for l in timed.stdout.splitlines() if l.startswith("STARTUP")))
    collected = run_python_job(python, FLINK_JOB, [query, "collect", *source])
    result = {}
    for line in collected.stdout.splitlines():
        if line.startswith("RESULT"):
            _, k, c, s = line.split()
            result[k] = (int(c), int(s))
    return Timing(timed.seconds, startup, result, timed.total_mb, timed.total_pss_mb)


# -- changelake ---------------------------------------------------------------------------------------
def changelake_config(query: str, *, bootstrap: str, work: Path, batch: int) -> dict:
    """The service YAML (as a dict) of query ``query``: sources, views, the result table."""
    sources = []
    for name in QUERIES[query]["sources"]:
        columns, key = (PRODUCT_COLUMNS, "id") if name == "products" else (ORDER_COLUMNS, "order_id")
        sources.append({"name": name, "topic_pattern": TOPIC.format(table=name, n="").replace(".", r"\.") + r"\d+",
                        "format": "debezium-json", "columns": columns, "primary_key": [key],
                        "normalize": False})
    if query == "a":
        views = [{"name": "by_category", "from": "products", "group_by": ["category"],
                  "aggregates": {"products": "count(*)", "total_price": "sum(price)"}}]
    else:
        views = [{"name": "enriched", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"},
                                               "how": "inner"}},
                 {"name": "by_category", "from": "enriched", "group_by": ["category"],
                  "aggregates": {"orders": "count(*)", "revenue": "sum(price)"}}]
    return {
        "pipeline": {"id": f"bench-ops-{query}", "checkpoint": str(work / f"checkpoint-{query}"),
                     "max_records_per_batch": batch, "read_tasks": 2},
        "kafka": {"bootstrap_servers": bootstrap},
        "sources": sources,
        "views": views,
        "tables": [{"name": QUERIES[query]["table"], "from": "by_category", "primary_key": ["category"]}],
        "storage": {"root": str(work / "lake")},
        "metrics": {"port": 0},
    }


def pipeline_of(query: str):
    """The same graph as :func:`changelake_config`, through the typed Python API."""
    from changelake.plan import Pipeline

    p = Pipeline()
    products = p.source("products", columns=PRODUCT_COLUMNS, primary_key=["id"], normalize=False)
    if query == "a":
        out = products.group_by("category").agg(name="by_category", products="count(*)", total_price="sum(price)")
    else:
        orders = p.source("orders", columns=ORDER_COLUMNS, primary_key=["order_id"], normalize=False)
        enriched = orders.join(products, on={"product_id": "id"}, how="inner", name="enriched")
        out = enriched.group_by("category").agg(name="by_category", orders="count(*)", revenue="sum(price)")
    out.to_table(QUERIES[query]["table"], primary_key=["category"])
    return p


def spark_executor_missing() -> str | None:
    """Why the product path cannot run on this tree, or None."""
    import importlib.util

    from changelake.service.config import ChangelakeConfig

    if importlib.util.find_spec("changelake.spark.compile") is None:
        return "changelake/spark/compile.py (the plan's Spark executor) is not on this tree"
    if "views" not in ChangelakeConfig.model_fields:
        return "the service config has no 'views' section yet"
    return None


def result_of(table: pa.Table, query: str) -> Result:
    count, total = QUERIES[query]["columns"]
    return {k: (int(c), int(s)) for k, c, s in zip(table["category"].to_pylist(), table[count].to_pylist(),
                                                   table[total].to_pylist())}


def run_changelake_spark(queries: list[str], *, bootstrap: str, work: Path, batch: int,
                         exclude_pids: tuple[int, ...]) -> dict[str, Timing]:
    import orjson

    from changelake.connectors.delta_read import read_delta
    from changelake.service.config import parse_config
    from changelake.service.runner import PipelineRunner
    from changelake.spark.session import build_session

    configs = {q: parse_config(orjson.dumps(changelake_config(q, bootstrap=bootstrap, work=work, batch=batch))
                               .decode()) for q in queries}
    first = configs[queries[0]].pipeline
    out = {}
    with PeakMemory(exclude=exclude_pids) as mem:
        t = time.perf_counter()
        (work / "eventlog").mkdir(exist_ok=True)
        conf = {**first.spark_conf, "spark.eventLog.enabled": "true", "spark.eventLog.dir": str(work / "eventlog"),
                "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
        spark = build_session(app_name="bench-operators", master=first.master, conf=conf, ui=False)
        startup = time.perf_counter() - t
        print(f"changelake: Spark session started in {startup:.1f}s", flush=True)
        peaks = {}
        for q in queries:
            mem.restart()         # each query's own peak (the session's start counts for the first one)
            t = time.perf_counter()
            with BatchClock() as clock:
                run = PipelineRunner(configs[q], serve_http=False, spark=spark).run(
                    available_now=True, install_signal_handlers=False)
            clock.check(run.progress)
            seconds = time.perf_counter() - t
            in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in run.progress) / 1000
            if run.totals.expired:
                raise SystemExit(f"changelake ({q}): {run.totals.expired} offsets had expired in the broker")
            result = result_of(read_delta(configs[q].table_path(QUERIES[q]["table"])), q)
            out[q] = Timing(seconds + startup, startup, result, extra={
                "records": run.totals.records, "query_id": run.progress[0]["id"] if run.progress else None,
                "outside_batches": seconds - in_batches, "setup": dict(clock.setup),
                "batches": [(p["batchId"], clock.records[i], p["durationMs"], *clock.batches[i])
                            for i, p in enumerate(run.progress)]})
            print(f"changelake ({q}): {run.totals.records:,} records in {seconds:.1f}s after the session start",
                  flush=True)
            peaks[q] = (mem.total_mb, mem.total_pss_mb, dict(mem.peak_mb), dict(mem.pss_mb))
        spark.stop()
    stages = spark_stages(work / "eventlog")
    for q, timing in out.items():
        timing.peak_mb, timing.peak_pss_mb, timing.extra["peak_mb"], timing.extra["pss_mb"] = peaks[q]
        timing.extra["stages"] = stages.get(timing.extra["query_id"], [])
    return out


def consume(bootstrap: str, tables: tuple[str, ...], topics: int) -> dict[str, list[pa.Table]]:
    """Every record of the tables' topics, per table, each partition read in order (RAW_SCHEMA)."""
    from confluent_kafka import Consumer, TopicPartition

    from changelake.changelog import RAW_SCHEMA

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ops-local", "enable.auto.commit": False,
                  "log_level": 3})
    out: dict[str, list[pa.Table]] = {}
    try:
        for table in tables:
            parts = []
            for n in range(topics):
                topic = TOPIC.format(table=table, n=n)
                for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
                    _, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                    c.assign([TopicPartition(topic, p, 0)])
                    got: list = []
                    while len(got) < high:
                        got.extend(m for m in c.consume(10_000, timeout=5) if m.error() is None)
                    parts.append(pa.table({
                        "topic": [topic] * len(got), "partition": [p] * len(got),
                        "offset": [m.offset() for m in got], "timestamp": [m.timestamp()[1] for m in got],
                        "key": [m.key() for m in got], "value": [m.value() for m in got]}, schema=RAW_SCHEMA))
            out[table] = parts
    finally:
        c.close()
    return out


def run_changelake_local(query: str, raw: dict[str, list[pa.Table]], batch: int) -> Timing:
    """The plan in-process (LocalRunner): decode and step micro-batches of ``batch`` records per source."""
    from changelake.changelog import KIND
    from changelake.formats import make_decoder
    from changelake.plan.local import LocalRunner
    from changelake.types import arrow_schema

    t = time.perf_counter()
    runner = LocalRunner(pipeline_of(query).plan())
    decoders = {s: make_decoder("debezium-json", columns=arrow_schema(PRODUCT_COLUMNS if s == "products"
                                                                         else ORDER_COLUMNS))
                for s in QUERIES[query]["sources"]}
    whole = {s: pa.concat_tables(raw[s]) for s in decoders}
    final: dict[str, tuple] = {}
    steps = max(-(-t.num_rows // batch) for t in whole.values())
    decode_s = operators_s = 0.0
    for i in range(steps):
        inputs = {}
        t_decode = time.perf_counter()
        for s, table in whole.items():
            decoded = decoders[s].decode(table.slice(i * batch, batch))
            if decoded.dead_letters.num_rows:
                raise SystemExit(f"{s}: {decoded.dead_letters.num_rows} events failed to decode: "
                                 f"{decoded.dead_letters['error'][0]}")
            inputs[s] = decoded.rows
        t_step = time.perf_counter()
        changes = runner.step(inputs)[QUERIES[query]["table"]]
        decode_s += t_step - t_decode
        operators_s += time.perf_counter() - t_step
        count, total = QUERIES[query]["columns"]
        for k, c, s, kind in zip(*(changes[col].to_pylist() for col in ("category", count, total, KIND))):
            if kind in (0, 2):
                final[k] = (c, s)
            elif kind == 3:
                final.pop(k, None)
    return Timing(time.perf_counter() - t, 0.0, final,
                  note=f"in-process LocalRunner, not a product figure: decode {decode_s:.1f}s, "
                       f"operators {operators_s:.1f}s, {steps} micro-batches")


# -- main ---------------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="product change events (snapshot included)")
    ap.add_argument("--keys", type=int, default=200_000, help="product keys")
    ap.add_argument("--order-events", type=int, help="order change events (default: --events)")
    ap.add_argument("--order-keys", type=int, help="order keys (default: 1.5 x --keys)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5,000 events over 1,000 keys per table; PyFlink only where installed")
    ap.add_argument("--changelake", choices=("auto", "spark", "local", "none"), default="auto")
    ap.add_argument("--queries", default="a,b")
    ap.add_argument("--skip-pyflink", action="store_true")
    ap.add_argument("--flink-python", default=DEFAULT_FLINK_PYTHON)
    ap.add_argument("--topics", type=int, default=4, help="topics per table (the mock broker keeps 5 MB/partition)")
    add_broker_option(ap)
    ap.add_argument("--batch", type=int, default=250_000, help="max records per micro-batch")
    ap.add_argument("--print-yaml", action="store_true", help="print the changelake YAML of each query")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.quick:
        args.events, args.keys = 5_000, 1_000
    args.skip_pyflink = skip_pyflink(args.flink_python, quick=args.quick, skipped=args.skip_pyflink)
    queries = [q for q in args.queries.split(",") if q]
    w = Workload(events={"products": args.events, "orders": args.order_events or args.events},
                 keys={"products": args.keys, "orders": args.order_keys or args.keys * 3 // 2})
    mode = args.changelake
    missing = spark_executor_missing() if mode in ("auto", "spark") else None
    if mode == "spark" and missing:
        raise SystemExit(f"--changelake spark: {missing}")
    if mode == "auto":
        mode = "local" if missing else "spark"

    work = Path(tempfile.mkdtemp(prefix="changelake-bench-ops-"))
    load0 = os.getloadavg()
    print(f"machine: {machine()}; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; work dir {work}")
    print("same plan on both systems: PyFlink table.exec.source.cdc-events-duplicate = false (default), "
          "changelake sources normalize: false; parallelism 2")
    figures: dict[tuple[str, str], Timing] = {}
    with open_broker(args.broker, quick=args.quick) as broker:
        if broker.kind == "real" and not args.skip_pyflink:
            args.skip_pyflink = skip_flink_kafka(quick=args.quick)
        flink_files = 2 if broker.kind != "real" and not args.skip_pyflink else 0
        secs, w, live, want = generate_apart(w, broker.bootstrap_servers, work / "data", topics=args.topics,
                                             flink_files=flink_files)
        check_retention(broker.bootstrap_servers, w, args.topics)
        for table in ("products", "orders"):
            ops = w.ops[table]
            changed = ops["c"] + ops["u"] + ops["d"]
            print(f"{table}: {sum(ops.values()):,} events: {ops['r']:,} snapshot inserts, then {changed:,} changes "
                  f"= {ops['c']:,} inserts ({ops['c'] / max(changed, 1):.0%}), {ops['u']:,} updates "
                  f"({ops['u'] / max(changed, 1):.0%}), {ops['d']:,} deletes ({ops['d'] / max(changed, 1):.0%}); "
                  f"{live[table]:,} live rows at the end")
        print(f"generated and produced in {secs:.1f}s (in a child process: this one, changelake's driver, holds none "
              f"of it); no offset expired in the broker", flush=True)
        if args.print_yaml:
            import yaml
            for q in queries:
                print(yaml.safe_dump(changelake_config(q, bootstrap="<broker>", work=Path("<work>"),
                                                       batch=args.batch), sort_keys=False))
        for q in queries:
            print(f"changelake plan {q}:\n{pipeline_of(q).explain()}")
        if not args.skip_pyflink:
            source = flink_source(broker, work / "data", args.topics)
            print(f"pyflink reads {'the same Kafka topics' if source[0] == 'kafka' else 'Debezium JSON files'}",
                  flush=True)
            for q in queries:
                figures[q, "pyflink"] = run_pyflink(args.flink_python, source, q)
                f = figures[q, "pyflink"]
                print(f"pyflink ({q}): {f.seconds:.1f}s ({f.startup:.1f}s TableEnvironment start)", flush=True)
        if mode == "spark":
            for q, timing in run_changelake_spark(queries, bootstrap=broker.bootstrap_servers, work=work,
                                                  batch=args.batch, exclude_pids=(broker.pid,)).items():
                figures[q, "changelake"] = timing
        elif mode == "local":
            why = missing or "--changelake local"
            print(f"changelake: {why}; running the plan in-process (LocalRunner), not a product figure", flush=True)
            raw = consume(broker.bootstrap_servers, ("products", "orders"), args.topics)
            for q in queries:
                figures[q, "changelake (in-process)"] = run_changelake_local(q, raw, args.batch)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return report(args, w, queries, figures, want, load0, broker)


def skip_flink_kafka(*, quick: bool) -> bool:
    """Whether PyFlink is left out of a real-broker run for want of the ``flink-kafka`` JVM set (a quick run
    says so and goes on; a full run stops)."""
    from changelake import jvm_deps

    why = jvm_deps.missing("flink-kafka")
    if why is None:
        return False
    if quick:
        print(f"pyflink: skipped in the quick run: {why}", flush=True)
        return True
    raise SystemExit(f"PyFlink cannot read the real broker: {why}; or pass --skip-pyflink or --broker embedded")


def report(args, w: Workload, queries: list[str], figures: dict, want: dict[str, Result], load0, broker) -> int:
    load1 = os.getloadavg()
    ok = True
    print(f"\nload average at start {load0[0]:.2f}, at end {load1[0]:.2f}")
    flink_reads = "the same Kafka topics" if broker.kind == "real" else "Debezium JSON files (Kafka left out)"
    print(f"broker: {broker.kind}, {broker.label}; changelake reads it, PyFlink reads {flink_reads}")
    print("\n| query | system | events | seconds (start-up incl.) | start-up s | events/s | "
          "events/s w/o start-up | peak RSS MB | peak PSS MB | = DuckDB |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for q in queries:
        events = sum(w.events[s] for s in QUERIES[q]["sources"])
        for (fq, system), f in figures.items():
            if fq != q:
                continue
            agree = f.result == want[q]
            # the peer's wrong result is reported below (and its ratio is then not a fair one), but only
            # changelake's fails the run: PyFlink 2.3 at parallelism 2 has given (b) results that differ from
            # DuckDB's in quick runs since it no longer runs at nice 19 (2026-11-28; cause not found yet)
            ok &= agree or system == "pyflink"
            mem = f"{f.peak_mb:,.0f}" if f.peak_mb else "-"
            pss = f"{f.peak_pss_mb:,.0f}" if f.peak_pss_mb else "-"
            print(f"| {q} | {system} | {events:,} | {f.seconds:.1f} | {f.startup:.1f} | {events / f.seconds:,.0f} | "
                  f"{events / (f.seconds - f.startup):,.0f} | {mem} | {pss} | {agree} |")
    print()
    for q in queries:
        flink = figures.get((q, "pyflink"))
        for (fq, system), f in figures.items():
            if fq != q or system == "pyflink":
                continue
            if flink:
                target = TARGETS[q]
                ratio, ratio_run = flink.seconds / f.seconds, (flink.seconds - flink.startup) / (f.seconds - f.startup)
                verdict = ("met" if ratio >= target else "NOT met") if system == "changelake" else \
                    "not applicable: in-process LocalRunner, not a product figure"
                print(f"{QUERIES[q]['label']}: {system} / pyflink = {ratio:.2f} with start-up "
                      f"({ratio_run:.2f} without); target >= {target}: {verdict}")
                print(f"  results agree with each other: {f.result == flink.result}")
            if f.note:
                print(f"  {system}: {f.note}")
            if f.extra.get("peak_mb"):
                print("  changelake peak RSS: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in f.extra["peak_mb"].items())
                      + f"; total {f.peak_mb:,.0f} MB")
                print("  changelake peak PSS: " + ", ".join(f"{k} {v:,.0f} MB" for k, v in f.extra["pss_mb"].items())
                      + f"; total {f.peak_pss_mb:,.0f} MB")
            if "outside_batches" in f.extra:
                print(f"  outside micro-batches (pipeline set-up, query start and stop): "
                      f"{f.extra['outside_batches']:.1f}s, of which "
                      + ", ".join(f"{k} {v:.1f}s" for k, v in f.extra["setup"].items()))
            for batch_id, rows, durations, action, driver in f.extra.get("batches", []):
                print(f"  batch {batch_id}: {rows:,} records; Spark action (read, decode, operators, collect) "
                      f"{action:.1f}s, driver (Delta) {driver:.1f}s; Spark durations (ms) {durations}")
            for i, st in enumerate(f.extra.get("stages", [])):
                print(f"  stage {i} {st['what']}: {st['batches']} batch(es), {st['tasks']} tasks, "
                      f"wall {st['wall_ms'] / 1000:.1f}s, task time {st['task_ms'] / 1000:.1f}s "
                      f"(Python code {st['python_ms'] / 1000:.1f}s)")
        if not any(fq == q for fq, _ in figures):
            print(f"{q}: nothing ran")
    for q in queries:
        print(f"DuckDB ({q}): {sorted(want[q].items())}")
        for (fq, system), f in figures.items():
            if fq == q and f.result != want[q]:
                peer = " (the peer: its ratio above is not a fair one)" if system == "pyflink" else ""
                print(f"  {system} ({q}) differs{peer}: " + ", ".join(
                    f"{k} {f.result.get(k)} (DuckDB {want[q].get(k)})" for k in sorted(set(f.result) | set(want[q]))
                    if f.result.get(k) != want[q].get(k)))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
