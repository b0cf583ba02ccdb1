"""Soak with faults: a steady stream of a simulated inventory database's changes (customers, products,
orders) through mirrors and a join graph (orders JOIN products, sales per category, Top-3) on a 3-node
Apache Kafka cluster (KRaft, replication factor 3, min.insync.replicas 2), while faults drawn at random
hit it; at the end every table is compared with the database's final state.

    .venv/bin/python bench/soak.py [--rate 500] [--minutes 30] [--fault-every 180] [--faults KINDS] [--seed 7]
        [--store local|s3] [--draw bag|random] [--faults-each N] [--max-records N] [--drain SECONDS]
        [--world-nice N] [--spark-conf KEY=VALUE ...] [--keep-data]
    .venv/bin/python bench/soak.py --quick      # smoke run: ~20 s of stream, one SIGKILL of changelake
    .venv/bin/python bench/soak.py --quick --store s3   # the same on S3, its first three commits refused

A fault comes only once the pipeline has finished a batch since its last start, so each one's recovery
is measured on its own.

==================  ==========================================================================
fault               what happens
==================  ==========================================================================
changelake-kill     SIGKILL of the pipeline's process group (driver, Spark JVM, Python workers),
                    then ``changelake run`` again on the same checkpoint
leader-kill         SIGKILL of the node leading a random source partition; restarted 10 s later
cluster-restart     every node stopped (SIGTERM) for three trigger intervals, then started
optimize            a concurrent OPTIMIZE (delta-rs compaction, another writer) of a random table
                    while the pipeline writes it; a Z-order by its key when there was nothing to
                    compact (one file), so that every such fault commits
s3-errors           (``--store s3``) the object store answers 503 SlowDown to every Delta log PUT
                    (the commits) for 20 s, then recovers
==================  ==========================================================================

``--store s3``: the Delta tables and dead letters on an S3 API on this machine (moto's server, the test
suite's ``tests/objstore/s3_server.py``, behind its fault proxy), with the storage options a user gives
(conditional PUT by ETag, the default for S3); the checkpoint stays on a local path, as docs/operations.md
("Object storage") says. Every fault kind then runs against the tables on S3.

The pipeline runs as ``changelake run`` in a child process (its log in the workdir). Reported: faults
survived per kind, changes lost and duplicated (rows missing or differing, and rows beyond one per key,
per table: both must be 0), restart to first commit of each changelake restart (the run's own
``restart to first commit`` log line, split by phase) and, for broker faults, the time from the
fault's end to the next finished batch; the RSS of the pipeline's process tree over time. Exit code 1
when a table differs. The machine may be shared: the figures say how long things took here, then.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from statistics import median

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QUICK_BROKER_JAVA_OPTIONS, _children, _rss_kb, machine  # noqa: E402

from changelake.connectors.delta_read import read_delta  # noqa: E402
from changelake.connectors.kafka_broker import LocalKafka, create_topics  # noqa: E402
from changelake.service.config import parse_config  # noqa: E402
from changelake.service.demo import demo_config, expected_views, verify, verify_views  # noqa: E402
from changelake.service.inventory import TABLES, InventoryDatabase, SteadyProducer, topic_for  # noqa: E402

KINDS = ("changelake-kill", "leader-kill", "cluster-restart", "optimize", "s3-errors")
#: how long the s3-errors fault refuses the commits
S3_ERROR_S = 20.0
RESTART = re.compile(r"restart to first commit: ([\d.]+) s \(([^)]*)\)")
PHASE = re.compile(r"(\w+) ([\d.]+) s")
#: every table's key columns (the duplicate count, the optimize fault's Z-order)
KEYS = {**{t: [s["key"]] for t, s in TABLES.items()}, "sales_by_category": ["category"], "top_categories": ["rank"]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Pipeline:
    """``changelake run`` in its own process group, its log appended to ``log``."""

    def __init__(self, config_path: Path, log: Path, port: int, tables: dict[str, str] | None = None,
                 storage_options: dict[str, str] | None = None, proxy=None, boost: int = 0) -> None:
        self.config_path, self.log, self.port = config_path, log, port
        self.boost = boost                  # --world-nice: started this much less nice than this process
        self.tables = tables or {}          # table name -> path (the optimize fault's targets)
        self.storage_options = storage_options or None
        self.proxy = proxy                  # --store s3: the fault proxy in front of the object store
        self.proc: subprocess.Popen | None = None
        self.starts = 0                     # how many times ``changelake run`` was started

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "changelake.service.cli", "--log-level", "INFO",
                                          "run", "-c", str(self.config_path)], env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=(lambda: os.nice(-self.boost)) if self.boost else None)
        self.starts += 1

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(300)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()

    def batches(self) -> float:
        """changelake_batches_total from /metrics (-1: not answering)."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2).read().decode()
        except OSError:
            return -1
        m = re.search(r"^changelake_batches_total ([\d.e+]+)$", text, re.M)
        return float(m.group(1)) if m else 0

    def broker_figures(self) -> dict[str, float]:
        """The sums of changelake_broker_{disconnects,reconnects}_total from /metrics (empty: not answering)."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2).read().decode()
        except OSError:
            return {}
        out = {}
        for name in ("disconnects", "reconnects"):
            out[name] = sum(float(v) for v in re.findall(rf"^changelake_broker_{name}_total{{[^}}]*}} ([\d.e+]+)$",
                                                          text, re.M))
        return out

    def rss_mb(self) -> float:
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        total, stack = _rss_kb(self.proc.pid), _children(self.proc.pid)
        while stack:
            pid = stack.pop()
            total += _rss_kb(pid)
            stack.extend(_children(pid))
        return total / 1024


def compare(config, db: InventoryDatabase) -> dict[str, tuple[int, int]]:
    """table -> (changes lost: rows missing or differing, duplicated: rows beyond one per key)."""
    out = {}
    checks = {**verify(config, db.state), **verify_views(config, expected_views(db.state))}
    for table, verdict in checks.items():
        lost = 0
        if verdict != "ok":
            nums = [int(n) for n in re.findall(r"(\d+) (?:missing|differ)", verdict)]
            lost = sum(nums) if nums else 1
        try:
            rows = read_delta(config.table_path(table), storage_options=config.storage.plain_options(),
                              columns=KEYS[table]).to_pylist()
            dup = len(rows) - len({tuple(r.values()) for r in rows})
        except Exception:  # the table does not exist: everything lost
            dup = 0
        out[table] = (lost, dup)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=500.0, help="messages per second (default 500)")
    ap.add_argument("--minutes", type=float, default=30.0, help="how long the stream runs (default 30)")
    ap.add_argument("--fault-every", type=float, default=180.0, help="seconds between faults, on average")
    ap.add_argument("--faults", default=None,
                    help=f"comma-separated, of {', '.join(KINDS)} (default: all; s3-errors with --store s3)")
    ap.add_argument("--max-faults", type=int, default=0, help="at most this many faults (0: no limit)")
    ap.add_argument("--faults-each", type=int, default=0,
                    help="the stream goes on past --minutes (up to twice as long) until every kind has had this "
                         "many faults (0: the stream ends at --minutes)")
    ap.add_argument("--draw", choices=("bag", "random"), default="bag",
                    help="bag (default): every kind once per round, each round in a random order, so N faults "
                         "hold every kind N/kinds times (+-1); random: each fault's kind drawn independently")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--max-records", type=int, default=50_000,
                    help="the pipeline's max_records_per_batch (default 50,000)")
    ap.add_argument("--drain", type=float, default=900.0,
                    help="after the stream, how long the tables may take to match the source (default 900 s)")
    ap.add_argument("--workdir", type=Path, default=Path("soak-work"))
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the Kafka nodes' logs, the checkpoint and local tables of a passed run (deleted by "
                         "default: ~28 GB for an hour at 5,000 events/s); a failed run keeps them")
    ap.add_argument("--store", choices=("local", "s3"), default="local",
                    help="where the Delta tables are: a local directory, or an S3 API on this machine (moto)")
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting of the pipeline (pipeline.spark_conf), repeatable")
    ap.add_argument("--world-nice", type=int, default=0, metavar="N",
                    help="run the world (the Kafka nodes, the producer, the S3 server) N steps nicer than the "
                         "pipeline, so that the pipeline has this machine's cores first, as on a node of its own; "
                         "needs the right to lower a process's niceness (root, CAP_SYS_NICE). Default 0: all at "
                         "one priority, the world taking its share of the pipeline's cores")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 1,800 changes at 120 messages/s, one SIGKILL (with --store s3, the orders "
                         "table's first three commits refused)")
    args = ap.parse_args(argv)
    if args.world_nice:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled")
        if autogroup.exists() and autogroup.read_text().strip() == "1":
            ap.error("--world-nice: the kernel shares the CPU between sessions first (sched_autogroup_enabled is 1), "
                     "so niceness has no effect between the pipeline (a session of its own) and the world; "
                     "write 0 to /proc/sys/kernel/sched_autogroup_enabled for the run")
        os.nice(args.world_nice)        # this process (the producer) and all it starts, but the pipeline
        can = subprocess.run([sys.executable, "-c", f"import os; os.nice(-{args.world_nice})"], capture_output=True)
        if can.returncode:
            ap.error(f"--world-nice {args.world_nice}: this user may not start the pipeline at a lower niceness "
                     f"than its own (needs root or CAP_SYS_NICE): {can.stderr.decode().strip().splitlines()[-1]}")
    kinds = [k.strip() for k in (args.faults or ",".join(KINDS)).split(",") if k.strip()]
    if set(kinds) - set(KINDS):
        ap.error(f"unknown fault kind(s): {sorted(set(kinds) - set(KINDS))}")
    if args.store != "s3" and args.faults is None:
        kinds.remove("s3-errors")
    elif args.store != "s3" and "s3-errors" in kinds:
        ap.error("the s3-errors fault needs --store s3")
    if args.quick:      # one SIGKILL (with --store s3, the first commits refused too: see _soak)
        # 1,800 changes after the 800 snapshot rows: ~22 s at 120/s; at 60/s the stream, not the pipeline's two
        # starts, was what the run waited for (a stream that ends before the first batch: see _soak)
        args.rate, args.minutes, args.fault_every, args.max_faults = 120.0, 0.25, 5.0, 1
        kinds = ["changelake-kill"]
    rng = random.Random(args.seed)
    work = args.workdir.resolve()
    if work.exists():
        import shutil
        shutil.rmtree(work)
    work.mkdir(parents=True)
    print(f"machine: {machine()} (shared: other jobs may run; figures are this run's)", flush=True)
    if args.world_nice:
        print(f"the world (Kafka nodes, producer, S3 server) at niceness {os.nice(0)}, the pipeline at "
              f"{os.nice(0) - args.world_nice}", flush=True)

    with _store(args.store, work) as (storage, proxy):
        code = _with_store(args, kinds, rng, work, storage, proxy)
    if code == 0 and not args.keep_data:
        _drop_data(work)
    return code


#: what a passed run leaves in its workdir without ``--keep-data``
KEPT = ("changelake.log", "pipeline.yaml", "s3-slow.tsv")


def _drop_data(work: Path) -> None:
    """Delete a passed run's data (the Kafka nodes' logs, three copies of every message; the checkpoint; local
    tables): an hour at 5,000 events/s leaves some 28 GB. The pipeline's log and configuration stay."""
    import shutil

    freed = 0
    for entry in work.iterdir():
        if entry.name in KEPT:
            continue
        freed += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file()) if entry.is_dir() else entry.stat().st_size
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    print(f"the run's data deleted ({freed / 1e9:.1f} GB; --keep-data keeps it): {work} keeps {', '.join(KEPT)}",
          flush=True)


class _store:
    """``--store``: nothing for ``local``; for ``s3``, moto's server and the fault proxy, the bucket, and the
    credentials in this process's environment (the pipeline's child process takes them from there, as a pod
    does). Yields (the YAML ``storage`` section or None, the proxy or None)."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind, self.work, self.server, self.proxy = kind, work, None, None

    def __enter__(self):
        if self.kind != "s3":
            return None, None
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.objstore.s3_server import FaultProxy, MotoS3

        self.server = MotoS3(self.work).start()
        bucket = self.server.bucket("soak")
        self.proxy = FaultProxy(self.server.port)
        options = self.server.options(self.proxy.endpoint)
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ[key] = options.pop(key)
        print(f"store: s3://{bucket}/lake on moto's S3 server ({self.server.endpoint}) behind a fault proxy",
              flush=True)
        return {"root": f"s3://{bucket}/lake", "engine": "delta-rs", "options": options}, self.proxy

    def __exit__(self, *exc) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self.server is not None:
            self.server.stop()


def _with_store(args: argparse.Namespace, kinds: list[str], rng: random.Random, work: Path, storage, proxy) -> int:
    java = QUICK_BROKER_JAVA_OPTIONS if args.quick else ("-Xmx512m", "-Xms64m", "-XX:+UseSerialGC")
    # a node restarted under a heavy load recovers its logs for minutes before it answers
    # --quick faults only changelake: one broker node is enough (the smoke run in make test)
    with LocalKafka(nodes=1 if args.quick else 3, workdir=work / "kafka", java_options=java,
                    settings={"log.retention.ms": "-1"},
                    start_timeout_s=600) as cluster:
        servers = cluster.bootstrap_servers
        create_topics(servers, {topic_for(t): 4 for t in TABLES})
        changes = int(args.rate * args.minutes * 60 * (2 if args.faults_each else 1))
        db = InventoryDatabase(seed=args.seed)
        msgs = db.history(snapshot_sizes={"customers": 200, "products": 100, "orders": 500}, changes=changes)
        raw = demo_config(bootstrap_servers=servers, workdir=work, metrics_port=_free_port(),
                          pipeline_id="soak", max_records_per_batch=args.max_records)
        raw["pipeline"]["trigger_interval"] = "2 seconds"
        if args.spark_conf:
            raw["pipeline"]["spark_conf"] = dict(kv.split("=", 1) for kv in args.spark_conf)
        if storage is not None:
            raw["storage"] = storage
        (work / "pipeline.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        config = parse_config((work / "pipeline.yaml").read_text(), origin=str(work / "pipeline.yaml"))
        pipeline = Pipeline(work / "pipeline.yaml", work / "changelake.log", raw["metrics"]["port"],
                            {t.name: config.table_path(t.name) for t in config.tables},
                            config.storage.plain_options(), proxy, boost=args.world_nice)
        early = None
        if args.quick and proxy is not None:        # the orders table's first three commits refused, retried
            from tests.objstore.s3_server import Fault

            early = proxy.arm(Fault("refuse", "PUT", "/orders/_delta_log/", times=3))
        pipeline.start()
        try:
            return _soak(args, kinds, rng, cluster, db, config, pipeline, msgs, work, early)
        finally:
            if pipeline.proc.poll() is None:       # a failed soak leaves no pipeline behind
                pipeline.kill()


def _soak(args: argparse.Namespace, kinds: list[str], rng: random.Random, cluster: LocalKafka,
          db: InventoryDatabase, config, pipeline: Pipeline, msgs, work: Path, early=None) -> int:
    """The stream, the faults, the final comparison and the report (:func:`main` set it up)."""
    servers = cluster.bootstrap_servers
    producer = SteadyProducer(msgs, servers, rate=args.rate).start()
    started = time.monotonic()
    memory: list[tuple[float, float, int]] = []     # (seconds, RSS MB, life: changelake starts so far - 1)
    faults: list[dict] = []
    bag: list[str] = []                             # --draw bag: every kind once per round, in random order
    next_fault = started + rng.uniform(0.5, 1.5) * args.fault_every
    # --quick: the one fault also when the stream ended before the pipeline's first batch (a slow start)
    while not producer.done or (args.quick and not faults and time.monotonic() - started < 600):
        now = time.monotonic()
        if pipeline.proc.poll() is not None:        # it stopped by itself: what a fault must never cause
            print(f"[{now - started:6.0f} s] changelake run exited with code {pipeline.proc.returncode} "
                  f"(see {pipeline.log})", flush=True)
            break
        memory.append((now - started, pipeline.rss_mb(), pipeline.starts - 1))
        # a fault once the pipeline committed since its last start (so each restart's recovery is measured)
        if now >= next_fault and (not args.max_faults or len(faults) < args.max_faults) \
                and pipeline.batches() > 0:
            if args.draw == "random":
                kind = rng.choice(kinds)
            else:
                bag = bag or rng.sample(kinds, len(kinds))
                kind = bag.pop()
            faults.append(inject(kind, cluster, pipeline, rng, at=now - started))
            next_fault = time.monotonic() + rng.uniform(0.5, 1.5) * args.fault_every
        if args.faults_each and now - started >= args.minutes * 60 \
                and all(sum(f["kind"] == k for f in faults) >= args.faults_each for k in kinds):
            producer.stop()                         # --faults-each: every kind had its faults
            break
        time.sleep(1.0)
    if early is not None:
        print(f"s3-errors from the start: {early.met} of the orders table's commit PUT(s) refused with 503", flush=True)
        if early.met:
            faults.append({"kind": "s3-errors", "at": 0.0, "recovered_s": None})
    sent = producer.wait(600)
    ended = time.monotonic()
    print(f"produced {sent:,} messages in {ended - started:.0f} s ({sent / (ended - started):,.0f}/s); "
          "waiting for the tables", flush=True)
    deadline = ended + (300 if args.quick else args.drain)
    result = compare(config, db)
    while any(lost for lost, _ in result.values()) and time.monotonic() < deadline \
            and pipeline.proc.poll() is None:
        memory.append((time.monotonic() - started, pipeline.rss_mb(), pipeline.starts - 1))
        time.sleep(2)
        result = compare(config, db)
    caught_up = time.monotonic() - ended
    print(f"tables {'equal to the source' if not any(lost for lost, _ in result.values()) else 'still behind'} "
          f"{caught_up:.0f} s after the stream's last message", flush=True)
    brokers = pipeline.broker_figures()
    code = pipeline.stop()
    if brokers:
        print(f"broker connections the last run's /metrics counted: {brokers['disconnects']:.0f} disconnects, "
              f"{brokers['reconnects']:.0f} reconnects (since its last start)", flush=True)

    restarts = [{"total": float(m.group(1)), **{p: float(x) for p, x in PHASE.findall(m.group(2))}}
                for m in RESTART.finditer((work / "changelake.log").read_text())]
    report(faults, restarts, memory, result, stopped=code)
    if pipeline.proxy is not None:
        report_slow_s3(pipeline.proxy, started_wall=time.time() - (time.monotonic() - started), work=work)
    return 0 if all(lost == 0 and dup == 0 for lost, dup in result.values()) else 1


def inject(kind: str, cluster: LocalKafka, pipeline: Pipeline, rng: random.Random, *, at: float) -> dict:
    print(f"[{at:6.0f} s] fault: {kind}", flush=True)
    before = pipeline.batches()
    if kind == "changelake-kill":
        pipeline.kill()
        pipeline.start()
    elif kind == "leader-kill":
        topic = topic_for(rng.choice(list(TABLES)))
        node = cluster.leader(topic, rng.randrange(4))
        cluster.kill(node)
        time.sleep(10)
        cluster.start_node(node)
    elif kind == "cluster-restart":
        cluster.stop_all()
        time.sleep(6)
        cluster.start_all()
    elif kind == "s3-errors":               # every commit refused for a while: retried with backoff
        from tests.objstore.s3_server import Fault

        began = time.monotonic()
        fault = pipeline.proxy.arm(Fault("refuse", "PUT", "/_delta_log/", until=began + S3_ERROR_S))
        time.sleep(S3_ERROR_S)
        pipeline.proxy.disarm()
        print(f"         s3-errors: {fault.met} commit PUT(s) refused with 503 over {time.monotonic() - began:.0f} s",
              flush=True)
    else:                                   # another writer compacts a table the pipeline writes
        from deltalake import DeltaTable

        table = rng.choice(sorted(pipeline.tables))
        try:
            dt = DeltaTable(pipeline.tables[table], storage_options=pipeline.storage_options)
            done = dt.optimize.compact()
            how = "compacted"
            if not done.get("numFilesRemoved"):     # one file already: a Z-order rewrites it, a real commit
                done, how = dt.optimize.z_order(KEYS[table]), f"Z-ordered by {', '.join(KEYS[table])}"
            print(f"         optimize {table}: {done.get('numFilesRemoved', 0)} file(s) {how}", flush=True)
        except Exception as exc:  # the pipeline's commit won the race: that is the pipeline's retry's business
            print(f"         optimize {table} failed: {exc}", flush=True)
    ended = time.monotonic()
    recovered = None
    if kind != "changelake-kill":           # the next finished batch after the broker is back
        while time.monotonic() - ended < 300:
            n = pipeline.batches()
            if n > before >= 0:
                recovered = time.monotonic() - ended
                break
            time.sleep(0.5)
    return {"kind": kind, "at": at, "recovered_s": recovered}


def report(faults: list[dict], restarts: list[dict[str, float]], memory: list[tuple[float, float]],
           result: dict[str, tuple[int, int]], *, stopped: int) -> None:
    print("\nfaults survived:")
    for kind in KINDS:
        done = [f for f in faults if f["kind"] == kind]
        if done:
            rec = [f["recovered_s"] for f in done if f["recovered_s"] is not None]
            extra = f"; fault end to next batch: median {median(rec):.1f} s, max {max(rec):.1f} s" if rec else ""
            print(f"  {kind}: {len(done)}{extra}")
    if restarts:
        phases = list(restarts[0])
        print("restart to first commit (s): " + " | ".join(phases))
        for r in restarts:
            print("  " + " | ".join(f"{r.get(p, 0.0):.2f}" for p in phases))
        again = restarts[1:]
        if again:
            print("  median of the restarts (the first, cold start left out): "
                  + ", ".join(f"{p} {median(r.get(p, 0.0) for r in again):.2f}" for p in phases)
                  + f" s over {len(again)} restart(s)")
        else:
            print("  no restart: the one start above is the cold start (a new checkpoint)")
    print("tables: lost | duplicated")
    for table, (lost, dup) in sorted(result.items()):
        print(f"  {table}: {lost} | {dup}")
    print(f"changes lost (must be 0): {sum(lost for lost, _ in result.values())}")
    print(f"changes duplicated (must be 0): {sum(dup for _, dup in result.values())}")
    if memory:
        step = max(1, len(memory) // 10)
        print("memory of the pipeline's processes (RSS, MB) over time: "
              + ", ".join(f"{t:.0f}s {mb:,.0f}" for t, mb, _ in memory[::step]))
        lives: dict[int, list[tuple[float, float]]] = {}
        for t, mb, life in memory:
            if mb:
                lives.setdefault(life, []).append((t, mb))
        # a leak shows as peaks that climb from life to life (each SIGKILL starts the climb again)
        print("peak RSS of each life of changelake run (MB, its length): "
              + ", ".join(f"{max(mb for _, mb in s):,.0f} ({s[-1][0] - s[0][0]:.0f} s)" for s in lives.values()))
    print(f"pipeline stopped with exit code {stopped}")
    print("soak run ok" if all(lost == 0 and dup == 0 for lost, dup in result.values()) else "soak run FAILED")


def report_slow_s3(proxy, *, started_wall: float, work: Path) -> None:
    """The S3 requests that took the fault proxy more than SLOW_S, by where the time went: a stall of the
    sink's commits on the soak's store is then either the harness (the proxy reading, moto answering) or the
    client. All of them, with their times from the soak's start, in s3-slow.tsv beside the log."""
    from tests.objstore.s3_server import SLOW_S

    slow = list(proxy.slow)
    print(f"S3 requests slower than {SLOW_S:.0f} s in the proxy: {len(slow)} of {proxy.requests:,}", end="")
    if slow:
        worst = max(slow, key=lambda r: r.read_s + r.upstream_s + r.reply_s)
        print(f"; time in reading the request {sum(r.read_s for r in slow):.0f} s, moto's answer "
              f"{sum(r.upstream_s for r in slow):.0f} s, the reply {sum(r.reply_s for r in slow):.0f} s; the slowest "
              f"{worst.method} {worst.path[:80]} {worst.read_s + worst.upstream_s + worst.reply_s:.1f} s "
              f"at {worst.at - started_wall:.0f} s (all in {work / 's3-slow.tsv'})", end="")
        (work / "s3-slow.tsv").write_text("at_s\tmethod\tpath\tread_s\tupstream_s\treply_s\n" + "".join(
            f"{r.at - started_wall:.1f}\t{r.method}\t{r.path}\t{r.read_s:.2f}\t{r.upstream_s:.2f}\t{r.reply_s:.2f}\n"
            for r in slow))
    print(flush=True)


if __name__ == "__main__":
    sys.exit(main())
