"""Fixed cost per micro-batch: the demo's pipeline (three mirrored tables, orders JOIN products, sales
per category, top 3 categories) run in small micro-batches, each batch's wall time from Spark's
progress reports.

    .venv/bin/python bench/batch_latency.py [--batch 1000] [--changes 20000] [--broker real|embedded] [--quick]

Prints the median, p90 and max of the batch durations (``durationMs.triggerExecution``: read, decode,
operators, collect, Delta commits) with the records per batch, first batch (Spark warm-up) left out,
and where the time goes in the median batch (``durationMs``' parts); then checks every table
against the simulated database (the demo's own verification). Target (issue 12): a micro-batch of at
most 1,000 changes through this graph in at most 2 s median on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import add_broker_option, kafka_records, machine, open_broker  # noqa: E402

from changelake.service.config import parse_config  # noqa: E402
from changelake.service.demo import demo_config, expected_views, verify, verify_views  # noqa: E402
from changelake.service.inventory import InventoryDatabase, produce  # noqa: E402
from changelake.service.runner import PipelineRunner  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--batch", type=int, default=1000, help="max records per micro-batch")
    ap.add_argument("--changes", type=int, default=20_000, help="changes after the snapshot")
    ap.add_argument("--views", action=argparse.BooleanOptionalAction, default=True,
                    help="run the operator graph (--no-views: the three mirrors alone)")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the pipeline (pipeline.spark_conf), e.g. spark.sql.shuffle.partitions=2")
    add_broker_option(ap)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1,500 changes after a snapshot of 600 rows, three micro-batches at the default --batch")
    args = ap.parse_args(argv)
    changes = 1_500 if args.quick else args.changes
    sizes = {"customers": 100, "products": 200, "orders": 300} if args.quick else \
        {"customers": 1_000, "products": 2_000, "orders": 3_000}
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as tmp, open_broker(args.broker, quick=args.quick) as broker:
        work = Path(tmp)
        db = InventoryDatabase(seed=11)
        n = produce(db.history(snapshot_sizes=sizes, changes=changes, redeliver=100), broker.bootstrap_servers)
        raw = demo_config(bootstrap_servers=broker.bootstrap_servers, workdir=work, metrics_port=0,
                          max_records_per_batch=args.batch, views=args.views)
        raw["pipeline"]["spark_conf"] = dict(c.split("=", 1) for c in args.conf)
        config = parse_config(yaml.safe_dump(raw), origin="batch_latency")
        t0 = time.monotonic()
        result = PipelineRunner(config, serve_http=False).run(available_now=True, install_signal_handlers=False)
        elapsed = time.monotonic() - t0
        batches = [p for p in result.progress if p.get("numInputRows")]
        timed = batches[1:] or batches
        secs = sorted(p["durationMs"]["triggerExecution"] / 1000 for p in timed)
        rows = [kafka_records(p) or 0 for p in timed]
        median = statistics.median(secs)
        p90 = secs[min(len(secs) - 1, int(0.9 * len(secs)))]
        print(f"{n:,} messages, {len(batches)} micro-batches of at most {args.batch:,} records, "
              f"{'mirrors + graph' if args.views else 'mirrors only'}, {elapsed:.1f} s in all")
        print(f"per batch (first left out): median {median:.2f} s, p90 {p90:.2f} s, max {secs[-1]:.2f} s; "
              f"records per batch median {statistics.median(rows):,.0f}")
        mid = sorted(timed, key=lambda p: p["durationMs"]["triggerExecution"])[len(timed) // 2]
        parts = {k: v for k, v in mid["durationMs"].items() if k != "triggerExecution" and v}
        print(f"the median batch's parts (ms): {parts}")
        print("target: <= 2 s median per batch of <= 1,000 changes (issue 12)")
        checks = verify(config, db.state)
        if args.views:
            checks.update(verify_views(config, expected_views(db.state)))
        bad = {k: v for k, v in checks.items() if v != "ok"}
        print(f"tables equal to the source: {'yes' if not bad else bad}")
        return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
