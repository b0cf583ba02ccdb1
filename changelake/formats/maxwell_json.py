"""Maxwell JSON (Flink format ``maxwell-json``).

One message, one row::

    type      emits
    insert    +I(data)
    update    -U(before), +U(data)     before = data overwritten by the keys of 'old'
    delete    -D(data)
    other     dead letter unknown-op (bootstrap-start/-complete: skipped, counted)

``bootstrap-insert`` (Maxwell's snapshot rows) reads as ``insert``. ``_seq`` comes
from ``position`` (``mysql-bin.000003:1234``, present with Maxwell's
``output_binlog_position``) plus ``xoffset``, else the Kafka position; its epoch
(``changelake.formats.sequence``) is ``server_id`` (Maxwell's ``output_server_id``).
``_source_ts`` is ``ts`` (seconds) as milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from changelake.changelog import seq_from_kafka, seq_from_log_position
from changelake.formats.assemble import ChangeCollector, Reject
from changelake.formats.canal_json import merged_before
from changelake.formats.debezium import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE
from changelake.formats.jsonbase import JsonChangelogDecoder
from changelake.formats.options import Option, json_format_options, parse_options
from changelake.formats.sequence import binlog_order, mysql_marker

FORMAT = "maxwell-json"

METADATA_TYPES: dict[str, pa.DataType] = {
    "database": pa.string(),
    "table": pa.string(),
    "primary-key-columns": pa.list_(pa.string()),
    "ingestion-timestamp": pa.timestamp("ms", tz="UTC"),
}


def option_specs() -> list[Option]:
    return [*json_format_options(), Option("metadata", "metadata", (), tuple(METADATA_TYPES))]


def sequence(obj: dict, partition: int, offset: int) -> str:
    position = obj.get("position")
    if isinstance(position, str) and ":" in position:
        file, _, pos = position.rpartition(":")
        suffix = file[file.rfind(".") + 1:]
        xoffset = obj.get("xoffset")
        if suffix.isdigit() and pos.isdigit():
            return seq_from_log_position(int(suffix), int(pos), xoffset if type(xoffset) is int and xoffset >= 0
                                         else 0, offset=offset)
    return seq_from_kafka(partition, offset)


def log_position(out: ChangeCollector, record: int, obj: dict) -> None:
    """The message's binlog position and server (``server_id``, written with Maxwell's ``output_server_id``)
    for the epoch rule (``changelake.formats.sequence``)."""
    position = obj.get("position")
    if isinstance(position, str) and ":" in position:
        file, _, pos = position.rpartition(":")
        suffix = file[file.rfind(".") + 1:]
        if suffix.isdigit() and pos.isdigit():
            ts = obj.get("ts")
            out.position(record, mysql_marker(obj.get("server_id"), None), binlog_order(int(suffix), int(pos)),
                         ts * 1000 if type(ts) is int else None)


class MaxwellJsonDecoder(JsonChangelogDecoder):
    format_name = FORMAT
    metadata_types = METADATA_TYPES
    decimals_as_numbers = True

    def __init__(self, *, columns: pa.Schema | None = None, options: Mapping[str, Any] | None = None) -> None:
        opts = parse_options(FORMAT, options, option_specs())
        super().__init__(columns=columns, opts=opts)

    def _message(self, out: ChangeCollector, record: int, obj: Any, partition: int, offset: int) -> str | None:
        kind = obj.get("type")
        if kind in ("bootstrap-start", "bootstrap-complete"):
            return "bootstrap-marker"
        if kind not in ("insert", "bootstrap-insert", "update", "delete"):
            raise Reject("unknown-op", f"unknown Maxwell type {kind!r}; expected insert, update or delete")
        data = obj.get("data")
        if not isinstance(data, dict):
            raise Reject("malformed", f"Maxwell {kind} without a 'data' object")
        old = obj.get("old")
        if kind == "update" and not isinstance(old, dict):
            raise Reject("missing-before", "Maxwell update without an 'old' object, so the old row cannot be "
                                           "retracted; check Maxwell's output settings")
        ts = obj.get("ts")
        database, table = obj.get("database"), obj.get("table")
        meta = [self._meta_value(m.key, obj) for m in self._meta] if self._meta else ()
        log_position(out, record, obj)
        msg = out.message(record, sequence(obj, partition, offset), ts * 1000 if type(ts) is int else None,
                          database if isinstance(database, str) else None,
                          table if isinstance(table, str) else None, meta)
        if kind == "update":
            out.row(msg, UPDATE_BEFORE, merged_before(data, old))
            out.row(msg, UPDATE_AFTER, data)
        else:
            out.row(msg, DELETE if kind == "delete" else INSERT, data)
        return None

    @staticmethod
    def _meta_value(key: str, obj: dict) -> Any:
        if key == "ingestion-timestamp":
            ts = obj.get("ts")
            return ts * 1000 if type(ts) is int else None
        return obj.get({"database": "database", "table": "table",
                        "primary-key-columns": "primary_key_columns"}[key])
