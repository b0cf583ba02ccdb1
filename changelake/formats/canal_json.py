"""Canal JSON (Flink format ``canal-json``).

One Canal message carries a ``data`` array; every element becomes its own change::

    type              emits per element i
    INSERT, INIT      +I(data[i])
    UPDATE            -U(before_i), +U(data[i])    before_i = data[i] overwritten by the keys of old[i]
    DELETE            -D(data[i])
    TRUNCATE          on_truncate apply or skip: a truncate at the message's position   fail: dead letter
                      (Canal marks it isDdl: true, with no data; checked before the DDL rule)
    isDdl / DDL type  nothing, counted as skipped['ddl']
    other             dead letter unknown-op

``database.include`` / ``table.include`` are regular expressions that must match
the whole name; other messages are counted as ``skipped['filtered']``. Values
arrive as strings and are converted to the declared column types, or to the
types ``mysqlType`` (else ``sqlType``) reports; a BYTES column reads Canal's ISO-8859-1 text
unless another encoding is declared. Canal carries no binlog
position, so ``_seq`` is the Kafka position.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pyarrow as pa

from changelake.changelog import seq_from_kafka
from changelake.formats.assemble import ChangeCollector, Reject
from changelake.formats.debezium import DELETE, INSERT, TRUNCATE_POLICIES, UPDATE_AFTER, UPDATE_BEFORE, truncate
from changelake.formats.jsonbase import JsonChangelogDecoder
from changelake.formats.mysqltypes import canal_columns
from changelake.formats.options import Option, json_format_options, parse_options

FORMAT = "canal-json"

METADATA_TYPES: dict[str, pa.DataType] = {
    "database": pa.string(),
    "table": pa.string(),
    "sql-type": pa.map_(pa.string(), pa.int32()),
    "pk-names": pa.list_(pa.string()),
    "ingestion-timestamp": pa.timestamp("ms", tz="UTC"),
    "event-timestamp": pa.timestamp("ms", tz="UTC"),
}

_DDL = {"CREATE", "ALTER", "ERASE", "RENAME", "CINDEX", "DINDEX", "QUERY", "GTID", "XACOMMIT", "XAROLLBACK",
        "MHEARTBEAT"}


def option_specs() -> list[Option]:
    return [
        *json_format_options(),
        Option("database.include", "regex", None, doc="only databases whose whole name matches"),
        Option("table.include", "regex", None, doc="only tables whose whole name matches"),
        Option("on-truncate", "choice", "skip", TRUNCATE_POLICIES),
        Option("metadata", "metadata", (), tuple(METADATA_TYPES)),
    ]


def merged_before(data: dict, old: Any) -> dict:
    """The before-image of an updated row: the new row with the changed columns' old values."""
    before = dict(data)
    if isinstance(old, dict):
        before.update(old)
    return before


class CanalJsonDecoder(JsonChangelogDecoder):
    format_name = FORMAT
    metadata_types = METADATA_TYPES

    def __init__(self, *, columns: pa.Schema | None = None, options: Mapping[str, Any] | None = None) -> None:
        opts = parse_options(FORMAT, options, option_specs())
        super().__init__(columns=columns, opts=opts)
        if self._specs is not None:   # Canal writes bytes as ISO-8859-1 text, not base64
            self._specs = [replace(s, wire="latin-1") if s.wire is None and pa.types.is_binary(s.type) else s
                           for s in self._specs]
        self._db_re = opts["database_include"]
        self._table_re = opts["table_include"]
        self.database_include: str | None = self._db_re.pattern if self._db_re else None
        self.table_include: str | None = self._table_re.pattern if self._table_re else None
        self.on_truncate: str = opts["on_truncate"]

    def _message(self, out: ChangeCollector, record: int, obj: Any, partition: int, offset: int) -> str | None:
        database, table = obj.get("database"), obj.get("table")
        if self._db_re is not None and not (isinstance(database, str) and self._db_re.fullmatch(database)):
            return "filtered"
        if self._table_re is not None and not (isinstance(table, str) and self._table_re.fullmatch(table)):
            return "filtered"
        kind = obj.get("type")
        if kind == "TRUNCATE":
            truncate(out, record, seq_from_kafka(partition, offset), database, table, on_truncate=self.on_truncate,
                     what="a Canal TRUNCATE")
            return None
        if obj.get("isDdl") is True or kind in _DDL:
            return "ddl"
        if kind not in ("INSERT", "INIT", "UPDATE", "DELETE"):
            raise Reject("unknown-op", f"unknown Canal type {kind!r}; expected INSERT, UPDATE, DELETE or a DDL type")
        data = obj.get("data")
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise Reject("malformed", f"Canal {kind} without a 'data' array of rows; check the Canal "
                                      f"flatMessage setting (canal.mq.flatMessage=true)")
        if not data:
            return "empty"   # a change message without rows: nothing to apply, counted
        old = obj.get("old")
        if kind == "UPDATE" and (not isinstance(old, list) or len(old) != len(data)):
            raise Reject("missing-before", f"Canal UPDATE whose 'old' does not hold one entry per row of "
                                           f"'data' ({len(data)} rows); the message is incomplete")
        if self._specs is None and self._declared is None:
            self._specs = canal_columns(obj.get("mysqlType"), obj.get("sqlType"))
        es = obj.get("es")
        meta = [self._meta_value(m.key, obj) for m in self._meta] if self._meta else ()
        msg = out.message(record, seq_from_kafka(partition, offset), es if type(es) is int else None,
                          database if isinstance(database, str) else None,
                          table if isinstance(table, str) else None, meta)
        if kind == "UPDATE":
            for row, previous in zip(data, old):
                out.row(msg, UPDATE_BEFORE, merged_before(row, previous))
                out.row(msg, UPDATE_AFTER, row)
        else:
            k = DELETE if kind == "DELETE" else INSERT
            for row in data:
                out.row(msg, k, row)
        return None

    @staticmethod
    def _meta_value(key: str, obj: dict) -> Any:
        if key == "database":
            return obj.get("database")
        if key == "table":
            return obj.get("table")
        if key == "sql-type":
            st = obj.get("sqlType")
            return list(st.items()) if isinstance(st, dict) else None
        if key == "pk-names":
            return obj.get("pkNames")
        if key == "ingestion-timestamp":
            return obj.get("ts")
        if key == "event-timestamp":
            return obj.get("es")
        raise KeyError(key)
