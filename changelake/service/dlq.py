"""Dead letters as a queue: ``changelake dlq list | show | replay``.

A pipeline's dead letters are kept in the Delta quarantine table (``dead_letter.path``) and in the
dead-letter topics (committed messages whose ``changelake.pipeline`` header is this pipeline); the
commands read both. A letter is identified by its **position**, ``topic/partition/offset``, where the
message was first read: a replayed message is read back with that position (the Kafka source takes it
from the replay's headers, spark/kafka_source.py), so if it fails again it is the same letter,
quarantined once more, not a new one.

What ``replay`` does with a letter, by reason:

=====================================================  ==================  ========================================
reason                                                 replay              why
=====================================================  ==================  ========================================
``schema-mismatch``, ``schema-incompatible``,          yes, once the       a change of configuration or table
``missing-key``, ``missing-before``, ``unsupported``,  cause is fixed      (column types, ``schema_change``, keys,
``unrouted``                                                               ``upsert``, ``on_truncate``, a route
                                                                           rule) makes the same bytes decode
``malformed``, ``unknown-op``                          only with           the bytes do not parse, are not an
                                                       ``--force``         envelope, or name an op the format does
                                                                           not define: they fail again
``late``, ``operator-error``                           never               the letter holds the decoded row (JSON),
                                                                           not the message: there is nothing to
                                                                           read again
=====================================================  ==================  ========================================

**Where to.** Never into the source's topic (the database connector owns it, other consumers read it):
each letter goes to its source's replay topic, ``sources[].replay_topic`` or ``<topic>.replay``, which the
pipeline reads as part of that source. The message keeps its key and value bytes and its Kafka timestamp;
the headers ``changelake.topic``, ``changelake.partition``, ``changelake.offset`` carry its original position
(so its ``_seq`` is the one it would have had: an old change does not overwrite newer rows where ``_seq``
falls back to the Kafka offset), with ``changelake.source``, ``changelake.pipeline``, ``changelake.reason``.

**Once.** Every position sent is recorded in the Delta table ``<dead_letter.path>_replayed`` after the
broker acknowledged it; a recorded position is not sent again unless ``--again``. (A crash between the
acknowledgement and the record sends it once more on the next run: the copy has the same position and
``_seq``, so the mirrored tables hold it once.)
"""

from __future__ import annotations

import base64
import datetime as dt
import difflib
import json
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from changelake.connectors.dead_letter_topic import read_letters as read_topic_letters
from changelake.connectors.dead_letters import DeadLetterStore
from changelake.connectors.delta_read import read_delta
from changelake.errors import ConfigError
from changelake.formats import REASONS
from changelake.service.config import ChangelakeConfig

log = logging.getLogger(__name__)

#: reason -> what replay does (module doc); every reason a letter can carry has a rule
REPLAY_RULE: dict[str, str] = {
    **{r: "after-fix" for r in ("schema-mismatch", "schema-incompatible", "missing-key", "missing-before",
                                "unsupported", "unrouted")},
    "malformed": "force", "unknown-op": "force",
    "late": "never", "operator-error": "never",
}
#: every reason a dead letter can carry: the decoders' and the pipeline's own
ALL_REASONS = tuple(dict.fromkeys((*REASONS, "late", "operator-error")))
_WHY = {"force": "cannot succeed again (the same bytes fail the same way)",
        "never": "holds the decoded row, not the message"}

#: the letters as the commands see them: one row per position, the last time it was quarantined
LETTERS = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.int64()), pa.field("key", pa.binary()), pa.field("value", pa.binary()),
    pa.field("reason", pa.string()), pa.field("error", pa.string()), pa.field("source", pa.string()),
    pa.field("table", pa.string()), pa.field("batch_id", pa.int64()), pa.field("store", pa.string()),
    pa.field("quarantined", pa.int64()), pa.field("replayed", pa.int64()),
])
REPLAYED_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                             pa.field("offset", pa.int64()), pa.field("replayed_to", pa.string()),
                             pa.field("reason", pa.string()), pa.field("replayed_at", pa.timestamp("ms", tz="UTC"))])
_TIMEOUT_S = 60


@dataclass(frozen=True)
class Filters:
    """What ``list``, ``show`` and ``replay`` narrow to; None: any. ``since``/``until``: the message's Kafka
    timestamp (ISO 8601 or epoch ms); offsets are the original positions."""

    source: str | None = None
    reason: str | None = None
    table: str | None = None
    topic: str | None = None
    partition: int | None = None
    min_offset: int | None = None
    max_offset: int | None = None
    since: str | None = None
    until: str | None = None


@dataclass(frozen=True)
class ReplayResult:
    replayed: int                                   # sent now (0 on a dry run)
    already_replayed: int                           # skipped: sent before (--again sends them)
    by_reason: dict[str, int]                       # what was (or would be) sent, by reason
    refused: dict[str, int] = field(default_factory=dict)      # held back by the reason rule, by reason
    topics: dict[str, int] = field(default_factory=dict)       # replay topic -> letters sent there


# --- reading ----------------------------------------------------------------------------------------------

def replayed_path(config: ChangelakeConfig) -> str:
    return config.dead_letter_path().rstrip("/") + "_replayed"


def read_letters(config: ChangelakeConfig) -> pa.Table:
    """This pipeline's dead letters (LETTERS) from the Delta table and the dead-letter topics, one row per
    position: the last quarantine of it, with how many times it was quarantined and replayed."""
    storage = config.storage.plain_options() or None
    store = DeadLetterStore(config.dead_letter_path(), pipeline_id=config.pipeline.id, storage_options=storage)
    kept = store.read()
    kept = kept.set_column(kept.schema.get_field_index("timestamp"), "timestamp", kept["timestamp"].cast(pa.int64()))
    parts = [kept.select([n for n in LETTERS.names if n in kept.column_names])
             .append_column("store", pa.array(["delta"] * kept.num_rows, pa.string()))]
    topics = sorted({t for t in (config.dead_letter_topic(s.name) for s in config.sources) if t})
    if topics:
        client = {"bootstrap.servers": config.kafka.bootstrap_servers, "log_level": 3,
                  **config.kafka.plain_properties()}
        parts.append(read_topic_letters(client, topics, pipeline_id=config.pipeline.id))
    rows = [r for p in parts for r in p.to_pylist()]
    replays = _replay_counts(config)
    by_position: dict[Any, dict] = {}
    for i, r in enumerate(rows):
        known = r["offset"] is not None and r["offset"] >= 0
        position = (r["topic"], r["partition"], r["offset"]) if known else ("?", i)
        seen = by_position.get(position)
        times = 1 + (seen["quarantined"] if seen else 0)
        if seen is None or (r["batch_id"] or -1) >= (seen["batch_id"] or -1):
            by_position[position] = r
        by_position[position]["quarantined"] = times
        by_position[position]["replayed"] = replays.get(position, 0)
    out = sorted(by_position.values(), key=lambda r: (r["topic"] or "", r["partition"] or 0, r["offset"] or 0))
    return pa.Table.from_pylist(out, schema=LETTERS)


def _replay_counts(config: ChangelakeConfig) -> dict[tuple[str, int, int], int]:
    storage = config.storage.plain_options() or None
    path = replayed_path(config)
    if not DeltaTable.is_deltatable(path, storage_options=storage):
        return {}
    t = read_delta(path, storage_options=storage, columns=["topic", "partition", "offset"])
    counts: dict[tuple[str, int, int], int] = {}
    for key in zip(t["topic"].to_pylist(), t["partition"].to_pylist(), t["offset"].to_pylist()):
        counts[key] = counts.get(key, 0) + 1
    return counts


# --- choosing ---------------------------------------------------------------------------------------------

def select(config: ChangelakeConfig, letters: pa.Table, filters: Filters) -> pa.Table:
    """The letters ``filters`` keep; an unknown source, reason or table is an error naming the valid ones."""
    _check(config, letters, filters)
    keep = pa.array([True] * letters.num_rows, pa.bool_())
    for column, wanted in (("source", filters.source), ("reason", filters.reason), ("table", filters.table),
                           ("topic", filters.topic), ("partition", filters.partition)):
        if wanted is not None:
            keep = pc.and_(keep, pc.fill_null(pc.equal(letters[column], wanted), False))
    for column, bound, op in (("offset", filters.min_offset, pc.greater_equal),
                              ("offset", filters.max_offset, pc.less_equal),
                              ("timestamp", _epoch_ms("since", filters.since), pc.greater_equal),
                              ("timestamp", _epoch_ms("until", filters.until), pc.less_equal)):
        if bound is not None:
            keep = pc.and_(keep, pc.fill_null(op(letters[column], bound), False))
    return letters.filter(keep)


def _check(config: ChangelakeConfig, letters: pa.Table, filters: Filters) -> None:
    tables = {t.name for t in config.tables} | {t for t in letters["table"].to_pylist() if t}
    for what, value, valid in (("source", filters.source, [s.name for s in config.sources]),
                               ("reason", filters.reason, list(ALL_REASONS)),
                               ("table", filters.table, sorted(tables))):
        if value is not None and value not in valid:
            close = difflib.get_close_matches(value, valid, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(f"unknown {what} {value!r}: {hint}valid {what}s: {', '.join(valid) or '(none)'}")


def _epoch_ms(what: str, text: str | None) -> int | None:
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"--{what} {text!r}: give an ISO 8601 time (2026-11-28T10:00:00Z) or epoch "
                          "milliseconds") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.timezone.utc)
    return int(at.timestamp() * 1000)


def list_letters(config: ChangelakeConfig, filters: Filters = Filters()) -> list[dict[str, Any]]:
    """The chosen letters as dicts (LETTERS), with ``position`` and ``replay`` (the reason rule)."""
    chosen = select(config, read_letters(config), filters)
    return [{"position": f"{r['topic']}/{r['partition']}/{r['offset']}", **r,
             "replay": REPLAY_RULE.get(r["reason"], "after-fix")} for r in chosen.to_pylist()]


def parse_position(text: str) -> Filters:
    """``topic/partition/offset`` (as ``list`` prints it) as filters."""
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].lstrip("-").isdigit():
        raise ConfigError(f"position {text!r}: give topic/partition/offset, as `changelake dlq list` prints it")
    offset = int(parts[2])
    return Filters(topic=parts[0], partition=int(parts[1]), min_offset=offset, max_offset=offset)


# --- printing ---------------------------------------------------------------------------------------------

def format_list(letters: list[dict[str, Any]], *, limit: int | None = None) -> str:
    """A table for a terminal, one line per letter (the error cut short; ``show`` prints it whole)."""
    if not letters:
        return "no dead letters"
    head = ("POSITION", "SOURCE", "TABLE", "REASON", "REPLAY", "TIME", "QUAR.", "REPL.", "ERROR")
    lines = [head]
    for r in letters[:limit] if limit else letters:
        lines.append((r["position"], r["source"] or "-", r["table"] or "-", r["reason"], r["replay"],
                      _time(r["timestamp"]), str(r["quarantined"]), str(r["replayed"]), _cut(r["error"], 60)))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    out = ["  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1] for line in lines]
    more = len(letters) - limit if limit and len(letters) > limit else 0
    tail = [f"... {more} more (--limit 0 shows all)"] if more else []
    counts: dict[str, int] = {}
    for r in letters:
        counts[r["reason"]] = counts.get(r["reason"], 0) + 1
    return "\n".join(out + tail + [f"{len(letters)} dead letter(s): " +
                                   ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))])


def format_show(letters: list[dict[str, Any]]) -> str:
    """Every field of each letter, the key and value as text (or hex when they are not UTF-8)."""
    if not letters:
        return "no dead letters"
    blocks = []
    for r in letters:
        rule = r["replay"]
        blocks.append("\n".join([
            f"position     {r['position']}",
            f"source       {r['source'] or '-'}    table {r['table'] or '-'}",
            f"reason       {r['reason']}    replay: {rule}" + (f" ({_WHY[rule]})" if rule in _WHY else ""),
            f"time         {_time(r['timestamp'])}    batch {r['batch_id']}    kept in {r['store']}",
            f"quarantined  {r['quarantined']}x    replayed {r['replayed']}x",
            f"error        {r['error']}",
            f"key          {_bytes_text(r['key'])}",
            f"value        {_bytes_text(r['value'])}"]))
    return "\n\n".join(blocks)


def as_json(letters: list[dict[str, Any]], *, payload: bool) -> str:
    """JSON lines' worth of letters as one array; ``payload``: the key and value too (text when UTF-8, and
    always base64)."""
    out = []
    for r in letters:
        item = {k: v for k, v in r.items() if k not in ("key", "value")}
        item["time"] = _time(r["timestamp"])
        item["key_bytes"] = len(r["key"]) if r["key"] is not None else None
        item["value_bytes"] = len(r["value"]) if r["value"] is not None else None
        if payload:
            for name in ("key", "value"):
                raw = r[name]
                item[name] = _utf8(raw)
                item[f"{name}_base64"] = base64.b64encode(raw).decode() if raw is not None else None
        out.append(item)
    return json.dumps(out, indent=2, ensure_ascii=False)


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _cut(text: str | None, n: int) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[:n - 3] + "..."


def _utf8(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _bytes_text(raw: bytes | None) -> str:
    if raw is None:
        return "(null)"
    text = _utf8(raw)
    return text if text is not None else f"(not UTF-8, {len(raw)} bytes) hex {raw.hex()}"


# --- replaying --------------------------------------------------------------------------------------------

def replay(config: ChangelakeConfig, filters: Filters = Filters(), *, force: bool = False, again: bool = False,
           dry_run: bool = False) -> ReplayResult:
    """Send the chosen letters to their sources' replay topics (module doc): once each unless ``again``,
    those whose reason cannot succeed again only with ``force``, those holding a decoded row never."""
    chosen = select(config, read_letters(config), filters).to_pylist()
    sources = {s.name: s for s in config.sources}
    refused: dict[str, int] = {}
    already = 0
    send = []
    for r in chosen:
        rule = REPLAY_RULE.get(r["reason"], "after-fix")
        if rule == "never" or (rule == "force" and not force) or r["source"] not in sources \
                or r["offset"] is None or r["offset"] < 0:
            label = r["reason"] if r["source"] in sources else f"{r['reason']} (source {r['source']!r} is gone)"
            refused[label] = refused.get(label, 0) + 1
        elif r["replayed"] and not again:
            already += 1
        else:
            send.append(r)
    by_reason: dict[str, int] = {}
    topics: dict[str, int] = {}
    for r in send:
        by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + 1
        target = sources[r["source"]].replay_topic_for(r["topic"])
        r["replay_topic"] = target
        topics[target] = topics.get(target, 0) + 1
    if dry_run or not send:
        return ReplayResult(0, already, by_reason, refused, topics)
    _produce(config, send)
    _record(config, send)
    log.info("replayed %d dead letter(s) to %s", len(send), ", ".join(sorted(topics)))
    return ReplayResult(len(send), already, by_reason, refused, topics)


def _produce(config: ChangelakeConfig, letters: list[dict[str, Any]]) -> None:
    from confluent_kafka import Producer

    client = {"bootstrap.servers": config.kafka.bootstrap_servers, "log_level": 3, **config.kafka.plain_properties()}
    _create_topics(client, letters)
    producer = Producer({**client, "enable.idempotence": True})
    errors: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for r in sorted(letters, key=lambda r: (r["topic"], r["partition"], r["offset"])):
        headers = [("changelake." + k, str(v).encode()) for k, v in (
            ("topic", r["topic"]), ("partition", r["partition"]), ("offset", r["offset"]), ("source", r["source"]),
            ("pipeline", config.pipeline.id), ("reason", r["reason"]))]
        producer.produce(r["replay_topic"], key=r["key"], value=r["value"], headers=headers,
                         timestamp=r["timestamp"] or 0, on_delivery=delivered)
        producer.poll(0)
    left = producer.flush(_TIMEOUT_S)
    if errors or left:
        first = errors[0] if errors else f"{left} not acknowledged after {_TIMEOUT_S}s"
        raise ConfigError(f"{len(errors) or left} dead letter(s) could not be produced to the replay topic(s) "
                          f"(first: {first}); nothing was recorded as replayed: fix the cause (does the topic "
                          "exist? may this client write it?) and run the command again")


def _create_topics(client: dict[str, Any], letters: list[dict[str, Any]]) -> None:
    """Create the replay topics that do not exist, with as many partitions as the topic the letters came from.
    A broker that cannot (the embedded broker has no controller) creates them on the first produce."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(client)
    present = admin.list_topics(timeout=_TIMEOUT_S).topics
    wanted = {}
    for r in letters:
        if r["replay_topic"] not in present:
            origin = present.get(r["topic"])
            wanted[r["replay_topic"]] = len(origin.partitions) if origin is not None and origin.partitions else 1
    if not wanted:
        return
    futures = admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=-1) for t, n in wanted.items()],
                                  operation_timeout=10, request_timeout=15)
    for topic, future in futures.items():
        try:
            future.result()
            log.info("created replay topic %s (%d partition(s))", topic, wanted[topic])
        except Exception as exc:  # KafkaException: already there, or no controller; producing creates it
            log.debug("replay topic %s not created (%s); the first produce creates it", topic, exc)


def _record(config: ChangelakeConfig, letters: list[dict[str, Any]]) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    record = pa.table({
        "topic": [r["topic"] for r in letters], "partition": pa.array([r["partition"] for r in letters], pa.int32()),
        "offset": pa.array([r["offset"] for r in letters], pa.int64()),
        "replayed_to": [r["replay_topic"] for r in letters], "reason": [r["reason"] for r in letters],
        "replayed_at": pa.array([now] * len(letters), pa.timestamp("ms", tz="UTC"))}, schema=REPLAYED_SCHEMA)
    write_deltalake(replayed_path(config), record, mode="append", schema_mode="merge",
                    storage_options=config.storage.plain_options() or None)


def result_json(result: ReplayResult, *, dry_run: bool) -> str:
    return json.dumps({"dry_run": dry_run, **asdict(result)}, indent=2)
