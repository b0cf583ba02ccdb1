"""``changelake status``: where a pipeline stands, read from outside the running process.

====================  ================================================================================
lag per partition     end offset (Kafka) minus the offset committed to the pipeline's consumer group
                      (:func:`~changelake.service.query_start.consumer_group`) after each batch
last batch            the newest entry of the checkpoint's commit log: batch id, when, its end offsets
tables                Delta version, live files and their bytes (sink tables and their tombstone tables)
dead letters          rows of the dead-letter Delta table, by source and reason
lease                 the newest commit of the pipeline's lease (``changelake.service.lease``): who holds
                      it, when it was last renewed, and whether that is within ``pipeline.lease_ttl``
running instance      from its /metrics (``metrics.port`` on this host), when it answers: the lease state
                      and, per broker, connected or not with its disconnects and reconnects
                      (``changelake.service.broker_watch``)
====================  ================================================================================

Nothing here takes a lock or writes: it is safe beside a running pipeline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

from changelake.connectors.kafka_retry import with_retries
from changelake.service.config import ChangelakeConfig
from changelake.service.query_start import consumer_group
from changelake.service.preflight import RDKAFKA_LOGGER, broker_topics, pattern_without_side_topics

_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None       # None: the group has no offset for it (no batch committed yet)
    end: int

    @property
    def lag(self) -> int | None:
        return None if self.committed is None else max(0, self.end - self.committed)


@dataclass(frozen=True)
class LastBatch:
    batch_id: int
    finished_at: datetime
    end_offsets: dict[str, dict[str, int]]


@dataclass(frozen=True)
class TableFiles:
    name: str
    path: str
    version: int | None         # None: the table does not exist yet
    files: int = 0
    bytes: int = 0


@dataclass
class PipelineStatus:
    pipeline_id: str
    group: str
    partitions: list[PartitionLag] = field(default_factory=list)
    kafka_error: str | None = None
    last_batch: LastBatch | None = None
    #: the mirrors' own query's last batch (``pipeline.mirrors: own_query``, ``service.split``); None: one query
    mirrors_batch: LastBatch | None = None
    tables: list[TableFiles] = field(default_factory=list)
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)      # (source, reason) -> rows
    dead_letter_topics: list[str] = field(default_factory=list)
    #: the lease's newest commit: (holder, event, unix time, ttl seconds); None: never taken
    lease: tuple[str, str, float, float] | None = None
    #: the running instance's /metrics, when it answered: its URL and the samples below
    live_url: str | None = None
    lease_state: str | None = None
    #: broker -> (connected, disconnects, reconnects)
    brokers: dict[str, tuple[bool, int, int]] = field(default_factory=dict)


def collect_status(config: ChangelakeConfig) -> PipelineStatus:
    status = PipelineStatus(pipeline_id=config.pipeline.id, group=consumer_group(config))
    broker_topics(config)           # an unreachable broker: one line (SourceError), at once
    from changelake.service.split import MIRRORS_APP, split

    two = split(config) is not None
    try:
        status.partitions = group_lag(config)
        if two:     # the mirrors' query commits to a group of its own: a partition lags as its slower query
            mirrors = group_lag(config, group=consumer_group(config) + MIRRORS_APP)
            status.partitions = _slower(status.partitions, mirrors)
    except Exception as exc:  # KafkaException: report it, show the rest
        status.kafka_error = str(exc)
    status.last_batch = last_batch(config.pipeline.checkpoint)
    if two:
        status.mirrors_batch = last_batch(split(config).mirrors.pipeline.checkpoint)
    storage = config.storage.plain_options() or None
    for t in config.tables:
        path = config.table_path(t.name)
        status.tables.append(table_files(t.name, path, storage))
        tomb = _tombstone_path(path, storage)
        if tomb is not None:
            status.tables.append(table_files(f"{t.name} (tombstones)", tomb, storage))
    status.dead_letters = dead_letter_counts(config.dead_letter_path(), storage)
    status.dead_letter_topics = sorted({tp for s in config.sources if (tp := config.dead_letter_topic(s.name))})
    from changelake.durations import parse_duration
    from changelake.service.lease import newest_holder

    holder = newest_holder(config)
    if holder is not None:
        status.lease = (holder.owner, holder.event, holder.at,
                        parse_duration(config.pipeline.lease_ttl))
    live_metrics(status, "127.0.0.1" if config.metrics.host in ("0.0.0.0", "") else config.metrics.host,
                 config.metrics.port, pipeline_id=config.pipeline.id)
    return status


def live_metrics(status: PipelineStatus, host: str, port: int, *, pipeline_id: str) -> None:
    """Fill the running instance's figures from its /metrics at ``host:port``; nothing when it does not answer or
    serves another pipeline (its ``changelake_lease_state`` names the pipeline id)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    if not port:
        return
    url = f"http://{host}:{port}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=2).read().decode()
    except (OSError, ValueError):
        return
    brokers: dict[str, list] = {}
    mine = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            broker = sample.labels.get("broker")
            if sample.name == "changelake_lease_state" and sample.labels.get("pipeline") == pipeline_id:
                mine = True
                if sample.value == 1:
                    status.lease_state = sample.labels["state"]
            elif broker is not None and sample.name in _BROKER_SAMPLES:
                brokers.setdefault(broker, [False, 0, 0])[_BROKER_SAMPLES[sample.name]] = \
                    bool(sample.value) if sample.name == "changelake_broker_connected" else int(sample.value)
    if mine:
        status.live_url = url
        status.brokers = {b: tuple(v) for b, v in sorted(brokers.items())}


_BROKER_SAMPLES = {"changelake_broker_connected": 0, "changelake_broker_disconnects_total": 1,
                   "changelake_broker_reconnects_total": 2}


def _slower(a: list[PartitionLag], b: list[PartitionLag]) -> list[PartitionLag]:
    """Per partition, the lag of the group further behind (a partition one group has not committed: unknown)."""
    other = {(p.topic, p.partition): p.committed for p in b}
    out = []
    for p in a:
        c = other.get((p.topic, p.partition), p.committed)
        committed = None if p.committed is None or c is None else min(p.committed, c)
        out.append(PartitionLag(p.topic, p.partition, committed, p.end))
    return out


def group_lag(config: ChangelakeConfig, *, group: str | None = None) -> list[PartitionLag]:
    """Per partition of the pipeline's topics: the group's (default: the pipeline's) committed offset and the
    end offset."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": config.kafka.bootstrap_servers, "enable.auto.commit": False, "log_level": 3,
            **config.kafka.plain_properties(), "group.id": group or consumer_group(config), "logger": RDKAFKA_LOGGER}
    consumer = Consumer(conf)
    try:
        md = consumer.list_topics(timeout=_TIMEOUT_S)
        parts = []
        for s in config.sources:
            if s.topic_pattern is not None:
                rx = re.compile(pattern_without_side_topics(s.topic_pattern))
                names = sorted(t for t in md.topics if rx.fullmatch(t) and not t.startswith("__"))
            else:
                names = list(s.topics or ())
            for name in names:
                topic = md.topics.get(name)
                if topic is not None and topic.error is None:
                    parts.extend(TopicPartition(name, p) for p in sorted(topic.partitions))
        parts = sorted({(tp.topic, tp.partition): tp for tp in parts}.values(), key=lambda tp: (tp.topic, tp.partition))
        if not parts:
            return []
        # a group coordinator still loading after a broker start answers NOT_COORDINATOR for a while
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in with_retries(f"the committed offsets of {conf['group.id']}",
                                            lambda: consumer.committed(parts, timeout=_TIMEOUT_S),
                                            wait_ms=int(_TIMEOUT_S * 1000))}
        out = []
        for tp in parts:
            _, high = consumer.get_watermark_offsets(tp, timeout=_TIMEOUT_S, cached=False)
            c = committed.get((tp.topic, tp.partition))
            out.append(PartitionLag(tp.topic, tp.partition, c if c is not None and c >= 0 else None, high))
        return out
    finally:
        consumer.close()


def last_batch(checkpoint: str) -> LastBatch | None:
    """The newest batch in the checkpoint's commit log, with its end offsets."""
    from changelake.spark.checkpoint import batch_end_offsets, last_committed_batch

    last = last_committed_batch(checkpoint)
    if last is None:
        return None
    return LastBatch(batch_id=last[0], finished_at=last[1], end_offsets=batch_end_offsets(checkpoint, last[0]))


def table_files(name: str, path: str, storage: dict[str, str] | None) -> TableFiles:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, storage_options=storage)
    except TableNotFoundError:
        return TableFiles(name=name, path=path, version=None)
    adds = table.get_add_actions(flatten=True)
    sizes = adds.column("size_bytes").to_pylist() if adds.num_rows else []
    return TableFiles(name=name, path=path, version=table.version(), files=len(sizes), bytes=int(sum(sizes)))


def dead_letter_counts(path: str, storage: dict[str, str] | None) -> dict[tuple[str, str], int]:
    from deltalake import DeltaTable, QueryBuilder
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path, storage_options=storage)
    except TableNotFoundError:
        return {}
    import pyarrow as pa

    rows = pa.table(QueryBuilder().register("dl", table).execute(
        'SELECT "source", "reason", count(*) AS n FROM dl GROUP BY "source", "reason"')).to_pylist()
    return {(r["source"], r["reason"]): int(r["n"]) for r in rows}


def format_status(s: PipelineStatus, *, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    out = [f"pipeline {s.pipeline_id} (consumer group {s.group})", "", "lag (end offset - committed offset):"]
    if s.kafka_error:
        out.append(f"  cannot read Kafka: {s.kafka_error}")
    elif not s.partitions:
        out.append("  no partitions found for the configured topics")
    else:
        out.append(f"  {'topic':<40} {'part':>4} {'committed':>12} {'end':>12} {'lag':>10}")
        for p in s.partitions:
            committed = "-" if p.committed is None else str(p.committed)
            lag = "-" if p.lag is None else f"{p.lag:,}"
            out.append(f"  {p.topic:<40} {p.partition:>4} {committed:>12} {p.end:>12} {lag:>10}")
        known = [p.lag for p in s.partitions if p.lag is not None]
        out.append(f"  total lag: {sum(known):,}" + ("" if len(known) == len(s.partitions) else
                                                    " (partitions without a committed offset: '-')"))
    out.append("")
    if s.last_batch is None:
        out.append("last batch: none committed yet")
    else:
        age = (now - s.last_batch.finished_at).total_seconds()
        out.append(f"last batch: {s.last_batch.batch_id}, committed {s.last_batch.finished_at:%Y-%m-%d %H:%M:%S} UTC "
                   f"({_ago(age)} ago)")
    if s.mirrors_batch is not None:
        age = (now - s.mirrors_batch.finished_at).total_seconds()
        out.append(f"mirrors' last batch (their own query): {s.mirrors_batch.batch_id}, committed "
                   f"{s.mirrors_batch.finished_at:%Y-%m-%d %H:%M:%S} UTC ({_ago(age)} ago)")
    out += ["", "tables:", f"  {'table':<40} {'version':>8} {'files':>8} {'bytes':>14}"]
    for t in s.tables:
        version = "-" if t.version is None else str(t.version)
        out.append(f"  {t.name:<40} {version:>8} {t.files:>8} {t.bytes:>14,}")
    out += ["", "dead letters (Delta table):"]
    if not s.dead_letters:
        out.append("  none")
    for (source, reason), n in sorted(s.dead_letters.items()):
        out.append(f"  {source} / {reason}: {n:,}")
    if s.dead_letter_topics:
        out.append(f"  (sources with a dead-letter topic write to {', '.join(s.dead_letter_topics)} instead)")
    out += ["", "lease:"]
    if s.lease is None:
        out.append("  never taken")
    else:
        holder, event, at, ttl = s.lease
        age = now.timestamp() - at
        verdict = ("released" if event == "release" else "held" if age < ttl
                   else f"expired (not renewed within lease_ttl {ttl:.0f} s: its holder is gone or stalled)")
        out.append(f"  {verdict}: {holder}, last {event} {_ago(age)} ago")
    if s.live_url is None:
        out += ["", "running instance: none answered on metrics.port of this host (not running here, or its lease "
                "not taken yet)"]
    else:
        out += ["", f"running instance ({s.live_url}): lease {s.lease_state or 'not held'}",
                f"  {'broker':<40} {'connected':>9} {'disconnects':>11} {'reconnects':>10}"]
        for broker, (up, down, again) in s.brokers.items():
            out.append(f"  {broker:<40} {'yes' if up else 'NO':>9} {down:>11} {again:>10}")
    return "\n".join(out)


def _ago(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _tombstone_path(path: str, storage: dict[str, str] | None) -> str | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from changelake.connectors.delta_sink_schema import PROP_TOMBSTONES

    try:
        return DeltaTable(path, storage_options=storage).metadata().configuration.get(PROP_TOMBSTONES)
    except TableNotFoundError:
        return None


def status_json(s: PipelineStatus, *, now: datetime | None = None) -> str:
    """``status --json``: what :func:`format_status` prints, as one JSON object (times in ISO 8601 UTC)."""
    import json

    now = now or datetime.now(timezone.utc)
    known = [p.lag for p in s.partitions if p.lag is not None]
    def batch(b: LastBatch | None) -> dict | None:
        return None if b is None else {
            "batch_id": b.batch_id, "finished_at": b.finished_at.isoformat(),
            "age_seconds": round((now - b.finished_at).total_seconds(), 3), "end_offsets": b.end_offsets}

    last = batch(s.last_batch)
    return json.dumps({
        "pipeline_id": s.pipeline_id, "consumer_group": s.group, "kafka_error": s.kafka_error,
        "partitions": [{"topic": p.topic, "partition": p.partition, "committed": p.committed, "end": p.end,
                        "lag": p.lag} for p in s.partitions],
        "total_lag": sum(known) if s.kafka_error is None else None,
        "last_batch": last,
        "mirrors_last_batch": batch(s.mirrors_batch),
        "tables": [{"name": t.name, "path": t.path, "version": t.version, "files": t.files, "bytes": t.bytes}
                   for t in s.tables],
        "dead_letters": [{"source": source, "reason": reason, "rows": n}
                         for (source, reason), n in sorted(s.dead_letters.items())],
        "dead_letter_topics": s.dead_letter_topics,
        "lease": None if s.lease is None else {"holder": s.lease[0], "event": s.lease[1],
                                                "at": datetime.fromtimestamp(s.lease[2], timezone.utc).isoformat(),
                                                "ttl_seconds": s.lease[3]},
        "running_instance": None if s.live_url is None else {
            "metrics_url": s.live_url, "lease_state": s.lease_state,
            "brokers": [{"broker": b, "connected": up, "disconnects": d, "reconnects": r}
                        for b, (up, d, r) in s.brokers.items()]},
    }, indent=2)
