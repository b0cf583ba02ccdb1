"""What ``validate`` (and every load of a pipeline file) checks beyond the fields' own types.

=====================================  =====================================================  ========
check                                  rule                                                   reported
=====================================  =====================================================  ========
``kafka.properties``, each             librdkafka's own ``conf_set`` (confluent-kafka, no      error
                                       client made, no broker): unknown names, invalid or
                                       out-of-range values, with "did you mean"
``kafka.properties``, together         librdkafka creates a consumer with them and no          warning
                                       broker address (``sasl.mechanism`` without a password:
                                       the runtime's environment may still supply it)
``kafka.properties``, managed          group.id, enable.auto.commit, ... : changelake sets     error
                                       them; the message says why
a credential written in the file       kafka.properties, storage.options, sources[].options:   warning
                                       name the environment variable / ``<key>_file`` form
``views[].sql``                        syntax and unsupported constructs, when something      error
                                       else is wrong too (else the planner's check lists them)
``partition_by`` of a mirrored table   a column the source declares (or the route rule's)      error
``kafka.reader: spark-kafka``          each ``kafka.properties`` entry has a Java client       error
                                       equivalent; ``kafka.spark_options`` are Spark Kafka
                                       source options changelake does not set itself
                                       (changelake/spark/spark_kafka_options.py)
``kafka.spark_options``                only with ``kafka.reader: spark-kafka``                 error
``pipeline.first_batch_records``       not with ``kafka.reader: spark-kafka`` (no ramp there)  error
=====================================  =====================================================  ========

A graph table's ``partition_by`` is checked with the planner's schemas (:func:`changelake.service.views.graph_problems`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from changelake.errors import ConfigError
from changelake.formats.options import is_secret_option

if TYPE_CHECKING:
    from changelake.service.config import ChangelakeConfig, Loc, Origins

#: librdkafka properties changelake sets itself, and why a pipeline file may not
MANAGED_PROPERTIES = {
    "bootstrap.servers": "set kafka.bootstrap_servers instead",
    "metadata.broker.list": "set kafka.bootstrap_servers instead",
    "group.id": "changelake names its consumer group itself (changelake.<pipeline.id>), and commits each batch's "
                "end offsets to it only after the batch's Delta commits; partitions are assigned from Spark's "
                "checkpoint, never by a group. Choose the group's name through pipeline.id",
    "group.instance.id": "the pipeline never joins a consumer group: partitions are assigned from Spark's checkpoint",
    "enable.auto.commit": "the read position lives in Spark's checkpoint and is committed to the consumer group only "
                          "after the batch's Delta commits; an automatic commit would mark records done before their "
                          "rows are in Delta",
    "enable.auto.offset.store": "the read position lives in Spark's checkpoint; changelake stores offsets itself "
                                "after the Delta commits",
    "auto.offset.reset": "a new checkpoint starts where sources[].starting_offsets says (earliest, latest or "
                         "{timestamp: ...})",
    "enable.partition.eof": "the reader relies on librdkafka's end-of-partition signal to end a micro-batch",
    "isolation.level": "changelake reads read_committed, so that records of aborted transactions (its own "
                       "dead-letter writes among them) never reach a table",
    "transactional.id": "the dead-letter producer sets its own (changelake-<pipeline.id>-dead-letters)",
}
_CONFIGURATION = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"
#: not a librdkafka property: ``conf_set`` stops at it, so no client is ever created by a probe
_STOP = "changelake.validate.stop"
_NAME_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789._"
_VALUE_LETTERS = _NAME_LETTERS + "ABCDEFGHIJKLMNOPQRSTUVWXYZ-"
#: credentials that :func:`changelake.formats.options.is_secret_option` does not name (object-store keys)
_MORE_SECRETS = re.compile(r"account[-_.]?key|sas[-_.]?key|ssl\.key\.pem", re.IGNORECASE)


# -- kafka.properties ---------------------------------------------------------------------------
def property_text(value: Any) -> str:
    """A property's value as librdkafka takes it (YAML's true -> 'true')."""
    if hasattr(value, "get_secret_value"):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _rejects(name: str, value: str) -> str | None:
    """librdkafka's message for ``name: value`` alone, or None when it accepts it (no client is created)."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer({name: value, _STOP: ""})
    except KafkaException as exc:
        message = exc.args[0].str()
        return None if _STOP in message else message.strip()
    except (TypeError, ValueError) as exc:     # confluent-kafka's own keys (error_cb, logger, ...)
        return str(exc)
    raise AssertionError(f"{_STOP} was accepted")


def _edits(word: str, letters: str) -> Iterator[str]:
    """The words one edit away: deletions, transpositions, substitutions, insertions (in that order)."""
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    yield from (a + b[1:] for a, b in splits if b)
    yield from (a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1)
    yield from (a + c + b[1:] for a, b in splits if b for c in letters if c != b[0])
    yield from (a + c + b for a, b in splits for c in letters)


def _suggest(candidates: Iterator[str], accepted: Any) -> str | None:
    seen: set[str] = set()
    for candidate in candidates:
        if candidate not in seen:
            seen.add(candidate)
            if accepted(candidate):
                return candidate
    return None


def _close_name(name: str, value: str) -> str | None:
    """A librdkafka property one edit (or a case / '_' for '.' change) away from ``name``."""
    if len(name) > 64:
        return None
    plain = name.lower().replace("_", ".")

    def variants() -> Iterator[str]:
        yield from (plain, name.lower())
        yield from _edits(plain, _NAME_LETTERS)

    return _suggest(variants(), lambda n: n != name and "No such configuration property" not in (_rejects(n, value) or ""))


def _close_value(name: str, value: str) -> str | None:
    """A value of an enumerated property one edit (or a case change) away from ``value``."""
    if len(value) > 40 or not re.search(r"[A-Za-z]", value):
        return None

    def variants() -> Iterator[str]:
        yield from (value.upper(), value.lower())
        yield from _edits(value, _VALUE_LETTERS)

    return _suggest(variants(), lambda v: v != value and not re.fullmatch(r"[\d.]+", v) and _rejects(name, v) is None)


def kafka_property_problems(properties: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Every problem of ``kafka.properties`` as (YAML path, message): managed properties, and what
    librdkafka rejects of each property alone (:func:`client_warning`: of them together)."""
    problems: list[tuple[Loc, str]] = []
    plain = {str(k): property_text(v) for k, v in properties.items()}
    for name, value in plain.items():
        loc = ("kafka", "properties", name)
        if name in MANAGED_PROPERTIES:
            problems.append((loc, f"{name} is set by changelake, not by the pipeline file: "
                                  f"{MANAGED_PROPERTIES[name]}"))
            continue
        rejected = _rejects(name, value)
        if rejected is None:
            continue
        if rejected.startswith("No such configuration property"):
            close = _close_name(name, value)
            hint = f"; did you mean {close!r}?" if close else f" (librdkafka's properties: {_CONFIGURATION})"
            problems.append((loc, f"librdkafka has no property {name!r}{hint}"))
        else:
            close = _close_value(name, value) if rejected.startswith("Invalid value \"") else None
            problems.append((loc, f"librdkafka rejects it: {rejected}" + (f"; did you mean {close!r}?" if close else "")))
    return problems


def client_warning(properties: Mapping[str, Any]) -> str | None:
    """What librdkafka says when it cannot create a consumer with all of ``properties`` (no broker address:
    no network), or None. A warning, not an error: a credential or file that the file does not give may
    come from the environment or a secret mount where the pipeline runs."""
    from confluent_kafka import Consumer, KafkaException

    plain = {str(k): property_text(v) for k, v in properties.items()}
    if not plain:
        return None

    conf: dict[str, Any] = {"group.id": "changelake-validate", **plain, "log_level": 0}
    if plain.get("sasl.mechanism", plain.get("sasl.mechanisms", "")).upper() == "GSSAPI":
        conf["sasl.kerberos.min.time.before.relogin"] = 0       # no kinit from a check
    try:
        Consumer(conf).close()
    except KafkaException as exc:
        reason = re.sub(r"^Failed to create consumer: ", "", exc.args[0].str())
        return (f"librdkafka would not start a client with these properties: {reason} (where the pipeline runs, "
                "the environment or a secret file must supply what is missing)")
    except (TypeError, ValueError) as exc:
        return str(exc)
    return None


# -- credentials written in the file ------------------------------------------------------------
def _is_credential(key: str) -> bool:
    return is_secret_option(key) or bool(_MORE_SECRETS.search(key))


def secret_warnings(data: Mapping[str, Any], origins: Origins) -> list[str]:
    """A warning for each credential whose value is written in the file itself (not read from a
    ``<key>_file``, an environment variable or a ``${VAR}`` reference), naming the alternatives."""
    places: list[tuple[Loc, Mapping[str, Any], Any]] = []
    kafka, storage = data.get("kafka"), data.get("storage")
    if isinstance(kafka, Mapping) and isinstance(kafka.get("properties"), Mapping):
        places.append((("kafka", "properties"), kafka["properties"],
                       lambda k: "CHANGELAKE_KAFKA__PROPERTIES__" + k.upper().replace(".", "_")))
    if isinstance(storage, Mapping) and isinstance(storage.get("options"), Mapping):
        places.append((("storage", "options"), storage["options"], lambda k: "CHANGELAKE_STORAGE__OPTIONS__" + k.upper()))
    for i, source in enumerate(data.get("sources") or ()):
        if isinstance(source, Mapping) and isinstance(source.get("options"), Mapping):
            places.append((("sources", i, "options"), source["options"], None))
    out = []
    for where, values, variable in places:
        for key, value in values.items():
            loc = (*where, str(key))
            if not _is_credential(str(key)) or not isinstance(value, str) or not value or loc in origins.other:
                continue
            env = f"set {variable(str(key))}, or " if variable and re.fullmatch(r"[A-Za-z0-9_.]+", str(key)) else ""
            out.append(origins.problem(loc, f"a credential written in the file as plain text: {env}write "
                                            f"'{key}_file: /path/to/secret' (a mounted Kubernetes secret) or "
                                            f"'{key}: ${{AN_ENVIRONMENT_VARIABLE}}'"))
    return out


# -- SQL views, partition_by ----------------------------------------------------------------------
def sql_problems(data: Mapping[str, Any]) -> list[tuple[Loc, str]]:
    """Syntax errors and unsupported constructs of every ``views[].sql``, read from the raw file so that
    they show whatever else is wrong."""
    from changelake.plan.sql_view import check_query

    problems: list[tuple[Loc, str]] = []
    for i, view in enumerate(data.get("views") or ()):
        if isinstance(view, Mapping) and isinstance(view.get("sql"), str):
            name = view.get("name", f"views.{i}")
            problems.extend((("views", i, "sql"), f"view {name!r}: {e}") for e in check_query(view["sql"]))
    return problems


def partition_problems(config: ChangelakeConfig) -> list[tuple[Loc, str]]:
    """``partition_by`` columns that a mirrored table (or a route rule's tables) will not have, where the
    columns are declared; a table without declared columns learns them from its first batch."""
    from changelake.service.config import ORIGIN_COLUMNS, _did_you_mean

    problems: list[tuple[Loc, str]] = []
    for i, t in enumerate(config.tables):
        for s in (s for s in config.sources if s.table == t.name and s.columns):
            known = _columns_of(s)
            missing = [c for c in t.partition_by if c not in known]
            if missing:
                problems.append((("tables", i, "partition_by"), f"table {t.name!r}: partition_by names {missing}, "
                                 f"which source {s.name!r} does not give{_did_you_mean(missing[0], known)} "
                                 f"(its columns: {known})"))
    for i, s in enumerate(config.sources):
        for j, rule in enumerate(s.route or ()):
            if rule.columns and rule.partition_by:
                known = [*rule.columns, *(ORIGIN_COLUMNS if rule.origin_columns else ())]
                missing = [c for c in rule.partition_by if c not in known]
                if missing:
                    problems.append((("sources", i, "route", j, "partition_by"), f"partition_by names {missing}, "
                                     f"which the rule's columns do not hold{_did_you_mean(missing[0], known)} "
                                     f"(columns: {known})"))
    return problems


def engine_problems(config: ChangelakeConfig) -> list[tuple[Loc, str]]:
    """What ``storage.engine: delta-spark`` cannot write and delta-rs can, where the config declares it:
    column names Delta for Spark refuses (a space, ``,;{}()=``, tab, newline) among a mirrored table's
    or a route rule's declared columns, and table properties it refuses (a log retention shorter than
    the deleted files'). History tables are written with delta-rs whatever the engine, and a graph
    table's columns are checked with the views (changelake/service/views.py)."""
    from changelake.connectors.delta_sink import (
        delta_spark_refusal,
        delta_spark_refused_columns,
        delta_spark_refused_properties,
    )

    if config.storage.engine != "delta-spark":
        return []
    history = {t.name for t in config.tables if t.history is not None}
    problems: list[tuple[Loc, str]] = []
    for i, t in enumerate(config.tables):
        why = None if t.history is not None else delta_spark_refused_properties(t.properties)
        if why:
            problems.append((("tables", i, "properties"), f"table {t.name!r}: {why}"))
    for i, s in enumerate(config.sources):
        for j, rule in enumerate(s.route or ()):
            why = delta_spark_refused_properties(rule.properties)
            if why:
                problems.append((("sources", i, "route", j, "properties"), f"table {rule.table!r}: {why}"))
    problems += store_problems(config)
    for i, s in enumerate(config.sources):
        refused = delta_spark_refused_columns(_columns_of(s)) if s.columns and s.table not in history else []
        if refused:
            problems.append((("sources", i, "columns"), delta_spark_refusal(repr(s.table or s.name), refused)))
        for j, rule in enumerate(s.route or ()):
            refused = delta_spark_refused_columns(list(rule.columns or ()))
            if refused:
                problems.append((("sources", i, "route", j, "columns"),
                                 delta_spark_refusal(f"{rule.table!r} (a route rule's)", refused)))
    return problems


def store_problems(config: ChangelakeConfig) -> list[tuple[Loc, str]]:
    """Object-store locations (``storage.root``, a table's ``path``, the dead-letter table) that delta-spark cannot
    reach because the Hadoop connector for their scheme is on no classpath it will have: the project's pinned
    Spark sets (``delta``, ``spark-kafka``) and the pipeline's own ``spark.jars`` / ``spark.jars.packages``.
    Jars given only to spark-submit (``--jars``) or baked into a custom image are not seen here: list them in
    ``pipeline.spark_conf`` as well."""
    from changelake import jvm_deps
    from changelake.connectors.object_store import hadoop_connector_missing

    _, sets = jvm_deps.read_lock()
    jars = [name for s in jvm_deps.IMAGE_SETS for name in sets.get(s, {})]
    for key in ("spark.jars", "spark.jars.packages"):
        jars += [j for j in config.pipeline.spark_conf.get(key, "").split(",") if j.strip()]
    places: list[tuple[Loc, str]] = [(("storage", "root"), config.storage.root)]
    places += [(("tables", i, "path"), t.path) for i, t in enumerate(config.tables) if t.path]
    if config.dead_letter.path:
        places.append((("dead_letter", "path"), config.dead_letter.path))
    problems: list[tuple[Loc, str]] = []
    for loc, uri in places:
        why = hadoop_connector_missing(uri, jars)
        if why:
            problems.append((loc, f"storage.engine: delta-spark cannot write {uri}: {why}"))
    return problems


def _columns_of(source: Any) -> list[str]:
    """The columns a mirrored source's rows have: the declared ones and requested metadata columns."""
    from changelake.service.views import _decoded_columns

    try:
        return _decoded_columns(source).names
    except (ConfigError, ValueError):
        return list(source.columns)


def reader_problems(config: ChangelakeConfig) -> list[tuple[Loc, str]]:
    """What the chosen Kafka reader (``kafka.reader``) cannot take of the Kafka settings."""
    from changelake.spark.spark_kafka_options import option_problems, property_problems

    kafka = config.kafka
    if kafka.reader != "spark-kafka":
        return [(("kafka", "spark_options", key), f"{key!r} is a Spark Kafka source option, which only "
                 "kafka.reader: spark-kafka reads; set the reader, or move a client setting to kafka.properties")
                for key in kafka.spark_options]
    problems: list[tuple[Loc, str]] = [
        (("kafka", "properties", key), f"{key!r} cannot be given to Spark's Kafka source (kafka.reader: spark-kafka): "
         f"{why}") for key, why in property_problems(kafka.plain_properties())]
    if config.pipeline.first_batch_records is not None:
        problems.append((("pipeline", "first_batch_records"), "Spark's Kafka source (kafka.reader: spark-kafka) "
                         "admits the same maxOffsetsPerTrigger to every batch, a first batch too; remove "
                         "first_batch_records or use kafka.reader: python"))
    problems += [(("kafka", "spark_options", key), f"{key!r}: {why}")
                 for key, why in option_problems(kafka.plain_spark_options())]
    return problems
