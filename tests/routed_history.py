"""A simulated MySQL database of many tables, written as a Debezium MySQL connector with the JSON
converter and schemas enabled would write it: one topic per table, ``{schema, payload}`` values,
``{schema, payload}`` keys, a snapshot (op ``r``), inserts, updates, deletes with their Kafka
tombstones and re-delivered messages, binlog positions that grow across the whole database.

With ``ddl`` > 0, :meth:`RoutedDatabase.more` alters the columns of the tables it may (``alterable``) in the
middle of the history: ADD COLUMN (int), widening MODIFY (int to bigint) and DROP COLUMN (never the key nor
``flag``), each followed by a change of that table, which carries the new schema.

Sharded tables (``orders_0``..``orders_3``) keep their keys apart (id = shard + 4 * n), as
a routed merge into one ``orders`` table requires; ``events_0``.. reuse the same ids in every
shard, so only a merge with ``origin_columns`` keeps them apart. :meth:`RoutedDatabase.expected`
is what each target table must hold.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import orjson

_FIELDS = [("id", "int64", False), ("name", "string", True), ("big", "int64", True), ("ratio", "double", True),
           ("flag", "boolean", True)]
_NAMES = ["Ada", "Zoë", "Łukasz", "李雷", "O'Brien", "", "emoji 🚀", "tab\tline"]


def _schema(db: str, table: str, fields: list[tuple[str, str, bool]] = _FIELDS) -> dict:
    row = {"type": "struct", "optional": True, "name": f"srv.{db}.{table}.Value",
           "fields": [{"field": n, "type": t, "optional": o} for n, t, o in fields]}
    source = {"type": "struct", "name": "io.debezium.connector.mysql.Source", "optional": False,
              "fields": [{"field": f, "type": t, "optional": True} for f, t in
                         (("db", "string"), ("table", "string"), ("file", "string"), ("pos", "int64"),
                          ("row", "int32"), ("ts_ms", "int64"))]}
    return {"type": "struct", "name": f"srv.{db}.{table}.Envelope", "optional": False,
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}, {**source, "field": "source"},
                       {"field": "op", "type": "string", "optional": False},
                       {"field": "ts_ms", "type": "int64", "optional": True}]}


_KEY_SCHEMA = {"type": "struct", "name": "Key", "optional": False,
               "fields": [{"field": "id", "type": "int64", "optional": False}]}


@dataclass
class Message:
    topic: str
    key: bytes | None
    value: bytes | None


@dataclass
class RoutedDatabase:
    prefix: str
    db: str = "shop"
    seed: int = 5
    #: source table -> id -> row
    state: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    #: source table -> its columns (name, Connect type, optional) once altered; else _FIELDS
    fields: dict[str, list[tuple[str, str, bool]]] = field(default_factory=dict)
    #: (position, table, what) of every ALTER
    ddl_log: list[tuple[int, str, str]] = field(default_factory=list)
    _pos: int = 4
    _next: dict[str, int] = field(default_factory=dict)
    _step: dict[str, int] = field(default_factory=dict)
    _added: int = 0

    def __post_init__(self) -> None:
        self._rnd = random.Random(self.seed)

    def topic(self, table: str) -> str:
        return f"{self.prefix}.{self.db}.{table}"

    def history(self, tables: dict[str, tuple[int, int]], *, changes: int, redeliver: int = 10) -> list[Message]:
        """``tables``: source table -> (first id, id step); a snapshot of 3 rows each, then ``changes`` random
        changes over all tables, then ``redeliver`` of those messages sent again."""
        out: list[Message] = []
        for table, (first, step) in tables.items():
            self.state.setdefault(table, {})
            self._next[table] = first
            self._step[table] = step
            for _ in range(3):
                out.extend(self._insert(table, "r"))
        return out + self.more(changes, tables=list(tables), redeliver=redeliver, earlier=out)

    def more(self, changes: int, *, tables: list[str] | None = None, redeliver: int = 0,
             earlier: list[Message] = (), ddl: float = 0.0, alterable: tuple[str, ...] = ()) -> list[Message]:
        """``changes`` random changes over ``tables`` (default: all), then ``redeliver`` messages sent again;
        before a change of a table in ``alterable``, with probability ``ddl``, an ALTER of it."""
        rnd = self._rnd
        names = tables or sorted(self.state)
        out: list[Message] = []
        for _ in range(changes):
            table = rnd.choice(names)
            rows = self.state[table]
            if table in alterable and rows and rnd.random() < ddl:
                self._alter(table)
                rows = self.state[table]
                op = 0.5        # an update, which carries the new schema
            else:
                op = rnd.random()
            if not rows or op < 0.35:
                out.extend(self._insert(table, "c"))
            elif op < 0.85:
                key = rnd.choice(sorted(rows))
                before, after = rows[key], {**rows[key], **self._values(rnd, table)}
                rows[key] = after
                out.append(self._message(table, "u", key, before, after))
            else:
                key = rnd.choice(sorted(rows))
                out.append(self._message(table, "d", key, rows.pop(key), None))
                out.append(Message(self.topic(table), self._key(key), None))       # the tombstone
        everything = [*earlier, *out]
        return out + rnd.sample(everything, min(redeliver, len(everything)))

    def _values(self, rnd: random.Random, table: str) -> dict[str, Any]:
        values = {"name": rnd.choice(_NAMES + [None]), "big": rnd.choice([2**63 - 1, -2**63, 0, rnd.randint(-9, 9)]),
                  "ratio": rnd.choice([0.1, -2.5, 1e300, None]), "flag": rnd.choice([True, False, None])}
        out = {}
        for name, ctype, _ in self.fields.get(table, _FIELDS)[1:]:
            out[name] = values[name] if name in values else rnd.choice(
                [None, 0, rnd.randint(-99, 99), 2**31 - 1 if ctype == "int32" else 2**40])
        return out

    def _alter(self, table: str) -> None:
        """ADD COLUMN, widen an int column to bigint or DROP COLUMN (not the key, not ``flag``)."""
        rnd = self._rnd
        fields = list(self.fields.get(table, _FIELDS))
        narrow = [i for i, (_, t, _) in enumerate(fields) if t == "int32"]
        droppable = [i for i, (n, _, _) in enumerate(fields) if n not in ("id", "flag")]
        what = rnd.choice(["add", "add", *(["widen"] if narrow else []), *(["drop"] if droppable else [])])
        if what == "add":
            self._added += 1
            fields.append((f"x{self._added}", "int32", True))
        elif what == "widen":
            i = rnd.choice(narrow)
            fields[i] = (fields[i][0], "int64", True)
        else:
            name = fields.pop(rnd.choice(droppable))[0]
            self.state[table] = {k: {c: v for c, v in r.items() if c != name} for k, r in self.state[table].items()}
        self._pos += 1
        self.fields[table] = fields
        self.ddl_log.append((self._pos, table, f"{what} {fields[i][0] if what == 'widen' else ''}".strip()))

    def _insert(self, table: str, op: str) -> Iterator[Message]:
        key = self._next[table]
        self._next[table] += self._step[table]
        row = {"id": key, **self._values(self._rnd, table)}
        self.state[table][key] = row
        yield self._message(table, op, key, None, row)

    def _key(self, key: int) -> bytes:
        return orjson.dumps({"schema": _KEY_SCHEMA, "payload": {"id": key}})

    def _message(self, table: str, op: str, key: int, before: dict | None, after: dict | None) -> Message:
        self._pos += 1
        source = {"db": self.db, "table": table, "file": "mysql-bin.000002", "pos": self._pos, "row": 0,
                  "ts_ms": 1_700_000_000_000 + self._pos}
        if before is not None:      # a row written before an ADD COLUMN reads NULL in it
            before = {n: before.get(n) for n, _, _ in self.fields.get(table, _FIELDS)}
        payload = {"before": before, "after": after, "source": source, "op": op, "ts_ms": source["ts_ms"]}
        return Message(self.topic(table), self._key(key),
                       orjson.dumps({"schema": _schema(self.db, table, self.fields.get(table, _FIELDS)),
                                     "payload": payload}))

    def expected(self, tables: list[str], *, origin: bool = False) -> dict[tuple, dict[str, Any]]:
        """The rows the target table of source ``tables`` must hold, by key (with the origin columns)."""
        out: dict[tuple, dict[str, Any]] = {}
        for table in tables:
            names = [n for n, _, _ in self.fields.get(table, _FIELDS)]
            for key, row in self.state.get(table, {}).items():
                row = {n: row.get(n) for n in names}
                if origin:
                    out[(key, self.db, table)] = {**row, "source_db": self.db, "source_table": table}
                else:
                    out[(key,)] = row
        return out


def produce(messages: list[Message], servers: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5, "log_level": 3})
    for m in messages:
        producer.produce(m.topic, key=m.key, value=m.value)
    assert producer.flush(60) == 0
