"""The field names of a Kafka message key, for tables whose primary key comes from the key.

Debezium keys a change by the row's primary key as a struct: JSON
``{"schema": ..., "payload": {"id": 1}}``, schema-less JSON ``{"id": 1}``, or
Confluent-framed Avro (magic byte 0, schema id, body) whose registered schema is
a record. :func:`key_shapes` returns, per distinct field list, how many messages
had it and where the first one was; a message without a usable key has
``fields`` None.

Messages that carry no row say nothing about the key and are left out: tombstones (no
value), and the Debezium JSON events without a key by design, a ``TRUNCATE`` (op ``t``, one
per truncated table) and a logical decoding message (op ``m``).
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from changelake.formats.assemble import Reject

SHAPES_SCHEMA = pa.schema([pa.field("fields", pa.string()), pa.field("messages", pa.int64()),
                           pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                           pa.field("offset", pa.int64())])


def key_fields(raw: bytes | None, decoder: Any = None) -> tuple[str, ...] | None:
    """Field names of one message key, or None when it has none (null, empty, not a struct)."""
    if not raw:
        return None
    if raw[0] == 0 and len(raw) >= 5 and hasattr(decoder, "registered_schema"):
        try:
            schema = decoder.registered_schema(int.from_bytes(raw[1:5], "big"))
        except Reject:      # a schema id the registry does not know
            return None
        if isinstance(schema, dict) and schema.get("type") == "record":
            return tuple(f["name"] for f in schema.get("fields", ())) or None
        return None
    value = json_object(raw)
    return (tuple(value) or None) if value is not None else None


def json_object(raw: bytes | None) -> dict | None:
    """The JSON object of a record's key or value, unwrapped from the JSON converter's schema envelope
    (``{"schema": ..., "payload": ...}``); None when it is empty, not JSON or not an object."""
    if not raw:
        return None
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, dict) and "payload" in value and "schema" in value:
        value = value["payload"]
    return value if isinstance(value, dict) else None


#: Debezium ops of events that carry no row, hence no key
_ROWLESS_OPS = ("t", "m")


def _rowless(value: bytes) -> bool:
    """True for a Debezium JSON truncate or message event (with or without the schema envelope)."""
    try:
        event = orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    if isinstance(event, dict) and "op" not in event and isinstance(event.get("payload"), dict):
        event = event["payload"]
    return isinstance(event, dict) and event.get("op") in _ROWLESS_OPS


def key_shapes(records: pa.Table, decoder: Any = None) -> pa.Table:
    """SHAPES_SCHEMA: the distinct key field lists of ``records`` (raw Kafka records); tombstones
    (no value) and keyless events without a row (Debezium JSON truncate and message events) are
    left out."""
    records = records.filter(pc.invert(pc.is_null(records["value"])))
    shapes: dict[str | None, list] = {}
    cache: dict[bytes | None, str | None] = {}
    for key, value, topic, partition, offset in zip(records["key"].to_pylist(), records["value"].to_pylist(),
                                                    records["topic"].to_pylist(), records["partition"].to_pylist(),
                                                    records["offset"].to_pylist()):
        if not key and _rowless(value):
            continue
        if key not in cache:
            fields = key_fields(key, decoder)
            cache[key] = None if fields is None else json.dumps(list(fields))
        shape = shapes.setdefault(cache[key], [0, topic, partition, offset])
        shape[0] += 1
    rows = [{"fields": f, "messages": n, "topic": t, "partition": p, "offset": o}
            for f, (n, t, p, o) in shapes.items()]
    return pa.Table.from_pylist(rows, schema=SHAPES_SCHEMA)
