"""Prometheus metrics, one registry per process.

Names follow Prometheus conventions: ``changelake_`` prefix, ``_total`` for
counters, units in the name. Label values are bounded: topic, partition,
table, source, format, kind, reason, operator, engine, lookup, result. Never keys or offsets.

The driver serves these on ``/metrics``. Counts made in executor Python
workers travel back to the driver with the batch (see the pipeline), so every
figure here is the driver's view of the whole job.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

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
PROCESS_START = Gauge(
    "changelake_process_start_time_seconds", "Unix time this process started (a new value after each restart).",
    registry=REGISTRY)
PROCESS_START.set_to_current_time()

# --- operators --------------------------------------------------------------------
STATE_ROWS = Gauge(
    "changelake_state_rows", "Rows held in operator state.", ["operator"], registry=REGISTRY)
STATE_BYTES = Gauge(
    "changelake_state_bytes", "Bytes held in operator state.", ["operator"], registry=REGISTRY)
STALE_RETRACTIONS = Counter(
    "changelake_stale_retractions_total",
    "Retractions that found no matching state (expired by TTL or never seen).",
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
