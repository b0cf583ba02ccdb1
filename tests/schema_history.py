"""A simulated MySQL table whose columns change mid-stream (ADD COLUMN, widening MODIFY, DROP COLUMN), written
as Debezium (JSON with the schema envelope, schema-less JSON, Avro with a registry) or Maxwell would write
it, to a topic of several partitions by key, with re-delivered messages, then read in batches that take
a random number of messages from each partition, so partitions run behind each other as they do.

:class:`SchemaHistory` keeps every change with its binlog position and the columns in force;
:meth:`SchemaHistory.expected` says what a table must hold under each ``schema_change`` behaviour
(docs/pipelines.md, "Schema changes": the schema of the newest position, a change written as the row
image it carries, a column its image lacks written NULL).
"""

from __future__ import annotations

import io
import random
import struct
from dataclasses import dataclass, field
from typing import Any

import fastavro
import orjson
import pyarrow as pa

from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED

#: Connect type -> (Arrow type, Avro type); Avro has no 16-bit integer
TYPES = {"int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "string": pa.string()}
WIDER = {"int16": "int32", "int32": "int64"}
AVRO = {"int16": "int", "int32": "int", "int64": "long", "string": "string"}


@dataclass(frozen=True)
class Change:
    pos: int
    key: int
    op: str                               # c u d
    before: dict | None
    after: dict | None
    columns: tuple[tuple[str, str], ...]   # (name, connect type) in force at pos, id first


@dataclass
class Message:
    partition: int
    change: Change


@dataclass
class SchemaHistory:
    seed: int
    partitions: int = 3
    avro: bool = False
    #: schema-less: an integer column is never null (a field's type is read from its values)
    schemaless: bool = False
    columns: list[tuple[str, str]] = field(default_factory=lambda: [("id", "int32"), ("qty", "int16"),
                                                                     ("note", "string")])
    rows: dict[int, dict] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    ddl: list[tuple[int, str]] = field(default_factory=list)    # (position, what)
    _pos: int = 100
    _next_col: int = 0

    def __post_init__(self) -> None:
        self.rnd = random.Random(self.seed)
        if self.avro:
            self.columns = [("id", "int32"), ("qty", "int32"), ("note", "string")]

    def run(self, *, changes: int, ddl: int, redeliver: int, drops: bool = True, widen: bool = True) -> None:
        rnd = self.rnd
        at = sorted(rnd.sample(range(1, changes), min(ddl, changes - 1)))
        for i in range(changes):
            while at and at[0] == i:
                at.pop(0)
                self._alter(drops=drops, widen=widen)
            self._change()
        for _ in range(redeliver):
            m = rnd.choice(self.messages)
            self.messages.append(Message(m.partition, m.change))

    def _alter(self, *, drops: bool, widen: bool) -> None:
        rnd = self.rnd
        self._pos += 1
        options = ["add"]
        if widen and any(t in WIDER for _, t in self.columns[1:]):
            options.append("widen")
        if drops and len(self.columns) > 2:
            options.append("drop")
        what = rnd.choice(options)
        if what == "add":
            self._next_col += 1
            name = f"c{self._next_col}"
            # schema-less: a field first seen only as null (a before-image) is typed string, so new ones are strings
            self.columns.append((name, "string" if self.schemaless else rnd.choice(
                ["int16" if not self.avro else "int32", "string"])))
            self.ddl.append((self._pos, f"add {name}"))
        elif what == "widen":
            i = rnd.choice([i for i, (_, t) in enumerate(self.columns) if i and t in WIDER])
            self.columns[i] = (self.columns[i][0], WIDER[self.columns[i][1]])
            self.ddl.append((self._pos, f"widen {self.columns[i][0]}"))
        else:
            i = rnd.randrange(1, len(self.columns))
            name = self.columns.pop(i)[0]
            self.rows = {k: {n: v for n, v in row.items() if n != name} for k, row in self.rows.items()}
            self.ddl.append((self._pos, f"drop {name}"))

    def _value(self, ctype: str) -> Any:
        if ctype == "string":
            return self.rnd.choice(["a", "bb", None, "zoë"])
        values = [0, self.rnd.randint(-300, 300), 32767, -32768]     # fit every integer type
        return self.rnd.choice(values if self.schemaless else [None, *values])

    def _image(self, key: int) -> dict:
        return {"id": key, **{n: self._value(t) for n, t in self.columns[1:]}}

    def _change(self) -> None:
        rnd = self.rnd
        self._pos += 1
        op = "c" if not self.rows or rnd.random() < 0.3 else "d" if rnd.random() < 0.15 else "u"
        if op == "c":
            key = max(self.rows, default=0) + 1 + rnd.randrange(3)
            before, after = None, self._image(key)
        else:
            key = rnd.choice(sorted(self.rows))
            before = {**{n: None for n, _ in self.columns}, **self.rows[key]}
            after = self._image(key) if op == "u" else None
        if after is None:
            self.rows.pop(key)
        else:
            self.rows[key] = after
        change = Change(self._pos, key, op, before, after, tuple(self.columns))
        self.changes.append(change)
        self.messages.append(Message(key % self.partitions, change))

    # --- encodings ---------------------------------------------------------------------------------

    def value(self, change: Change, fmt: str, registry: dict[int, Any] | None = None) -> bytes:
        source = {"db": "shop", "table": "items", "file": "mysql-bin.000003", "pos": change.pos, "row": 0,
                  "ts_ms": 1_700_000_000_000 + change.pos}
        payload = {"before": change.before, "after": change.after, "source": source, "op": change.op,
                   "ts_ms": source["ts_ms"]}
        if fmt == "schema":
            return orjson.dumps({"schema": _connect_schema(change.columns), "payload": payload})
        if fmt == "schemaless":
            return orjson.dumps(payload)
        if fmt == "maxwell":      # no binlog position: ordered by Kafka partition and offset only
            kind = {"c": "insert", "u": "update", "d": "delete"}[change.op]
            body = {"database": "shop", "table": "items", "type": kind, "ts": change.pos,
                    "data": change.after if change.op != "d" else change.before}
            if change.op == "u":
                body["old"] = {k: v for k, v in change.before.items() if change.after.get(k) != v}
            return orjson.dumps(body)
        assert fmt == "avro" and registry is not None
        schema = _avro_schema(change.columns)
        schema_id = next((i for i, s in registry.items() if s == schema), None)
        if schema_id is None:
            schema_id = len(registry) + 1
            registry[schema_id] = schema
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), payload)
        return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()

    def batches(self, topic: str, fmt: str, registry: dict | None = None, *, most: int = 6
                ) -> list[tuple[pa.RecordBatch, list[Change]]]:
        """The messages read in batches: each batch takes 0..``most`` of the next messages of each partition
        (at least one in all); returns each batch's records and changes."""
        logs: dict[int, list[Message]] = {}
        for m in self.messages:
            logs.setdefault(m.partition, []).append(m)
        read = {p: 0 for p in logs}
        out = []
        while any(read[p] < len(logs[p]) for p in logs):
            taken: list[tuple[int, int, Message]] = []
            order = list(logs)
            self.rnd.shuffle(order)
            for p in order:
                n = self.rnd.randint(0, most)
                for off in range(read[p], min(read[p] + n, len(logs[p]))):
                    taken.append((p, off, logs[p][off]))
                read[p] = min(read[p] + n, len(logs[p]))
            if not taken:
                continue
            n = len(taken)
            out.append((pa.RecordBatch.from_pydict({
                "topic": [topic] * n, "partition": [p for p, _, _ in taken], "offset": [o for _, o, _ in taken],
                "timestamp": [1_700_000_000_000] * n,
                "key": [orjson.dumps({"id": m.change.key}) for _, _, m in taken],
                "value": [self.value(m.change, fmt, registry) for _, _, m in taken], EXPIRED: [0] * n},
                schema=ARROW_SCHEMA), [m.change for _, _, m in taken]))
        return out

    # --- what a table must hold ----------------------------------------------------------------------

    def expected(self, behaviour: str, batches: list[list[Change]], *, schemaless: bool = False
                 ) -> tuple[dict[str, pa.DataType] | None, dict[int, dict], int | None]:
        """(table columns and types, rows by key, the batch that quarantines the table or None) under
        ``behaviour`` for the changes read in ``batches`` (docs/pipelines.md, "Schema changes")."""
        read = [c for b in batches for c in b]
        first = batches[0]
        if schemaless:
            return self._expected_schemaless(behaviour, batches)
        created = dict(min(first, key=lambda c: c.pos).columns)
        quarantined = None
        if behaviour == "exception":
            recorded = max(c.pos for c in first)
            if len({c.columns for c in first}) > 1:
                quarantined = 0
            else:
                quarantined = next((i for i, b in enumerate(batches) if i and any(
                    c.pos > recorded and dict(c.columns) != created for c in b)), None)
        if behaviour in ("evolve", "try_evolve"):
            columns = dict(max(read, key=lambda c: c.pos).columns)
        elif behaviour == "lenient":    # loses nothing: every column read, in the type of its newest position
            columns = dict(created)     # (the widest: this history only widens), whatever position was read when
            for cols in sorted({c.columns for c in read},
                               key=lambda cols: min(c.pos for c in read if c.columns == cols)):
                columns.update(dict(cols))
        else:
            columns = created
        applied = read if quarantined is None else [c for b in batches[:quarantined] for c in b]
        rows = _last_images(applied, columns)
        return ({n: TYPES[t] for n, t in columns.items()} if quarantined != 0 else None), rows, quarantined

    def _expected_schemaless(self, behaviour: str, batches: list[list[Change]]):
        """Schema-less: columns from the fields seen (int64, string), none ever dropped; a new field is added."""
        read = [c for b in batches for c in b]
        types: dict[str, str] = {}
        first_fields = {n for c in batches[0] for n, _ in c.columns}
        quarantined = None
        for i, b in enumerate(batches):
            for c in b:
                for n, t in c.columns:
                    types.setdefault(n, "int64" if t.startswith("int") else "string")
            if behaviour == "exception" and i and quarantined is None and set(types) - first_fields:
                quarantined = i
        if behaviour in ("ignore", "exception"):
            types = {n: t for n, t in types.items() if n in first_fields}
        applied = read if quarantined is None else [c for b in batches[:quarantined] for c in b]
        return {n: TYPES[t] for n, t in types.items()}, _last_images(applied, types), quarantined


def _last_images(changes: list[Change], columns: dict) -> dict[int, dict]:
    last: dict[int, Change] = {}
    for c in sorted(changes, key=lambda c: c.pos):
        last[c.key] = c
    return {k: {n: c.after.get(n) for n in columns} for k, c in last.items() if c.op != "d"}


def _connect_schema(columns: tuple[tuple[str, str], ...]) -> dict:
    row = {"type": "struct", "optional": True, "name": "shop.items.Value",
           "fields": [{"field": n, "type": t, "optional": n != "id"} for n, t in columns]}
    return {"type": "struct", "name": "shop.items.Envelope", "optional": False,
            "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                       {"field": "source", "type": "struct", "optional": False, "fields": [
                           {"field": f, "type": t, "optional": True} for f, t in
                           (("db", "string"), ("table", "string"), ("file", "string"), ("pos", "int64"),
                            ("row", "int32"), ("ts_ms", "int64"))]},
                       {"field": "op", "type": "string", "optional": False},
                       {"field": "ts_ms", "type": "int64", "optional": True}]}


def _avro_schema(columns: tuple[tuple[str, str], ...]) -> dict:
    fields = [{"name": n, "type": AVRO[t]} if n == "id" else {"name": n, "type": ["null", AVRO[t]], "default": None}
              for n, t in columns]
    row = {"type": "record", "name": "Value", "namespace": "shop.items", "fields": fields}
    source = {"type": "record", "name": "Source", "namespace": "io.debezium", "fields": [
        {"name": "db", "type": "string"}, {"name": "table", "type": "string"}, {"name": "file", "type": "string"},
        {"name": "pos", "type": "long"}, {"name": "row", "type": "int"}, {"name": "ts_ms", "type": "long"}]}
    return {"type": "record", "name": "Envelope", "namespace": "shop.items", "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "shop.items.Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}
