"""Pipeline configuration: YAML, environment overrides and secrets.

Precedence, lowest first: the YAML file; ``${VAR}`` references inside it; environment
variables ``CHANGELAKE_<SECTION>__<KEY>[__<KEY>...]`` (e.g.
``CHANGELAKE_KAFKA__BOOTSTRAP_SERVERS``; ``CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD``
sets ``kafka.properties["sasl.password"]``); and, for any string value, a sibling key
ending in ``_file`` whose file content replaces it (Kubernetes secret mounts).

An item of a list section is named by its name or index (``CHANGELAKE_SOURCES__orders__FORMAT``);
an override that names nothing is an error. Errors are reported all at once, each with its path
in the YAML and where the value came from (:class:`Origins`).
"""

from __future__ import annotations

import logging
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import (BaseModel, ConfigDict, Field, SecretStr, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from changelake.durations import parse_duration
from changelake.errors import ConfigError
from changelake.formats.options import is_secret_option

_log = logging.getLogger(__name__)
ENV_PREFIX = "CHANGELAKE_"
#: a key ``<key>_file`` (or ``_FILE``; an environment override ``..._<KEY>_FILE``) reads ``<key>`` from that file
FILE_SUFFIX = "_file"
#: Debezium's default ``unavailable.value.placeholder``
UNAVAILABLE_VALUE = "__debezium_unavailable_value"
FORMATS = ("debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json")
#: what a table does when its source's columns change (docs/pipelines.md, "Schema changes")
SchemaChange = Literal["evolve", "try_evolve", "lenient", "ignore", "exception"]
class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _duration_text(value: Any) -> str:
    """A duration must be text with a unit: a bare number (``trigger_interval: 10``) says so."""
    if isinstance(value, bool) or not isinstance(value, str):
        unit = " with a unit" if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
        raise ValueError(f"{value!r} is not a duration; write a number{unit} as text, e.g. '10 seconds', "
                         "'500 ms', '1 minute', '7 days'")
    return value


def _check_duration(value: Any) -> str:
    parse_duration(_duration_text(value))
    return value


def _check_signed_duration(value: Any) -> str:
    """A duration that may start with '-' (an interval bound on the other side)."""
    parse_duration(_duration_text(value).strip().lstrip("-").strip())
    return value


def _check_optional_duration(value: Any) -> str | None:
    return None if value is None else _check_duration(value)


#: the first batch after a start admits this share of max_records_per_batch by default, and at least FIRST_BATCH_FLOOR
#: records (below about that many a batch's time is its fixed cost: a smaller one would not commit sooner)
FIRST_BATCH_SHARE = 16
FIRST_BATCH_FLOOR = 10_000


class PipelineSettings(_Model):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="stable pipeline id; part of the Delta transaction ids")
    checkpoint: str = Field(description="Spark checkpoint directory (one writer per checkpoint)")
    trigger_interval: str = Field("10 seconds", description="how often a micro-batch starts ('10 seconds')")
    available_now: bool = Field(False, description="read what is there, then stop (batch-style catch-up)")
    max_records_per_batch: int | None = Field(200_000, gt=0, description="Kafka records per micro-batch at most; "
                                              "it bounds the driver's memory per batch (operations.md, 'Scaling "
                                              "out'); null: no cap")
    first_batch_records: int | None = Field(
        None, gt=0, description="Kafka records the first micro-batch after a start reads at most; each next batch "
        "twice as many, up to max_records_per_batch: a restart commits its first batch early instead of carrying "
        "the whole backlog (operations.md, 'Restart to first commit'); default max_records_per_batch / 16, "
        "at least 10000; set it to max_records_per_batch for no ramp")
    read_tasks: int = Field(2, gt=0, description="Spark tasks that read Kafka per micro-batch; about the executor cores")
    mirrors: Literal["own_query", "with_graph"] = Field(
        "with_graph", description="with views: with_graph runs the mirrors in the operator graph's query (they "
                                  "wait for its batches); own_query (opt-in, fewer tests run in this mode; not "
                                  "with consistency: transaction) runs them in a streaming query of their own "
                                  "(checkpoint <checkpoint>/mirrors), committing on their own cadence. Decided "
                                  "when the checkpoint is created (operations.md, 'Mirrors and views')")
    state_ttl: str | None = Field(None, description="idle-state retention of every operator ('1 day'); none: forever")
    on_stale_retraction: Literal["warn", "fail"] = Field(
        "warn", description="a retraction that finds no state (expired or never seen): warn and skip, or fail")
    master: str | None = Field(None, description="Spark master when the launcher sets none (spark-submit --master, "
                               "spark-defaults.conf); default local[2]")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Spark settings; a key the launcher sets "
                                       "(spark-submit --conf, spark-defaults.conf) keeps the launcher's value")
    max_held_rows: int = Field(1_000_000, gt=0, description="sources with consistency: transaction: changelog rows "
                               "of incomplete source transactions held for later batches at most; beyond it the held "
                               "transactions are applied as they are (split), logged and counted (docs/pipelines.md, "
                               "'Transaction-consistent tables')")
    max_hold: str | None = Field("10 minutes", description="sources with consistency: transaction: how long an "
                                 "incomplete source transaction (an END whose changes are not all read, changes "
                                 "whose END is not read) is held at most; then its rows are applied as they are "
                                 "(split), logged with its id and counted (changelake_transactions_expired_total); "
                                 "null: no time bound (docs/pipelines.md, 'Transaction-consistent tables')")
    consistency_table: bool | None = Field(None, description="append a row per batch to "
                                           "<storage.root>/_changelake_consistency: the source position the tables "
                                           "are consistent to and each table's Delta version; default on when a "
                                           "source has consistency: transaction")

    lease_ttl: str = Field("1 minute", description="how long the pipeline's lease lasts without renewal "
                           "(renewed every third of it): a second instance of the pipeline refuses to start while "
                           "the lease is held, and takes over once it has expired (operations.md, 'One instance "
                           "per pipeline')")

    _interval = field_validator("trigger_interval", "lease_ttl", mode="before")(_check_duration)

    _ttl = field_validator("state_ttl", "max_hold", mode="before")(_check_optional_duration)

    def first_admission(self) -> int:
        """The admission of the first batch after a start (``first_batch_records``, else a sixteenth of
        ``max_records_per_batch`` and at least ``FIRST_BATCH_FLOOR``); only meaningful with a
        ``max_records_per_batch``: at or above it there is no ramp."""
        cap = self.max_records_per_batch or 0
        if self.first_batch_records is not None:
            return min(self.first_batch_records, cap) if cap else self.first_batch_records
        return max(FIRST_BATCH_FLOOR, cap // FIRST_BATCH_SHARE)


class KafkaSettings(_Model):
    bootstrap_servers: str = Field(description="host:port[,host:port...] of the Kafka brokers")
    properties: dict[str, SecretStr] = Field(default_factory=dict,
                                             description="librdkafka consumer properties (security.protocol, sasl.*, ssl.*)")
    reader: Literal["python", "spark-kafka"] = Field(
        "python", description="what reads Kafka (docs/operations.md, 'Kafka readers'): python (librdkafka in a Spark "
        "Python data source) or spark-kafka (Spark's own Kafka source, the spark-kafka JVM set on spark.jars; "
        "kafka.properties mapped to the Java client's)")
    spark_options: dict[str, SecretStr] = Field(
        default_factory=dict, description="reader spark-kafka: Spark Kafka source options passed as they are, over "
        "those changelake derives (failOnDataLoss, maxOffsetsPerTrigger, startingOffsets, kafka.<Java consumer "
        "property>, ...)")

    @field_validator("properties", "spark_options", mode="before")
    @classmethod
    def _scalars_as_text(cls, props: Any) -> Any:
        """YAML's ``enable.ssl.certificate.verification: false`` or ``fetch.max.bytes: 1048576`` as librdkafka
        takes them ('false', '1048576')."""
        if not isinstance(props, Mapping):
            return props
        return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) if isinstance(v, (int, float)) else v
                for k, v in props.items()}

    def plain_properties(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.properties.items()}

    def plain_spark_options(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.spark_options.items()}


class ColumnDecl(_Model):
    """A declared column with the wire encoding of its values, for sources without a schema in
    the messages: ``{type: timestamp, encoding: io.debezium.time.MicroTimestamp}``."""

    type: str
    encoding: str | None = Field(None, description="how the value is written on the wire (docs/formats.md, "
                                 "'Wire encodings'), e.g. io.debezium.time.MicroTimestamp, epoch-millis, iso-8601")
    scale: int | None = Field(None, ge=0, description="scale of a decimal sent as base64 bytes (default: the type's)")


def _check_columns(columns: Any) -> Any:
    """Types and encodings are checked before pydantic parses the entries, so that a mistake gets
    one error that lists what is accepted."""
    if isinstance(columns, Mapping):
        from changelake.formats.encodings import source_schema
        try:
            source_schema(columns)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
    return columns


class SequenceColumn(_Model):
    """``sequence_by: {column: updated_at}``: a user column (integer, date or timestamp) orders each key's changes."""

    column: str


class StartingTimestamp(_Model):
    """``starting_offsets: {timestamp: 2026-11-01T00:00:00Z}``: each partition starts at its first record whose
    Kafka timestamp is at or after this moment (a time without a zone is UTC); a partition with none starts
    at its end."""

    timestamp: datetime

    @property
    def epoch_ms(self) -> int:
        moment = self.timestamp if self.timestamp.tzinfo else self.timestamp.replace(tzinfo=timezone.utc)
        return int(moment.timestamp() * 1000)


_STARTING_FORMS = ("write earliest, latest, {timestamp: 2026-11-01T00:00:00Z} (ISO 8601; no zone: UTC) or "
                   "{topic: {partition: offset}}")


def starting_offsets_form(value: Any) -> Any:
    """``starting_offsets`` checked against the form it was meant as (``earliest``/``latest``, a timestamp, or
    offsets per topic and partition); ValueError with one message that shows the forms."""
    if isinstance(value, StartingTimestamp):
        return value
    if isinstance(value, str):
        if value in ("earliest", "latest"):
            return value
        raise ValueError(f"{value!r} is not a starting position{_did_you_mean(value, ('earliest', 'latest'))} "
                         f"({_STARTING_FORMS})")
    if isinstance(value, Mapping) and "timestamp" in value:
        if len(value) > 1:
            raise ValueError(f"{{timestamp: ...}} takes no other key (found {sorted(set(map(str, value)) - {'timestamp'})})")
        try:
            return StartingTimestamp.model_validate(dict(value))
        except ValidationError:
            raise ValueError(f"timestamp {value['timestamp']!r} is not a date and time; write ISO 8601, e.g. "
                             "2026-11-01T00:00:00Z or 2026-11-01 08:30:00+01:00 (no zone: UTC)") from None
    if isinstance(value, Mapping) and value:
        for topic, partitions in value.items():
            if not isinstance(partitions, Mapping) or not partitions or not all(
                    str(p).isdigit() and isinstance(o, int) and not isinstance(o, bool) for p, o in partitions.items()):
                raise ValueError(f"offsets of topic {topic!r}: {partitions!r} is not a mapping of partition -> offset "
                                 f"(whole numbers, e.g. {{0: 1200, 1: 0}}); {_STARTING_FORMS}")
        return value
    raise ValueError(f"{value!r} is not a starting position; {_STARTING_FORMS}")


class MaintenanceSpec(_Model):
    """Scheduled Delta maintenance of one table and its tombstone table, run after a batch's commits."""

    compact_every: str | None = Field("15 minutes", description="how often to check for small files and compact "
                                      "them (OPTIMIZE; readers see the same rows); null: never")
    compact_min_files: int = Field(32, ge=2, description="compact only when the table has more live files than this")
    vacuum_every: str | None = Field("1 day", description="how often to delete files the table no longer uses "
                                     "(VACUUM); null: never")
    vacuum_retention: str = Field("7 days", description="VACUUM keeps unused files this long: a reader or time "
                                  "travel older than this fails")

    _durations = field_validator("compact_every", "vacuum_every", mode="before")(_check_optional_duration)
    _retention = field_validator("vacuum_retention", mode="before")(_check_duration)


class TableSettings(_Model):
    """The settings of a Delta table that a pipeline writes: those of ``tables[]`` entries, and those a
    route rule gives every table it creates (``sources[].route[]``)."""

    primary_key: list[str] | None = Field(None, min_length=1, description="key columns; default: the field "
                                          "names of the Kafka message keys (Debezium key struct), learnt once")
    partition_by: list[str] = Field(default_factory=list)
    tombstone_retention: str = "7 days"
    maintenance: MaintenanceSpec = MaintenanceSpec()
    properties: dict[str, str] = Field(default_factory=dict, description="Delta table properties set on the "
                                       "table, e.g. delta.enableChangeDataFeed: 'true'; a table changelake "
                                       "creates gets delta.checkpointInterval: '10' unless they name another")
    schema_change: SchemaChange | None = Field(None, description="this table's schema_change behaviour "
                                               "(default: that of the source it mirrors)")

    _retention = field_validator("tombstone_retention", mode="before")(_check_duration)

    @field_validator("properties")
    @classmethod
    def _own_properties(cls, props: dict[str, str]) -> dict[str, str]:
        mine = sorted(k for k in props if k.startswith("changelake."))
        if mine:
            raise ValueError(f"properties {mine} are changelake's own (the sink sets them); remove them")
        return props

    def table_settings(self) -> dict[str, Any]:
        """The values of the fields a ``tables[]`` entry shares with this model (for a routed table's entry)."""
        shared = set(TableSpecModel.model_fields) - {"name", "from_", "path"}
        return {k: getattr(self, k) for k in type(self).model_fields if k in shared}


class TableSpecModel(TableSettings):
    name: str
    from_: str | None = Field(None, alias="from", description="the view or source whose changelog the table holds; "
                              "omit for a table that sources mirror through their 'table' key")
    path: str | None = Field(None, description="table URI; default <storage.root>/<name>")
    history: Literal["scd2"] | None = Field(None, description="scd2: keep every version of each key, with "
                                            "__start_at/__end_at (the _seq positions that opened and closed it; "
                                            "docs/sink.md 'History tables'); unset: the table holds the latest row")
    track_history: list[str] | None = Field(None, min_length=1, description="history: scd2 only: the columns "
                                            "whose changes open a new version; changes to the other columns update "
                                            "the current version in place (default: every column opens one)")

    @model_validator(mode="after")
    def _history(self) -> "TableSpecModel":
        if self.track_history is not None and self.history is None:
            raise ValueError("track_history applies to history tables; add history: scd2 or remove track_history")
        return self


class RouteRule(TableSettings):
    """One rule of a routed source (``sources[].route``): the changes of every source table whose name matches
    ``source_table`` go to the Delta table named by ``table``, created on first sight with this rule's settings.
    The first rule that matches a change's table wins."""

    source_table: str = Field(description="a regular expression over the change's own table name, "
                              "'<database>.<table>' ('<database>.<schema>.<table>' when the message names a "
                              "schema, as Debezium for Postgres does; OGG: its 'SCHEMA.TABLE'), matched whole")
    table: str = Field(description="the target table's name: a template in which $1..$9 are source_table's "
                       "capture groups and replace_symbol stands for the source table's own name")
    replace_symbol: str | None = Field(None, min_length=1, description="the text in 'table' (and 'path') that "
                                       "stands for the source table's name (its last part), e.g. '<>'")
    path: str | None = Field(None, description="table URI template (as 'table'); default <storage.root>/<table>")
    columns: dict[str, str | ColumnDecl] | None = Field(
        None, description="for messages without a schema: the columns of every table of this rule (name -> type or "
        "{type, encoding, scale}); default: names and types read from the values of the table's first batch")
    origin_columns: bool = Field(False, description="add the columns source_db and source_table (the change's "
                                 "own database and table) to the rows and to the primary key, so that rows of "
                                 "sharded tables merged into one table stay apart even when their keys collide")

    _columns = field_validator("columns", mode="before")(_check_columns)

    @model_validator(mode="after")
    def _check_rule(self) -> "RouteRule":
        try:
            rx = re.compile(self.source_table)
        except re.error as exc:
            raise ValueError(f"source_table is not a valid regular expression: {exc}") from None
        for template in (self.table, self.path or ""):
            for ref in re.findall(r"\$(\d+)", template):
                if int(ref) > rx.groups:
                    raise ValueError(f"{template!r} refers to ${ref}, but source_table {self.source_table!r} "
                                     f"has {rx.groups} capture group(s)")
        if self.origin_columns and self.primary_key and set(ORIGIN_COLUMNS) & set(self.primary_key):
            raise ValueError(f"origin_columns adds {list(ORIGIN_COLUMNS)} to the key itself; leave them out of "
                             "primary_key")
        return self


#: the columns ``origin_columns: true`` adds (the change's own database and table)
ORIGIN_COLUMNS = ("source_db", "source_table")
#: ``changelake dlq replay`` writes a dead letter of topic T to T + this, unless the source names a replay_topic
REPLAY_SUFFIX = ".replay"
#: the progress table of consistent cuts, under ``storage.root`` (``changelake.connectors.consistency``)
CONSISTENCY_TABLE = "_changelake_consistency"


class SourceSpec(_Model):
    name: str = Field(description="unique among sources; views and tables read the source by it")
    topics: list[str] | None = Field(None, description="the topics to read (or topic_pattern)")
    topic_pattern: str | None = Field(None, description="a regular expression over topic names (or topics)")
    format: Literal["debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json"] = Field(
        "debezium-json", description="the messages' change format (docs/formats.md)")
    options: dict[str, Any] = Field(default_factory=dict, description="the format's options (docs/formats.md); "
                                    "a value whose key names a credential (password, secret, token, user-info, "
                                    "...) is kept as a secret string")
    columns: dict[str, str | ColumnDecl] | None = Field(
        None, description="column name -> type (int, bigint, double, string, boolean, timestamp, date, decimal(p,s)), "
        "or -> {type, encoding, scale} to declare how a schema-less message encodes the value")
    starting_offsets: Literal["earliest", "latest"] | StartingTimestamp | dict[str, dict[str, int]] = Field(
        "earliest", description="where a new checkpoint starts: earliest, latest, {timestamp: 2026-11-01T00:00:00Z} "
        "(per partition, the first record at or after it, by the broker's offsets-for-times), or "
        "{topic: {partition: offset}}")
    on_error: Literal["fail", "skip", "dlq"] = Field(
        "dlq", description="a message that cannot be decoded: stop the pipeline, count and skip it, or dead-letter it")
    on_data_loss: Literal["fail", "skip"] = Field(
        "fail", description="records Kafka deleted (retention) before the pipeline read them: stop with an error "
        "naming topic, partition and the lost offsets, or skip the gap and count it in "
        "changelake_expired_offsets_skipped_total (docs/operations.md, 'Broker faults')")
    on_truncate: Literal["apply", "skip", "fail"] | None = Field(
        None, description="a TRUNCATE of the source table: apply (empty the mirrored table at the truncate's "
        "position), skip (count it) or fail (a dead letter naming the position). Default skip")
    schema_change: SchemaChange = Field(
        "lenient", description="what its tables do when the source's columns change (Flink CDC's "
        "schema.change.behavior): evolve, try_evolve, lenient, ignore or exception (docs/pipelines.md, "
        "'Schema changes')")
    dead_letter_topic: str | None = Field(None, description="Kafka topic for this source's dead letters "
                                          "(overrides dead_letter.topic); else the dead-letter Delta table")
    replay_topic: str | None = Field(None, description="the topic `changelake dlq replay` produces this source's "
                                     "dead letters to, read by the pipeline as part of this source with each "
                                     "message's original position (docs/operations.md, 'Dead letters'); default: "
                                     "<topic>.replay for each of its topics")
    table: str | None = Field(None, description="mirror the source into this table; omit when only views read it")
    route: list[RouteRule] | None = Field(None, min_length=1, description="route each change to a table named "
                                          "from the change's own database and table, created on first sight "
                                          "(docs/pipelines.md, 'Routing a database'); instead of 'table'")
    primary_key: list[str] | None = Field(None, description="the source rows' key, for views that read the source "
                                          "(default: the primary key of its table)")
    normalize: bool | None = Field(None, description="ChangelogNormalize behind the source for views: re-delivered "
                                   "changes become no-ops; default on when it has a primary key")
    event_time: str | None = Field(None, description="the column saying when each change happened (timestamp or "
                                   "epoch ms), for interval and temporal joins")
    watermark_delay: str | None = Field(None, description="how late (out of order) a row may arrive: the watermark "
                                        "is the largest event_time seen minus this (default 0)")
    append_only: bool = Field(False, description="the source only inserts (facts, events); an update or delete "
                              "from it is an error. Interval joins and a temporal join's facts need it")
    sequence_by: Literal["source", "kafka"] | SequenceColumn = Field(
        "source", description="what orders a key's changes: source (the database log position, compared within "
        "one server epoch; a failover or log reset starts a newer epoch, docs/formats.md 'Ordering'), kafka (the "
        "Kafka offset within the partition), or {column: name} (an integer, date or timestamp column; ties by "
        "offset). Changing it for an existing table needs a new table")
    consistency: Literal["offset", "transaction"] = Field(
        "offset", description="offset: a micro-batch applies what it read up to its Kafka offsets; transaction: only "
        "source transactions read in full (debezium-json with provide.transaction.metadata, maxwell-json), a partial "
        "one is held for a later batch (docs/pipelines.md, 'Transaction-consistent tables')")
    transaction_topic: str | None = Field(
        None, description="consistency: transaction on debezium-json: the connector's transaction metadata topic "
        "(default <topic.prefix>.transaction, the prefix being its topics' first name part)")
    unavailable_value: str | None = Field(
        UNAVAILABLE_VALUE, description="the text the connector writes for a value it did not send (Debezium's "
        "unavailable.value.placeholder: an unchanged TOASTed Postgres column); such a value keeps the stored one "
        "in the table and in the views. null: no placeholder")

    _delay = field_validator("watermark_delay", mode="before")(_check_optional_duration)

    _columns = field_validator("columns", mode="before")(_check_columns)

    @field_validator("starting_offsets", mode="before")
    @classmethod
    def _starting_form(cls, value: Any) -> Any:
        """One error that says which of the three forms was meant, instead of one per form."""
        return starting_offsets_form(value)

    @field_validator("options")
    @classmethod
    def _secret_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """Credentials among the format options (schema-registry ``basic-auth.user-info``) become
        ``SecretStr``, so that no dump, repr or log line shows them; decoders take either."""
        return {k: SecretStr(v) if isinstance(v, str) and is_secret_option(str(k)) else v for k, v in options.items()}

    @property
    def truncate_policy(self) -> str:
        """``on_truncate``, given here or among the format options (default skip)."""
        if self.on_truncate is not None:
            return self.on_truncate
        return str(self._truncate_option() or "skip").strip().lower()

    def _truncate_option(self) -> Any:
        from changelake.formats.options import normalize_key

        return next((v for k, v in self.options.items() if normalize_key(self.format, str(k)) == "on-truncate"), None)

    def decoder_options(self) -> dict[str, Any]:
        """The format options with ``on_truncate`` (Maxwell writes no truncates into row topics)."""
        if self.on_truncate is None or self.format == "maxwell-json":
            return dict(self.options)
        return {**self.options, "on-truncate": self.on_truncate}

    @model_validator(mode="after")
    def _one_topic_selector(self) -> "SourceSpec":
        if self.on_truncate is not None and self._truncate_option() is not None:
            raise ValueError("on_truncate is given both on the source and under its options; keep the source's")
        if isinstance(self.starting_offsets, StartingTimestamp) and self.topic_pattern is not None:
            raise ValueError("starting_offsets by timestamp needs 'topics' (a list): the topics a pattern matches "
                             "are not known when the checkpoint starts")
        if self.route is not None:
            if self.table is not None:
                raise ValueError("give 'table' (one table) or 'route' (a table per source table), not both")
            if self.columns is not None:
                raise ValueError("a routed source declares columns per route rule (route[].columns), not on the "
                                 "source")
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("give exactly one of 'topics' (a list) or 'topic_pattern' (a regular expression)")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern is not a valid regular expression: {exc}") from None
        if self.replay_topic is not None and (self.replay_topic in (self.topics or ()) or (
                self.topic_pattern is not None and re.fullmatch(self.topic_pattern, self.replay_topic))):
            raise ValueError(f"replay_topic {self.replay_topic!r} is one of the source's own topics; replays go to a "
                             "topic of the pipeline's own (default <topic>.replay), never to the database's")
        if self.replay_topic is not None and self.replay_topic == self.dead_letter_topic:
            raise ValueError("replay_topic and dead_letter_topic must differ")
        if self.consistency == "transaction":
            from changelake.formats.transactions import FORMATS

            if self.format not in FORMATS:
                raise ValueError(f"consistency: transaction needs transaction boundaries in the messages; format "
                                 f"{self.format!r} carries none that changelake reads (those that do: "
                                 f"{', '.join(FORMATS)}). Set consistency: offset")
            if self.format == "debezium-json" and self.transaction_topic is None and not self.topics:
                raise ValueError("consistency: transaction with a topic_pattern: name the connector's transaction "
                                 "metadata topic in transaction_topic")
        elif self.transaction_topic is not None:
            raise ValueError("transaction_topic is only read with consistency: transaction")
        return self

    def transaction_topic_name(self) -> str | None:
        """The Debezium transaction metadata topic a ``consistency: transaction`` source reads, else None."""
        if self.consistency != "transaction" or self.format != "debezium-json":
            return None
        return self.transaction_topic or f"{(self.topics or [''])[0].split('.')[0]}.transaction"

    def replay_topic_for(self, topic: str) -> str:
        """Where ``changelake dlq replay`` sends a dead letter read from ``topic``."""
        return self.replay_topic or topic + REPLAY_SUFFIX

    def topic_regex(self) -> str:
        """A regular expression that fully matches this source's topics."""
        if self.topic_pattern is not None:
            return f"(?:{self.topic_pattern})"
        return "|".join(re.escape(t) for t in self.topics or ())

    def replay_topic_regex(self) -> str:
        """A regular expression that fully matches this source's replay topics (those of a pattern as well)."""
        if self.replay_topic is not None:
            return re.escape(self.replay_topic)
        if self.topic_pattern is not None:
            return f"(?:{self.topic_pattern}){re.escape(REPLAY_SUFFIX)}"
        return "|".join(re.escape(t + REPLAY_SUFFIX) for t in self.topics or ())


def _consistency_problems(sources: list[SourceSpec], read: set[str], mirrors: str) -> list[tuple[tuple, str]]:
    """``consistency: transaction`` holds the rows of an incomplete transaction on the driver before the
    Delta sinks and the views (which then run on the driver, ``changelake.service.driver_graph``): one
    query must see every table's and view's rows."""
    problems: list[tuple[tuple, str]] = []
    topics = {s.transaction_topic_name() for s in sources} - {None}
    for i, s in enumerate(sources):
        if s.consistency != "transaction":
            continue
        if read and mirrors == "own_query":
            problems.append((("sources", i, "consistency"), f"source {s.name!r} has consistency: transaction, and "
                             "pipeline.mirrors is own_query: the mirrors' query and the views' query would each cut "
                             "their own batches, so no batch is one transaction-consistent cut of all tables. Set "
                             "pipeline.mirrors: with_graph"))
        if len(topics) > 1 and s.transaction_topic_name() is not None:
            problems.append((("sources", i, "transaction_topic"), f"source {s.name!r}: the sources with "
                             f"consistency: transaction read different transaction metadata topics {sorted(topics)}; "
                             "one pipeline follows one connector's transactions (run one pipeline per connector)"))
    return problems


def _sequence_by_problems(i: int, s: SourceSpec) -> list[tuple[tuple, str]]:
    """``sequence_by: {column: c}`` must name a declared column of an integer, date or timestamp type (without
    declared columns the decoder checks it on the first batch)."""
    if not isinstance(s.sequence_by, SequenceColumn):
        return []
    from changelake.formats.encodings import source_schema
    from changelake.formats.sequence import column_fits

    where = ("sources", i, "sequence_by", "column")
    name = s.sequence_by.column
    if s.route is not None:
        return [(where, f"source {s.name!r} is routed: its tables have different columns, so sequence_by cannot "
                        "name a column; use source or kafka")]
    if s.columns is None:
        return []
    if name not in s.columns:
        return [(where, f"source {s.name!r}: sequence_by names column {name!r}, which is not among its columns "
                        f"{sorted(s.columns)}{_did_you_mean(name, list(s.columns))}")]
    type_ = source_schema({name: s.columns[name]}).field(name).type
    if not column_fits(type_):
        return [(where, f"source {s.name!r}: sequence_by column {name!r} is {type_}; it must be an integer, date or "
                        "timestamp column (or use sequence_by: kafka)")]
    return []


def _yaml_on(cls, data: Any) -> Any:
    # YAML 1.1 reads an unquoted key `on` as the boolean true (a key "True" once environment-expanded)
    if isinstance(data, dict) and "on" not in data:
        data = {("on" if k is True or k == "True" else k): v for k, v in data.items()}
    return data


class JoinSpec(_Model):
    left: str
    right: str
    on: dict[str, str] = Field(min_length=1, description="left column -> right column")
    how: Literal["inner", "left", "right", "full", "semi", "anti"] = "inner"

    _yaml_on = model_validator(mode="before")(_yaml_on)


class LookupJoinSpec(_Model):
    lookup: str = Field(description="the name of an entry under 'lookups'")
    on: dict[str, str] = Field(min_length=1, description="stream column -> lookup key column (the whole key)")
    how: Literal["inner", "left"] = "inner"

    _yaml_on = model_validator(mode="before")(_yaml_on)


class IntervalJoinSpec(JoinSpec):
    """``left.time BETWEEN right.time - before AND right.time + after`` on insert-only, event-timed inputs."""

    how: Literal["inner", "left", "right", "full"] = "inner"
    before: str = Field(description="how far the left row's time may lie before the right row's ('10 minutes')")
    after: str = Field(description="how far the left row's time may lie after the right row's ('0 seconds')")
    left_time: str | None = Field(None, description="the left input's event-time column (default: its only one)")
    right_time: str | None = Field(None, description="the right input's event-time column (default: its only one)")
    late_rows: Literal["drop", "dead_letter"] = Field("drop", description="rows behind the watermark: counted, then "
                                                      "dropped or written to the dead-letter path")

    _durations = field_validator("before", "after", mode="before")(_check_signed_duration)


class TemporalJoinSpec(JoinSpec):
    """Facts (left) joined with the version of ``right`` (a keyed changelog) valid at each fact's event time."""

    how: Literal["inner", "left"] = "inner"
    time: str | None = Field(None, description="the facts' event-time column (default: their only one)")
    version_time: str | None = Field(None, description="the versions' event-time column (default: their only one)")
    late_rows: Literal["drop", "dead_letter"] = "drop"


class DeduplicateSpec(_Model):
    keys: list[str] = Field(min_length=1)
    keep: Literal["first", "last"] = "last"
    order_by: str | None = Field(None, description="keep by this column's order instead of arrival (insert-only input)")


class TopNSpec(_Model):
    n: int = Field(gt=0)
    order_by: list[str] = Field(min_length=1, description="'column', 'column desc', 'column asc nulls first'")
    partition_by: list[str] = Field(default_factory=list)
    rank_column: str | None = None
    two_level: int | None = Field(None, ge=2,
                                  description="plan as a two-level Top-N over this many hash buckets of the row key "
                                              "(a hot partition, or a global Top-N); default: single level")


#: the keys of a view that name its operation; exactly one per view (group_by goes with aggregates)
VIEW_OPERATIONS = ("join", "interval_join", "temporal_join", "lookup_join", "deduplicate", "filter", "select",
                   "aggregates", "top_n", "sql")
#: the operations that name their two inputs themselves (left, right) instead of 'from'
TWO_INPUT_OPERATIONS = ("join", "interval_join", "temporal_join")


class ViewSpec(_Model):
    """One operator of the graph: ``from`` (its input) plus exactly one operation; a join names both inputs."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    from_: str | None = Field(None, alias="from")
    join: JoinSpec | None = None
    interval_join: IntervalJoinSpec | None = None
    temporal_join: TemporalJoinSpec | None = None
    lookup_join: LookupJoinSpec | None = None
    deduplicate: DeduplicateSpec | None = None
    filter: str | None = Field(None, description="SQL predicate")
    select: dict[str, str] | list[str] | None = Field(None, description="output column -> SQL expression, or names")
    group_by: list[str] | None = None
    aggregates: dict[str, str] | None = Field(None, description="output column -> 'count(*)', 'sum(col)', ...")
    top_n: TopNSpec | None = None
    sql: str | None = Field(None, description="the view as one Flink SQL query over sources, views defined above it "
                            "and lookups (docs/pipelines.md, 'Views in SQL'); no 'from'")
    state_ttl: str | None = Field(None, description="this view's idle-state retention (default: pipeline.state_ttl)")
    on_stale_retraction: Literal["warn", "fail"] | None = None

    _ttl = field_validator("state_ttl", mode="before")(_check_optional_duration)

    @model_validator(mode="after")
    def _one_operation(self) -> "ViewSpec":
        given = [k for k in VIEW_OPERATIONS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"view {self.name!r} must have exactly one of {list(VIEW_OPERATIONS)}; it has {given}")
        if self.group_by is not None and self.aggregates is None:
            raise ValueError(f"view {self.name!r}: group_by needs aggregates")
        if self.sql is not None:
            if self.from_ is not None:
                raise ValueError(f"view {self.name!r}: a sql view names what it reads in its query's FROM; drop 'from'")
        elif (self.two_inputs is None) == (self.from_ is None):
            raise ValueError(f"view {self.name!r}: give 'from' (its input), or a join with left and right, not both")
        return self

    @property
    def two_inputs(self) -> JoinSpec | None:
        """The view's join spec (join, interval_join or temporal_join), if it is one."""
        return next((getattr(self, k) for k in TWO_INPUT_OPERATIONS if getattr(self, k) is not None), None)

    def read_names(self) -> list[str]:
        """The names the view reads: sources and views, and (a sql view's) lookups."""
        if self.sql is not None:
            from changelake.plan.sql_view import read_names

            try:
                return read_names(self.sql)
            except ValueError:
                return []             # the syntax error is reported where the view is planned
        j = self.two_inputs
        return [j.left, j.right] if j else [self.from_]

    @property
    def inputs(self) -> list[str]:
        """The sources and views the view reads (a sql view: every name its query reads, lookups too;
        :meth:`ChangelakeConfig.view_inputs` leaves the lookups out)."""
        return self.read_names()


class LookupCacheSpec(_Model):
    max_rows: int = Field(100_000, ge=0, description="keys kept (least recently used evicted); 0: no cache")
    ttl: str | None = Field("10 minutes", description="how long a looked-up row (or its absence) is reused; "
                            "'0 s': no cache; null: until evicted")

    _ttl = field_validator("ttl", mode="before")(_check_optional_duration)


class DeltaLookupSpec(_Model):
    path: str = Field(description="table URI; a relative path is a table under storage.root")


class PostgresLookupSpec(_Model):
    url: str = Field(description="jdbc:postgresql://host:port/database or postgresql://host:port/database")
    table: str = Field(description="table name, or schema.table")
    user: str | None = None
    password_env: str | None = Field(None, description="name of the environment variable holding the password "
                                     "(set on the driver and the executors)")
    connect_timeout: str = "5 seconds"
    retries: int = Field(3, ge=0, description="reconnects of a broken connection before the batch fails")

    _timeout = field_validator("connect_timeout", mode="before")(_check_duration)

    @field_validator("url")
    @classmethod
    def _no_password_in_url(cls, url: str) -> str:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(url[len("jdbc:"):] if url.startswith("jdbc:") else url)
        if parts.password or "password" in parse_qs(parts.query):
            raise ValueError("the URL holds a password; put it in an environment variable and name it in "
                             "password_env")
        return url


class LookupSpec(_Model):
    """A dimension table that views look keys up in (``lookup_join``); exactly one of delta / postgres."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    delta: DeltaLookupSpec | None = None
    postgres: PostgresLookupSpec | None = None
    columns: dict[str, str] = Field(min_length=1, description="the columns the join reads: name -> type")
    key: list[str] = Field(min_length=1, description="the columns looked up by; one row per key")
    cache: LookupCacheSpec = LookupCacheSpec()
    batch_size: int | None = Field(None, gt=0, description="keys per query (default: delta 10000, postgres 1000)")
    max_concurrency: int | None = Field(None, gt=0, description="queries at once (default: delta 1, postgres 4)")

    @model_validator(mode="after")
    def _one_table(self) -> "LookupSpec":
        if (self.delta is None) == (self.postgres is None):
            raise ValueError(f"lookup {self.name!r}: give exactly one of 'delta' (path) or 'postgres' (url, table)")
        missing = [k for k in self.key if k not in self.columns]
        if missing:
            raise ValueError(f"lookup {self.name!r}: key column(s) {missing} are not under its columns")
        return self


class StorageSettings(_Model):
    root: str = Field("./lake", description="where tables without a path live: <root>/<table name> (a directory "
                      "or an object-store URI)")
    options: dict[str, SecretStr] = Field(default_factory=dict, description="object-store options for delta-rs / Hadoop")
    engine: Literal["auto", "delta-rs", "delta-spark"] = Field(
        "auto", description="the Delta writer (docs/sink.md): delta-spark when its jars are present, else delta-rs")
    reduce_on: Literal["auto", "driver", "executors"] = Field(
        "auto", description="where a batch's changes are reduced to one per key (docs/sink.md, \"What the driver "
        "holds\"): executors (the batch stays distributed; delta-rs then collects one row per key), driver (the "
        "batch is collected), auto: executors with delta-spark, driver with delta-rs")

    def plain_options(self) -> dict[str, str]:
        """The options as delta-rs gets them: the secrets revealed, and on S3 the commit mode added when the
        user chose none (``changelake.connectors.object_store``)."""
        from changelake.connectors.object_store import delta_options

        return delta_options({k: v.get_secret_value() for k, v in self.options.items()}, [self.root])


class DeadLetterSettings(_Model):
    path: str | None = Field(None, description="Delta quarantine table; default <storage.root>/_dead_letters")
    topic: str | None = Field(None, description="Kafka topic for dead letters (every source with on_error: dlq "
                              "that names no dead_letter_topic of its own); unset: the Delta table")


class MetricsSettings(_Model):
    host: str = Field("0.0.0.0", description="address of /metrics, /healthz and /readyz")
    port: int = Field(9108, ge=0, le=65535, description="their port (0 picks a free one)")
    ready_after_intervals: int = Field(3, gt=0, description="/readyz fails when no batch finished within this many trigger intervals")
    stalled_after: str = Field("10 minutes", description="/livez fails (so Kubernetes restarts the pod) when the "
                               "running query has finished no batch, and the running batch no task, for this long "
                               "while records wait in Kafka or a batch is running: a hung query. Longer than the "
                               "slowest read task you expect (a first catch-up batch's)")

    _stalled = field_validator("stalled_after")(_check_duration)


class LoggingSettings(_Model):
    format: Literal["text", "json"] = Field("text", description="text, or json: one JSON object per line (ts, level, "
                                            "logger, msg, exception); --log-format or CHANGELAKE_LOG_FORMAT wins")
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="the service's log level; --log-level or CHANGELAKE_LOG_LEVEL wins")
    row_values: bool = Field(False, description="show row values in log lines and errors about a row (stale "
                             "retractions, values that do not fit a column); off: keys and counts only. Sets "
                             "CHANGELAKE_LOG_ROW_VALUES=1 for the process and its Spark workers (a cluster's "
                             "executors: spark.executorEnv.CHANGELAKE_LOG_ROW_VALUES)")

    @field_validator("format", "level", mode="before")
    @classmethod
    def _case(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        return value.lower() if info.field_name == "format" else value.upper()


class ChangelakeConfig(_Model):
    pipeline: PipelineSettings
    kafka: KafkaSettings
    sources: list[SourceSpec] = Field(min_length=1)
    lookups: list[LookupSpec] = Field(default_factory=list)
    views: list[ViewSpec] = Field(default_factory=list)
    tables: list[TableSpecModel] = Field(default_factory=list, description="the tables the pipeline writes "
                                         "(routed sources create theirs as they see them)")
    storage: StorageSettings = StorageSettings()
    dead_letter: DeadLetterSettings = DeadLetterSettings()
    metrics: MetricsSettings = MetricsSettings()
    logging: LoggingSettings = LoggingSettings()

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> "ChangelakeConfig":
        if info.context and info.context.get("collect_references"):
            return self                 # parse_config collects every problem itself, each with its path
        problems = self.reference_problems()
        if problems:
            raise ValueError("; ".join(message for _, message in problems))
        return self

    def reference_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Every broken reference between sections, as (YAML path, message): names are unique per
        section, sources and views read defined names, every table has one writer, nothing dangles."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for section, items in (("sources", self.sources), ("lookups", self.lookups), ("views", self.views),
                               ("tables", self.tables)):
            seen: dict[str, int] = {}
            for i, item in enumerate(items):
                if item.name in seen:
                    problems.append(((section, i, "name"), f"{section} names must be unique; {item.name!r} is "
                                     f"also {section}.{seen[item.name]}"))
                seen.setdefault(item.name, i)
        names = [t.name for t in self.tables]
        if not self.tables and not any(s.route for s in self.sources):
            problems.append((("tables",), "the pipeline writes no table: list tables under 'tables', or give a "
                             "source a 'route'"))
        for i, s in enumerate(self.sources):
            if s.table is not None and s.table not in names:
                problems.append((("sources", i, "table"), f"source {s.name!r} writes to table {s.table!r}, which "
                                 f"is not under 'tables'{_did_you_mean(s.table, names)} (known: {names})"))
        sources = [s.name for s in self.sources]
        defined = list(sources)
        lookups = [lk.name for lk in self.lookups]
        for i, v in enumerate(self.views):
            if v.lookup_join is not None and v.lookup_join.lookup not in lookups:
                problems.append((("views", i, "lookup_join", "lookup"), f"view {v.name!r}: lookup_join names lookup "
                                 f"{v.lookup_join.lookup!r}, which is not under 'lookups'"
                                 f"{_did_you_mean(v.lookup_join.lookup, lookups)} (defined: {lookups})"))
            inputs = self.view_inputs(v)
            for which, inp in zip(("left", "right") if v.two_inputs else ("sql",) * len(inputs) if v.sql else ("from",),
                                  inputs):
                if inp not in defined:
                    where = ("views", i, which) if which in ("from", "sql") else \
                        ("views", i, next(k for k in TWO_INPUT_OPERATIONS if getattr(v, k) is not None), which)
                    problems.append((where, f"view {v.name!r} reads {inp!r}, which is neither a source nor a view "
                                     f"defined above it{_did_you_mean(inp, defined)} (defined: {defined})"))
            if v.name in sources:
                problems.append((("views", i, "name"), f"view {v.name!r}: the name is already used by a source"))
            defined.append(v.name)
        read = {i for v in self.views for i in self.view_inputs(v)} | {t.from_ for t in self.tables if t.from_}
        for i, t in enumerate(self.tables):
            if t.from_ is not None and t.from_ not in defined:
                problems.append((("tables", i, "from"), f"table {t.name!r} reads from {t.from_!r}, which is neither "
                                 f"a source nor a view{_did_you_mean(t.from_, defined)} (defined: {defined})"))
            mirrors = [s.name for s in self.sources if s.table == t.name]
            if t.from_ is not None and mirrors:
                problems.append((("tables", i, "from"), f"table {t.name!r} has 'from: {t.from_}' and is also the "
                                 f"table of source(s) {mirrors}; a table has one writer"))
            if t.from_ is not None and not t.primary_key:
                problems.append((("tables", i), f"table {t.name!r} reads from {t.from_!r}, so it needs a primary_key "
                                 "(keys are learnt from Kafka message keys only for tables that sources mirror)"))
            if t.from_ is None and not mirrors:
                problems.append((("tables", i), f"table {t.name!r} has no writer: give it 'from' (a view or source) "
                                 "or name it as a source's 'table'"))
        for i, s in enumerate(self.sources):
            if s.truncate_policy == "apply" and s.name in read:
                problems.append((("sources", i, "on_truncate"),
                                 f"source {s.name!r} has on_truncate: apply, but views or tables read it: a truncate "
                                 "would empty its mirror while the views' state (joins, aggregates) kept the rows. Set "
                                 "on_truncate: skip or fail for it, or give it a source entry of its own that only "
                                 "mirrors (docs/formats.md, 'Truncates')"))
            if s.route is not None and s.name in read:
                problems.append((("sources", i, "route"), f"source {s.name!r} is routed to tables of its own, so "
                                 "views and tables cannot read it; give them a source entry of their own for "
                                 "the topics they need"))
            if s.truncate_policy == "apply" and s.table is not None and \
                    next((t.history for t in self.tables if t.name == s.table), None) is not None:
                problems.append((("sources", i, "on_truncate"),
                                 f"source {s.name!r} has on_truncate: apply, but its table {s.table!r} is a history "
                                 "table (history: scd2), which keeps every version and does not apply truncates. "
                                 "Set on_truncate: skip or fail"))
            problems.extend(_sequence_by_problems(i, s))
            if s.table is None and s.route is None and s.name not in read:
                problems.append((("sources", i), f"source {s.name!r} has no 'table' and no view or table reads it"))
        problems.extend(_consistency_problems(self.sources, read, self.pipeline.mirrors))
        for i, v in enumerate(self.views):
            if v.name not in read:
                problems.append((("views", i), f"view {v.name!r} is not read by any view or table"))
        used = {v.lookup_join.lookup for v in self.views if v.lookup_join is not None}
        used |= {n for v in self.views if v.sql is not None for n in v.read_names()}
        for i, lk in enumerate(self.lookups):
            if lk.name not in used:
                problems.append((("lookups", i), f"lookup {lk.name!r} is not used by any view's lookup_join"))
        return problems

    def consistent_sources(self) -> list[SourceSpec]:
        """The sources with ``consistency: transaction``."""
        return [s for s in self.sources if s.consistency == "transaction"]

    def writes_consistency_table(self) -> bool:
        """Whether each batch appends its row to ``_changelake_consistency`` (``pipeline.consistency_table``)."""
        wanted = self.pipeline.consistency_table
        return bool(self.consistent_sources()) if wanted is None else wanted

    def consistency_table_path(self) -> str:
        return _join(self.storage.root, CONSISTENCY_TABLE)

    def view_inputs(self, view: ViewSpec) -> list[str]:
        """The sources and views ``view`` reads (its query's names that are not lookups)."""
        lookups = {lk.name for lk in self.lookups}
        return [n for n in view.inputs if n not in lookups]

    def table(self, name: str) -> TableSpecModel:
        return next(t for t in self.tables if t.name == name)

    def table_path(self, name: str) -> str:
        t = self.table(name)
        return t.path if t.path else _join(self.storage.root, name)

    def schema_change_of(self, table: str) -> str:
        """The ``schema_change`` behaviour of a table: its own, else that of the first source mirroring
        it, else ``lenient`` (a graph table)."""
        own = self.table(table).schema_change
        if own is not None:
            return own
        return next((s.schema_change for s in self.sources if s.table == table), "lenient")

    def lookup_path(self, name: str) -> str:
        """A Delta lookup's table URI (a relative path is under ``storage.root``)."""
        path = next(lk for lk in self.lookups if lk.name == name).delta.path
        return path if "://" in path or Path(path).is_absolute() else _join(self.storage.root, path)

    def dead_letter_path(self) -> str:
        return self.dead_letter.path or _join(self.storage.root, "_dead_letters")

    def dead_letter_topic(self, source: str) -> str | None:
        """The Kafka topic that receives ``source``'s dead letters, or None for the Delta table."""
        spec = next(s for s in self.sources if s.name == source)
        return spec.dead_letter_topic or self.dead_letter.topic

    def redacted(self) -> dict[str, Any]:
        """A log-safe dump: secrets shown as '**********'."""
        return self.model_dump(mode="json")


def _join(root: str, name: str) -> str:
    if "://" in root:
        return root.rstrip("/") + "/" + name
    return str(Path(root).absolute() / name)


# ----------------------------------------------------------------------------
#: a path into the configuration, as pydantic reports it: ("sources", 0, "format")
Loc = tuple[str | int, ...]
#: the sections that are lists of named items (an environment override names an item by name or index)
LIST_SECTIONS = ("sources", "lookups", "views", "tables")

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _did_you_mean(word: str, choices: Any) -> str:
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def format_loc(loc: Loc) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


class Origins:
    """Where each value of a configuration came from: a line of the YAML file, an environment
    variable (an override, or a ``${VAR}`` reference), or a secret file (``<key>_file``)."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.lines: dict[Loc, int] = {}
        self.other: dict[Loc, str] = {}
        #: what is valid but unwise (a credential written in the file), each as an error line is
        self.warnings: list[str] = []

    def read_lines(self, text: str) -> None:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            return

        def walk(node: yaml.Node, loc: Loc) -> None:
            self.lines.setdefault(loc, node.start_mark.line + 1)
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    self.lines[(*loc, str(key.value))] = key.start_mark.line + 1
                    walk(value, (*loc, str(key.value)))
            elif isinstance(node, yaml.SequenceNode):
                for i, value in enumerate(node.value):
                    walk(value, (*loc, i))

        if root is not None:
            walk(root, ())

    def at(self, loc: Loc) -> str:
        """The nearest recorded origin of ``loc`` or of the value that holds it."""
        for n in range(len(loc), -1, -1):
            key = tuple(loc[:n])
            if key in self.other:
                return self.other[key]
            if key in self.lines and key:
                return f"{self.origin}:{self.lines[key]}"
        return self.origin

    def problem(self, loc: Loc, message: str) -> str:
        """One line of an error listing: path, message, where the value came from."""
        flat = " ".join(message.split())
        return f"{format_loc(loc)}: {flat} [{self.at(loc)}]"


def _expand_env(node: Any, loc: Loc, errors: list[str], environ: Mapping[str, str], origins: Origins) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            key = str(k)
            if key.lower().endswith(FILE_SUFFIX) and isinstance(v, str):
                target = (*loc, key[: -len(FILE_SUFFIX)])
                origins.other[target] = f"secret file {v} ({origins.at((*loc, key))})"
                out[target[-1]] = _secret_file(v, (*loc, key), errors, origins)
                continue
            out[key] = _expand_env(v, (*loc, key), errors, environ, origins)
        return out
    if isinstance(node, list):
        return [_expand_env(v, (*loc, i), errors, environ, origins) for i, v in enumerate(node)]
    if isinstance(node, str):
        def sub(m: re.Match[str]) -> str:
            val = environ.get(m.group(1), m.group(2))
            if val is None:
                errors.append(origins.problem(loc, f"environment variable {m.group(1)} is not set"))
                return ""
            origins.other[loc] = f"environment variable {m.group(1)}, referenced at {origins.at(loc)}"
            return val
        return _ENV_REF.sub(sub, node)
    return node


def _secret_file(path: str, loc: Loc, errors: list[str], origins: Origins) -> str:
    """The content of a secret file (``<key>_file``), stripped; an error (and '') when it cannot be read."""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        errors.append(origins.problem(loc, f"cannot read secret file {path!r}: {exc.strerror}"))
        return ""


def _list_item(items: list[Any], part: str, loc: Loc, variable: str) -> int:
    """The index of the list item an override names, by index or by its ``name``; ConfigError if none."""
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    if part.isdigit():
        if int(part) < len(items):
            return int(part)
        raise ConfigError(f"{variable}: {format_loc(loc)} has {len(items)} item(s), so there is no index {part} "
                          f"(names: {names})")
    for exact in (True, False):
        hits = [i for i, n in enumerate(names) if isinstance(n, str) and (n == part if exact else n.lower() == part.lower())]
        if len(hits) == 1:
            return hits[0]
    raise ConfigError(f"{variable}: no item of {format_loc(loc)} is named {part!r}{_did_you_mean(part, names)} "
                      f"(names: {names}; an index such as 0 works too)")


def _apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str], origins: Origins, errors: list[str]) -> None:
    """CHANGELAKE_<SECTION>__<KEY>[__<KEY>...] = value.

    Under ``kafka.properties`` the last part names a librdkafka property with ``_`` for ``.``
    (``..._SASL_PASSWORD`` -> ``sasl.password``); under ``storage.options`` it is lower-cased as is
    (``AWS_ACCESS_KEY_ID`` -> ``aws_access_key_id``). An item of a list section is named by its
    ``name`` or its index: ``CHANGELAKE_SOURCES__orders__FORMAT``, ``CHANGELAKE_TABLES__0__PATH``.
    A value starting with ``[`` or ``{`` is read as YAML (``CHANGELAKE_SOURCES__orders__TOPICS=[a, b]``).
    An override that names no section, no list item or no mapping is an error, never ignored.
    """
    for variable, value in sorted(environ.items()):
        if not variable.startswith(ENV_PREFIX) or "__" not in variable:
            continue
        parts = variable[len(ENV_PREFIX):].split("__")
        if not all(parts):
            errors.append(f"{variable}: empty part between '__' separators")
            continue
        section = parts[0].lower()
        if section not in ChangelakeConfig.model_fields:
            errors.append(f"{variable}: there is no configuration section {section!r}"
                          f"{_did_you_mean(section, ChangelakeConfig.model_fields)} "
                          f"(sections: {list(ChangelakeConfig.model_fields)})")
            continue
        try:
            node: Any = data
            loc: Loc = ()
            for depth, part in enumerate(parts):
                last = depth == len(parts) - 1
                if isinstance(node, list):
                    if last:
                        raise ConfigError(f"{variable}: {format_loc(loc)} is a list; name an item and a key in it, "
                                          f"e.g. {variable}__<KEY>")
                    i = _list_item(node, part, loc, variable)
                    node, loc = node[i], (*loc, i)
                    if not isinstance(node, dict):
                        raise ConfigError(f"{variable}: {format_loc(loc)} is not a mapping")
                    continue
                key = part.lower()
                from_file = last and key.endswith(FILE_SUFFIX)
                if from_file:                   # ..._SASL_PASSWORD_FILE: sasl.password, read from the file
                    key = key[: -len(FILE_SUFFIX)]
                if loc == ("kafka", "properties"):
                    key = key.replace("_", ".")
                if from_file:
                    origins.other[(*loc, key)] = f"secret file {value} (environment variable {variable})"
                    node[key] = _secret_file(value, (*loc, key), errors, origins)
                    break
                if last:
                    node[key] = yaml.safe_load(value) if value.strip()[:1] in ("[", "{") else value
                    origins.other[(*loc, key)] = f"environment variable {variable}"
                    break
                child = node.get(key)
                if loc == () and key in LIST_SECTIONS:
                    if not isinstance(child, list):
                        raise ConfigError(f"{variable}: the file has no '{key}' list to override an item of")
                elif not isinstance(child, dict):
                    child = node[key] = {}
                node, loc = child, (*loc, key)
        except ConfigError as exc:
            errors.append(str(exc))


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> ChangelakeConfig:
    """Read and validate a pipeline YAML; raise ConfigError listing every problem with its path."""
    config, problems, origins = check_config(path, environ=environ)
    if problems:
        raise ConfigError(problem_listing(str(path), problems))
    assert config is not None
    for warning in origins.warnings:
        _log.warning("%s", warning)
    return config


def read_config_file(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the pipeline file {str(path)!r}: {exc.strerror}") from None


def check_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
                 ) -> tuple[ChangelakeConfig | None, list[str], Origins]:
    """The configuration of a YAML file (None if invalid), every problem found, and where values came from."""
    return check_config_text(read_config_file(path), environ=environ, origin=str(path))


def parse_config(text: str, *, environ: Mapping[str, str] | None = None, origin: str = "<config>") -> ChangelakeConfig:
    config, problems, _ = check_config_text(text, environ=environ, origin=origin)
    if problems:
        raise ConfigError(problem_listing(origin, problems))
    assert config is not None
    return config


def problem_listing(origin: str, problems: list[str]) -> str:
    return f"{origin} has {len(problems)} error(s):\n" + "\n".join(f"  - {e}" for e in problems)


def check_config_text(text: str, *, environ: Mapping[str, str] | None = None, origin: str = "<config>"
                      ) -> tuple[ChangelakeConfig | None, list[str], Origins]:
    """Every problem of a configuration, each with its YAML path and where its value came from:
    the fields of every section first; when they are all valid, the references between sections."""
    environ = os.environ if environ is None else environ
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping with pipeline, kafka, sources, tables")
    from changelake.service import config_checks

    origins = Origins(origin)
    origins.read_lines(text)
    errors: list[str] = []
    data = _expand_env(data, (), errors, environ, origins)
    _apply_env_overrides(data, environ, origins, errors)
    config: ChangelakeConfig | None = None
    try:
        config = ChangelakeConfig.model_validate(data, context={"collect_references": True})
    except ValidationError as exc:
        errors.extend(origins.problem(tuple(err["loc"]), _message(err)) for err in exc.errors())
    kafka = data.get("kafka")
    properties = kafka.get("properties") if isinstance(kafka, dict) else None
    warnings = []
    if isinstance(properties, dict):
        wrong = config_checks.kafka_property_problems(properties)
        errors.extend(origins.problem(loc, message) for loc, message in wrong)
        together = None if wrong else config_checks.client_warning(properties)
        if together:
            warnings.append(origins.problem(("kafka", "properties"), together))
    if config is not None:
        checks = (config.reference_problems() + config_checks.partition_problems(config)
                  + config_checks.reader_problems(config) + config_checks.engine_problems(config))
        errors.extend(origins.problem(loc, message) for loc, message in checks)
    if errors:      # else the views' own check lists them beside every other view's (views.graph_problems)
        errors.extend(origins.problem(loc, message) for loc, message in config_checks.sql_problems(data))
    origins.warnings = warnings + config_checks.secret_warnings(data, origins)
    return (None if errors else config), errors, origins


def _message(err: Any) -> str:
    """Pydantic's message (a validator's own without pydantic's "Value error, "), with the keys that were
    meant for an unknown one."""
    if err["type"] == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])
    if err["type"] != "extra_forbidden":
        return err["msg"]
    key = str(err["loc"][-1])
    known = _known_keys(err["loc"][:-1])
    hint = _did_you_mean(key, known) if known else ""
    return f"unknown key {key!r}{hint}" + (f" (keys here: {', '.join(known)})" if known else "")


def _known_keys(loc: Loc) -> list[str]:
    """The keys the model accepts at ``loc`` (empty when it is not a model)."""
    import types
    import typing

    def members(t: Any) -> list[Any]:
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            return [m for a in typing.get_args(t) for m in members(a)]
        return [t]

    kinds: list[Any] = [ChangelakeConfig]
    for part in loc:
        nxt: list[Any] = []
        for t in (m for k in kinds for m in members(k)):
            if isinstance(t, type) and issubclass(t, BaseModel) and isinstance(part, str):
                f = next((f for n, f in t.model_fields.items() if part in (n, f.alias)), None)
                if f is not None:
                    nxt.append(f.annotation)
            elif typing.get_origin(t) is list and isinstance(part, int):
                nxt.append(typing.get_args(t)[0])
            elif typing.get_origin(t) is dict and isinstance(part, str):
                nxt.append(typing.get_args(t)[1])
        kinds = nxt
    for t in (m for k in kinds for m in members(k)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return [f.alias or n for n, f in t.model_fields.items()]
    return []
