"""Oracle GoldenGate JSON (Flink format ``ogg-json``).

::

    op_type   emits
    I         +I(after)
    U         -U(before), +U(after)     before null: upsert -> +U only, else dead letter missing-before
    D         -D(before)                before null: dead letter missing-before
    T         on_truncate apply or skip: a truncate at the record's position   fail: dead letter unsupported
    other     dead letter unknown-op

``_seq`` comes from ``pos`` (the trail position, a digit string) when present,
else the Kafka position. ``_source_ts`` is ``op_ts``; ``table`` ("SCHEMA.TABLE")
gives ``_db`` (the schema) and ``_table``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from changelake.changelog import seq_from_kafka, seq_from_log_position
from changelake.formats.assemble import ChangeCollector, Reject
from changelake.formats.convert import to_arrow
from changelake.formats.debezium import DELETE, INSERT, TRUNCATE_POLICIES, UPDATE_AFTER, UPDATE_BEFORE, truncate
from changelake.formats.jsonbase import JsonChangelogDecoder
from changelake.formats.options import Option, json_format_options, parse_options

FORMAT = "ogg-json"

METADATA_TYPES: dict[str, pa.DataType] = {
    "table": pa.string(),
    "primary-keys": pa.list_(pa.string()),
    "ingestion-timestamp": pa.timestamp("us", tz="UTC"),
    "event-timestamp": pa.timestamp("us", tz="UTC"),
}

_MS = pa.timestamp("ms", tz="UTC")


def option_specs() -> list[Option]:
    return [
        *json_format_options(),
        Option("upsert", "bool", False, doc="an update without a before-image emits only +U"),
        Option("on-truncate", "choice", "skip", TRUNCATE_POLICIES),
        Option("metadata", "metadata", (), tuple(METADATA_TYPES)),
    ]


def _epoch_ms(text: Any) -> int | None:
    if not isinstance(text, str):
        return None
    arr, bad = to_arrow([text], _MS)
    return None if bad else arr[0].value


class OggJsonDecoder(JsonChangelogDecoder):
    format_name = FORMAT
    metadata_types = METADATA_TYPES
    decimals_as_numbers = True

    def __init__(self, *, columns: pa.Schema | None = None, options: Mapping[str, Any] | None = None) -> None:
        opts = parse_options(FORMAT, options, option_specs())
        super().__init__(columns=columns, opts=opts)
        self.upsert: bool = opts["upsert"]
        self.on_truncate: str = opts["on_truncate"]

    def _message(self, out: ChangeCollector, record: int, obj: Any, partition: int, offset: int) -> str | None:
        op = obj.get("op_type")
        before, after = obj.get("before"), obj.get("after")
        rows: list = []
        if op == "I":
            if not isinstance(after, dict):
                raise Reject("malformed", "OGG insert (op_type I) without an 'after' row")
            rows = [(INSERT, after)]
        elif op == "U":
            if not isinstance(after, dict):
                raise Reject("malformed", "OGG update (op_type U) without an 'after' row")
            if isinstance(before, dict):
                rows = [(UPDATE_BEFORE, before), (UPDATE_AFTER, after)]
            elif self.upsert:
                rows = [(UPDATE_AFTER, after)]
            else:
                raise Reject("missing-before", "OGG update without a 'before' row; configure GoldenGate to write "
                                               "before images (GETUPDATEBEFORES / NOCOMPRESSUPDATES), or "
                                               "declare the source as upsert")
        elif op == "D":
            if not isinstance(before, dict):
                raise Reject("missing-before", "OGG delete (op_type D) without a 'before' row; configure "
                                               "GoldenGate to write before images")
            rows = [(DELETE, before)]
        elif op != "T":
            raise Reject("unknown-op", f"unknown OGG op_type {op!r}; expected I, U, D or T")
        pos = obj.get("pos")
        seq = (seq_from_log_position(int(pos), offset=offset) if isinstance(pos, str) and pos.isdigit()
               else seq_from_kafka(partition, offset))
        if isinstance(pos, str) and pos.isdigit() and int(pos) < 2 ** 63:
            out.position(record, None, int(pos), _epoch_ms(obj.get("op_ts")))     # the epoch rule's input
        table = obj.get("table")
        schema_name, table_name = None, None
        if isinstance(table, str):
            schema_name, _, table_name = table.rpartition(".")
        if op == "T":
            truncate(out, record, seq, schema_name or None, table_name, on_truncate=self.on_truncate,
                     what="an OGG TRUNCATE (op_type T)")
            return None
        meta = [self._meta_value(m.key, obj) for m in self._meta] if self._meta else ()
        msg = out.message(record, seq, _epoch_ms(obj.get("op_ts")), schema_name or None, table_name, meta)
        for kind, image in rows:
            out.row(msg, kind, image)
        return None

    @staticmethod
    def _meta_value(key: str, obj: dict) -> Any:
        return obj.get({"table": "table", "primary-keys": "primary_keys", "ingestion-timestamp": "current_ts",
                        "event-timestamp": "op_ts"}[key])
