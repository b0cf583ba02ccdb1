"""Prometheus metrics, one registry per process.

Names follow Prometheus conventions: ``changelake_`` prefix, ``_total`` for
counters, units in the name. Label values are bounded: topic, partition,
table, source, format, kind, reason, operator, engine, lookup, result. Never keys or offsets.

The driver serves these on ``/metrics``. Counts made in executor Python
workers travel back to the driver with the batch (see the pipeline), so every
figure here is the driver's view of the whole job.
"""

from __future__ import annotations

import os
import sys
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector, ProcessCollector,
                               disable_created_metrics)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from changelake import __version__

# Counters and histograms without their ``_created`` series: one series per counter, not two.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)
# process_* (the driver's Python: CPU, resident memory, open files, start time) and python_info
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

_BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# --- source -------------------------------------------------------------------
RECORDS_IN = Counter(
    "changelake_records_in_total", "Kafka records read, by topic and format.",
    ["topic", "format"], registry=REGISTRY)
CHANGES_IN = Counter(
    "changelake_changes_in_total", "Changelog rows decoded, by table and row kind (+I, -U, +U, -D).",
    ["table", "kind"], registry=REGISTRY)
CONSUMER_LAG = Gauge(
    "changelake_consumer_lag_records",
    "End offset minus the last committed offset, per topic-partition.",
    ["topic", "partition"], registry=REGISTRY)
CONSUMER_LAG_SECONDS = Gauge(
    "changelake_consumer_lag_seconds",
    "How long the records a topic-partition still holds for the pipeline have waited, per topic-partition: 0 when "
    "caught up, else now minus the Kafka timestamp of the last record read from it (or, before this process has "
    "read one, at least the time since the process started). See docs/operations.md, 'Lag and freshness'.",
    ["topic", "partition"], registry=REGISTRY)
KEY_CHANGES = Counter(
    "changelake_key_changes_total",
    "Updates that changed the row's primary key, applied as a delete of the old key and an insert of the new "
    "one, by source (changelake.key_changes).", ["source"], registry=REGISTRY)
SOURCE_EPOCHS = Counter(
    "changelake_source_epoch_changes_total",
    "Times a source's log positions started a new epoch in a Kafka partition (reason new-server: a failover "
    "to another server; position-reset: the position went back while the source time went on, as after RESET "
    "MASTER or a restore). Later changes are ordered after all earlier ones (docs/operations.md, 'Database "
    "failover').", ["source", "reason"], registry=REGISTRY)


class ReadTimes:
    """The latest Kafka timestamp read per topic-partition (the driver's view; the batches bring them), and
    the lag in seconds it gives (:data:`CONSUMER_LAG_SECONDS`)::

        records left   timestamp read        lag seconds
        0              -                     0
        > 0            a real time           now - that timestamp
        > 0            none yet / not real   now - this process's start (a lower bound)

    A timestamp before 2001 is not real (a broker that stamps no time, as librdkafka's mock cluster)."""

    _REAL_MS = 978_307_200_000

    def __init__(self) -> None:
        self.last_ms: dict[tuple[str, str], int] = {}

    def note(self, topic: str, partition: str, timestamp_ms: int | None) -> None:
        if timestamp_ms and timestamp_ms > self.last_ms.get((topic, partition), 0):
            self.last_ms[(topic, partition)] = timestamp_ms

    def lag_seconds(self, topic: str, partition: str, records_left: int, *, now: float, started: float) -> float:
        if records_left <= 0:
            return 0.0
        ts = self.last_ms.get((topic, partition), 0)
        since = ts / 1000.0 if ts >= self._REAL_MS else started
        return max(0.0, now - since)


READ_TIMES = ReadTimes()
TOPICS_SKIPPED = Gauge(
    "changelake_topics_skipped",
    "1 per topic a source's topic_pattern matches but the pipeline does not read: a Debezium side topic "
    "(reason transaction-metadata: <topic.prefix>.transaction, which holds no row changes).",
    ["topic", "reason"], registry=REGISTRY)
EXPIRED_OFFSETS = Counter(
    "changelake_expired_offsets_skipped_total",
    "Offsets that had expired from Kafka (below the low watermark) before they were read: data lost upstream.",
    ["topic", "partition"], registry=REGISTRY)

# --- bad input ------------------------------------------------------------------
DECODE_ERRORS = Counter(
    "changelake_decode_errors_total", "Messages that could not be decoded, by topic and reason.",
    ["topic", "reason"], registry=REGISTRY)
DEAD_LETTERS = Counter(
    "changelake_dead_letters_total", "Messages written to the dead-letter path, by topic and reason.",
    ["topic", "reason"], registry=REGISTRY)
TABLE_QUARANTINED = Gauge(
    "changelake_table_quarantined",
    "1 while the table is quarantined by a schema change its schema_change behaviour refuses (its messages go "
    "to the dead-letter path), else 0.", ["table"], registry=REGISTRY)
SCHEMA_CHANGES = Counter(
    "changelake_schema_changes_total",
    "Changes of a Delta table's schema made by the sink (kind: add_column, widen_type, drop_column), by table.",
    ["table", "kind"], registry=REGISTRY)
SCHEMA_CHANGES_NOT_APPLIED = Counter(
    "changelake_schema_changes_not_applied_total",
    "Changes of a source's columns the table did not take (outcome keep, skip, convert or refuse under its "
    "schema_change behaviour), by table, kind and outcome; counted once per batch that brings them.",
    ["table", "kind", "outcome"], registry=REGISTRY)
TRUNCATES = Counter(
    "changelake_truncates_total",
    "TRUNCATE messages read, by source and what its on_truncate did with them (apply, skip).",
    ["source", "action"], registry=REGISTRY)
TABLE_BAD_RECORDS = Counter(
    "changelake_table_bad_records_total",
    "Bad messages by the table they were meant for (\"\" when none: a routed source's message no route took), "
    "reason, and what the source's on_error did with them (dlq, skip, fail).", ["table", "reason", "action"],
    registry=REGISTRY)
SKIPPED_BAD = Counter(
    "changelake_bad_records_skipped_total", "Bad messages dropped because the source says on_error: skip.",
    ["topic", "reason"], registry=REGISTRY)

TRANSACTIONS_RELEASED = Counter(
    "changelake_transactions_committed_total",
    "Source transactions applied in full (sources with consistency: transaction).", registry=REGISTRY)
TRANSACTIONS_HELD = Gauge(
    "changelake_transactions_held",
    "Source transactions read in part, whose rows wait for a later batch (consistency: transaction).",
    registry=REGISTRY)
HELD_ROWS = Gauge(
    "changelake_transaction_held_rows",
    "Changelog rows of incomplete source transactions held for a later batch (bounded by "
    "pipeline.max_held_rows).", registry=REGISTRY)
TRANSACTIONS_SPLIT = Counter(
    "changelake_transactions_split_total",
    "Incomplete source transactions applied in part because the held rows exceeded pipeline.max_held_rows.",
    registry=REGISTRY)
TRANSACTIONS_EXPIRED = Counter(
    "changelake_transactions_expired_total",
    "Incomplete source transactions applied in part because they were held longer than pipeline.max_hold.",
    registry=REGISTRY)

# --- sink -------------------------------------------------------------------------
TRUNCATED_ROWS = Counter(
    "changelake_truncated_rows_total", "Rows of a Delta table removed by truncates (on_truncate: apply), by table.",
    ["table"], registry=REGISTRY)
ROWS_OUT = Counter(
    "changelake_rows_out_total", "Changes applied to a Delta table, by table and row kind.",
    ["table", "kind"], registry=REGISTRY)
STALE_CHANGES = Counter(
    "changelake_out_of_order_changes_total",
    "Changes ignored because the table already holds a newer change for the key (out-of-order delivery).",
    ["table"], registry=REGISTRY)
RESURRECTIONS_PREVENTED = Counter(
    "changelake_resurrections_prevented_total",
    "Late updates older than a delete, kept out of the table by its tombstone.",
    ["table"], registry=REGISTRY)
COMMIT_SECONDS = Histogram(
    "changelake_delta_commit_duration_seconds", "Time to merge one batch into one Delta table.",
    ["table", "engine"], buckets=_BATCH_BUCKETS, registry=REGISTRY)
#: source time to Delta commit: a few seconds up to a day of catch-up
_FRESHNESS_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class BulkHistogram(Collector):
    """A labelled histogram fed a whole array of observations at once (one committed batch's rows), at the
    cost of one ``numpy.searchsorted`` instead of a Python call per row."""

    def __init__(self, name: str, documentation: str, label: str, *, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = tuple(float(b) for b in buckets)
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}
        registry.register(self)

    def observe_many(self, label: str, values: "Sequence[float] | Any") -> None:
        import numpy as np

        values = np.asarray(values, dtype="float64")
        if values.size == 0:
            return
        per_bucket = np.bincount(np.searchsorted(self.bounds, values, side="left"), minlength=len(self.bounds) + 1)
        self.observe_counts(label, per_bucket.tolist(), float(values.sum()))

    def observe_counts(self, label: str, per_bucket: Sequence[int], total: float) -> None:
        """Observations already counted per bucket (``per_bucket[i]``: values in (bounds[i-1], bounds[i]], the
        last one above every bound; e.g. counted on Spark's executors) whose sum is ``total``."""
        if len(per_bucket) != len(self.bounds) + 1:
            raise ValueError(f"{self.name}: {len(per_bucket)} bucket counts for {len(self.bounds) + 1} buckets")
        if not any(per_bucket):
            return
        counts = self._counts.setdefault(label, [0] * (len(self.bounds) + 1))
        for i, n in enumerate(per_bucket):
            counts[i] += int(n)
        self._sums[label] = self._sums.get(label, 0.0) + float(total)

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=[self.label])

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for label, counts in sorted(self._counts.items()):
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, self.bounds), "+Inf"], counts):
                cumulative += n
                buckets.append((bound, cumulative))
            family.add_metric([label], buckets, self._sums[label])
        yield family


FRESHNESS = BulkHistogram(
    "changelake_table_freshness_seconds",
    "Per change committed to a Delta table: the commit's time minus the change's source time (_source_ts, when "
    "the database made it), by table; changes without a source time (e.g. an aggregate's rows) are not counted.",
    "table", buckets=_FRESHNESS_BUCKETS, registry=REGISTRY)
COMMIT_FAILURES = Counter(
    "changelake_delta_commit_failures_total", "Delta commits that failed (after retries).",
    ["table"], registry=REGISTRY)
COMMIT_RETRIES = Counter(
    "changelake_delta_commit_retries_total", "Delta commits retried after a concurrent-write conflict.",
    ["table"], registry=REGISTRY)
REPLAYED_BATCHES = Counter(
    "changelake_replayed_batches_skipped_total",
    "Batches already committed to a table (found by transaction id after a restart) and not written again.",
    ["table"], registry=REGISTRY)
TABLE_VERSION = Gauge(
    "changelake_delta_table_version", "Latest Delta table version written.", ["table"], registry=REGISTRY)
TABLE_FILES = Gauge(
    "changelake_delta_table_files", "Live data files of a Delta table (its tombstone table: table=\"<name> tombstones\").",
    ["table"], registry=REGISTRY)
TABLE_BYTES = Gauge(
    "changelake_delta_table_bytes", "Bytes in the live data files of a Delta table.", ["table"], registry=REGISTRY)
MAINTENANCE = Counter(
    "changelake_delta_maintenance_total",
    "Delta maintenance runs (operation: compact, vacuum; result: ok, failed).",
    ["table", "operation", "result"], registry=REGISTRY)

# --- batches ----------------------------------------------------------------------
BATCH_SECONDS = Histogram(
    "changelake_batch_duration_seconds", "Wall time of one micro-batch, from Spark's progress report.",
    buckets=_BATCH_BUCKETS, registry=REGISTRY)
BATCH_ROWS = Gauge(
    "changelake_batch_input_rows", "Kafka records read by the last micro-batch that read any.", registry=REGISTRY)
BATCHES = Counter(
    "changelake_batches_total", "Micro-batches completed.", registry=REGISTRY)
LAST_BATCH_TS = Gauge(
    "changelake_last_batch_timestamp_seconds", "Unix time the last micro-batch finished successfully "
    "(0 until this process finishes one).", registry=REGISTRY)
ARROW_MEMORY = Gauge(
    "changelake_driver_arrow_bytes", "Bytes Arrow's memory pool of the driver process holds for live buffers after "
    "a micro-batch, once the pool has given its free pages back to the system: what the pipeline keeps "
    "(the sinks' copies of their tombstones), nothing of the batches.", registry=REGISTRY)
PROCESS_START = Gauge(
    "changelake_process_start_time_seconds", "Unix time this process started (a new value after each restart).",
    registry=REGISTRY)
PROCESS_START.set_to_current_time()
RESTART_TO_FIRST_COMMIT = Gauge(
    "changelake_restart_to_first_commit_seconds", "Seconds from this process's start to the end of its first "
    "micro-batch (Delta commits done), by phase: session, query, read, commit, and total "
    "(changelake.service.restart_clock).", ["phase"], registry=REGISTRY)
# --- brokers and the lease (changelake.service.broker_watch, changelake.service.lease) -----
BROKER_CONNECTED = Gauge(
    "changelake_broker_connected", "1 while the driver's watching Kafka client is connected to the broker, else 0 "
    "(changelake.service.broker_watch).", ["broker"], registry=REGISTRY)
BROKER_DISCONNECTS = Counter(
    "changelake_broker_disconnects_total", "Times the driver's connection to the broker was lost.", ["broker"],
    registry=REGISTRY)
BROKER_RECONNECTS = Counter(
    "changelake_broker_reconnects_total", "Times the driver connected to the broker again after its first "
    "connection.", ["broker"], registry=REGISTRY)
LEASE_STATE = Gauge(
    "changelake_lease_state", "1 for the state this instance's lease is in, 0 for the others: held (taken and "
    "renewed), renewal_failing (held, its last renewal failed: a store error; it is lost once lease_ttl passes "
    "without one), lost (another instance took it over: this one stops), by pipeline id (changelake.service.lease).",
    ["pipeline", "state"],
    registry=REGISTRY)
LEASE_RENEWED = Gauge(
    "changelake_lease_renewed_timestamp_seconds", "Unix time this instance last committed its lease (take or "
    "renewal).", registry=REGISTRY)
BUILD_INFO = Gauge(
    "changelake_build_info", "Always 1; the labels name the versions this process runs.",
    ["version", "pyspark", "deltalake", "python"], registry=REGISTRY)


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


BUILD_INFO.labels(__version__, _package_version("pyspark"), _package_version("deltalake"),
                  ".".join(map(str, sys.version_info[:3]))).set(1)


# --- the driver JVM and its Python workers ---------------------------------------------------
class JvmCollector(Collector):
    """Memory of the Spark driver JVM this process started (and of the processes it started: Python workers)
    read from /proc at scrape time, and the JVM's heap as the JVM reports it. Nothing until :meth:`watch`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.pid: int | None = None
        self.heap: Callable[[], dict[str, int]] | None = None
        self.workers_under: int | None = None
        registry.register(self)

    def watch(self, pid: int | None, heap: Callable[[], dict[str, int]] | None = None, *,
              workers_under: int | None = None) -> None:
        """``workers_under``: a process whose tree holds Spark's Python processes too (the fork server)."""
        self.pid, self.heap, self.workers_under = pid, heap, workers_under

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.pid is None:
            return
        rss = _rss_bytes(self.pid)
        if rss is not None:
            yield GaugeMetricFamily("changelake_jvm_resident_memory_bytes",
                                    "Resident memory of the Spark driver JVM (local mode: executors too).",
                                    value=rss)
            pids = _descendants(self.pid)
            if self.workers_under is not None:
                pids += [self.workers_under, *_descendants(self.workers_under)]
            children = sum(_rss_bytes(p) or 0 for p in pids)
            yield GaugeMetricFamily("changelake_spark_python_workers_resident_memory_bytes",
                                    "Resident memory of the processes the driver JVM started (Spark's Python "
                                    "workers in local mode, and the fork server they start from); a page forks "
                                    "share is counted once per fork.",
                                    value=children)
            yield GaugeMetricFamily("changelake_spark_python_workers_proportional_memory_bytes",
                                    "Proportional set size (PSS) of the same processes: each page they share "
                                    "split between its sharers, so a page is counted once; what they hold.",
                                    value=sum(_pss_bytes(p) or 0 for p in pids))
        if self.heap is not None:
            try:
                heap = self.heap()
            except Exception:       # a JVM that is stopping: no heap figures in this scrape
                heap = {}
            if heap:
                family = GaugeMetricFamily("changelake_jvm_memory_bytes",
                                           "The driver JVM's heap: used, committed, max.", labels=["area"])
                for area, n in sorted(heap.items()):
                    family.add_metric([area], n)
                yield family


def _rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _pss_bytes(pid: int) -> int | None:
    """The proportional set size of ``pid`` (``Pss:`` of /proc/PID/smaps_rollup), None when unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return found


JVM = JvmCollector(REGISTRY)

# --- operators --------------------------------------------------------------------
STATE_ROWS = Gauge(
    "changelake_state_rows", "Rows held in operator state.", ["operator"], registry=REGISTRY)
STATE_BYTES = Gauge(
    "changelake_state_bytes", "Bytes held in operator state.", ["operator"], registry=REGISTRY)
STALE_RETRACTIONS = Counter(
    "changelake_stale_retractions_total",
    "Retractions (-U, -D) an operator received for a row its state does not hold, and ignored: expected after a "
    "state TTL expired the row, for a delete of a row never inserted in what the pipeline read (a source started "
    "from latest or a timestamp), for a re-delivered delete (at-least-once sources, replays) and for the -U/-D a "
    "keyed upstream operator sends for rows it filtered. A rate that grows with the input, with no TTL and no "
    "replays, points to changes lost before the operator (docs/operations.md, 'Stale retractions').",
    ["operator"], registry=REGISTRY)
LATE_ROWS = Counter(
    "changelake_late_rows_total",
    "Rows an interval or temporal join received behind its watermark: not joined, dropped or dead-lettered "
    "by the view's late_rows.", ["view", "side"], registry=REGISTRY)
MATERIALIZER_CORRECTIONS = Counter(
    "changelake_materializer_corrections_total",
    "Out-of-order retractions undone by the sink upsert materializer.", ["table"], registry=REGISTRY)

# --- lookup joins -------------------------------------------------------------------
LOOKUP_REQUESTS = Counter(
    "changelake_lookup_requests_total",
    "Keys a lookup join needed, per micro-batch and distinct key: served from its cache (hit) or looked up "
    "in the dimension table (miss).", ["lookup", "result"], registry=REGISTRY)
LOOKUP_LATENCY = Histogram(
    "changelake_lookup_latency_seconds", "Time of one batched query to a lookup join's dimension table.",
    ["lookup"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY)
LOOKUP_CACHE_ROWS = Gauge(
    "changelake_lookup_cache_rows", "Keys held in a lookup join's caches (summed over Python workers).",
    ["lookup"], registry=REGISTRY)


# --- figures made away from the registry -------------------------------------------------
#: The counters a kernel may count into its :class:`Figures` (by figure name): the kernel runs in
#: whatever process runs it (a Spark Python worker, the in-process runner); whoever runs it
#: publishes the figures into the registry that is scraped.
FIGURES = {"stale_retractions": STALE_RETRACTIONS, "materializer_corrections": MATERIALIZER_CORRECTIONS}


class Figures(Tally):
    """Counts by (figure name, label value), e.g. ``figures["stale_retractions", "GroupAggregate"] += 1``."""


def publish(figures: Mapping[tuple[str, str], int]) -> None:
    """Add ``figures`` to this process's registry."""
    for (name, label), n in figures.items():
        if n:
            FIGURES[name].labels(label).inc(n)
