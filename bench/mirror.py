"""Mirror benchmark: 1,000,000 Debezium JSON events over 200,000 keys (~10% deletes)
through Kafka (``--broker real|embedded``, bench/common.py) -> changelake (Spark) -> Delta (delta-rs),
on embedded defaults.

    .venv/bin/python bench/mirror.py [--events 1000000] [--keys 200000] [--profile]
    .venv/bin/python bench/mirror.py --quick     # smoke run: 20,000 events, 4,000 keys, 2 micro-batches
    .venv/bin/python bench/mirror.py --engine delta-spark [--master 'local-cluster[2,1,1024]']

``--engine`` is ``storage.engine`` (delta-spark: the reduction and the MERGE on the executors, the ``delta``
JVM set on the session's classpath) and ``--master`` ``pipeline.master``.

Prints events/s end to end (from query start, Spark start-up included, and from the first
batch on), peak RSS of the driver, the Spark JVM and the Python workers, and the Delta
table's size and file count; checks the table against the generator's final state and
that no offset expired in the broker. The mock broker keeps at most 5 MB per partition,
so the events are spread over several topics of the same table (``--topics``).
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import os
import pstats
import random
import re
import shutil
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeakMemory, add_broker_option, dir_size, kafka_records, machine, open_broker  # noqa: E402
from gen import debezium_envelope  # noqa: E402

from changelake.connectors.delta_read import read_delta  # noqa: E402
from changelake.service.config import parse_config  # noqa: E402
from changelake.service.runner import PipelineRunner  # noqa: E402

CATEGORIES = ["tools", "garden", "kitchen", "toys", "sports", "office", "auto", "outdoor", "books", "music"]
COLUMNS = {"id": "bigint", "name": "string", "description": "string", "category": "string",
           "weight": "double", "price": "double", "stock": "int", "active": "boolean"}


def generate(events: int, keys: int, seed: int = 42):
    """Snapshot of ``keys`` rows, then updates (~78%), deletes (~10% of all) and re-inserts."""
    rng = random.Random(seed)
    live: dict[int, dict] = {}
    pos = 154
    ts = 1_700_000_000_000

    def row(i: int) -> dict:
        return {"id": i, "name": f"product {i}", "description": f"a fine product number {i} of its kind",
                "category": rng.choice(CATEGORIES), "weight": round(rng.uniform(0.1, 50), 3),
                "price": round(rng.uniform(1, 999), 2), "stock": rng.randint(0, 5000), "active": rng.random() < 0.9}

    def envelope(op, before, after):
        nonlocal pos, ts
        pos += 200
        ts += 1
        return debezium_envelope(op, before, after, table="products", pos=pos, ts=ts)

    deleted: list[int] = []
    for i in range(1, keys + 1):
        live[i] = row(i)
        yield i, envelope("r", None, live[i])
    for _ in range(events - keys):
        r = rng.random()
        if r < 0.125 and live:                       # 12.5% of the changes: ~10% of all events
            k = rng.choice(list(live)) if len(live) < 1000 else rng.randint(1, keys)
            if k not in live:
                k = next(iter(live))
            before = live.pop(k)
            deleted.append(k)
            yield k, envelope("d", before, None)
        elif r < 0.16 and deleted:                   # a deleted key comes back
            k = deleted.pop(rng.randrange(len(deleted)))
            live[k] = row(k)
            yield k, envelope("c", None, live[k])
        else:
            k = rng.randint(1, keys)
            if k not in live:
                k = next(iter(live))
            before = live[k]
            after = dict(before, price=round(rng.uniform(1, 999), 2), stock=rng.randint(0, 5000))
            live[k] = after
            yield k, envelope("u", before, after)
    generate.final_state = live  # type: ignore[attr-defined]


class _DriverBytes(logging.Handler):
    """The bytes each batch collected on the driver, from the query's ``batch N: B bytes collected`` log line."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sizes: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.match(r"batch \d+: (\d+) bytes collected on the driver", record.getMessage())
        if m:
            self.sizes.append(int(m.group(1)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--topics", type=int, default=4)
    ap.add_argument("--batch", type=int, default=250_000, help="max records per micro-batch")
    ap.add_argument("--workdir", default="bench/out/mirror")
    ap.add_argument("--profile", action="store_true", help="cProfile the driver; print the top functions")
    ap.add_argument("--reduce-on", choices=["auto", "driver", "executors"], default="auto",
                    help="storage.reduce_on: where each batch is reduced per key (docs/sink.md)")
    ap.add_argument("--engine", choices=["auto", "delta-rs", "delta-spark"], default="auto",
                    help="storage.engine (auto: delta-rs on a local master)")
    ap.add_argument("--master", default=None, help="pipeline.master (default: the session builder's, local[2])")
    ap.add_argument("--jobs", action="store_true",
                    help="list each batch's Spark jobs (call site, wall time, stages, tasks) from Spark's event log")
    add_broker_option(ap)
    ap.add_argument("--quick", action="store_true", help="smoke run: 20,000 events over 4,000 keys, batches of 10,000")
    args = ap.parse_args()
    if args.quick:
        args.events, args.keys, args.batch = 20_000, 4_000, 10_000
    work = Path(args.workdir).absolute()
    shutil.rmtree(work, ignore_errors=True)
    eventlog = work / "eventlog"
    if args.jobs:
        eventlog.mkdir(parents=True)
    print(f"machine: {machine()}")
    from confluent_kafka import Producer

    with open_broker(args.broker, quick=args.quick) as broker:
        t0 = time.monotonic()
        producer = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 50,
                             "batch.num.messages": 10_000, "batch.size": 4_000_000, "compression.type": "zstd",
                             "queue.buffering.max.messages": 1_000_000, "log_level": 3})
        n = 0
        for key, value in generate(args.events, args.keys):
            topic = f"bench.shop.products.{key % args.topics}"
            kb = b'{"id":%d}' % key
            while True:
                try:
                    producer.produce(topic, key=kb, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
            n += 1
        producer.flush(120)
        final = generate.final_state  # type: ignore[attr-defined]
        print(f"produced {n:,} events ({len(final):,} live keys at the end) in {time.monotonic() - t0:.1f}s")
        raw = {
            "pipeline": {"id": "bench-mirror", "checkpoint": str(work / "checkpoint"),
                         "max_records_per_batch": args.batch, "read_tasks": 2,
                         **({"master": args.master} if args.master else {}),
                         **({"spark_conf": {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(eventlog),
                                            "spark.eventLog.compress": "false"}} if args.jobs else {})},
            "kafka": {"bootstrap_servers": broker.bootstrap_servers},
            "sources": [{"name": "products", "topic_pattern": r"bench\.shop\.products\.\d+",
                         "format": "debezium-json", "columns": COLUMNS, "table": "products"}],
            "tables": [{"name": "products", "primary_key": ["id"]}],
            "storage": {"root": str(work / "lake"), "reduce_on": args.reduce_on, "engine": args.engine},
            "metrics": {"port": 0},
        }
        config = parse_config(orjson.dumps(raw).decode())
        runner = PipelineRunner(config)
        profiler = cProfile.Profile() if args.profile else None
        first_batch_done: list[float] = []
        from changelake.service import pipeline as pl
        original = pl.BatchProcessor.process_decoded   # the driver part of each micro-batch

        def timed(self, *args, **kwargs):
            out = original(self, *args, **kwargs)
            first_batch_done.append(time.monotonic())
            print(f"  batch {out.batch_id}: {out.records:,} records, applied in {out.seconds:.2f}s",
                  flush=True)
            return out
        pl.BatchProcessor.process_decoded = timed
        collected = _DriverBytes()
        logging.getLogger("changelake.spark.query").addHandler(collected)
        logging.getLogger("changelake.spark.query").setLevel(logging.INFO)
        with PeakMemory(exclude=(broker.pid,)) as mem:   # the broker is not the system measured
            start = time.monotonic()
            if profiler:
                profiler.enable()
            result = runner.run(available_now=True, install_signal_handlers=False)
            if profiler:
                profiler.disable()
            elapsed = time.monotonic() - start
    records = result.totals.records
    print(f"\nevents: {records:,} in {elapsed:.1f}s -> {records / elapsed:,.0f} events/s end to end "
          f"(Spark session and query start-up included)")
    if len(first_batch_done) > 1:
        steady = first_batch_done[-1] - first_batch_done[0]
        print(f"batches: {len(first_batch_done)}; after the first batch: "
              f"{(records - args.batch) / steady:,.0f} events/s" if steady > 0 else "")
    for p in result.progress:
        print(f"  spark batch {p['batchId']}: {kafka_records(p) or '?'} records, durations (ms) {p['durationMs']}")
    print(f"storage.engine {args.engine}, master {args.master or 'local[2] (default)'}: driver bytes collected per "
          f"batch {collected.sizes} (max {max(collected.sizes, default=0):,}; "
          f"{sum(collected.sizes) / max(records, 1):,.1f} per record)")
    print(f"expired offsets (must be 0): {result.totals.expired}")
    for k, v in mem.peak_mb.items():
        print(f"peak RSS {k}: {v:,.0f} MB")
    size, files = dir_size(work / "lake" / "products")
    print(f"delta table: {size / 2**20:,.1f} MB in {files} parquet files")
    table = read_delta(config.table_path("products"), columns=["id", "price", "stock"])
    got = {r["id"]: (r["price"], r["stock"]) for r in table.to_pylist()}
    want = {k: (v["price"], v["stock"]) for k, v in final.items()}
    verdict = "ok" if got == want else f"MISMATCH ({len(got)} rows vs {len(want)} expected)"
    print(f"verification against the generator's final state: {verdict}")
    if args.jobs:
        from spark_timing import print_batch_jobs
        print_batch_jobs(eventlog)
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(int(os.environ.get("PROFILE_LINES", "25")))
    return 0 if verdict == "ok" and result.totals.expired == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
