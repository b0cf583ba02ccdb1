"""The options of Spark's own Kafka source (``kafka.reader: spark-kafka``) from a pipeline's configuration;
imports no pyspark (``validate`` runs these checks).

The pipeline's Kafka settings are written for librdkafka (``kafka.properties``, the ``python`` reader's
client). For Spark's source (spark-sql-kafka-0-10, a Java Kafka consumer) :func:`spark_options` maps them:

=====================================  =============================================================================
the pipeline's                         Spark's Kafka source option
=====================================  =============================================================================
``kafka.bootstrap_servers``            ``kafka.bootstrap.servers``
``sources[].topics`` / ``topic_        ``subscribePattern``: every source's topics and patterns, and their replay
pattern``, replay topics               topics (``changelake dlq replay``) with ``includeHeaders``
``sources[].starting_offsets``         ``startingOffsets``: ``earliest`` or ``latest`` as they are; otherwise the
                                       offset of every partition, resolved on the driver as the ``python`` reader
                                       resolves them (per topic, timestamps) when the query starts
``pipeline.max_records_per_batch``     ``maxOffsetsPerTrigger`` (also for ``--available-now``)
(always)                               ``kafka.isolation.level=read_committed`` (as the ``python`` reader)
``kafka.properties``                   ``kafka.<Java client property>`` per :data:`PROPERTY_MAP`, ``sasl.username`` /
                                       ``sasl.password`` as ``kafka.sasl.jaas.config``; a property without an
                                       equivalent is refused at ``validate`` (:func:`property_problems`)
``kafka.spark_options``                passed as they are, last (they win): Spark's own option names
                                       (``failOnDataLoss``, ``kafka.ssl.keystore.location``, ...); those changelake
                                       sets itself are refused with the reason (:data:`OWNED_OPTIONS`)
=====================================  =============================================================================
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any, Mapping

#: librdkafka property -> the Java client's property of the same meaning (values as they are)
PROPERTY_MAP = {
    "client.id": "client.id", "client.rack": "client.rack",
    "fetch.min.bytes": "fetch.min.bytes", "fetch.max.bytes": "fetch.max.bytes",
    "fetch.wait.max.ms": "fetch.max.wait.ms", "max.partition.fetch.bytes": "max.partition.fetch.bytes",
    "metadata.max.age.ms": "metadata.max.age.ms", "reconnect.backoff.ms": "reconnect.backoff.ms",
    "reconnect.backoff.max.ms": "reconnect.backoff.max.ms", "retry.backoff.ms": "retry.backoff.ms",
    "socket.connection.setup.timeout.ms": "socket.connection.setup.timeout.ms",
    "socket.send.buffer.bytes": "send.buffer.bytes", "socket.receive.buffer.bytes": "receive.buffer.bytes",
    "sasl.kerberos.service.name": "sasl.kerberos.service.name",
    "ssl.key.password": "ssl.key.password", "ssl.keystore.location": "ssl.keystore.location",
    "ssl.keystore.password": "ssl.keystore.password", "ssl.cipher.suites": "ssl.cipher.suites",
}
#: SASL mechanism -> the JAAS login module a user name and password go to
_LOGIN_MODULES = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
                  "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
                  "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
#: properties read together by :func:`java_properties` (not through :data:`PROPERTY_MAP`)
_COMBINED = {"security.protocol", "sasl.mechanism", "sasl.mechanisms", "sasl.username", "sasl.password",
             "ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.endpoint.identification.algorithm",
             "sasl.kerberos.keytab", "sasl.kerberos.principal"}
#: why a librdkafka property is refused for the spark-kafka reader, where the reason is more than "no equivalent"
_NO_EQUIVALENT = {
    "enable.ssl.certificate.verification": "the Java client always verifies the broker's certificate; give it the "
                                           "CA with ssl.ca.location (or kafka.ssl.truststore.* in kafka.spark_options)",
    "ssl.ca.pem": "the Java client reads PEM from files: put the CA in a file and name it with ssl.ca.location",
    "ssl.certificate.pem": "the Java client reads PEM from files: give kafka.ssl.keystore.location (one PEM file with "
                           "the key and the certificate chain) and kafka.ssl.keystore.type: PEM in kafka.spark_options",
    "ssl.key.pem": "the Java client reads PEM from files: give kafka.ssl.keystore.location (one PEM file with the key "
                   "and the certificate chain) and kafka.ssl.keystore.type: PEM in kafka.spark_options",
}

#: Spark Kafka source options changelake sets itself (from the YAML), and why kafka.spark_options may not
OWNED_OPTIONS = {
    "subscribe": "the topics come from sources[].topics / topic_pattern (every source is read by the one query)",
    "subscribepattern": "the topics come from sources[].topics / topic_pattern (every source is read by the one "
                        "query)",
    "assign": "the topics come from sources[].topics / topic_pattern; the partitions are all of theirs",
    "kafka.bootstrap.servers": "set kafka.bootstrap_servers instead",
    "minpartitions": "each Kafka partition's range is read by one task, in offset order: the decoders keep the "
                     "partition's epoch state across its records (docs/formats.md, 'Ordering changes')",
    "maxrecordsperpartition": "each Kafka partition's range is read by one task, in offset order: the decoders keep "
                              "the partition's epoch state across its records (docs/formats.md, 'Ordering changes')",
    "includeheaders": "changelake reads the headers of replay topics itself (changelake dlq replay)",
    "kafka.isolation.level": "changelake reads read_committed, so that records of aborted transactions (its own "
                             "dead-letter writes among them) never reach a table",
    "kafka.group.id": "changelake names its consumer group itself (changelake.<pipeline.id>) and commits to it only "
                      "after the Delta commits; Spark's consumers use groupIdPrefix",
    "endingoffsets": "a batch query's option: a streaming pipeline has no end (use --available-now to catch up "
                     "and stop)",
    "endingoffsetsbytimestamp": "a batch query's option: a streaming pipeline has no end (use --available-now)",
    "endingtimestamp": "a batch query's option: a streaming pipeline has no end (use --available-now)",
    # Spark's own refusals, said at validate rather than when the query starts
    "kafka.auto.offset.reset": "Spark refuses it: a new checkpoint starts where startingOffsets (or "
                               "sources[].starting_offsets) says",
    "kafka.enable.auto.commit": "Spark refuses it: the position lives in the checkpoint",
    "kafka.key.deserializer": "Spark refuses it: keys are read as bytes and decoded by the source's format",
    "kafka.value.deserializer": "Spark refuses it: values are read as bytes and decoded by the source's format",
    "kafka.interceptor.classes": "Spark refuses it (the source reads bytes, an interceptor would see none)",
}
#: Spark's Kafka source options (Structured Streaming + Kafka integration guide) a pipeline may pass
SPARK_OPTIONS = ("startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp",
                 "startingOffsetsByTimestampStrategy", "failOnDataLoss", "kafkaConsumer.pollTimeoutMs",
                 "fetchOffset.numRetries", "fetchOffset.retryIntervalMs", "maxOffsetsPerTrigger",
                 "minOffsetsPerTrigger", "maxTriggerDelay", "groupIdPrefix")


def property_problems(properties: Mapping[str, str]) -> list[tuple[str, str]]:
    """(property, why) for every ``kafka.properties`` entry the spark-kafka reader cannot give the Java client."""
    problems = []
    for key in properties:
        if key in PROPERTY_MAP or key in _COMBINED:
            continue
        why = _NO_EQUIVALENT.get(key) or (
            "librdkafka's property has no equivalent the spark-kafka reader maps; drop it, or give the Java client's "
            "setting as kafka.<name> in kafka.spark_options (or use kafka.reader: python)")
        problems.append((key, why))
    mechanism = (properties.get("sasl.mechanism") or properties.get("sasl.mechanisms") or "").upper()
    if ("sasl.username" in properties or "sasl.password" in properties) and mechanism not in _LOGIN_MODULES:
        problems.append(("sasl.mechanism", f"a user name and password go to the Java client's JAAS login of PLAIN or "
                         f"SCRAM-SHA-256/512, not {mechanism or 'GSSAPI (the default)'}: give kafka.sasl.jaas.config "
                         f"in kafka.spark_options"))
    cert, key = properties.get("ssl.certificate.location"), properties.get("ssl.key.location")
    if (cert or key) and cert != key:
        problems.append(("ssl.certificate.location", "the Java client reads a PEM client certificate and its key from "
                         "one file (ssl.keystore.type PEM): name one file holding both as ssl.certificate.location "
                         "and ssl.key.location, or give kafka.ssl.keystore.* in kafka.spark_options"))
    return problems


def option_problems(options: Mapping[str, str]) -> list[tuple[str, str]]:
    """(option, why) for every ``kafka.spark_options`` entry changelake sets itself or Spark does not know."""
    known = {o.lower(): o for o in SPARK_OPTIONS}
    problems = []
    for key in options:
        low = key.lower()
        if low in OWNED_OPTIONS:
            problems.append((key, OWNED_OPTIONS[low]))
        elif not low.startswith("kafka.") and low not in known:
            close = difflib.get_close_matches(key, SPARK_OPTIONS, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append((key, f"not an option of Spark's Kafka source{hint} (they are: {', '.join(SPARK_OPTIONS)},"
                             f" and kafka.<Java consumer property>)"))
    return problems


def java_properties(properties: Mapping[str, str]) -> dict[str, str]:
    """``kafka.properties`` (librdkafka's names) as the Java consumer's (without the ``kafka.`` prefix).
    :func:`property_problems` must be empty."""
    out = {PROPERTY_MAP[k]: v for k, v in properties.items() if k in PROPERTY_MAP}
    if "ssl.keystore.location" in properties:
        out["ssl.keystore.type"] = "PKCS12"           # librdkafka's keystore is a PKCS#12 file
    if properties.get("security.protocol"):
        out["security.protocol"] = properties["security.protocol"].upper()
    mechanism = (properties.get("sasl.mechanism") or properties.get("sasl.mechanisms") or "").upper()
    if mechanism:
        out["sasl.mechanism"] = mechanism
    if "sasl.username" in properties or "sasl.password" in properties:
        user, password = (_jaas_quote(properties.get(k, "")) for k in ("sasl.username", "sasl.password"))
        out["sasl.jaas.config"] = f'{_LOGIN_MODULES[mechanism]} required username="{user}" password="{password}";'
    if "sasl.kerberos.keytab" in properties or "sasl.kerberos.principal" in properties:
        keytab, principal = (_jaas_quote(properties.get(k, "")) for k in ("sasl.kerberos.keytab",
                                                                           "sasl.kerberos.principal"))
        out["sasl.jaas.config"] = ("com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true "
                                   f'storeKey=true keyTab="{keytab}" principal="{principal}";')
    if properties.get("ssl.ca.location"):
        out["ssl.truststore.location"] = properties["ssl.ca.location"]
        out["ssl.truststore.type"] = "PEM"
    if properties.get("ssl.certificate.location"):
        out["ssl.keystore.location"] = properties["ssl.certificate.location"]
        out["ssl.keystore.type"] = "PEM"
    algorithm = properties.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        out["ssl.endpoint.identification.algorithm"] = "" if algorithm.lower() == "none" else algorithm
    return out


def _jaas_quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def subscribe_pattern(reader_options: Mapping[str, str]) -> str:
    """One Java regular expression (fully matched) over every topic the ``python`` reader's options read:
    ``topics`` or ``topicPattern``, and ``replayTopics``."""
    opts = {k.lower(): v for k, v in reader_options.items()}
    parts = [opts["topicpattern"]] if opts.get("topicpattern") else \
        [re.escape(t.strip()) for t in opts.get("topics", "").split(",") if t.strip()]
    if opts.get("replaytopics"):
        parts.append(opts["replaytopics"])
    return "|".join(f"(?:{p})" for p in parts)


def spark_options(reader_options: Mapping[str, str], properties: Mapping[str, str],
                  passthrough: Mapping[str, str], *, resolve_offsets: Any = None) -> dict[str, str]:
    """The options of ``spark.readStream.format("kafka")`` (module docstring). ``reader_options`` are the
    ``python`` reader's (``changelake.service.query_start.kafka_reader_options``); ``resolve_offsets`` (called
    only for starting offsets other than ``earliest`` / ``latest``) returns ``{topic: {partition: offset}}``
    for every partition, as the ``python`` reader's ``initialOffset``."""
    opts = {k.lower(): v for k, v in reader_options.items()}
    out = {"kafka.bootstrap.servers": opts["bootstrap.servers"], "subscribePattern": subscribe_pattern(reader_options),
           "includeHeaders": "true", "kafka.isolation.level": "read_committed"}
    starting = opts.get("startingoffsets", "earliest").strip()
    if starting in ("earliest", "latest"):
        out["startingOffsets"] = starting
    elif resolve_offsets is not None:
        resolved = resolve_offsets()
        out["startingOffsets"] = json.dumps({t: {str(p): int(o) for p, o in sorted(ps.items(), key=lambda kv: int(kv[0]))}
                                             for t, ps in sorted(resolved.items())})
    else:
        raise ValueError("starting offsets other than earliest/latest need resolve_offsets")
    if opts.get("maxrecordspertrigger"):
        out["maxOffsetsPerTrigger"] = opts["maxrecordspertrigger"]
    out.update({f"kafka.{k}": v for k, v in java_properties(properties).items()})
    given = {k.lower() for k in passthrough}       # Spark's option names are case-insensitive
    return {**{k: v for k, v in out.items() if k.lower() not in given}, **passthrough}


def replay_regex(reader_options: Mapping[str, str]) -> str | None:
    """The replay topics' regular expression of the ``python`` reader's options (None: none)."""
    return next((v for k, v in reader_options.items() if k.lower() == "replaytopics" and v), None)
