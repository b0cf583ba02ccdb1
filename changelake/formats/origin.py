"""The source table a change message names, read from the message itself (for routing).

=======================  ===================================================================
format                   origin (database, schema, table)
=======================  ===================================================================
debezium-json            ``source.db``, ``source.schema``, ``source.table`` of the payload
                         (bare or inside the ``{schema, payload}`` envelope)
debezium-avro-confluent  the same fields of the record, read with its writer schema
canal-json               ``database``, -, ``table``
maxwell-json             ``database``, -, ``table``
ogg-json                 -, -, ``table`` as ``SCHEMA.TABLE``: its schema part is the database
=======================  ===================================================================

:func:`origin_name` joins the parts that are present with dots: ``inventory.orders``
(MySQL), ``shop.public.orders`` (Postgres: database, schema, table), ``HR.EMPLOYEES``
(OGG). A message that names no table has no origin (:class:`NoOrigin` says why).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Origin:
    """The database, schema and table a change message says it comes from (None where it names none)."""

    db: str | None
    schema: str | None
    table: str

    @property
    def name(self) -> str:
        return ".".join(p for p in (self.db, self.schema, self.table) if p)


class NoOrigin(Exception):
    """The message names no source table: ``reason`` (a dead-letter reason) and ``error`` say why."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _debezium(payload: Any) -> Origin | None:
    if not isinstance(payload, dict):
        return None
    source = payload.get("source")
    if not isinstance(source, dict) or _text(source.get("table")) is None:
        return None
    return Origin(_text(source.get("db")), _text(source.get("schema")), source["table"])


def _debezium_json(obj: Any) -> Origin | None:
    if isinstance(obj, dict) and "payload" in obj and "op" not in obj:
        obj = obj["payload"]
    return _debezium(obj)


def _database_table(obj: Any) -> Origin | None:
    if not isinstance(obj, dict) or _text(obj.get("table")) is None:
        return None
    return Origin(_text(obj.get("database")), None, obj["table"])


def _ogg(obj: Any) -> Origin | None:
    if not isinstance(obj, dict) or _text(obj.get("table")) is None:
        return None
    schema, _, table = obj["table"].rpartition(".")
    return Origin(schema or None, None, table) if table else None


_JSON = {"debezium-json": _debezium_json, "canal-json": _database_table, "maxwell-json": _database_table,
         "ogg-json": _ogg}

_WHERE = {"debezium-json": "source.table", "debezium-avro-confluent": "source.table",
          "canal-json": "'database' and 'table'", "maxwell-json": "'database' and 'table'",
          "ogg-json": "'table' (SCHEMA.TABLE)"}


class OriginReader:
    """Reads the origin of each message of one format; ``decoder`` (that format's) fetches Avro writer schemas."""

    def __init__(self, format: str, decoder: Any = None) -> None:  # noqa: A002 - the option is called format
        if format not in _WHERE:
            raise ValueError(f"no origin reader for format {format!r}")
        self.format = format
        self.decoder = decoder
        self._parsed: dict[int, Any] = {}

    def origin(self, value: bytes) -> Origin:
        """The origin of one message value (not empty); :class:`NoOrigin` when it names none."""
        if self.format == "debezium-avro-confluent":
            found = _debezium(self._avro_record(value))
        else:
            try:
                obj = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                from changelake.formats.jsonbase import not_json

                raise NoOrigin("malformed", not_json(value, exc, self.format)) from None
            found = _JSON[self.format](obj)
        if found is None:
            raise NoOrigin("unrouted", f"the message names no source table ({self.format}: "
                           f"{_WHERE[self.format]}), so it cannot be routed to a table; read such messages with a "
                           "source entry of their own that names its 'table'")
        return found

    def _avro_record(self, value: bytes) -> Any:
        import fastavro

        from changelake.errors import ChangelakeError
        from changelake.formats.assemble import Reject

        if len(value) < 5 or value[0] != 0:
            raise NoOrigin("malformed", "not a Confluent-framed Avro message (magic byte 0, 4-byte schema id); "
                           "check the topic's format setting")
        schema_id = int.from_bytes(value[1:5], "big")
        try:
            parsed = self._parsed.get(schema_id)
            if parsed is None:
                parsed = self._parsed[schema_id] = fastavro.parse_schema(self.decoder.registered_schema(schema_id))
            return fastavro.schemaless_reader(io.BytesIO(value[5:]), parsed)
        except Reject as rej:
            raise NoOrigin(rej.reason, rej.error) from None
        except ChangelakeError:     # the registry is unreachable: not the message's fault, the batch is retried
            raise
        except Exception as exc:  # noqa: BLE001 - a bad message is a dead letter, never a crash
            raise NoOrigin("malformed", f"cannot read the Avro body with writer schema {schema_id} "
                           f"({type(exc).__name__}: {exc})") from None
