"""Decode-only throughput per core: Debezium JSON, Debezium Avro, Canal JSON.

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", choices=["debezium-json", "debezium-avro", "canal-json"], action="append")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5,000 events in batches of 1,000, once")
    args = ap.parse_args()
    if args.quick:
        args.events, args.batch, args.repeat = 5_000, 1_000, 1
    only = set(args.only or ["debezium-json", "debezium-avro", "canal-json"])
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
    print(f"load average {os.getloadavg()[0]:.2f} at end", flush=True)


if __name__ == "__main__":
    main()
