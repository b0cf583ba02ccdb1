"""An adversarial MySQL database and its Debezium history, as the MySQL connector writes it.

Three related tables, ``customers``, ``products`` and ``orders`` (``orders.customer_id`` and
``orders.product_id`` are nullable references), filled by a seeded generator that reaches for
the corners a real database holds:

* values at the type limits: BIGINT -2^63 and ±(2^63−1) (as customer ids, so also in the
  nullable join key ``orders.customer_id``), INT/SMALLINT/TINYINT limits, DECIMAL(38, s)
  extremes, DOUBLE extremes and −0.0, DATE/DATETIME in years 1000 and 9999 (the
  ``'9999-12-31'`` sentinel), TIMESTAMP at 1970 and 2038, strings with NUL, emoji, combining
  marks, right-to-left text and the empty string (not NULL), bytes with 0x00 and 0xff;
* NULLs in every nullable column, set on insert and by updates to and from NULL;
* a snapshot (op ``r``, one binlog position), then binlog events: single- and multi-row
  inserts, updates and deletes (one event, several rows: the same ``source.file``/``pos``,
  ``source.row`` 0, 1, ...), with the binlog file rotating (``mysql-bin.000001`` ->
  ``.000002`` -> ``.000003``, ``pos`` restarting low);
* primary-key changes as Debezium MySQL reports them: a DELETE of the old key with the header
  ``__debezium.newkey``, its tombstone, then a CREATE of the new key with ``__debezium.oldkey``;
* deletes followed by tombstones, re-inserts of deleted keys, duplicates (a message sent twice
  in a row) and replays (a connector restart re-sends the messages after its last committed
  offset, in order), and malformed messages, which must end in the dead letters.

:meth:`AdversarialShop.phase` writes the next part of the history; :func:`encode` turns it into
Kafka messages with the JSON converter's schema envelope (``schemas.enable=true``) or without
(``schemas.enable=false``). :attr:`AdversarialShop.state` is the database after the messages
written so far: what the mirrors must hold and what DuckDB computes the graph tables from.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import random
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import orjson

SERVER = "shop"
DATABASE = "shop"
UTC = dt.timezone.utc
EPOCH = dt.datetime(1970, 1, 1)
EPOCH_DAY = dt.date(1970, 1, 1)

#: column -> (pipeline type, Connect schema of the JSON converter, schema-less wire encoding or None, nullable)
COLUMNS: dict[str, dict[str, tuple[str, dict, str | None, bool]]] = {
    "customers": {
        "id": ("bigint", {"type": "int64"}, None, False),
        "name": ("string", {"type": "string"}, None, True),
        "tier": ("tinyint", {"type": "int16"}, None, True),         # Debezium writes TINYINT as INT16
        "score": ("smallint", {"type": "int16"}, None, True),
        "points": ("int", {"type": "int32"}, None, True),
        "balance": ("decimal(38,10)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                        "version": 1, "parameters": {"scale": "10", "connect.decimal.precision": "38"}},
                    "org.apache.kafka.connect.data.Decimal", True),
        "rating": ("double", {"type": "double"}, None, True),
        "born": ("date", {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
                 "io.debezium.time.Date", True),
        "joined": ("timestamp_ntz", {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
                   "io.debezium.time.MicroTimestamp", True),                               # DATETIME(6)
        "token": ("bytes", {"type": "bytes"}, None, True),                                  # VARBINARY
        "vip": ("boolean", {"type": "boolean"}, None, True),                                # BIT(1)
    },
    "products": {
        "id": ("bigint", {"type": "int64"}, None, False),
        "name": ("string", {"type": "string"}, None, True),
        "category": ("string", {"type": "string"}, None, True),
        "price": ("decimal(38,2)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                     "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "38"}},
                  "org.apache.kafka.connect.data.Decimal", True),
        "weight": ("float", {"type": "float"}, None, True),                                 # FLOAT
        "attrs": ("string", {"type": "string", "name": "io.debezium.data.Json", "version": 1}, None, True),
        "released": ("timestamp_ntz", {"type": "int64", "name": "io.debezium.time.Timestamp", "version": 1},
                     "io.debezium.time.Timestamp", True),                                  # DATETIME(3)
    },
    "orders": {
        "order_id": ("bigint", {"type": "int64"}, None, False),
        "customer_id": ("bigint", {"type": "int64"}, None, True),
        "product_id": ("bigint", {"type": "int64"}, None, True),
        "quantity": ("int", {"type": "int32"}, None, True),
        "amount": ("decimal(18,4)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                                      "version": 1, "parameters": {"scale": "4", "connect.decimal.precision": "18"}},
                   "org.apache.kafka.connect.data.Decimal", True),
        "placed": ("timestamp_ntz", {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1},
                   "io.debezium.time.MicroTimestamp", True),                               # DATETIME(6)
        "ship_date": ("date", {"type": "int32", "name": "io.debezium.time.Date", "version": 1},
                      "io.debezium.time.Date", True),
        "modified": ("timestamp", {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1},
                     "io.debezium.time.ZonedTimestamp", True),                             # TIMESTAMP(6)
        "note": ("string", {"type": "string"}, None, True),
        "tracking": ("decimal(20,0)", {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",   # BIGINT
                                        "version": 1, "parameters": {"scale": "0", "connect.decimal.precision": "20"}},
                     "org.apache.kafka.connect.data.Decimal", True),    # UNSIGNED, bigint.unsigned.handling.mode=precise
    },
}
KEYS = {"customers": "id", "products": "id", "orders": "order_id"}

BIGINT_MAX, BIGINT_MIN = 2**63 - 1, -(2**63)
_ODD_TEXT = ["\x00", "a\x00b", "😀🎉👩‍👩‍👧", "e\u0301\u0323", "שלום עולם", "مرحبا", "\u202eabc\u202c", "",
             "'\"\\\n\t", "\U0010ffff\ufeff", "Zürich ß", "x" * 300]
_CORNERS: dict[str, list] = {
    "bigint": [BIGINT_MAX, BIGINT_MIN, -BIGINT_MAX, 0, -1, 2**53 + 1, -(2**53 + 1)],
    "int": [2**31 - 1, -(2**31), 0, -1],
    "smallint": [2**15 - 1, -(2**15), 0],
    "tinyint": [127, -128, 0],
    "decimal(38,10)": [Decimal("9999999999999999999999999999.9999999999"),
                       Decimal("-9999999999999999999999999999.9999999999"), Decimal("0.0000000001"),
                       Decimal("-0.0000000001"), Decimal("0E-10")],
    "decimal(38,2)": [Decimal("999999999999999999999999999999999999.99"),
                      Decimal("-999999999999999999999999999999999999.99"), Decimal("0.01"), Decimal("-0.01")],
    "decimal(18,4)": [Decimal("99999999999999.9999"), Decimal("-99999999999999.9999"), Decimal("0.0001")],
    "decimal(20,0)": [Decimal(2**64 - 1), Decimal(2**63), Decimal(0)],
    "float": [3.4028234663852886e38, -3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, -0.0,
              0.10000000149011612],
    "boolean": [True, False],
    "json": ['{"a": [1, 2.5, {"b": null}], "ü": "😀"}', "[]", "null", '"\\u0000"', '{"k": "a\\u0000b"}'],
    "double": [1.7976931348623157e308, -1.7976931348623157e308, 2.2250738585072014e-308, -2.2250738585072014e-308,
               -0.0, 0.0, 0.1],
    "date": [dt.date(1000, 1, 1), dt.date(9999, 12, 31), dt.date(1969, 12, 31), dt.date(1970, 1, 1)],
    "timestamp_ntz": [dt.datetime(1000, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
                      dt.datetime(1969, 12, 31, 23, 59, 59, 999999), dt.datetime(1970, 1, 1)],
    "timestamp": [dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), dt.datetime(2038, 1, 19, 3, 14, 7, 999999, tzinfo=UTC)],
    "string": _ODD_TEXT,
    "bytes": [b"\x00", b"\xff\xfe\x00", b"", bytes(range(256))],
}
_CATEGORIES = ["tools", "garden", "kitchen", "", "😀 toys", "a\x00b", "שלום"]
#: customer and product ids: the BIGINT limits are among them, so they reach the join keys
_ID_POOL = [BIGINT_MAX, BIGINT_MIN, -BIGINT_MAX, 0, -1, 2**53 + 1]


@dataclass
class Event:
    """One Kafka message of the history before encoding: a change, a tombstone or a malformed message."""

    table: str
    key: Any                                  # the row's key value
    op: str | None = None                     # r c u d; None: a tombstone
    before: dict | None = None
    after: dict | None = None
    source: dict = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)
    malformed: str | None = None              # the kind of malformation (see ``_malformed``)


@dataclass
class AdversarialShop:
    seed: int = 1
    state: dict[str, dict[Any, dict]] = field(default_factory=lambda: {t: {} for t in COLUMNS})
    #: kinds of events written (for the test to check the history reaches every corner)
    seen: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._file = 1
        self._pos = 154
        self._ts = 1_700_000_000_000
        self._deleted: dict[str, list] = {t: [] for t in COLUMNS}
        self._ever: dict[str, set] = {t: set() for t in COLUMNS}
        self._sent: list[Event] = []           # what a connector restart may re-send

    # --- values -----------------------------------------------------------------------------
    def _value(self, table: str, column: str) -> Any:
        kind, schema, _, nullable = COLUMNS[table][column]
        if schema.get("name") == "io.debezium.data.Json":
            kind = "json"
        r = self.rng.random()
        if nullable and r < 0.15:
            return None
        value = self.rng.choice(_CORNERS[kind]) if r < 0.45 else self._ordinary(kind)
        if COLUMNS[table][column][2] == "io.debezium.time.Timestamp":        # DATETIME(3): milliseconds
            value = value.replace(microsecond=value.microsecond // 1000 * 1000)
        return value

    def _ordinary(self, kind: str) -> Any:
        rng = self.rng
        if kind in ("bigint", "int"):
            return rng.randint(-10**6, 10**6)
        if kind in ("smallint", "tinyint"):
            return rng.randint(-100, 100)
        if kind.startswith("decimal"):
            scale = int(kind.split(",")[1].rstrip(")"))
            return Decimal(rng.randint(-10**8, 10**8)).scaleb(-scale)
        if kind == "double":
            return rng.uniform(-1e6, 1e6)
        if kind == "float":
            return float(np.float32(rng.uniform(-1e6, 1e6)))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "json":
            return orjson.dumps({"n": rng.randint(0, 99)}).decode()
        if kind == "date":
            return EPOCH_DAY + dt.timedelta(days=rng.randint(-20_000, 20_000))
        if kind == "timestamp_ntz":
            return EPOCH + dt.timedelta(microseconds=rng.randint(-2 * 10**15, 2 * 10**15))
        if kind == "timestamp":
            return dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=rng.randint(0, 10**15))
        if kind == "string":
            return rng.choice(["Ada", "Bo", "Cy", "Di", "Émile", "Zoë", "李雷"]) + str(rng.randint(0, 99))
        if kind == "bytes":
            return rng.randbytes(rng.randint(1, 8))
        raise AssertionError(kind)

    def _row(self, table: str, key: Any) -> dict:
        row = {c: self._value(table, c) for c in COLUMNS[table]}
        row[KEYS[table]] = key
        if table == "products":
            row["category"] = None if self.rng.random() < 0.2 else self.rng.choice(_CATEGORIES)
        if table == "orders":
            row["customer_id"] = self._reference("customers")
            row["product_id"] = self._reference("products")
            if row["quantity"] is not None and self.rng.random() < 0.6:
                row["quantity"] = self.rng.randint(1, 20)
        return row

    def _reference(self, table: str) -> Any:
        r = self.rng.random()
        live = sorted(self.state[table])
        if r < 0.12:
            return None
        if live and r < 0.8:
            return self.rng.choice(live)
        if self._ever[table] and r < 0.9:            # deleted or moved away: the join finds nothing
            return self.rng.choice(sorted(self._ever[table]))
        return self.rng.choice(_ID_POOL + [10**15 + 7])

    def _fresh_key(self, table: str) -> Any:
        while True:
            if table != "orders" and self.rng.random() < 0.4:
                key = self.rng.choice(_ID_POOL)
            elif self._deleted[table] and self.rng.random() < 0.25:       # a re-insert of a deleted key
                key = self.rng.choice(self._deleted[table])
            else:
                key = self.rng.randint(-10**12, 10**12)
            if key not in self.state[table]:
                if key in self._deleted[table]:
                    self._count("re-insert")
                return key

    def _changed(self, table: str, row: dict) -> dict:
        new = dict(row)
        columns = [c for c in COLUMNS[table] if c != KEYS[table]]
        for c in self.rng.sample(columns, self.rng.randint(1, 3)):
            old = new[c]
            new[c] = self._row(table, row[KEYS[table]])[c] if c in ("customer_id", "product_id", "category") \
                else self._value(table, c)
            if old is not None and new[c] is None:
                self._count("to-null")
            if old is None and new[c] is not None:
                self._count("from-null")
        return new

    # --- positions and events -------------------------------------------------------------------
    def _count(self, what: str) -> None:
        self.seen[what] = self.seen.get(what, 0) + 1

    def _source(self, table: str, row: int, *, snapshot: str = "false") -> dict:
        return {"version": "2.7.3.Final", "connector": "mysql", "name": SERVER, "ts_ms": self._ts,
                "snapshot": snapshot, "db": DATABASE, "sequence": None, "table": table, "server_id": 223344,
                "gtid": None, "file": f"mysql-bin.{self._file:06d}", "pos": self._pos, "row": row,
                "thread": None if snapshot != "false" else 7, "query": None}

    def _next_event_position(self) -> None:
        self._pos += self.rng.randint(150, 900)
        self._ts += self.rng.randint(1, 2_000)

    def rotate(self) -> None:
        """FLUSH LOGS: the next binlog file, positions start again at the top of the file."""
        self._file += 1
        self._pos = 157 + self.rng.randint(0, 40)
        self._count("rotation")

    def _apply(self, table: str, before: dict | None, after: dict | None) -> None:
        key = KEYS[table]
        live = self.state[table]
        if before is not None:
            assert live[before[key]] == before
            del live[before[key]]
            self._deleted[table].append(before[key])
        if after is not None:
            assert after[key] not in live
            live[after[key]] = after
            self._ever[table].add(after[key])

    def _statement(self, table: str, op: str, rows: list[tuple[dict | None, dict | None]]) -> list[Event]:
        """One binlog event with ``rows``: the messages Debezium writes for it."""
        self._next_event_position()
        key = KEYS[table]
        out: list[Event] = []
        for i, (before, after) in enumerate(rows):
            self._apply(table, before, after)
            src = self._source(table, i)
            if op == "u" and before[key] != after[key]:           # a key change: delete + tombstone + create
                old, new = before[key], after[key]
                out.append(Event(table, old, "d", before, None, src, {"__debezium.newkey": {key: new}}))
                out.append(Event(table, old))
                out.append(Event(table, new, "c", None, after, src, {"__debezium.oldkey": {key: old}}))
                self._count("key-change")
            elif op == "d":
                out.append(Event(table, before[key], "d", before, None, src))
                out.append(Event(table, before[key]))
            else:
                out.append(Event(table, (after or before)[key], op, before, after, src))
        if len(rows) > 1:
            self._count(f"multi-row-{op}")
        return out

    def snapshot(self, sizes: dict[str, int]) -> list[Event]:
        """The initial snapshot: every row with op ``r`` at the binlog position the snapshot started at."""
        out = []
        total = sum(sizes.values())
        n = 0
        for table in ("customers", "products", "orders"):
            for _ in range(sizes[table]):
                row = self._row(table, self._fresh_key(table))
                self._apply(table, None, row)
                n += 1
                flag = "first" if n == 1 else "last" if n == total else "true"
                out.append(Event(table, row[KEYS[table]], "r", None, row, self._source(table, 0, snapshot=flag)))
        self._next_event_position()
        return out

    def _change(self) -> list[Event]:
        rng = self.rng
        table = rng.choice(("customers", "products", "orders", "orders"))
        live = self.state[table]
        key = KEYS[table]
        r = rng.random()
        if len(live) < 3 or r < 0.25:
            n = rng.choice([1, 1, 1, 2, 3])
            rows = []
            for _ in range(n):
                row = self._row(table, self._fresh_key(table))
                if row[key] in [a[key] for _, a in rows]:
                    continue
                rows.append((None, row))
            # the rows of one INSERT are applied one by one, so fresh keys are checked against the earlier rows
            return self._statement(table, "c", rows)
        if r < 0.55:
            picked = rng.sample(sorted(live), min(len(live), rng.choice([1, 1, 2, 3])))
            return self._statement(table, "u", [(live[k], self._changed(table, live[k])) for k in picked])
        if r < 0.66:
            picked = rng.sample(sorted(live), min(len(live), rng.choice([1, 1, 2])))
            return self._statement(table, "d", [(live[k], None) for k in picked])
        if r < 0.85:                                  # UPDATE ... SET id = ...: a primary-key change
            old = live[rng.choice(sorted(live))]
            new = self._changed(table, old) if rng.random() < 0.5 else dict(old)
            new[key] = self._fresh_key(table)
            return self._statement(table, "u", [(old, new)])
        # a multi-row update of one column (UPDATE orders SET quantity = ... WHERE ...)
        picked = rng.sample(sorted(live), min(len(live), 3))
        column = rng.choice([c for c in COLUMNS[table] if c != key])
        value = self._value(table, column)
        return self._statement(table, "u", [(live[k], {**live[k], column: value}) for k in picked])

    def _malformed(self, table: str) -> Event:
        kind = MALFORMED[sum(v for k, v in self.seen.items() if k.startswith("malformed-")) % len(MALFORMED)]
        self._count(f"malformed-{kind}")
        return Event(table, self.rng.randint(1, 99), malformed=kind)

    def phase(self, *, changes: int, snapshot: dict[str, int] | None = None, rotate_at: float = 0.5,
              replay: int = 15) -> list[Event]:
        """The next part of the history: an optional snapshot, ``changes`` binlog events (the file
        rotating at ``rotate_at`` of them), with duplicates, malformed messages and, at 3/4, a
        connector restart that re-sends the last ``replay`` messages."""
        out: list[Event] = self.snapshot(snapshot) if snapshot else []
        for i in range(changes):
            if i == int(changes * rotate_at):
                self.rotate()
            events = self._change()
            out += events
            if self.rng.random() < 0.05:                           # a producer retry: sent twice in a row
                out.append(events[-1])
                self._count("duplicate")
            if self.rng.random() < 0.06:
                out.append(self._malformed(self.rng.choice(list(COLUMNS))))
            if i == changes * 3 // 4 and replay:                  # a connector restart
                out += out[-replay:]
                self._count("replay")
        for table, columns in COLUMNS.items():       # UPDATE t SET c = NULL WHERE ...: every column gets a NULL
            live = self.state[table]
            for c, (_, _, _, nullable) in columns.items():
                if nullable and live and all(r[c] is not None for r in live.values()):
                    picked = self.rng.sample(sorted(live), min(len(live), 2))
                    out += self._statement(table, "u", [(live[k], {**live[k], c: None}) for k in picked])
                    self._count("to-null")
        return out


# --- encoding -----------------------------------------------------------------------------------

MALFORMED = ("truncated", "non-utf8-string", "not-json", "not-an-envelope", "unknown-op", "wrong-type",
             "out-of-range")


@dataclass
class Message:
    topic: str
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    malformed: str | None = None


def topic(prefix: str, table: str) -> str:
    return f"{prefix}.{DATABASE}.{table}"


def _decimal_bytes(value: Decimal, scale: int) -> str:
    with decimal.localcontext(prec=80):
        unscaled = int(value.scaleb(scale))
    length = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
    return base64.b64encode(unscaled.to_bytes(length, "big", signed=True)).decode()


def _wire(table: str, column: str, value: Any) -> Any:
    """The value as Debezium's JSON converter writes it (MySQL connector defaults)."""
    if value is None:
        return None
    kind = COLUMNS[table][column][0]
    if kind.startswith("decimal"):
        return _decimal_bytes(value, int(kind.split(",")[1].rstrip(")")))
    if kind == "date":
        return (value - EPOCH_DAY).days
    if kind == "timestamp_ntz":
        unit = 1000 if COLUMNS[table][column][2] == "io.debezium.time.Timestamp" else 1
        micros = (value - EPOCH) // dt.timedelta(microseconds=1)
        assert micros % unit == 0
        return micros // unit
    if kind == "timestamp":
        return value.isoformat().replace("+00:00", "Z")
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind == "float":     # Java's Float.toString: the shortest text that reads back as the same float32
        return float(str(np.float32(value)))
    return value


def _image(table: str, row: dict | None) -> dict | None:
    return None if row is None else {c: _wire(table, c, row[c]) for c in COLUMNS[table]}


def _field_schema(table: str, column: str) -> dict:
    _, schema, _, nullable = COLUMNS[table][column]
    return {**schema, "optional": nullable, "field": column}


def _value_schema(table: str) -> dict:
    row = {"type": "struct", "fields": [_field_schema(table, c) for c in COLUMNS[table]], "optional": True,
           "name": f"{SERVER}.{DATABASE}.{table}.Value"}
    source = {"type": "struct", "optional": False, "name": "io.debezium.connector.mysql.Source", "field": "source",
              "fields": [{"type": "string", "optional": False, "field": "version"},
                         {"type": "string", "optional": False, "field": "connector"},
                         {"type": "string", "optional": False, "field": "name"},
                         {"type": "int64", "optional": False, "field": "ts_ms"},
                         {"type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                          "parameters": {"allowed": "true,first,first_in_data_collection,last_in_data_collection,"
                                                    "last,false,incremental"},
                          "default": "false", "field": "snapshot"},
                         {"type": "string", "optional": False, "field": "db"},
                         {"type": "string", "optional": True, "field": "sequence"},
                         {"type": "string", "optional": True, "field": "table"},
                         {"type": "int64", "optional": False, "field": "server_id"},
                         {"type": "string", "optional": True, "field": "gtid"},
                         {"type": "string", "optional": False, "field": "file"},
                         {"type": "int64", "optional": False, "field": "pos"},
                         {"type": "int32", "optional": False, "field": "row"},
                         {"type": "int64", "optional": True, "field": "thread"},
                         {"type": "string", "optional": True, "field": "query"}]}
    return {"type": "struct", "optional": False, "name": f"{SERVER}.{DATABASE}.{table}.Envelope", "version": 1,
            "fields": [{**row, "field": "before"}, {**row, "field": "after"}, source,
                       {"type": "string", "optional": False, "field": "op"},
                       {"type": "int64", "optional": True, "field": "ts_ms"}]}


def _key_schema(table: str) -> dict:
    return {"type": "struct", "fields": [_field_schema(table, KEYS[table])], "optional": False,
            "name": f"{SERVER}.{DATABASE}.{table}.Key"}


def _wrap(schemas: bool, schema: dict, payload: Any) -> bytes:
    return orjson.dumps({"schema": schema, "payload": payload} if schemas else payload)


def encode(events: list[Event], *, prefix: str, schemas: bool) -> list[Message]:
    """The events as Kafka messages of the JSON converter, ``schemas.enable`` = ``schemas``."""
    out = []
    for e in events:
        key = _wrap(schemas, _key_schema(e.table), {KEYS[e.table]: e.key})
        if e.malformed:
            out.append(Message(topic(prefix, e.table), key, _malformed_value(e, schemas), malformed=e.malformed))
            continue
        if e.op is None:
            out.append(Message(topic(prefix, e.table), key, None))
            continue
        payload = {"before": _image(e.table, e.before), "after": _image(e.table, e.after), "source": e.source,
                   "op": e.op, "ts_ms": e.source["ts_ms"] + 17}
        headers = [(h, _wrap(schemas, _key_schema(e.table), v)) for h, v in e.headers.items()]
        out.append(Message(topic(prefix, e.table), key, _wrap(schemas, _value_schema(e.table), payload), headers))
    return out


def _malformed_value(e: Event, schemas: bool) -> bytes:
    table, key = e.table, KEYS[e.table]
    good = {c: None for c in COLUMNS[table]} | {key: e.key}
    payload = {"before": None, "after": _image(table, good), "op": "c", "ts_ms": 1_700_000_000_000,
               "source": {"connector": "mysql", "name": SERVER, "ts_ms": 1_700_000_000_000, "db": DATABASE,
                          "table": table, "server_id": 1, "file": "mysql-bin.000001", "pos": 4, "row": 0}}
    schema = _value_schema(table)
    text_column = "name" if table != "orders" else "note"
    if e.malformed == "truncated":
        whole = _wrap(schemas, schema, payload)
        return whole[:len(whole) // 2]
    if e.malformed == "non-utf8-string":
        payload["after"][text_column] = "caf@"
        return _wrap(schemas, schema, payload).replace(b"caf@", b"caf\xe9")
    if e.malformed == "not-json":
        return b"\x00\x01\x02 this is not JSON"
    if e.malformed == "not-an-envelope":
        return orjson.dumps([1, 2, 3]) if schemas else orjson.dumps("just a string")
    if e.malformed == "unknown-op":
        payload["op"] = "x"
    elif e.malformed == "wrong-type":
        payload["after"][key] = "not a number"
    elif e.malformed == "out-of-range":
        column = {"customers": "tier", "products": "released", "orders": "ship_date"}[table]
        payload["after"][column] = {"customers": 300, "products": 10**18, "orders": 10**9}[table]
    return _wrap(schemas, schema, payload)


def pipeline_columns(table: str, *, encodings: bool) -> dict[str, Any]:
    """``sources[].columns`` of a table: the types, and for schema-less sources the wire encodings."""
    out: dict[str, Any] = {}
    for c, (kind, _, encoding, _) in COLUMNS[table].items():
        out[c] = {"type": kind, "encoding": encoding} if encodings and encoding else kind
    return out


def arrow_state(shop: AdversarialShop, table: str):
    """The table's current rows as an Arrow table of the pipeline's column types."""
    import pyarrow as pa

    from changelake.types import arrow_schema

    schema = arrow_schema({c: spec[0] for c, spec in COLUMNS[table].items()})
    return pa.Table.from_pylist(list(shop.state[table].values()), schema=schema)


# --- the pipeline of the tests and its truth ------------------------------------------------------

ENVELOPES = {"s": True, "n": False}       # source prefix -> schemas.enable
#: revenue per category over the joined rows; the MIN/MAX carry each type's limits through the joins
REVENUE = {"orders": "count(*)", "units": "sum(quantity)", "revenue": "sum(amount)", "top_price": "max(price)",
           "low_customer": "min(customer_id)", "high_customer": "max(customer_id)", "high_balance": "max(balance)",
           "low_points": "min(points)", "low_tier": "min(tier)", "high_score": "max(score)",
           "low_rating": "min(rating)", "high_rating": "max(rating)", "first_born": "min(born)",
           "last_joined": "max(joined)", "first_placed": "min(placed)", "last_ship": "max(ship_date)",
           "last_modified": "max(modified)", "high_note": "max(note)", "high_token": "max(token)",
           "last_released": "max(released)", "low_weight": "min(weight)", "high_tracking": "max(tracking)"}
ENRICHED = ("SELECT * FROM orders o LEFT JOIN customers c ON o.customer_id = c.id "
            "LEFT JOIN products p ON o.product_id = p.id")
GRAPH = {   # table -> (view, primary key, columns, DuckDB query over the source's final state)
    "n_revenue_by_category": ("n_revenue", ["category"], ["category", *REVENUE],
                              (f"SELECT category, {', '.join(f'{f} AS {n}' for n, f in REVENUE.items())} "
                               f"FROM ({ENRICHED}) GROUP BY category")),
    "s_top_products": ("s_top3", ["category", "rn"], [*COLUMNS["products"], "rn"],
                       ("SELECT *, row_number() OVER (PARTITION BY category ORDER BY price DESC NULLS LAST, id) AS rn "
                        "FROM products QUALIFY rn <= 3")),
}
#: the graph: the join and the aggregate read the schema-less sources, the Top-N the enveloped ones
VIEWS = [
    {"name": "n_oc", "join": {"left": "n_orders", "right": "n_customers", "on": {"customer_id": "id"}, "how": "left"}},
    {"name": "n_enriched", "join": {"left": "n_oc", "right": "n_products", "on": {"product_id": "id"}, "how": "left"}},
    {"name": "n_revenue", "from": "n_enriched", "group_by": ["category"], "aggregates": REVENUE},
    {"name": "s_top3", "from": "s_products", "top_n": {"n": 3, "order_by": ["price desc nulls last", "id"],
                                                         "partition_by": ["category"], "rank_column": "rn"}},
]


def pipeline_yaml(prefix: str, servers: str, tmp_path: Path, max_records: int) -> Path:
    """Writes the pipeline of the tests to ``tmp_path``/pipeline.yaml: per envelope the three
    sources (topics ``<prefix>-s.shop.*`` with the schema envelope, ``<prefix>-n.shop.*`` without)
    mirrored, and the graph of :data:`VIEWS`."""
    sources, tables = [], []
    for p, schemas in ENVELOPES.items():
        for table in COLUMNS:
            sources.append({"name": f"{p}_{table}", "topics": [topic(f"{prefix}-{p}", table)],
                            "format": "debezium-json", "options": {"schema-include": schemas},
                            "columns": pipeline_columns(table, encodings=not schemas), "on_error": "dlq",
                            "primary_key": [KEYS[table]], "table": f"{p}_{table}"})
            tables.append({"name": f"{p}_{table}", "primary_key": [KEYS[table]]})
    tables += [{"name": t, "from": view, "primary_key": key} for t, (view, key, _, _) in GRAPH.items()]
    raw = {"pipeline": {"id": f"it-{prefix}", "checkpoint": str(tmp_path / "checkpoints"),
                        "trigger_interval": "2 seconds", "max_records_per_batch": max_records,
                        "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}},
           "kafka": {"bootstrap_servers": servers},
           "storage": {"root": str(tmp_path / "lake")}, "metrics": {"port": 0},
           "sources": sources, "views": VIEWS, "tables": tables}
    import yaml

    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path




def truth(shop: AdversarialShop) -> dict[str, set[tuple]]:
    """Every table: the mirrors (per envelope) from the source's state, the graph tables from DuckDB."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for table in COLUMNS:
        con.register(table, arrow_state(shop, table))
    graph = {t: {tuple(r) for r in con.sql(f"SELECT {', '.join(columns)} FROM ({sql})").fetchall()}
             for t, (_, _, columns, sql) in GRAPH.items()}
    con.close()
    mirrors = {t: {tuple(r[c] for c in COLUMNS[t]) for r in shop.state[t].values()} for t in COLUMNS}
    return {f"{p}_{t}": rows for p in ENVELOPES for t, rows in mirrors.items()} | graph


def columns_of(name: str) -> list[str]:
    """The columns to compare, in the truth's order."""
    return list(COLUMNS[name[2:]]) if name[2:] in COLUMNS else GRAPH[name][2]
