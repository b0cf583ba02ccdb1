"""``changelake dlq replay``: send quarantined messages back to their topic once the cause is fixed.

Dead letters are read from the Delta quarantine table and from the pipeline's
dead-letter topics (committed messages whose ``changelake.pipeline`` header is
this pipeline). Each dead letter is produced again, with its original key and value bytes, to the topic
it came from (or ``--to-topic``), with headers naming where it was quarantined from. A
Delta table ``<dead-letter path>_replayed`` records every (topic, partition, offset)
replayed, so running the command twice never sends a message twice. The pipeline then
reads the replayed message like any other: if its cause is fixed it lands in its table,
otherwise it is quarantined again at its new offset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from changelake.connectors.dead_letter_topic import header_dict, read_topics
from changelake.connectors.delta_read import read_delta
from changelake.service.config import ChangelakeConfig

log = logging.getLogger(__name__)

#: what replay needs of a dead letter, wherever it is kept
LETTER_COLUMNS = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                            pa.field("offset", pa.int64()), pa.field("key", pa.binary()),
                            pa.field("value", pa.binary()), pa.field("reason", pa.string()),
                            pa.field("source", pa.string()), pa.field("table", pa.string())])
REPLAYED_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                             pa.field("offset", pa.int64()), pa.field("replayed_to", pa.string())])


@dataclass(frozen=True)
class ReplayResult:
    replayed: int
    already_replayed: int
    remaining_by_reason: dict[str, int]


def replayed_path(config: ChangelakeConfig) -> str:
    return config.dead_letter_path().rstrip("/") + "_replayed"


def replay(config: ChangelakeConfig, *, source: str | None = None, reason: str | None = None,
           table: str | None = None, to_topic: str | None = None, dry_run: bool = False) -> ReplayResult:
    """Produce this pipeline's dead letters again, once each; ``source``, ``reason`` and ``table`` (the
    table a letter was meant for: one quarantined table of a routed database) narrow what is sent."""
    storage = config.storage.plain_options() or None
    letters = dead_letters(config)
    for column, wanted in (("source", source), ("reason", reason), ("table", table)):
        if wanted is not None:
            letters = letters.filter(pc.equal(letters[column], wanted))
    done = _replayed(config)
    fresh = [r for r in letters.to_pylist() if (r["topic"], r["partition"], r["offset"]) not in done]
    # the same message can be quarantined twice (a replayed batch before its commit): send it once
    unique = {(r["topic"], r["partition"], r["offset"]): r for r in fresh}
    remaining: dict[str, int] = {}
    for r in unique.values():
        remaining[r["reason"]] = remaining.get(r["reason"], 0) + 1
    if dry_run or not unique:
        return ReplayResult(0, letters.num_rows - len(fresh), remaining)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": config.kafka.bootstrap_servers, "enable.idempotence": True,
                         "log_level": 3, **config.kafka.plain_properties()})
    errors: list[str] = []

    def delivered(err, _msg):
        if err is not None:
            errors.append(str(err))

    for (topic, partition, offset), r in sorted(unique.items()):
        producer.produce(to_topic or topic, key=r["key"], value=r["value"], on_delivery=delivered, headers={
            "changelake.replayed-from": f"{topic}/{partition}/{offset}".encode(),
            "changelake.dead-letter-reason": r["reason"].encode()})
    producer.flush(60)
    if errors:
        raise RuntimeError(f"{len(errors)} dead letters could not be produced (first: {errors[0]}); "
                           "nothing was recorded as replayed, run the command again")
    record = pa.table({"topic": [k[0] for k in unique], "partition": pa.array([k[1] for k in unique], pa.int32()),
                       "offset": pa.array([k[2] for k in unique], pa.int64()),
                       "replayed_to": [to_topic or k[0] for k in unique]}, schema=REPLAYED_SCHEMA)
    write_deltalake(replayed_path(config), record, mode="append", storage_options=storage)
    log.info("replayed %d dead letters", len(unique))
    return ReplayResult(len(unique), letters.num_rows - len(fresh), {})


def dead_letters(config: ChangelakeConfig) -> pa.Table:
    """This pipeline's dead letters (LETTER_COLUMNS), from the Delta table and the dead-letter topics."""
    storage = config.storage.plain_options() or None
    parts = []
    path = config.dead_letter_path()
    if DeltaTable.is_deltatable(path, storage_options=storage):
        kept = read_delta(path, storage_options=storage)
        # a dead-letter table written before letters named their table has no ``table`` column
        parts.append(pa.table({f.name: kept[f.name] if f.name in kept.column_names
                               else pa.nulls(kept.num_rows, f.type) for f in LETTER_COLUMNS}))
    topics = sorted({t for t in (config.dead_letter_topic(s.name) for s in config.sources) if t})
    if topics:
        client = {"bootstrap.servers": config.kafka.bootstrap_servers, "log_level": 3,
                  **config.kafka.plain_properties()}
        rows = []
        for msg in read_topics(client, topics):
            h = header_dict(msg.headers())
            if h.get("pipeline") == config.pipeline.id:
                rows.append({"topic": h["topic"], "partition": int(h["partition"]), "offset": int(h["offset"]),
                             "key": msg.key(), "value": msg.value(), "reason": h["reason"], "source": h["source"],
                             "table": h.get("table")})
        parts.append(pa.Table.from_pylist(rows, schema=LETTER_COLUMNS))
    return pa.concat_tables([p.cast(LETTER_COLUMNS) for p in parts]) if parts else LETTER_COLUMNS.empty_table()


def _replayed(config: ChangelakeConfig) -> set[tuple[str, int, int]]:
    storage = config.storage.plain_options() or None
    path = replayed_path(config)
    if not DeltaTable.is_deltatable(path, storage_options=storage):
        return set()
    t = read_delta(path, storage_options=storage)
    return set(zip(t["topic"].to_pylist(), t["partition"].to_pylist(), t["offset"].to_pylist()))
