"""Decode-only throughput per core: Debezium JSON, Debezium Avro, Canal JSON, and a read task of bench/operators.py.

    python bench/decode.py [--events 200000] [--batch 50000] [--repeat 3]
    python bench/decode.py --quick      # smoke run: 5,000 events in batches of 1,000, once

Messages are generated (bench/gen.py: 20 columns of mixed types, ~10% inserts,
~85% updates with full before-images, ~5% deletes; Canal messages carry 1-4 rows)
and decoded in batches of ``--batch`` records, as the Kafka source hands them
over. Rates are per CPU-second of this process (``time.process_time``), i.e. per
core, so other load on the machine inflates them less than wall time would;
wall time is printed too. The best of ``--repeat`` runs is reported. Each run must decode
every message (no dead letters) into the number of changelog rows the generator made (one per
insert or delete, two per update: ``-U`` and ``+U``).

``read-task``: what a Kafka read task of ``bench/operators.py``'s query (a) runs over its records, in this
process without Spark or Kafka: the pipeline's decode stage (Debezium JSON, ``_seq``, the epoch rule, the key
check) and the routing of the rows into the operator graph's envelopes (the two-phase aggregate's local fold),
built from the bench's own YAML; its changes after the snapshot (~90 % updates), 428 bytes each. Reported
per event and per core; it must give at least a changelog row per change.

    python bench/decode.py --only read-task [--events 200000]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import gen  # noqa: E402
from changelake.formats import make_decoder  # noqa: E402
from changelake.formats.debezium_avro import DebeziumAvroDecoder  # noqa: E402


def changelog_rows(n: int) -> int:
    """Changelog rows of ``gen.changes(n)``: an update is a -U and a +U."""
    return sum(2 if op == "u" else 1 for op, *_ in gen.changes(n))


def run(name: str, decoder, table, batch: int, repeat: int, unit: str, want_rows: int) -> dict:
    decoder.decode(table.slice(0, min(batch, 1000)))  # warm-up: schema fetch, column inference
    best = None
    for _ in range(repeat):
        cpu, wall, events, rows, dead = time.process_time(), time.perf_counter(), 0, 0, 0
        for start in range(0, table.num_rows, batch):
            result = decoder.decode(table.slice(start, batch))
            rows += result.rows.num_rows
            dead += result.dead_letters.num_rows
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        events = table.num_rows
        if best is None or cpu < best["cpu"]:
            best = {"cpu": cpu, "wall": wall, "events": events, "rows": rows, "dead": dead}
    per = best["rows"] if unit == "rows" else best["events"]
    print(f"{name:<16} {best['events']:>9,} msgs {best['rows']:>9,} rows  {per / best['cpu']:>10,.0f} {unit}/s per core "
          f"(cpu {best['cpu']:.2f}s, wall {best['wall']:.2f}s, dead letters {best['dead']})", flush=True)
    if best["dead"] or best["rows"] != want_rows:
        raise SystemExit(f"{name}: {best['dead']} dead letters, {best['rows']:,} rows; expected none and "
                         f"{want_rows:,} rows")
    return best


def reference(messages: list[bytes], repeat: int) -> None:
    """How fast this machine is right now: orjson.loads alone over the same messages (no columns,
    no changelog). The decoder cannot beat it by much; compare runs by the ratio."""
    import gc

    import orjson
    best = None
    for _ in range(repeat):
        gc.disable()
        cpu = time.process_time()
        for m in messages:
            orjson.loads(m)
        cpu = time.process_time() - cpu
        gc.enable()
        best = cpu if best is None else min(best, cpu)
    print(f"{'orjson.loads only':<16} {len(messages):>9,} msgs {'':>14}  {len(messages) / best:>10,.0f} msgs/s per core "
          f"(reference: parsing alone, same messages)", flush=True)


def read_task(events: int, batch: int, repeat: int) -> None:
    """bench/operators.py (a)'s read task over ``events`` products changes (module doc)."""
    import tempfile

    import pyarrow as pa
    import yaml

    from bench import operators as ops
    from changelake.service.config import parse_config
    from changelake.service.pipeline import BatchProcessor
    from changelake.spark.kafka_source import ARROW_SCHEMA
    from changelake.spark.query import PipelineQuery

    keys = max(events // 4, 10)
    w = ops.Workload(events={"products": events + keys, "orders": 20}, keys={"products": keys, "orders": 10})
    values, message_keys, pos = [], [], 154
    for table, key, op, before, after in ops.changes(w):
        pos += 200
        if table == "products" and op != "r":
            values.append(gen.debezium_envelope(op, before, after, table=table, pos=pos, ts=1_700_000_000_000 + pos,
                                                snapshot="false"))
            message_keys.append(b'{"id":%d}' % key)
    n = len(values)
    with tempfile.TemporaryDirectory() as work:
        config = parse_config(yaml.safe_dump(ops.changelake_config("a", bootstrap="localhost:9", work=Path(work),
                                                                   batch=batch)))
        processor = BatchProcessor(config)
        stage = PipelineQuery(processor, read_tasks=2).source_stage()
        batches = [pa.RecordBatch.from_arrays([
            pa.repeat(pa.scalar("bench.ops.products.0"), m), pa.repeat(pa.scalar(0, pa.int32()), m),
            pa.array(range(s, s + m), pa.int64()), pa.repeat(pa.scalar(1_700_000_000_000), m),
            pa.array(message_keys[s:s + m], pa.binary()), pa.array(values[s:s + m], pa.binary()),
            pa.repeat(pa.scalar(0), m)], schema=ARROW_SCHEMA)
            for s in range(0, n, 10_000) for m in [min(10_000, n - s)]]
        # every change must come out as changelog rows of the graph's source (the decode stage alone, once)
        stage.begin({})
        decoded = sum(p.num_rows for chunk in processor.stage.chunks(iter(batches), tables=frozenset({0}))
                      for r, part, p in chunk if part == "rows")
        want = sum(2 if v.find(b'"op":"u"') >= 0 else 1 for v in values)
        if decoded < want:
            raise SystemExit(f"read-task: {decoded:,} changelog rows from {n:,} changes; expected at least {want:,}")
        best = None
        for _ in range(repeat):
            stage.begin({})
            cpu, wall = time.process_time(), time.perf_counter()
            envelopes = sum(b.num_rows for b in stage(iter(batches)))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if best is None or cpu < best[0]:
                best = (cpu, wall)
        cpu, wall = best
        print(f"{'read-task (a)':<16} {n:>9,} msgs {decoded:>9,} rows  {n / cpu:>10,.0f} events/s per core "
              f"({cpu / n * 1e6:.2f} µs per event; cpu {cpu:.2f}s, wall {wall:.2f}s, {envelopes} envelopes)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["debezium-json", "debezium-avro", "canal-json", "read-task"], action="append")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5,000 events in batches of 1,000, once")
    args = ap.parse_args()
    if args.quick:
        args.events, args.batch, args.repeat = 5_000, 1_000, 1
    only = set(args.only or ["debezium-json", "debezium-avro", "canal-json", "read-task"])
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f} at start", flush=True)
    if "debezium-json" in only:
        messages = gen.debezium_json(args.events)
        reference(messages, args.repeat)
        table = gen.records(messages)
        run("debezium-json", make_decoder("debezium-json", columns=gen.SCHEMA), table, args.batch, args.repeat,
            "events", changelog_rows(args.events))
    if "debezium-avro" in only:
        table = gen.records(gen.debezium_avro(args.events))
        schema = gen.avro_envelope_schema()
        decoder = DebeziumAvroDecoder(columns=gen.SCHEMA, schema_lookup=lambda _id: schema)
        run("debezium-avro", decoder, table, args.batch, args.repeat, "events", changelog_rows(args.events))
    if "canal-json" in only:
        messages, rows = gen.canal_json(args.events // 2)
        table = gen.records(messages)
        run("canal-json", make_decoder("canal-json", columns=gen.SCHEMA), table, args.batch, args.repeat, "rows",
            rows)
    if "read-task" in only:
        read_task(args.events, args.batch, args.repeat)
    print(f"load average {os.getloadavg()[0]:.2f} at end", flush=True)


if __name__ == "__main__":
    main()
