"""The Kafka source's read path in one process, per core: ``read_ranges`` alone and with the decode stage.

    python bench/kafka_read.py [--events 1000000] [--keys 200000] [--repeat 3] [--profile 25]
    python bench/kafka_read.py --quick      # smoke run: 20,000 events, once
    python bench/kafka_read.py --broker real|embedded   # the broker (bench/common.py; default real where installed)

The events of ``bench/operators.py`` query (a) (Debezium JSON ``products``, the same generator and the same
producer settings: zstd, ``linger.ms`` 50, batches of up to 10,000 messages, 4 topics of 4 partitions) are
produced to the broker (``--broker``; a child process, so its CPU is not counted here). Then, in this process:

* **read**: every partition's whole range through :func:`changelake.spark.kafka_source.read_ranges`, all
  with one consumer, as a read task does;
* **read + decode**: the same through the decode stage of query (a)'s pipeline
  (:class:`changelake.spark.decode_stage.DecodeStage`, built by the service's ``BatchProcessor``), as a
  Spark read task runs it.

Rates are per CPU-second of this process (``time.process_time``: librdkafka's fetch threads included), so
they are per core; wall time is printed too. The best of ``--repeat`` runs. Each run must read every
produced event exactly once, in offset order per partition, and decode each into changelog rows.
``--profile N`` prints the top N functions of one extra run of each under cProfile.

``--reader python|spark-kafka|both`` measures the readers of ``kafka.reader`` instead, as the pipeline runs
them: a Spark streaming query (``local[2]``, one session for both, ``--available-now`` in batches of
``--batch`` records) of the ``changelake.spark.query`` wiring, Kafka source -> decode stage in the read
tasks -> each batch's payloads collected on the driver and counted (no Delta commit: only the readers
differ). Each query must read every produced event exactly once. Reported per reader: records/s over the
batches (wall), the per-batch time (median and max of Spark's ``triggerExecution``), start-up (from
``start()`` to the first batch's payloads on the driver, with the first batch), and the peak memory of
the process tree. ``--repeat`` rounds alternate the order (python first, then spark-kafka first, ...);
the ratio line compares the best of each (the machine is shared: compare within one run).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import add_broker_option, machine, open_broker  # noqa: E402
from bench.operators import TOPIC, Workload, changelake_config, changes  # noqa: E402
from bench.gen import debezium_envelope  # noqa: E402

TOPICS = 4


def produce(bootstrap: str, events: int, keys: int) -> int:
    """bench/operators.py's products events, as it produces them; the number produced."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                         "batch.size": 4_000_000, "compression.type": "zstd",
                         "queue.buffering.max.messages": 1_000_000, "log_level": 3})
    w = Workload(events={"products": events, "orders": 0}, keys={"products": keys, "orders": 0})
    pos, ts, n = 154, 1_700_000_000_000, 0
    for table, key, op, before, after in changes(w):
        pos += 200
        ts += 1
        value = debezium_envelope(op, before, after, table=table, pos=pos, ts=ts,
                                  snapshot="true" if op == "r" else "false")
        while True:
            try:
                producer.produce(TOPIC.format(table=table, n=key % TOPICS), key=b'{"id":%d}' % key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
    if producer.flush(300):
        raise SystemExit("the producer could not deliver every event to the broker")
    return n


def ranges(bootstrap: str):
    from changelake.spark.kafka_source import KafkaOptions, KafkaRange, KafkaStreamReader

    opts = KafkaOptions.parse({"bootstrap.servers": bootstrap, "topicPattern": r"bench\.ops\.products\.\d+"})
    reader = KafkaStreamReader(opts)
    marks = reader._watermarks(reader._partitions())
    reader.stop()
    if any(low for low, _ in marks.values()):
        raise SystemExit("the broker expired offsets; produce fewer events")
    return opts, [KafkaRange(t, p, 0, high) for (t, p), (_, high) in sorted(marks.items()) if high]


def read_only(opts, rngs) -> tuple[int, int]:
    """(records, checksum of offsets): every range read whole, each partition's records gapless and in order."""
    from changelake.spark.kafka_source import read_ranges

    n = 0
    expect = {(r.topic, r.partition): r.start for r in rngs}
    for batch in read_ranges(opts, rngs):
        key = (batch.column("topic")[0].as_py(), batch.column("partition")[0].as_py())
        offsets = batch.column("offset").to_numpy()
        if len(offsets) and (offsets[0] != expect[key] or offsets[-1] != expect[key] + len(offsets) - 1):
            raise SystemExit(f"{key[0]}[{key[1]}]: offsets {offsets[0]}..{offsets[-1]}, expected from {expect[key]}, "
                             "gapless")
        expect[key] += len(offsets)
        n += len(offsets)
    for rng in rngs:
        if expect[(rng.topic, rng.partition)] != rng.end:
            raise SystemExit(f"{rng.topic}[{rng.partition}]: read up to {expect[(rng.topic, rng.partition)]}, the "
                             f"range ends at {rng.end}")
    return n, 0


def read_decode(opts, rngs, stage) -> tuple[int, int]:
    """(records read, changelog rows): every range through the decode stage, as a read task runs it."""
    from changelake.spark.kafka_source import read_ranges
    from changelake.spark.payloads import from_ipc

    def batches():
        return read_ranges(opts, rngs)

    read = rows = 0
    for out in stage(batches()):
        for part, payload in zip(out.column("part").to_pylist(), out.column("payload").to_pylist()):
            table = from_ipc(payload)
            if part == "stats":
                read += sum(table.column("records").to_pylist())
            elif part == "rows":
                rows += table.num_rows
            elif part == "dl":
                raise SystemExit(f"{table.num_rows} dead letters: {table.column('error').to_pylist()[:3]}")
    return read, rows


def timed(fn, repeat: int):
    best = None
    for _ in range(repeat):
        cpu, wall = time.process_time(), time.perf_counter()
        result = fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if best is None or cpu < best[0]:
            best = (cpu, wall, result)
    return best


def profile(fn, top: int) -> None:
    prof = cProfile.Profile()
    prof.runcall(fn)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


class _Counted:
    """The processor of a streaming query that only collects and counts the decode stage's payloads."""

    plan = None

    def __init__(self, stage) -> None:
        self.stage = stage
        self.routes = stage.routes
        self.records = self.rows = 0
        self.first_at: float | None = None

    def process_decoded(self, out, batch_id, **_):
        stats, parts = self.stage.split(out)
        self.records += sum(r for r, _, _ in stats.values())
        self.rows += sum(got["rows"].num_rows for got in parts.values() if "rows" in got)
        dead = sum(got["dl"].num_rows for got in parts.values() if "dl" in got)
        if dead:
            raise SystemExit(f"batch {batch_id}: {dead} dead letters")
        if self.first_at is None:
            self.first_at = time.perf_counter()


def spark_reader_run(spark, reader: str, config, work: Path, n: int) -> dict:
    """One available-now query of ``reader`` over every produced event; its figures."""
    import statistics

    from bench.common import PeakMemory
    from changelake.service.pipeline import BatchProcessor
    from changelake.service.query_start import kafka_reader_options
    from changelake.spark.query import PipelineQuery, start

    counted = _Counted(BatchProcessor(config).stage)
    options = kafka_reader_options(config)
    spark_kafka = None
    if reader == "spark-kafka":
        from changelake.spark.spark_kafka import source_options

        spark_kafka = source_options(options, config.kafka.plain_properties(), {})
    checkpoint = str(work / f"ckpt-{reader}-{time.monotonic_ns()}")
    with PeakMemory() as memory:
        t0 = time.perf_counter()
        query = start(spark, PipelineQuery(counted, read_tasks=config.pipeline.read_tasks), name=f"bench-{reader}",
                      checkpoint=checkpoint, reader_options=options, available_now=True, trigger_seconds=1,
                      spark_kafka_options=spark_kafka)
        query.awaitTermination()
        wall = time.perf_counter() - t0
    if counted.records != n or counted.rows < n:
        raise SystemExit(f"{reader}: read {counted.records:,} records ({counted.rows:,} rows), produced {n:,}")
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    per_batch = [p["durationMs"]["triggerExecution"] / 1000 for p in batches]
    later = per_batch[1:] or per_batch
    return {"reader": reader, "records": counted.records, "wall": wall, "batches": len(batches),
            "rate": counted.records / wall, "startup": counted.first_at - t0,
            "batch_median": statistics.median(later), "batch_max": max(later), "memory_mb": memory.total_mb}


def spark_readers(args, broker, work: Path, produced: int) -> None:
    from changelake import jvm_deps
    from changelake.service.config import parse_config
    from changelake.spark.session import build_session

    readers = ["python", "spark-kafka"] if args.reader == "both" else [args.reader]
    if "spark-kafka" in readers and jvm_deps.missing("spark-kafka"):
        raise SystemExit(jvm_deps.missing("spark-kafka"))
    config = parse_config(orjson.dumps(changelake_config("a", bootstrap=broker.bootstrap_servers, work=work,
                                                         batch=args.batch)).decode())
    spark = build_session(app_name="bench-kafka-read", master="local[2]", ui=False,
                          jar_sets=("spark-kafka",) if "spark-kafka" in readers else ())
    best: dict[str, dict] = {}
    for round_ in range(args.repeat):
        for reader in readers if round_ % 2 == 0 else readers[::-1]:
            r = spark_reader_run(spark, reader, config, work, produced)
            print(f"round {round_ + 1} {reader:<12} {r['records']:>9,} records in {r['batches']} batches: "
                  f"{r['rate']:>9,.0f} records/s (wall {r['wall']:.1f}s), per batch median {r['batch_median']:.2f}s "
                  f"max {r['batch_max']:.2f}s, start-up to first batch {r['startup']:.1f}s, "
                  f"peak memory {r['memory_mb']:,.0f} MB", flush=True)
            if reader not in best or r["rate"] > best[reader]["rate"]:
                best[reader] = r
    if len(best) == 2:
        py, sk = best["python"], best["spark-kafka"]
        print(f"spark-kafka / python (best of {args.repeat}): throughput {sk['rate'] / py['rate']:.2f}, per-batch "
              f"median {sk['batch_median'] / py['batch_median']:.2f}, start-up {sk['startup'] / py['startup']:.2f}, "
              f"peak memory {sk['memory_mb'] / py['memory_mb']:.2f}", flush=True)
    spark.stop()
    print("kafka read run ok", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N functions under cProfile")
    add_broker_option(ap)
    ap.add_argument("--quick", action="store_true", help="smoke run: 20,000 events over 4,000 keys, once")
    ap.add_argument("--reader", choices=("python", "spark-kafka", "both"), default=None,
                    help="measure kafka.reader's readers in Spark streaming queries instead (module docstring)")
    ap.add_argument("--batch", type=int, default=100_000, help="--reader: records per micro-batch at most")
    args = ap.parse_args()
    if args.quick:
        args.events, args.keys, args.repeat = 20_000, 4_000, 1

    from changelake.service.config import parse_config
    from changelake.service.pipeline import BatchProcessor

    print(machine(), flush=True)
    with open_broker(args.broker, quick=args.quick) as broker, tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        produced = produce(broker.bootstrap_servers, args.events, args.keys)
        print(f"produced {produced:,} events in {time.perf_counter() - start:.1f}s", flush=True)
        if args.reader:
            spark_readers(args, broker, Path(work), produced)
            return
        opts, rngs = ranges(broker.bootstrap_servers)
        config = parse_config(orjson.dumps(changelake_config("a", bootstrap=broker.bootstrap_servers,
                                                             work=Path(work), batch=250_000)).decode())
        stage = BatchProcessor(config).stage
        read_only(opts, rngs[:1])                            # warm-up: imports, first connection
        cpu, wall, (n, _) = timed(lambda: read_only(opts, rngs), args.repeat)
        if n != produced:
            raise SystemExit(f"read {n:,} records, produced {produced:,}")
        print(f"read           {n:>9,} records {n / cpu:>10,.0f} records/s per core "
              f"({cpu / n * 1e6:.2f} us each; cpu {cpu:.2f}s, wall {wall:.2f}s)", flush=True)
        cpu2, wall2, (n2, rows) = timed(lambda: read_decode(opts, rngs, stage), args.repeat)
        if n2 != produced or rows < produced:
            raise SystemExit(f"read + decode: {n2:,} records, {rows:,} changelog rows; produced {produced:,}")
        print(f"read + decode  {n2:>9,} records {n2 / cpu2:>10,.0f} records/s per core "
              f"({cpu2 / n2 * 1e6:.2f} us each; cpu {cpu2:.2f}s, wall {wall2:.2f}s; {rows:,} changelog rows)",
              flush=True)
        if args.profile:
            profile(lambda: read_only(opts, rngs), args.profile)
            profile(lambda: read_decode(opts, rngs, stage), args.profile)
        print("kafka read run ok", flush=True)


if __name__ == "__main__":
    main()
