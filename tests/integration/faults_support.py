"""A steady stream through a running pipeline, for the broker-fault tests (test_broker_faults.py).

:class:`Running` runs a pipeline in this test process's Spark session (``PipelineRunner``, trigger 1 s)
in a thread and samples its metrics every 0.25 s: total consumer lag, batches completed, and the longest
time between two finished batches (a stall), so a test can say what ``/metrics`` showed during a fault.
(The lag gauge is set from each finished batch's progress: while no batch finishes it keeps its last value,
so an outage shows as a stall, not as lag.)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from changelake import metrics
from changelake.connectors.kafka_broker import create_topics
from changelake.service.config import ChangelakeConfig, parse_config
from changelake.service.demo import demo_config, expected_views, verify, verify_views
from changelake.service.inventory import TABLES, InventoryDatabase, SteadyProducer, topic_for
from changelake.service.runner import PipelineRunner

SIZES = {"customers": 20, "products": 30, "orders": 40}


def topics(prefix: str) -> dict[str, str]:
    """table -> its topic under ``prefix``."""
    return {t: topic_for(t).replace("dbserver1", prefix, 1) for t in TABLES}


def stream(servers: str, prefix: str, *, seed: int, changes: int, rate: float, partitions: int = 2,
           extra: dict[str, Any] | None = None) -> tuple[InventoryDatabase, SteadyProducer]:
    """Create the prefix's topics and start writing an inventory history at ``rate`` messages/s."""
    create_topics(servers, {t: partitions for t in topics(prefix).values()})
    db = InventoryDatabase(seed=seed)
    names = topics(prefix)
    msgs = [m for m in db.history(snapshot_sizes=SIZES, changes=changes, redeliver=30)]
    for m in msgs:
        m.topic = names[m.topic.rsplit(".", 1)[1]]
    return db, SteadyProducer(msgs, servers, rate=rate, extra=extra).start()


def config_for(servers: str, workdir: Path, prefix: str, *, views: bool = True,
               sources: dict[str, Any] | None = None,
               per_source: dict[str, dict[str, Any]] | None = None) -> ChangelakeConfig:
    raw = demo_config(bootstrap_servers=servers, workdir=workdir, metrics_port=0, pipeline_id=f"faults-{prefix}",
                      max_records_per_batch=2_000, views=views)
    raw["pipeline"]["trigger_interval"] = "1 second"
    for source in raw["sources"]:
        source["topics"] = [t.replace("dbserver1", prefix, 1) for t in source["topics"]]
        source.update(sources or {})
        source.update((per_source or {}).get(source["name"], {}))
    path = workdir / "pipeline.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return parse_config(path.read_text(), origin=str(path))


def lag(prefix: str) -> int:
    return int(sum(s.value for m in metrics.REGISTRY.collect() if m.name == "changelake_consumer_lag_records"
                   for s in m.samples if s.labels.get("topic", "").startswith(prefix)))


def _batches() -> float:
    return metrics.REGISTRY.get_sample_value("changelake_batches_total") or 0.0


@dataclass
class Samples:
    max_lag: int = 0
    #: the longest time between two finished batches while the pipeline ran
    longest_gap_s: float = 0.0
    batches: list[tuple[float, float]] = field(default_factory=list)     # (monotonic time, batches so far)

    def batches_since(self, t: float) -> float:
        before = max((b for at, b in self.batches if at <= t), default=0.0)
        return (self.batches[-1][1] if self.batches else 0.0) - before


class Running:
    """``config``'s pipeline running in a thread of this process, until :meth:`stop`."""

    def __init__(self, spark: Any, config: ChangelakeConfig, prefix: str) -> None:
        self.config, self.prefix = config, prefix
        self.runner = PipelineRunner(config, serve_http=False, spark=spark)
        self.error: BaseException | None = None
        self.samples = Samples()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._monitor = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "Running":
        self._thread.start()
        self._monitor.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(raise_error=exc[0] is None)

    def _run(self) -> None:
        try:
            self.runner.run(available_now=False, install_signal_handlers=False)
        except BaseException as exc:  # reported by stop() / failed()
            self.error = exc
        finally:
            self._done.set()

    def _watch(self) -> None:
        last_count, last_change = _batches(), time.monotonic()
        while not self._done.wait(0.25):
            now, count = time.monotonic(), _batches()
            if count != last_count:
                last_count, last_change = count, now
            s = self.samples
            s.batches.append((now, count))
            s.longest_gap_s = max(s.longest_gap_s, now - last_change)
            s.max_lag = max(s.max_lag, lag(self.prefix))

    def wait_first_batch(self, timeout_s: float = 180.0) -> None:
        """Until the pipeline committed a batch of this run (its error, if it failed first)."""
        deadline = time.monotonic() + timeout_s
        while self.runner_batches() == 0:
            if self._done.is_set():
                raise AssertionError(f"the pipeline stopped before its first batch: {self.error!r}"[:3000])
            if time.monotonic() > deadline:
                raise AssertionError(f"no batch finished within {timeout_s:.0f} s")
            time.sleep(0.25)

    def wait_batch_after(self, t: float, timeout_s: float) -> None:
        """Until a batch finished after monotonic time ``t``."""
        deadline = time.monotonic() + timeout_s
        while self.samples.batches_since(t) <= 0:
            if self._done.is_set():
                raise AssertionError(f"the pipeline stopped: {self.error!r}"[:3000])
            if time.monotonic() > deadline:
                raise AssertionError(f"no batch finished within {timeout_s:.0f} s of the fault")
            time.sleep(0.25)

    def runner_batches(self) -> int:
        return 0 if self.runner_processor is None else self.runner_processor.totals.records

    @property
    def runner_processor(self) -> Any:
        q = getattr(self.runner, "processor", None)
        return q

    def wait_failed(self, timeout_s: float) -> BaseException | None:
        self._done.wait(timeout_s)
        return self.error

    def stop(self, *, raise_error: bool = True) -> None:
        self.runner.request_stop()
        self._thread.join(180)
        self._monitor.join(5)
        if raise_error and self.error is not None:
            raise self.error

    def wait_equal(self, db: InventoryDatabase, producer: SteadyProducer, *, timeout_s: float = 180.0,
                   views: bool = True) -> dict[str, str]:
        """Until the producer is done and every table equals the database's final state (or the timeout)."""
        producer.wait(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._done.is_set() and self.error is not None:
                raise self.error
            got = verify(self.config, db.state)
            if views:
                got.update(verify_views(self.config, expected_views(db.state)))
            if all(v == "ok" for v in got.values()) or time.monotonic() > deadline:
                return got
            time.sleep(1.0)
