"""Scaling out: the same pipeline and data on ``local[2]`` and on ``local-cluster[2,1,1024]``.

    .venv/bin/python bench/scaleout.py [--changes 20000] [--batch 5000]
    .venv/bin/python bench/scaleout.py --quick     # 1,000 changes, two batches of 700 (test_cluster_mode.py)
    .venv/bin/python bench/scaleout.py --engine delta-spark   # MERGE on the executors (the delta JVM set, --jars)

Writes one inventory history (three Debezium JSON tables, ~2% redelivered) to a broker
(``--broker real|embedded``, bench/common.py),
then runs the chart's driver entry point (``docker/spark_driver.py run --available-now``, the demo
pipeline: three mirrors and a join -> group -> top-N graph) under ``spark-submit --master M`` for
both masters, one after the other, on the same topics. The pipeline YAML names no master: only
spark-submit decides. ``local-cluster`` starts a standalone master, a worker and two executor JVMs
of 1 core and 1 GB each (SPARK_HOME = the pyspark package).

Prints, per master: records, seconds (from the query's start), events/s, batches, and the bytes
each batch collected on the driver (its largest, and per record). Exits non-zero unless both runs
match the simulated database (tables and views), equal each other table by table, and the
cluster run ran tasks on both executors (the local run on none).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import PeakMemory, add_broker_option, machine, open_broker  # noqa: E402

from changelake.connectors.delta_read import read_delta  # noqa: E402
from changelake.service.config import load_config  # noqa: E402
from changelake.service.demo import demo_config, expected_views, verify, verify_views  # noqa: E402
from changelake.service.inventory import SERVER, InventoryDatabase, Message, produce  # noqa: E402

DRIVER = ROOT / "docker" / "spark_driver.py"
MASTERS = ("local[2]", "local-cluster[2,1,1024]")
TABLES = ["customers", "products", "orders", "sales_by_category", "top_categories"]


def spark_submit(master: str, config: Path, engine: str = "auto") -> tuple[subprocess.CompletedProcess, dict]:
    """The finished spark-submit and the peak RSS (MB) of its process tree (bench/common.py's PeakMemory: the
    driver's Python process, the driver JVM, a local-cluster's executor JVMs, the Python workers).
    ``engine`` delta-spark: the ``delta`` JVM set passed with ``--jars`` (spark-submit's driver JVM is
    started before the session builder could add them) with Delta's extension and catalog."""
    import pyspark

    from changelake.spark import worker_python

    spark_home = os.path.dirname(pyspark.__file__)
    # Spark's Python processes run as in the image (Dockerfile: PYSPARK_PYTHON=changelake-worker-python, and on a
    # local master forks of the driver's fork server)
    env = dict(os.environ, SPARK_HOME=spark_home, PYSPARK_PYTHON=worker_python.script_path() or sys.executable,
               SPARK_LOCAL_IP="127.0.0.1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    for var in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS", "SPARK_DRIVER_MEMORY", "CHANGELAKE_FAULT"):
        env.pop(var, None)
    cmd = ["nice", "-n", "10", os.path.join(spark_home, "bin", "spark-submit"), "--master", master,
           "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false"]
    if engine == "delta-spark":
        from changelake.connectors.delta_sink import DELTA_SPARK_CATALOG, DELTA_SPARK_EXTENSION
        from changelake.spark.delta_jars import missing, session_jars

        if missing():
            raise SystemExit(f"--engine delta-spark: {missing()}")
        cmd += ["--jars", ",".join(session_jars()), "--conf", f"spark.sql.extensions={DELTA_SPARK_EXTENSION}",
                "--conf", f"spark.sql.catalog.spark_catalog={DELTA_SPARK_CATALOG}"]
    cmd += [str(DRIVER), "run", "--available-now", "-c", str(config)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakMemory(root=proc.pid, interval=0.5) as mem:
        out, err = proc.communicate(timeout=1800)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), {**mem.peak_mb, "forked": len(mem.forked)}


def write_config(servers: str, workdir: Path, prefix: str, batch: int, engine: str = "auto") -> Path:
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"scaleout-{prefix}",
                      max_records_per_batch=batch)
    raw["storage"]["engine"] = engine
    for s in raw["sources"]:
        s["topics"] = [t.replace(SERVER, prefix, 1) for t in s["topics"]]
    assert "master" not in raw["pipeline"]          # spark-submit alone decides
    workdir.mkdir(parents=True)
    path = workdir / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def table_rows(config, name: str) -> set[tuple]:
    t = read_delta(config.table_path(name))
    columns = sorted(c for c in t.column_names if not c.startswith("_"))
    return {tuple(r[c] for c in columns) for r in t.select(columns).to_pylist()}


def first_error(stderr: str) -> str:
    """The first error line and what follows (Spark's stack traces bury it)."""
    lines = stderr.splitlines()
    at = next((i for i, line in enumerate(lines) if "Error" in line or "Exception" in line), max(0, len(lines) - 40))
    return "\n".join(lines[at:at + 40])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=20_000, help="changes after the snapshot")
    ap.add_argument("--batch", type=int, default=5_000, help="max records per micro-batch")
    ap.add_argument("--workdir", default="bench/out/scaleout")
    add_broker_option(ap)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1,000 changes, two batches of 700")
    ap.add_argument("--engine", choices=("auto", "delta-rs", "delta-spark"), default="auto",
                    help="storage.engine of both runs (auto: delta-rs on these local masters)")
    args = ap.parse_args()
    sizes = {"customers": 400, "products": 600, "orders": 1_000}
    if args.quick:
        args.changes, args.batch, sizes = 1_000, 700, {"customers": 40, "products": 60, "orders": 100}
    work = Path(args.workdir).absolute()
    shutil.rmtree(work, ignore_errors=True)
    print(f"machine: {machine()}")
    print(f"storage.engine: {args.engine}")
    failures: list[str] = []
    with open_broker(args.broker, quick=args.quick) as broker:
        prefix = "scaleout"
        db = InventoryDatabase(seed=31)
        messages = db.history(snapshot_sizes=sizes, changes=args.changes, redeliver=50)
        n = produce((Message(m.topic.replace(SERVER, prefix, 1), m.key, m.value) for m in messages),
                    broker.bootstrap_servers)
        print(f"produced {n:,} messages")
        runs, memory = {}, {}
        for master in MASTERS:
            path = write_config(broker.bootstrap_servers, work / re.sub(r"\W", "_", master), prefix, args.batch,
                                args.engine)
            started = time.monotonic()
            done, peak = spark_submit(master, path, args.engine)
            wall = time.monotonic() - started
            (path.parent / "stdout.txt").write_text(done.stdout)
            (path.parent / "stderr.txt").write_text(done.stderr)
            if done.returncode != 0:
                print(f"{master}: spark-submit exited {done.returncode}\n{first_error(done.stderr)}")
                return 1
            runs[master] = (load_config(path), done.stdout + done.stderr, wall)
            memory[master] = peak

    print(f"\n| master | records | seconds | events/s | spark-submit wall s | batches | "
          f"driver bytes per batch (max) | driver bytes per record |")
    print("|---|---|---|---|---|---|---|---|")
    records = {}
    for master, (config, log, wall) in runs.items():
        m = re.search(r"stopped after ([\d,]+) records in ([\d.]+) s", log)
        if not m:
            failures.append(f"{master}: no 'stopped after' line")
            continue
        n_records, seconds = int(m.group(1).replace(",", "")), float(m.group(2))
        records[master] = n_records
        collected = [int(b) for b in re.findall(r"batch \d+: (\d+) bytes collected on the driver", log)]
        print(f"| {master} | {n_records:,} | {seconds:.1f} | {n_records / seconds:,.0f} | {wall:.0f} | "
              f"{len(collected)} | {max(collected, default=0):,} | {sum(collected) / max(n_records, 1):,.0f} |")

    print("\n| master | peak RSS MB: driver python | driver JVM | executor JVMs (sum) | Python workers (sum) | "
          "batch seconds on the driver (process_decoded) |")
    print("|---|---|---|---|---|---|")
    for master, (config, log, wall) in runs.items():
        m = memory[master]
        applied = [float(x) for x in re.findall(r"batch \d+: \d+ records, .*?, ([\d.]+)s", log)]
        print(f"| {master} | {m['driver (python)']:,.0f} | {m['spark jvm']:,.0f} | {m['executor jvms (sum)']:,.0f} | "
              f"{m['python workers (sum)']:,.0f} | {', '.join(f'{x:.2f}' for x in applied)} |")
    for master, (config, log, wall) in runs.items():
        for op, rows, size in re.findall(r"state of (\S+): ([\d,]+) rows, ([\d,]+) bytes", log):
            rows, size = int(rows.replace(",", "")), int(size.replace(",", ""))
            print(f"{master}: state of {op}: {rows:,} rows, {size:,} bytes ({size / max(rows, 1):,.0f} bytes per row)")
    for master in runs:
        print(f"{master}: Spark's Python processes forked by the driver's fork server: {memory[master]['forked']}")
    for master, (config, log, wall) in runs.items():
        times = re.search(r"task time: (.*)", log)
        print(f"{master}: task time {times.group(1) if times else '?'}")
    ran = re.search(r"ran on (\d+) executor\(s\): (.*)", runs[MASTERS[1]][1])
    tasks = {e: int(k) for e, k in re.findall(r"executor (\S+): (\d+) task", ran.group(2))} if ran else {}
    print(f"\nexecutors of the cluster run: {tasks}")
    if "ran on" in runs[MASTERS[0]][1]:
        failures.append("local[2] reports executors: spark-submit's master did not take effect")
    if len(tasks) != 2 or not all(k > 0 for k in tasks.values()):
        failures.append(f"local-cluster did not run tasks on two executors: {tasks}")
    if len(set(records.values())) != 1:
        failures.append(f"the runs read different record counts: {records}")
    views = expected_views(db.state)
    for master, (config, _, _) in runs.items():
        got = {**verify(config, db.state), **verify_views(config, views)}
        bad = {t: v for t, v in got.items() if v != "ok"}
        if bad:
            failures.append(f"{master}: tables differ from the simulated database: {bad}")
    local, cluster = runs[MASTERS[0]][0], runs[MASTERS[1]][0]
    differ = [t for t in TABLES if table_rows(local, t) != table_rows(cluster, t)]
    if differ:
        failures.append(f"tables differ between the runs: {differ}")
    print("verification (both runs against the simulated database and each other): "
          + ("ok" if not failures else "FAILED"))
    for f in failures:
        print(f"  {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
