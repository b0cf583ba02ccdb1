"""The batch loop every JSON change format shares.

A subclass implements :meth:`JsonChangelogDecoder._message`: given the parsed
message it registers the changes with the collector, raises
:class:`~changelake.formats.assemble.Reject` for a bad one, or returns the name
of a counted skip. The loop guarantees the rest: tombstones and empty values
produce nothing (counted as ``tombstone``), unparseable bytes (not
UTF-8, not JSON) and any unexpected failure become ``malformed`` dead letters,
nothing raises. orjson checks the UTF-8 of the whole document, so no string a
decoder emits can be invalid.
"""

from __future__ import annotations

import decimal
import json
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from changelake.errors import ConfigError
from changelake.formats.assemble import (ChangeCollector, ColumnSpec, MetaColumn, Reject, SchemaMixin, gc_paused,
                                         infer_columns, new_fields)
from changelake.formats.base import DecodeResult
from changelake.formats.encodings import column_spec

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError
_exact_loads = json.loads

#: a JSON number a double may not hold exactly: 16 or more significant digits with a decimal point
#: (15 always survive; an integer of up to 16 digits is read exactly), or an integer beyond 64 bits.
#: Matched for a whole batch at once (Arrow's RE2). It also matches digits inside strings and long
#: integers, which only costs those messages the slower, exact parse.
_LONG_NUMBER = r"[0-9][0-9.]{16,}"


class JsonChangelogDecoder(SchemaMixin):
    """Base of the JSON CDC decoders (not used directly)."""

    format_name = "?"
    #: the format writes exact decimals as JSON numbers (Debezium writes them as text or base64, or
    #: as doubles in decimal.handling.mode=double; Canal writes every value as text)
    decimals_as_numbers = False
    #: readable metadata keys and their Arrow types
    metadata_types: dict[str, pa.DataType] = {}

    def __init__(self, *, columns: pa.Schema | None, opts: dict[str, Any]) -> None:
        """``opts``: validated options (:func:`~changelake.formats.options.parse_options`)."""
        self.ignore_parse_errors: bool = opts["ignore_parse_errors"]
        self.timestamp_format: str = opts["timestamp_format_standard"]
        self.metadata: tuple[tuple[str, str], ...] = opts["metadata"]
        metadata, metadata_types, key = self.metadata, self.metadata_types, opts["key"]
        self._declared = columns
        self._specs: list[ColumnSpec] | None = [column_spec(f) for f in columns] if columns is not None else None
        self._meta = [MetaColumn(k, c, metadata_types[k]) for k, c in metadata]
        self._key = tuple(key)
        if columns is not None:
            names = set(columns.names)
            missing = [k for k in self._key if k not in names]
            if missing:
                raise ConfigError(f"option 'key' names {missing} which are not among the columns {columns.names}")
            clash = [m.column for m in self._meta if m.column in names]
            if clash:
                raise ConfigError(f"option 'metadata': column names {clash} clash with user columns; map the "
                                  f"metadata key to another name, e.g. metadata: {{key: other_name}}")

    # --- to implement -------------------------------------------------------------

    def _message(self, out: ChangeCollector, record: int, obj: Any, partition: int, offset: int) -> str | None:
        raise NotImplementedError

    def _column_specs(self, out: ChangeCollector) -> list[ColumnSpec]:
        """Columns for this batch: declared; else those of the first batch with data, plus the new fields
        of every later batch (typed from their values in the batch that brings them)."""
        if self._specs is None and out.images:
            self._specs = infer_columns(out.images)
        elif self._declared is None and out.images:
            added = new_fields(out.images, self._specs)
            if added:
                self._specs = [*self._specs, *added]
        return self._specs or []

    def _exact_numbers(self) -> bool:
        """Whether a DECIMAL column needs number literals read exactly: the format writes decimals as
        JSON numbers (Maxwell, OGG), which orjson reads as doubles (15-17 significant digits)."""
        return self.decimals_as_numbers and any(pat.is_decimal(s.type) for s in self._specs or ())

    # --- the loop -------------------------------------------------------------------

    def decode(self, records: pa.Table) -> DecodeResult:
        with gc_paused():
            return self._decode(records)

    def _decode(self, records: pa.Table) -> DecodeResult:
        out = ChangeCollector(records, len(self._meta))
        values = records.column("value").to_pylist()
        partitions = records.column("partition").to_pylist()
        offsets = records.column("offset").to_pylist()
        loads = _loads
        message = self._message
        long_numbers = _long_numbers(records.column("value")) if self._exact_numbers() else None
        for i, raw in enumerate(values):
            if not raw:
                out.skip("tombstone")
                continue
            try:
                obj = loads(raw)
            except _JSONDecodeError as exc:
                out.reject(i, "malformed", not_json(raw, exc, self.format_name))
                continue
            if long_numbers is not None and long_numbers[i]:
                # valid (orjson said so) but a number orjson reads as a double may have more digits than
                # a double keeps: read the message again with numbers as exact decimals
                try:
                    obj = _exact_loads(raw, parse_float=decimal.Decimal)
                except ValueError:   # not expected once orjson has accepted it: keep orjson's reading
                    pass
            try:
                skipped = message(out, i, obj, partitions[i], offsets[i])
            except Reject as rej:
                out.reject(i, rej.reason, rej.error)
                continue
            except Exception as exc:  # noqa: BLE001 - a bad message must never take the job down
                out.reject(i, "malformed", f"not a {self.format_name} message ({type(exc).__name__}: {exc}); "
                                           f"check the topic's format setting")
                continue
            if skipped:
                out.skip(skipped)
        return out.finish(self._column_specs(out), self._meta, self._key)


def not_json(raw: bytes, exc: Exception, format_name: str) -> str:
    """The error of a value orjson refused: invalid UTF-8 (where) or invalid JSON."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return (f"not valid UTF-8: byte 0x{raw[bad.start]:02x} at position {bad.start} ({bad.reason}); the topic "
                f"must carry {format_name} messages as UTF-8 JSON, check the producer's character set")
    return f"not valid JSON ({exc}); the topic must carry {format_name} messages as UTF-8 JSON"


def _long_numbers(values: pa.ChunkedArray) -> list[bool]:
    """Per raw value: does it hold a number literal orjson may not read exactly (:data:`_LONG_NUMBER`)?"""
    return pc.fill_null(pc.match_substring_regex(values, _LONG_NUMBER), False).to_pylist()
