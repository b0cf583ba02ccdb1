"""Pipeline configuration: YAML, environment overrides and secrets.

Precedence, lowest first: the YAML file; ``${VAR}`` references inside it; environment
variables ``CHANGELAKE_<SECTION>__<KEY>[__<KEY>...]`` (e.g.
``CHANGELAKE_KAFKA__BOOTSTRAP_SERVERS``; ``CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD``
sets ``kafka.properties["sasl.password"]``); and, for any string value, a sibling key
ending in ``_file`` whose file content replaces it (Kubernetes secret mounts).

Errors are reported all at once, each with its path in the YAML.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from changelake.durations import parse_duration
from changelake.errors import ConfigError

ENV_PREFIX = "CHANGELAKE_"
FORMATS = ("debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json")
class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


def _check_signed_duration(value: str) -> str:
    """A duration that may start with '-' (an interval bound on the other side)."""
    parse_duration(str(value).strip().lstrip("-").strip())
    return value


def _check_optional_duration(value: str | None) -> str | None:
    return None if value is None else _check_duration(value)


class PipelineSettings(_Model):
    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="stable pipeline id; part of the Delta transaction ids")
    checkpoint: str = Field(description="Spark checkpoint directory (one writer per checkpoint)")
    trigger_interval: str = "10 seconds"
    available_now: bool = Field(False, description="read what is there, then stop (batch-style catch-up)")
    max_records_per_batch: int | None = Field(200_000, gt=0)
    read_tasks: int = Field(2, gt=0, description="Spark tasks that read Kafka per micro-batch; about the executor cores")
    state_ttl: str | None = Field(None, description="idle-state retention of every operator ('1 day'); none: forever")
    on_stale_retraction: Literal["warn", "fail"] = Field(
        "warn", description="a retraction that finds no state (expired or never seen): warn and skip, or fail")
    master: str | None = Field(None, description="Spark master when the launcher sets none (spark-submit --master, "
                               "spark-defaults.conf); default local[2]")
    spark_conf: dict[str, str] = Field(default_factory=dict, description="Spark settings; a key the launcher sets "
                                       "(spark-submit --conf, spark-defaults.conf) keeps the launcher's value")

    _interval = field_validator("trigger_interval")(_check_duration)

    _ttl = field_validator("state_ttl")(_check_optional_duration)


class KafkaSettings(_Model):
    bootstrap_servers: str
    properties: dict[str, SecretStr] = Field(default_factory=dict,
                                             description="librdkafka consumer properties (security.protocol, sasl.*, ssl.*)")

    def plain_properties(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.properties.items()}


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


class SourceSpec(_Model):
    name: str
    topics: list[str] | None = None
    topic_pattern: str | None = None
    format: Literal["debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json"] = "debezium-json"
    options: dict[str, Any] = Field(default_factory=dict)
    columns: dict[str, str | ColumnDecl] | None = Field(
        None, description="column name -> type (int, bigint, double, string, boolean, timestamp, date, decimal(p,s)), "
        "or -> {type, encoding, scale} to declare how a schema-less message encodes the value")
    starting_offsets: Literal["earliest", "latest"] | dict[str, dict[str, int]] = "earliest"
    on_error: Literal["fail", "skip", "dlq"] = "dlq"
    dead_letter_topic: str | None = Field(None, description="Kafka topic for this source's dead letters "
                                          "(overrides dead_letter.topic); else the dead-letter Delta table")
    table: str | None = Field(None, description="mirror the source into this table; omit when only views read it")
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

    _delay = field_validator("watermark_delay")(_check_optional_duration)

    _columns = field_validator("columns", mode="before")(_check_columns)

    @model_validator(mode="after")
    def _one_topic_selector(self) -> "SourceSpec":
        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError("give exactly one of 'topics' (a list) or 'topic_pattern' (a regular expression)")
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(f"topic_pattern is not a valid regular expression: {exc}") from None
        return self


class MaintenanceSpec(_Model):
    """Scheduled Delta maintenance of one table and its tombstone table, run after a batch's commits."""

    compact_every: str | None = Field("15 minutes", description="how often to check for small files and compact "
                                      "them (OPTIMIZE; readers see the same rows); null: never")
    compact_min_files: int = Field(32, ge=2, description="compact only when the table has more live files than this")
    vacuum_every: str | None = Field("1 day", description="how often to delete files the table no longer uses "
                                     "(VACUUM); null: never")
    vacuum_retention: str = Field("7 days", description="VACUUM keeps unused files this long: a reader or time "
                                  "travel older than this fails")

    _durations = field_validator("compact_every", "vacuum_every")(_check_optional_duration)
    _retention = field_validator("vacuum_retention")(_check_duration)


class TableSpecModel(_Model):
    name: str
    from_: str | None = Field(None, alias="from", description="the view or source whose changelog the table holds; "
                              "omit for a table that sources mirror through their 'table' key")
    path: str | None = Field(None, description="table URI; default <storage.root>/<name>")
    primary_key: list[str] | None = Field(None, min_length=1, description="key columns; default: the field "
                                          "names of the Kafka message keys (Debezium key struct), learnt once")
    partition_by: list[str] = Field(default_factory=list)
    tombstone_retention: str = "7 days"
    maintenance: MaintenanceSpec = MaintenanceSpec()
    properties: dict[str, str] = Field(default_factory=dict, description="Delta table properties set on the "
                                       "table, e.g. delta.enableChangeDataFeed: 'true'")

    _retention = field_validator("tombstone_retention")(_check_duration)

    @field_validator("properties")
    @classmethod
    def _own_properties(cls, props: dict[str, str]) -> dict[str, str]:
        mine = sorted(k for k in props if k.startswith("changelake."))
        if mine:
            raise ValueError(f"properties {mine} are changelake's own (the sink sets them); remove them")
        return props


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

    _durations = field_validator("before", "after")(_check_signed_duration)


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
                   "aggregates", "top_n")
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
    state_ttl: str | None = Field(None, description="this view's idle-state retention (default: pipeline.state_ttl)")
    on_stale_retraction: Literal["warn", "fail"] | None = None

    _ttl = field_validator("state_ttl")(_check_optional_duration)

    @model_validator(mode="after")
    def _one_operation(self) -> "ViewSpec":
        given = [k for k in VIEW_OPERATIONS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"view {self.name!r} must have exactly one of {list(VIEW_OPERATIONS)}; it has {given}")
        if self.group_by is not None and self.aggregates is None:
            raise ValueError(f"view {self.name!r}: group_by needs aggregates")
        if (self.two_inputs is None) == (self.from_ is None):
            raise ValueError(f"view {self.name!r}: give 'from' (its input), or a join with left and right, not both")
        return self

    @property
    def two_inputs(self) -> JoinSpec | None:
        """The view's join spec (join, interval_join or temporal_join), if it is one."""
        return next((getattr(self, k) for k in TWO_INPUT_OPERATIONS if getattr(self, k) is not None), None)

    @property
    def inputs(self) -> list[str]:
        j = self.two_inputs
        return [j.left, j.right] if j else [self.from_]


class LookupCacheSpec(_Model):
    max_rows: int = Field(100_000, ge=0, description="keys kept (least recently used evicted); 0: no cache")
    ttl: str | None = Field("10 minutes", description="how long a looked-up row (or its absence) is reused; "
                            "'0 s': no cache; null: until evicted")

    _ttl = field_validator("ttl")(_check_optional_duration)


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

    _timeout = field_validator("connect_timeout")(_check_duration)

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
    root: str = "./lake"
    options: dict[str, SecretStr] = Field(default_factory=dict, description="object-store options for delta-rs / Hadoop")
    engine: Literal["auto", "delta-rs", "delta-spark"] = "auto"

    def plain_options(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.options.items()}


class DeadLetterSettings(_Model):
    path: str | None = Field(None, description="Delta quarantine table; default <storage.root>/_dead_letters")
    topic: str | None = Field(None, description="Kafka topic for dead letters (every source with on_error: dlq "
                              "that names no dead_letter_topic of its own); unset: the Delta table")


class MetricsSettings(_Model):
    host: str = "0.0.0.0"
    port: int = Field(9108, ge=0, le=65535)
    ready_after_intervals: int = Field(3, gt=0, description="/readyz fails when no batch finished within this many trigger intervals")


class ChangelakeConfig(_Model):
    pipeline: PipelineSettings
    kafka: KafkaSettings
    sources: list[SourceSpec] = Field(min_length=1)
    lookups: list[LookupSpec] = Field(default_factory=list)
    views: list[ViewSpec] = Field(default_factory=list)
    tables: list[TableSpecModel] = Field(min_length=1)
    storage: StorageSettings = StorageSettings()
    dead_letter: DeadLetterSettings = DeadLetterSettings()
    metrics: MetricsSettings = MetricsSettings()

    @model_validator(mode="after")
    def _references(self) -> "ChangelakeConfig":
        names = [t.name for t in self.tables]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"table names must be unique; repeated: {sorted(dup)}")
        for s in self.sources:
            if s.table is not None and s.table not in names:
                raise ValueError(f"source {s.name!r} writes to table {s.table!r}, which is not under 'tables' "
                                 f"(known: {names})")
        self._check_graph()
        return self

    def _check_graph(self) -> None:
        """Views and tables with 'from' read defined names; every source is used; the graph has no cycle."""
        sources = [s.name for s in self.sources]
        defined = list(sources)
        lookups = [lk.name for lk in self.lookups]
        dup = sorted({n for n in lookups if lookups.count(n) > 1})
        if dup:
            raise ValueError(f"lookup names must be unique; repeated: {dup}")
        for v in self.views:
            if v.lookup_join is not None and v.lookup_join.lookup not in lookups:
                raise ValueError(f"view {v.name!r}: lookup_join names lookup {v.lookup_join.lookup!r}, which is not "
                                 f"under 'lookups' (defined: {lookups})")
            for i in v.inputs:
                if i not in defined:
                    raise ValueError(f"view {v.name!r} reads {i!r}, which is neither a source nor a view defined "
                                     f"above it (defined: {defined})")
            if v.name in defined:
                raise ValueError(f"view {v.name!r}: the name is already used by a source or view")
            defined.append(v.name)
        read = {i for v in self.views for i in v.inputs} | {t.from_ for t in self.tables if t.from_}
        for t in self.tables:
            if t.from_ is not None and t.from_ not in defined:
                raise ValueError(f"table {t.name!r} reads from {t.from_!r}, which is neither a source nor a view "
                                 f"(defined: {defined})")
            mirrors = [s.name for s in self.sources if s.table == t.name]
            if t.from_ is not None and mirrors:
                raise ValueError(f"table {t.name!r} has 'from: {t.from_}' and is also the table of source(s) "
                                 f"{mirrors}; a table has one writer")
            if t.from_ is not None and not t.primary_key:
                raise ValueError(f"table {t.name!r} reads from {t.from_!r}, so it needs a primary_key (keys are "
                                 "learnt from Kafka message keys only for tables that sources mirror)")
            if t.from_ is None and not mirrors:
                raise ValueError(f"table {t.name!r} has no writer: give it 'from' (a view or source) or name it "
                                 "as a source's 'table'")
        unused = [s.name for s in self.sources if s.table is None and s.name not in read]
        if unused:
            raise ValueError(f"source(s) {unused} have no 'table' and no view or table reads them")
        unread = [v.name for v in self.views if v.name not in read]
        if unread:
            raise ValueError(f"view(s) {unread} are not read by any view or table")
        unused = sorted(set(lookups) - {v.lookup_join.lookup for v in self.views if v.lookup_join is not None})
        if unused:
            raise ValueError(f"lookup(s) {unused} are not used by any view's lookup_join")

    def table(self, name: str) -> TableSpecModel:
        return next(t for t in self.tables if t.name == name)

    def table_path(self, name: str) -> str:
        t = self.table(name)
        return t.path if t.path else _join(self.storage.root, name)

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
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand_env(node: Any, path: str, errors: list[str], environ: Mapping[str, str]) -> Any:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            key = str(k)
            if key.endswith("_file") and isinstance(v, str):
                try:
                    out[key[: -len("_file")]] = Path(v).read_text().strip()
                except OSError as exc:
                    errors.append(f"{path}{key}: cannot read secret file {v!r}: {exc.strerror}")
                continue
            out[key] = _expand_env(v, f"{path}{key}.", errors, environ)
        return out
    if isinstance(node, list):
        return [_expand_env(v, f"{path}{i}.", errors, environ) for i, v in enumerate(node)]
    if isinstance(node, str):
        def sub(m: re.Match[str]) -> str:
            val = environ.get(m.group(1), m.group(2))
            if val is None:
                errors.append(f"{path.rstrip('.')}: environment variable {m.group(1)} is not set")
                return ""
            return val
        return _ENV_REF.sub(sub, node)
    return node


def _apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> None:
    """CHANGELAKE_<SECTION>__<KEY>[__<KEY>] = value.

    Under ``kafka.properties`` the last part names a librdkafka property with
    ``_`` for ``.`` (``..._SASL_PASSWORD`` -> ``sasl.password``); under
    ``storage.options`` it is lower-cased as is (``AWS_ACCESS_KEY_ID`` -> ``aws_access_key_id``).
    """
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        keys = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if keys[0] not in ChangelakeConfig.model_fields or keys[0] in ("sources", "tables", "lookups", "views"):
            continue
        if keys[:2] == ["kafka", "properties"] and len(keys) == 3:
            keys[2] = keys[2].replace("_", ".")
        node = data
        for key in keys[:-1]:
            child = node.get(key)
            if not isinstance(child, dict):
                child = node[key] = {}
            node = child
        node[keys[-1]] = value


def load_config(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> ChangelakeConfig:
    """Read and validate a pipeline YAML; raise ConfigError listing every problem with its path."""
    environ = os.environ if environ is None else environ
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the pipeline file {str(path)!r}: {exc.strerror}") from None
    return parse_config(text, environ=environ, origin=str(path))


def parse_config(text: str, *, environ: Mapping[str, str] | None = None, origin: str = "<config>") -> ChangelakeConfig:
    environ = os.environ if environ is None else environ
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping with pipeline, kafka, sources, tables")
    errors: list[str] = []
    data = _expand_env(data, "", errors, environ)
    _apply_env_overrides(data, environ)
    try:
        config = ChangelakeConfig.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
            errors.append(f"{loc}: {err['msg']}")
        config = None
    if errors:
        raise ConfigError(f"{origin} has {len(errors)} error(s):\n" + "\n".join(f"  - {e}" for e in errors))
    assert config is not None
    return config
