"""Restart to first commit: SIGKILL ``changelake run`` and start it again, N times, while a steady stream of a
simulated inventory database's changes (customers, products, orders) flows through the demo's pipeline (the
mirrors and the graph: orders JOIN products, sales per category, Top-3) on a real Kafka broker.

    .venv/bin/python bench/restart.py [--restarts 5] [--rate 50] [--broker real|embedded]
    .venv/bin/python bench/restart.py --quick      # smoke run: one restart

Each restart waits for the pipeline's first batch since its start (the run's own ``restart to first commit``
log line, docs/operations.md "Restart to first commit"), then kills it again at once (SIGKILL of its process
group: driver, Spark JVM, Python workers). Reported: every start's phases (the first, a cold start on a new
checkpoint, apart), the median of the restarts per phase, the load average before and after (the machine may
be shared: the figures say how long things took here, then), and at the end the tables compared with the
database's final state (lost and duplicated changes: both must be 0; exit code 1 otherwise).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import median

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import _children, _cmdline, add_broker_option, machine, open_broker  # noqa: E402
from soak import PHASE, RESTART, Pipeline, _free_port, compare  # noqa: E402

from changelake.service.config import parse_config  # noqa: E402
from changelake.service.demo import demo_config  # noqa: E402
from changelake.service.inventory import InventoryDatabase, Message, SteadyProducer, fold  # noqa: E402
from changelake.service.restart_clock import PHASES  # noqa: E402


def starts(log: Path) -> list[dict[str, float]]:
    """Every ``restart to first commit`` line of the run's log: phase -> seconds, with ``total``."""
    return [{**{p: float(x) for p, x in PHASE.findall(m.group(2))}, "total": float(m.group(1))}
            for m in RESTART.finditer(log.read_text())]


def wait_for_start(pipeline: Pipeline, log: Path, n: int, timeout_s: float) -> dict[str, float]:
    """The ``n``-th start's phases, once its first batch is done (raises when the run died or took too long)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = starts(log)
        if len(done) >= n:
            return done[n - 1]
        if pipeline.proc.poll() is not None:
            raise SystemExit(f"changelake run exited {pipeline.proc.returncode} before its first commit; see {log}")
        time.sleep(0.25)
    raise SystemExit(f"no first commit within {timeout_s:.0f} s of start {n}; see {log}")


class Stream:
    """The messages of ``history`` until :meth:`end`; :attr:`state` is the tables' state after those sent."""

    def __init__(self, history: Iterator[Message]) -> None:
        self._history, self._ended, self._sent = history, False, []

    def __iter__(self) -> Iterator[Message]:
        for m in self._history:
            if self._ended:
                return
            self._sent.append((m.topic, m.key, m.value))
            yield m

    def end(self) -> None:
        self._ended = True

    @property
    def state(self) -> dict:
        return fold(self._sent)


class TreeCpu:
    """Samples the pipeline's process tree every ``interval`` s: each process's CPU seconds (user + system) as last
    seen, and its kind (driver, JVM, Python). A process that lives less than ``interval`` may be missed; the sums
    are a lower bound, and, unlike the wall time, hardly depend on what else the machine runs."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.cpu: dict[int, tuple[str, float]] = {}
        self.root = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def follow(self, root: int) -> None:
        with self._lock:
            self.root, self.cpu = root, {}

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.wait(self.interval):
            with self._lock:
                stack = [self.root] if self.root else []
                while stack:
                    pid = stack.pop()
                    try:
                        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    cmd = _cmdline(pid)
                    kind = ("driver" if pid == self.root else "jvm" if "java" in cmd.split(" ", 1)[0]
                            else "python")
                    self.cpu[pid] = (kind, (int(fields[11]) + int(fields[12])) / tick)
                    stack.extend(_children(pid))

    def totals(self) -> dict[str, float]:
        """CPU seconds by kind, and ``python processes``: how many Python processes Spark started."""
        with self._lock:
            out = {"cpu driver": 0.0, "cpu jvm": 0.0, "cpu python": 0.0, "python processes": 0}
            for kind, seconds in self.cpu.values():
                out[f"cpu {kind}"] += seconds
                out["python processes"] += kind == "python"
            return out

    def stop(self) -> None:
        self._stop.set()


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--restarts", type=int, default=5, help="SIGKILLs and restarts (default 5)")
    ap.add_argument("--rate", type=float, default=50.0, help="messages per second of the stream (default 50)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", type=Path, default=Path("restart-work"))
    ap.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the pipeline (pipeline.spark_conf), to compare settings; repeatable")
    ap.add_argument("--quick", action="store_true", help="smoke run: one restart")
    add_broker_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.restarts = 1
    work = args.workdir.resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    print(f"machine: {machine()}; load average (1/5/15 min) at the start: {load()} "
          "(shared: other jobs may run; figures are this run's)", flush=True)
    with open_broker(args.broker, quick=args.quick) as broker:
        db = InventoryDatabase(seed=args.seed)
        # enough changes for the whole run; the producer is stopped at the end
        stream = Stream(db.history(snapshot_sizes={"customers": 200, "products": 100, "orders": 500},
                                   changes=10_000_000))
        raw = demo_config(bootstrap_servers=broker.bootstrap_servers, workdir=work, metrics_port=_free_port(),
                          pipeline_id="restart")
        raw["pipeline"]["spark_conf"] = dict(kv.split("=", 1) for kv in args.spark_conf)
        (work / "pipeline.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        config = parse_config((work / "pipeline.yaml").read_text(), origin=str(work / "pipeline.yaml"))
        log = work / "changelake.log"
        pipeline = Pipeline(work / "pipeline.yaml", log, raw["metrics"]["port"])
        producer = SteadyProducer(stream, broker.bootstrap_servers, rate=args.rate).start()
        tree = TreeCpu()
        pipeline.start()
        tree.follow(pipeline.proc.pid)
        try:
            cold = {**wait_for_start(pipeline, log, 1, 900), **tree.totals()}
            print(f"cold start (new checkpoint): {cold['total']:.1f} s, load {load()}", flush=True)
            restarts = []
            for i in range(args.restarts):
                pipeline.kill()
                pipeline.start()
                tree.follow(pipeline.proc.pid)
                restarts.append({**wait_for_start(pipeline, log, i + 2, 900), **tree.totals()})
                print(f"restart {i + 1}: {restarts[-1]['total']:.1f} s, load {load()}", flush=True)
            stream.end()
            producer.wait(300)
            result = compare(config, stream)
            deadline = time.monotonic() + 300
            while any(lost for lost, _ in result.values()) and time.monotonic() < deadline:
                time.sleep(2)
                result = compare(config, stream)
        finally:
            tree.stop()
            stream.end()
            if pipeline.proc.poll() is None:
                pipeline.kill()
    report(cold, restarts, result)
    return 0 if all(lost == 0 and dup == 0 for lost, dup in result.values()) else 1


def report(cold: dict[str, float], restarts: list[dict[str, float]], result: dict[str, tuple[int, int]]) -> None:
    columns = [*PHASES, "total", "cpu driver", "cpu jvm", "cpu python", "python processes"]
    print("\nrestart to first commit (s)")
    print("| start | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, r in [("cold", cold), *((f"restart {i + 1}", r) for i, r in enumerate(restarts))]:
        print(f"| {name} | " + " | ".join(f"{r.get(p, 0.0):.2f}" for p in columns) + " |")
    print("| **median of the restarts** | " + " | ".join(f"{median(r.get(p, 0.0) for r in restarts):.2f}"
                                                     for p in columns) + " |")
    print("(cpu: CPU seconds of the pipeline's processes from their start to the first commit, sampled every 0.2 s;"
          " python processes: those Spark started and the sampler saw)")
    print(f"median restart to first commit: {median(r['total'] for r in restarts):.1f} s over "
          f"{len(restarts)} restart(s); load average at the end: {load()}")
    print(f"changes lost (must be 0): {sum(lost for lost, _ in result.values())}")
    print(f"changes duplicated (must be 0): {sum(dup for _, dup in result.values())}")
    print("restart run ok" if all(lost == 0 and dup == 0 for lost, dup in result.values()) else "restart run FAILED")


if __name__ == "__main__":
    sys.exit(main())
