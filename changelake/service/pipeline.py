"""Pipeline assembly: Kafka source -> decode -> (operators) -> Delta sinks, one Spark query.

Every micro-batch runs :class:`BatchProcessor` through ``foreachBatch``:

1. collect the batch's raw records (Arrow) and report offsets that expired upstream;
2. route records to their source by topic and decode them;
3. apply each source's ``on_error`` policy to the dead letters (fail: stop before
   anything is written; skip: count and drop; dlq: quarantine with raw bytes);
4. apply each table's changes through its idempotent Delta sink.

Every write is keyed by (pipeline id, batch id) through Delta transaction ids and
Spark only advances its offsets after the batch function returns, so a crash
anywhere in between replays the batch, and the replay writes nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import DEAD_LETTER_SCHEMA, KIND, RowKind
from changelake.connectors.delta_sink import DeltaUpsertSink, TableSpec, open_sink
from changelake.connectors.kafka_source import SOURCE_NAME, KafkaSource
from changelake.errors import DecodeError
from changelake.formats import make_decoder
from changelake.service import metrics
from changelake.service.config import ChangelakeConfig, SourceSpec, parse_duration
from changelake.service.dead_letter_paths import DeadLetterPaths
from changelake.service.decode_stage import SPARK_SCHEMA as DECODE_STAGE_SCHEMA
from changelake.service.decode_stage import DecodeStage
from changelake.service.key_inference import TableKeys
from changelake.service.quarantine import Quarantine
from changelake.types import arrow_schema

log = logging.getLogger(__name__)

#: Test hook: ``CHANGELAKE_FAULT=<point>@<batch id>`` kills the process with SIGKILL at that point.
FAULT_ENV = "CHANGELAKE_FAULT"
_KIND_LABEL = {k.value: k.short for k in RowKind}


def _fault(point: str, batch_id: int) -> None:
    if os.environ.get(FAULT_ENV) == f"{point}@{batch_id}":
        log.error("fault injection: killing the process at %s of batch %d", point, batch_id)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BatchReport:
    batch_id: int
    records: int = 0
    changes: dict[str, dict[str, int]] = field(default_factory=dict)    # table -> kind -> n
    dead_letters: dict[str, int] = field(default_factory=dict)          # reason -> n
    expired: int = 0
    committed_tables: list[str] = field(default_factory=list)
    seconds: float = 0.0


class _Route:
    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.decoder = make_decoder(spec.format, columns=arrow_schema(spec.columns) if spec.columns else None,
                                    options=spec.options)
        self._rx = re.compile(spec.topic_pattern) if spec.topic_pattern else None
        self._topics = frozenset(spec.topics or ())

    def matches(self, topic: str) -> bool:
        return topic in self._topics if self._rx is None else bool(self._rx.fullmatch(topic))


class BatchProcessor:
    """The ``foreachBatch`` function of a pipeline."""

    def __init__(self, config: ChangelakeConfig, *, spark: Any = None) -> None:
        self.config = config
        self.routes = [_Route(s) for s in config.sources]
        self.keys = TableKeys(config)
        self._spark = spark
        self.sinks: dict[str, DeltaUpsertSink] = {}     # opened once the table's key is known
        self.dead_letters = DeadLetterPaths(config)
        self.quarantine = Quarantine(config, self.routes, self.keys)
        self.stage: DecodeStage | None = None
        self.last_report: BatchReport | None = None
        self.totals = BatchReport(batch_id=-1)

    def _sink(self, name: str) -> DeltaUpsertSink:
        if name not in self.sinks:
            t = self.config.table(name)
            self.sinks[name] = open_sink(
                TableSpec(name=name, path=self.config.table_path(name), primary_key=self.keys.key_of(name),
                          partition_by=tuple(t.partition_by),
                          tombstone_retention=timedelta(seconds=parse_duration(t.tombstone_retention)),
                          storage_options=self.config.storage.plain_options()),
                pipeline_id=self.config.pipeline.id, engine=self.config.storage.engine, spark=self._spark)
        return self.sinks[name]

    # Spark calls this with the batch DataFrame and its id.
    def __call__(self, batch_df: Any, batch_id: int) -> None:
        if self.stage is None:
            self.stage = DecodeStage(self.routes)
        unknown = self.keys.unknown()
        self.stage.learn_keys = {i for i, r in enumerate(self.routes) if r.spec.table in unknown}
        decoded = batch_df.mapInArrow(self.stage, DECODE_STAGE_SCHEMA).toArrow()
        self.process_decoded(decoded, batch_id)

    def process_decoded(self, out: pa.Table, batch_id: int) -> BatchReport:
        """Apply the collected output of the executors' :class:`DecodeStage`."""
        assert self.stage is not None
        stats, parts = self.stage.split(out)
        self.keys.learn(_key_shapes(self.routes, parts))
        decoded = []
        for i, got in parts.items():
            route = self.routes[i]
            if "raw" in got:                      # columns learnt at run time: decode here
                result = route.decoder.decode(got["raw"])
                decoded.append((route, result.rows, result.dead_letters))
            rows = got.get("rows")
            dead = got.get("dl")
            if rows is not None or dead is not None:
                decoded.append((route, rows if rows is not None else _empty(route),
                                dead if dead is not None else DEAD_LETTER_SCHEMA.empty_table()))
        return self._apply(stats, decoded, batch_id)

    def _apply(self, stats: dict[tuple[str, int], tuple[int, int]],
               decoded: list[tuple["_Route", pa.Table, pa.Table]], batch_id: int) -> BatchReport:
        started = time.monotonic()
        report = BatchReport(batch_id=batch_id)
        for (topic, partition), (n, expired) in stats.items():
            report.records += n
            if expired:
                metrics.EXPIRED_OFFSETS.labels(topic, str(partition)).inc(expired)
                report.expired += expired
            route = next((r for r in self.routes if r.matches(topic)), None)
            metrics.RECORDS_IN.labels(topic, route.spec.format if route else "unrouted").inc(n)

        per_table: dict[str, list[pa.Table]] = {}
        letters: list[tuple[str, pa.Table]] = []
        for route, rows, dead in decoded:
            rows, bad = self._check_keys(route, rows, dead)
            if bad.num_rows:
                self.quarantine.observe(route, bad)
                self._handle_bad(route, bad, batch_id, report)
                if route.spec.on_error == "dlq":
                    letters.append((route.spec.name, bad))
            if rows.num_rows:
                per_table.setdefault(route.spec.table, []).append(rows)

        _fault("before-sinks", batch_id)
        self.dead_letters.write(letters, batch_id=batch_id)
        for i, (name, parts) in enumerate(sorted(per_table.items())):
            changes = pa.concat_tables(parts, promote_options="permissive")
            kinds = _count_kinds(changes)
            report.changes[name] = kinds
            for kind, n in kinds.items():
                metrics.CHANGES_IN.labels(name, kind).inc(n)
            result = self._sink(name).apply(changes, batch_id=batch_id)
            if result.committed:
                report.committed_tables.append(name)
            if i == 0:
                _fault("after-first-table", batch_id)
        _fault("after-sinks", batch_id)
        report.seconds = time.monotonic() - started
        self.last_report = report
        self._accumulate(report)
        log.info("batch %d: %d records, changes %s, dead letters %s, %.2fs", batch_id, report.records,
                 json.dumps(report.changes), json.dumps(report.dead_letters), report.seconds)
        return report

    def _check_keys(self, route: _Route, rows: pa.Table, bad: pa.Table) -> tuple[pa.Table, pa.Table]:
        """Rows whose primary key is absent or null become dead letters: they could not be applied."""
        key = self.keys.key_of(route.spec.table)
        if rows.num_rows == 0:
            return rows, bad.cast(DEAD_LETTER_SCHEMA)
        if key is None:
            raise DecodeError(f"table {route.spec.table!r} has no primary_key and none was learnt from the "
                              "message keys; set tables[].primary_key", reason="missing-key")
        missing = [k for k in key if k not in rows.column_names]
        if missing:
            raise DecodeError(
                f"source {route.spec.name!r}: the decoded rows have no column(s) {missing} that table "
                f"{route.spec.table!r} uses as primary key; fix tables[].primary_key or the source's columns",
                reason="missing-key")
        null_key = pc.or_(*[pc.is_null(rows[k]) for k in key]) if len(key) > 1 else pc.is_null(rows[key[0]])
        if not pc.any(null_key).as_py():
            return rows, bad
        offending = rows.filter(null_key)
        extra = pa.table({
            "topic": offending["_topic"], "partition": offending["_partition"], "offset": offending["_offset"],
            "timestamp": pa.nulls(offending.num_rows, pa.timestamp("ms", tz="UTC")),
            "key": pa.nulls(offending.num_rows, pa.binary()),
            "value": pa.nulls(offending.num_rows, pa.binary()),
            "reason": pa.array(["missing-key"] * offending.num_rows),
            "error": pa.array([f"primary key {key} is null; the change cannot be applied to table "
                               f"{route.spec.table!r}"] * offending.num_rows),
        }).cast(DEAD_LETTER_SCHEMA)
        return rows.filter(pc.invert(null_key)), pa.concat_tables([bad.cast(DEAD_LETTER_SCHEMA), extra])

    def _handle_bad(self, route: _Route, bad: pa.Table, batch_id: int, report: BatchReport) -> None:
        reasons = bad["reason"].to_pylist()
        topics = bad["topic"].to_pylist()
        for topic, reason in zip(topics, reasons):
            metrics.DECODE_ERRORS.labels(topic, reason).inc()
            report.dead_letters[reason] = report.dead_letters.get(reason, 0) + 1
        policy = route.spec.on_error
        if policy == "fail":
            first = bad.slice(0, 1).to_pylist()[0]
            raise DecodeError(
                f"source {route.spec.name!r} (on_error: fail): {first['error']}; {bad.num_rows} bad message(s) "
                f"in batch {batch_id}. Fix the producer, or set on_error: dlq to quarantine bad messages",
                reason=first["reason"], topic=first["topic"], partition=first["partition"], offset=first["offset"])
        counter = metrics.DEAD_LETTERS if policy == "dlq" else metrics.SKIPPED_BAD
        for topic, reason in zip(topics, reasons):
            counter.labels(topic, reason).inc()
        if policy == "skip":
            log.warning("source %s: skipped %d bad message(s) in batch %d (on_error: skip)",
                        route.spec.name, bad.num_rows, batch_id)

    def _accumulate(self, report: BatchReport) -> None:
        t = self.totals
        t.batch_id = report.batch_id
        t.records += report.records
        t.expired += report.expired
        for name, kinds in report.changes.items():
            acc = t.changes.setdefault(name, {})
            for k, n in kinds.items():
                acc[k] = acc.get(k, 0) + n
        for reason, n in report.dead_letters.items():
            t.dead_letters[reason] = t.dead_letters.get(reason, 0) + n


def _key_shapes(routes: list["_Route"], parts: dict[int, dict[str, pa.Table]]) -> dict[str, list[pa.Table]]:
    """The ``keys`` payloads of the decode stage, by table."""
    shapes: dict[str, list[pa.Table]] = {}
    for i, got in parts.items():
        if "keys" in got:
            shapes.setdefault(routes[i].spec.table, []).append(got["keys"])
    return shapes


def _empty(route: "_Route") -> pa.Table:
    schema = getattr(route.decoder, "output_schema", None)
    return schema.empty_table() if schema is not None else pa.table({})


def _count_kinds(changes: pa.Table) -> dict[str, int]:
    counts = pc.value_counts(changes[KIND]).to_pylist()
    return {_KIND_LABEL[c["values"]]: c["counts"] for c in counts}


def kafka_reader_options(config: ChangelakeConfig) -> dict[str, str]:
    """Options of the one Kafka source that feeds every configured source."""
    opts: dict[str, str] = {"bootstrap.servers": config.kafka.bootstrap_servers}
    patterns = [s.topic_pattern for s in config.sources if s.topic_pattern]
    topics = sorted({t for s in config.sources for t in (s.topics or ())})
    if patterns:
        alternatives = patterns + [re.escape(t) for t in topics]
        opts["topicPattern"] = "|".join(f"(?:{p})" for p in alternatives)
    else:
        opts["topics"] = ",".join(topics)
    starting: dict[str, Any] = {}
    for s in config.sources:
        for t in s.topics or ():
            if isinstance(s.starting_offsets, dict):
                starting[t] = s.starting_offsets.get(t, "earliest")
            else:
                starting[t] = s.starting_offsets
    if any(v != "earliest" for v in starting.values()):
        opts["startingOffsets"] = json.dumps(starting)
    opts["readTasks"] = str(config.pipeline.read_tasks)
    if config.pipeline.max_records_per_batch:
        opts["maxRecordsPerTrigger"] = str(config.pipeline.max_records_per_batch)
    for k, v in config.kafka.plain_properties().items():
        opts[f"kafka.{k}"] = v
    return opts


def start_query(spark: Any, config: ChangelakeConfig, processor: BatchProcessor, *,
                available_now: bool | None = None) -> Any:
    """Start the streaming query; returns Spark's StreamingQuery."""
    spark.dataSource.register(KafkaSource)
    reader = spark.readStream.format(SOURCE_NAME)
    for k, v in kafka_reader_options(config).items():
        reader = reader.option(k, v)
    writer = (reader.load().writeStream.queryName(config.pipeline.id)
              .foreachBatch(processor)
              .option("checkpointLocation", config.pipeline.checkpoint))
    once = config.pipeline.available_now if available_now is None else available_now
    if once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{parse_duration(config.pipeline.trigger_interval)} seconds")
    return writer.start()
