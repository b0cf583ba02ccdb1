"""Debezium JSON (Flink format ``debezium-json``).

Messages are Debezium change events, either bare ``{before, after, source, op,
ts_ms}`` or wrapped in the JSON converter's ``{schema, payload}`` envelope
(``schema-include``). Op rules: see :mod:`changelake.formats.debezium`.

Column types come from, in order: the declared ``columns``; the envelope's
Connect schema (semantic types such as ``io.debezium.time.MicroTimestamp`` or
``org.apache.kafka.connect.data.Decimal`` become proper Arrow types); else the
values of the first batch with data (int64, float64, bool, string). Declared
columns are still read with the encoding the envelope reports (a base64
Connect Decimal, micro- vs. milliseconds), so both can be combined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from changelake.formats import debezium as dbz
from changelake.formats.assemble import ChangeCollector, ColumnSpec, Reject, evolve_specs, gc_paused, merge_results
from changelake.formats.base import DecodeResult
from changelake.formats.debezium_bulk import BulkPlan, decode_json_chunk
from changelake.formats.jsonbase import JsonChangelogDecoder
from changelake.formats.options import Option, json_format_options, parse_options

FORMAT = "debezium-json"

#: messages per chunk: a bad message sends at most one chunk down the per-message path
CHUNK = 8192


def option_specs() -> list[Option]:
    return [
        Option("schema-include", "bool", False,
               doc="messages carry the {schema, payload} envelope (JSON converter schemas.enable=true)"),
        *json_format_options(),
        *dbz.debezium_options(),
        Option("metadata", "metadata", (), tuple(dbz.METADATA_TYPES),
               doc="metadata keys to append as columns: a list, or a mapping key -> column name"),
    ]


class DebeziumJsonDecoder(JsonChangelogDecoder):
    format_name = FORMAT
    metadata_types = dbz.METADATA_TYPES

    def __init__(self, *, columns: pa.Schema | None = None, options: Mapping[str, Any] | None = None) -> None:
        opts = parse_options(FORMAT, options, option_specs())
        super().__init__(columns=columns, opts=opts)
        self.schema_include: bool = opts["schema_include"]
        self.upsert: bool = opts["upsert"]
        self.on_truncate: str = opts["on_truncate"]
        self._seen: dict[str, ColumnSpec] = {}   # column encodings reported by envelope schemas
        self._seen_fields = -1
        self._last_fields: list | None = None
        #: the distinct row schemas (user columns) the envelopes of the last decoded batch carried, in order
        self.source_schemas: list[pa.Schema] = []
        #: per record of the last decoded batch: the index of its schema in ``source_schemas`` (null: none)
        self.record_schemas: pa.Array | None = None
        self._last_schema: pa.Schema | None = None
        self._envelope_seen = False
        self._plan: BulkPlan | None = None
        self._plan_envelope = False
        self._bulk_failures = 0
        self._chunks = 0

    def decode(self, records: pa.Table) -> DecodeResult:
        """Chunks that are healthy go through the bulk path; the others, message by message."""
        with gc_paused():
            self.source_schemas, self._last_fields, self.record_schemas = [], None, None
            if self._declared is None and (self.schema_include or self._envelope_seen):
                self.record_schemas = self._read_envelope_schemas(records)
            results = []
            for start in range(0, max(records.num_rows, 1), CHUNK):
                chunk = records.slice(start, CHUNK)
                result = None
                plan = self._bulk_plan()
                if plan is not None and self._try_bulk():
                    result = decode_json_chunk(plan, chunk, key=self._key)
                    self._bulk_failures = 0 if result is not None else self._bulk_failures + 1
                if result is None:
                    result = self._decode(chunk)
                results.append(result)
            if self.record_schemas is None and self.source_schemas:     # the first envelopes, learnt one by one
                self.record_schemas = self._read_envelope_schemas(records, learn=False)
            return merge_results(results)

    def _try_bulk(self) -> bool:
        # after repeated misses (a topic whose messages never fit), only probe now and then
        self._chunks += 1
        return self._bulk_failures < 3 or self._chunks % 16 == 0

    def _bulk_plan(self) -> BulkPlan | None:
        if self._specs is None:
            return None   # columns are inferred from the first batch, message by message
        envelope = self.schema_include or self._envelope_seen
        if envelope and self._seen_fields == -1:
            return None   # the first envelope tells how columns are encoded (e.g. micro- vs milliseconds)
        if self._plan is None or self._plan.specs != self._specs or self._plan_envelope != envelope:
            self._plan = BulkPlan(self._specs, self._meta, envelope=envelope,
                                  new_fields=self._declared is None and not envelope)
            self._plan_envelope = envelope
        return self._plan if self._plan.usable else None

    def _message(self, out: ChangeCollector, record: int, obj: Any, partition: int, offset: int) -> str | None:
        schema = None
        if "payload" in obj and "op" not in obj:
            schema = obj.get("schema")
            payload = obj["payload"]
            self._envelope_seen = True
            if payload is None:
                out.skip("tombstone")   # a tombstone that went through the JSON converter
                return None
            if schema is not None:
                self._learn(schema)
        elif self.schema_include:
            raise Reject("malformed", "schema-include is true but the message has no {schema, payload} envelope; "
                                      "set schema-include: false for this topic")
        else:
            payload = obj
        return dbz.collect_event(out, record, payload, schema=schema, meta=self._meta, partition=partition,
                                 offset=offset, upsert=self.upsert, on_truncate=self.on_truncate)

    def _read_envelope_schemas(self, records: pa.Table, *, learn: bool = True) -> pa.Array:
        """Learn every distinct envelope schema of the batch before decoding it, so that the whole batch,
        bulk chunks too, is read with the columns it brings (the JSON converter writes ``schema`` first).
        Returns each record's schema as an index into ``source_schemas`` (null: no envelope schema)."""
        heads = pc.replace_substring_regex(records.column("value"), r'(?s),\s*"payload"\s*:.*$', "}").combine_chunks()
        unique = pc.unique(heads)
        index: list[int | None] = []
        for head in unique.to_pylist():
            try:
                obj = orjson.loads(head) if head else None
            except orjson.JSONDecodeError:
                obj = None
            schema = None
            if isinstance(obj, dict) and isinstance(obj.get("schema"), dict):
                schema = self._learn(obj["schema"]) if learn else self._row_schema(obj["schema"])[1]
            index.append(next((i for i, s in enumerate(self.source_schemas) if s.equals(schema)), None)
                         if schema is not None else None)
        return pa.array(index, pa.int32()).take(pc.index_in(heads, unique))

    @staticmethod
    def _row_schema(envelope_schema: Any) -> tuple[list[ColumnSpec], pa.Schema | None]:
        fields = dbz.row_fields(envelope_schema)
        if fields is None:
            return [], None
        columns = [dbz.connect_column(f["field"], f) for f in fields if isinstance(f.get("field"), str)]
        return columns, pa.schema([pa.field(c.name, c.type) for c in columns])

    def _learn(self, envelope_schema: Any) -> pa.Schema | None:
        """Read the columns of an envelope's schema; returns them as a schema (None: the envelope has none)."""
        fields = dbz.row_fields(envelope_schema)
        if fields is None:
            return None
        if fields == self._last_fields:
            return self._last_schema
        self._last_fields = fields
        self._seen_fields = len(fields)
        columns, schema = self._row_schema(envelope_schema)
        self._last_schema = schema
        for spec in columns:
            self._seen[spec.name] = spec
        if not any(schema.equals(s) for s in self.source_schemas):
            self.source_schemas.append(schema)
        if self._specs is None:
            self._specs = columns
        elif self._declared is not None:
            self._specs = [dbz.with_source_encoding(s, self._seen.get(s.name)) for s in self._specs]
        else:
            self._specs = evolve_specs(self._specs, columns)
        return schema
