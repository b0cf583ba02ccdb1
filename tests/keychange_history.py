"""A small MySQL database whose updates change primary keys, and its history in every change format.

Two tables: ``customers(id, name, region)`` and ``orders(order_id, customer_id, amount)``. Besides
inserts, value updates and deletes, the history is full of key changes (``UPDATE ... SET id = ...``):

* to a fresh key, with or without other columns changing;
* back and forth (a row returns to its previous key);
* chains over several statements (a -> b, then b -> c);
* onto a key deleted by the statement just before;
* chains inside one multi-row statement, as ``UPDATE ... SET id = id + 1 ... ORDER BY id DESC`` writes
  them: the row at ``b`` moves to ``c`` first, then the row at ``a`` moves to ``b``;
* multi-row inserts, updates and deletes, and some re-delivered messages (at least once).

``orders.customer_id`` sometimes names a customer id that a key change has since moved away, so a
join with customers finds nothing there. :func:`encode` writes the history as Canal, Maxwell, OGG or
Debezium JSON: one Canal message per statement (``data``/``old`` arrays, every value a string), one
message per row for the others, with their log positions; each message keyed by its row's key as
JSON (``{"id": 7}``), so the key can be learnt from the message keys.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import orjson

TABLES: dict[str, dict[str, Any]] = {
    "customers": {"key": "id", "columns": {"id": "bigint", "name": "string", "region": "string"}},
    "orders": {"key": "order_id", "columns": {"order_id": "bigint", "customer_id": "bigint", "amount": "bigint"}},
}
FORMATS = ("canal-json", "maxwell-json", "ogg-json", "debezium-json")
DATABASE = "shop"
_MYSQL = {"id": ("bigint(20)", -5), "name": ("varchar(64)", 12), "region": ("varchar(16)", 12),
          "order_id": ("bigint(20)", -5), "customer_id": ("bigint(20)", -5), "amount": ("int(11)", 4)}
_REGIONS = ["north", "south", "east", "west", "central"]
_NAMES = ["Ada", "Bo", "Cy", "Di", "Ed", "Flo", "Gus", "Hal", "Ivy", "Jo"]


@dataclass
class Statement:
    """One SQL statement: its table, operation and rows as (before, after) in the order it wrote them."""

    table: str
    op: str                                   # insert | update | delete
    rows: list[tuple[dict | None, dict | None]]


@dataclass
class KeyChangeDatabase:
    seed: int = 1
    state: dict[str, dict[int, dict]] = field(default_factory=lambda: {t: {} for t in TABLES})
    statements: list[Statement] = field(default_factory=list)
    #: kinds of key change written, for the tests to check the history has them all
    key_changes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._next = {"customers": 100, "orders": 500_000_000}
        self._previous: dict[str, dict[int, int]] = {t: {} for t in TABLES}   # key -> the key it had before
        self._deleted: dict[str, list[int]] = {t: [] for t in TABLES}
        self._ever: dict[str, set[int]] = {t: set() for t in TABLES}

    # --- rows -------------------------------------------------------------------
    def _fresh(self, table: str) -> int:
        self._next[table] += self.rng.randint(1, 3)
        return self._next[table]

    def _row(self, table: str, key: int) -> dict:
        if table == "customers":
            return {"id": key, "name": self.rng.choice(_NAMES), "region": self.rng.choice(_REGIONS)}
        customers = list(self.state["customers"])
        if customers and self.rng.random() < 0.75:
            customer = self.rng.choice(customers)
        else:   # an id a key change may have moved away: the join finds nothing there
            customer = self.rng.choice(sorted(self._ever["customers"]) or [1])
        return {"order_id": key, "customer_id": customer, "amount": self.rng.randint(1, 100)}

    def _changed(self, table: str, row: dict) -> dict:
        new = dict(row)
        if table == "customers":
            if self.rng.random() < 0.6:
                new["region"] = self.rng.choice([r for r in _REGIONS if r != row["region"]])
            else:
                new["name"] = self.rng.choice([n for n in _NAMES if n != row["name"]])
        else:
            new["amount"] = row["amount"] % 100 + 1
        return new

    # --- statements ---------------------------------------------------------------
    def _write(self, table: str, op: str, rows: list[tuple[dict | None, dict | None]]) -> None:
        key = TABLES[table]["key"]
        live = self.state[table]
        for before, after in rows:
            if before is not None:
                assert live.get(before[key]) == before, (table, before)
                del live[before[key]]
            if after is not None:
                assert after[key] not in live, (table, after)
                live[after[key]] = after
                self._ever[table].add(after[key])
            if op == "update" and before[key] != after[key]:
                self._previous[table][after[key]] = before[key]
            if op == "delete":
                self._deleted[table].append(before[key])
        self.statements.append(Statement(table, op, rows))

    def _count(self, what: str) -> None:
        self.key_changes[what] = self.key_changes.get(what, 0) + 1

    def insert(self, table: str, n: int = 1) -> None:
        self._write(table, "insert", [(None, self._row(table, self._fresh(table))) for _ in range(n)])

    def change(self, table: str) -> None:
        """One random statement on ``table``."""
        live = self.state[table]
        key = TABLES[table]["key"]
        r = self.rng.random()
        if len(live) < 4 or r < 0.12:
            self.insert(table, self.rng.choice([1, 1, 2, 3]))
        elif r < 0.27:
            picked = self.rng.sample(sorted(live), self.rng.choice([1, 1, 2]))
            self._write(table, "update", [(live[k], self._changed(table, live[k])) for k in picked])
        elif r < 0.37:
            picked = self.rng.sample(sorted(live), self.rng.choice([1, 1, 2]))
            self._write(table, "delete", [(live[k], None) for k in picked])
        elif r < 0.55:                                       # to a fresh key, maybe with other columns
            old = live[self.rng.choice(sorted(live))]
            new = self._changed(table, old) if self.rng.random() < 0.4 else dict(old)
            new[key] = self._fresh(table)
            self._write(table, "update", [(old, new)])
            self._count("fresh")
        elif r < 0.67:                                       # back to the key it had before
            back = [k for k in sorted(live) if self._previous[table].get(k) is not None
                    and self._previous[table][k] not in live]
            if not back:
                return self.change(table)
            k = self.rng.choice(back)
            self._write(table, "update", [(live[k], {**live[k], key: self._previous[table][k]})])
            self._count("back")
        elif r < 0.77:                                       # onto the key deleted just before
            victim, mover = self.rng.sample(sorted(live), 2)
            self._write(table, "delete", [(live[victim], None)])
            self._write(table, "update", [(live[mover], {**live[mover], key: victim})])
            self._count("onto-deleted")
        elif r < 0.87:                                       # chain inside one statement: b -> c, a -> b
            a, b = self.rng.sample(sorted(live), 2)
            c = self._fresh(table)
            row_a, row_b = live[a], live[b]
            self._write(table, "update", [(row_b, {**row_b, key: c}), (row_a, {**row_a, key: b})])
            self._count("chain-in-statement")
        else:                                                # chain over two statements: a -> b -> c
            a = self.rng.choice(sorted(live))
            b, row = self._fresh(table), live[a]
            self._write(table, "update", [(row, {**row, key: b})])
            c = self._fresh(table)
            self._write(table, "update", [(live[b], {**live[b], key: c})])
            self._count("chain")
        return None

    def history(self, *, customers: int = 12, orders: int = 20, changes: int = 150) -> KeyChangeDatabase:
        self.insert("customers", customers)                 # multi-row inserts: the initial rows
        self.insert("orders", orders)
        for _ in range(changes):
            self.change(self.rng.choice(("customers", "orders", "orders")))
        return self


# --- encodings ----------------------------------------------------------------------------------------

@dataclass
class Message:
    topic: str
    key: bytes
    value: bytes
    moves: int = 0          # rows of the message whose key changed


def encode(db: KeyChangeDatabase, fmt: str, *, topic_prefix: str, redeliver: int = 12) -> list[Message]:
    """The history in ``fmt``; the ``redeliver`` messages before the last quarter are sent again (a
    connector restart re-sends what it had not committed, in order)."""
    writer = _WRITERS[fmt]
    pos = 4
    es = 1_700_000_000_000
    messages: list[Message] = []
    for n, st in enumerate(db.statements):
        pos += 1_000
        es += 1_000
        key_col = TABLES[st.table]["key"]
        for value, rows in writer(st, pos=pos, es=es, n=n):
            row = rows[0][1] or rows[0][0]
            moves = sum(1 for b, a in rows if b is not None and a is not None and b[key_col] != a[key_col])
            messages.append(Message(f"{topic_prefix}.{st.table}", orjson.dumps({key_col: row[key_col]}),
                                    orjson.dumps(value), moves))
    if redeliver:
        cut = len(messages) * 3 // 4
        messages[cut:cut] = messages[cut - redeliver:cut]
    return messages


def _image(row: dict | None) -> dict | None:
    return None if row is None else dict(row)


def _canal(st: Statement, *, pos: int, es: int, n: int):
    text = lambda row: {k: None if v is None else str(v) for k, v in row.items()}
    columns = TABLES[st.table]["columns"]
    kind = st.op.upper()
    data = [text(after if after is not None else before) for before, after in st.rows]
    old = None
    if st.op == "update":
        old = [{k: None if before[k] is None else str(before[k]) for k in before if before[k] != after[k]}
               for before, after in st.rows]
    value = {"data": data, "database": DATABASE, "es": es, "id": n + 1, "isDdl": False,
             "mysqlType": {c: _MYSQL[c][0] for c in columns}, "old": old,
             "pkNames": [TABLES[st.table]["key"]], "sql": "", "sqlType": {c: _MYSQL[c][1] for c in columns},
             "table": st.table, "ts": es + 5, "type": kind}
    yield value, st.rows


def _maxwell(st: Statement, *, pos: int, es: int, n: int):
    for i, (before, after) in enumerate(st.rows):
        value = {"database": DATABASE, "table": st.table, "type": st.op, "ts": es // 1000, "xid": 9000 + n,
                 "xoffset": i, "position": f"mysql-bin.000003:{pos}", "data": _image(after or before)}
        if st.op == "update":
            value["old"] = {k: before[k] for k in before if before[k] != after[k]}
        if i == len(st.rows) - 1:
            value["commit"] = True
        yield value, [(before, after)]


def _ogg(st: Statement, *, pos: int, es: int, n: int):
    op = {"insert": "I", "update": "U", "delete": "D"}[st.op]
    for i, (before, after) in enumerate(st.rows):
        value = {"table": f"{DATABASE.upper()}.{st.table.upper()}", "op_type": op,
                 "op_ts": "2023-11-14 22:13:20.000000", "current_ts": "2023-11-14T22:13:21.000000",
                 "pos": f"{pos + i:020d}", "primary_keys": [TABLES[st.table]["key"]],
                 "before": _image(before), "after": _image(after)}
        yield value, [(before, after)]


def _debezium(st: Statement, *, pos: int, es: int, n: int):
    op = {"insert": "c", "update": "u", "delete": "d"}[st.op]
    for i, (before, after) in enumerate(st.rows):
        value = {"before": _image(before), "after": _image(after),
                 "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "shop", "ts_ms": es,
                            "snapshot": "false", "db": DATABASE, "table": st.table, "server_id": 1,
                            "file": "mysql-bin.000003", "pos": pos, "row": i},
                 "op": op, "ts_ms": es + 3}
        yield value, [(before, after)]


_WRITERS = {"canal-json": _canal, "maxwell-json": _maxwell, "ogg-json": _ogg, "debezium-json": _debezium}


def raw_records(messages: list[Message], *, partition: int = 0, first_offset: int = 0):
    """The messages as the Kafka source hands them over (``RAW_SCHEMA``), in one partition."""
    import pyarrow as pa

    from changelake.changelog import RAW_SCHEMA

    n = len(messages)
    return pa.Table.from_pydict({
        "topic": [m.topic for m in messages], "partition": [partition] * n,
        "offset": list(range(first_offset, first_offset + n)), "timestamp": [None] * n,
        "key": [m.key for m in messages], "value": [m.value for m in messages]}, schema=RAW_SCHEMA)


def source_batches(messages: list[Message], size: int):
    """The messages as the Kafka source's record batches (``kafka_source.ARROW_SCHEMA``) of ``size``
    messages, every topic in partition 0 with its own offsets."""
    import pyarrow as pa

    from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED

    offsets: dict[str, int] = {}
    for start in range(0, len(messages), size):
        chunk = messages[start:start + size]
        positions = []
        for m in chunk:
            positions.append(offsets.get(m.topic, 0))
            offsets[m.topic] = positions[-1] + 1
        yield pa.RecordBatch.from_pydict({
            "topic": [m.topic for m in chunk], "partition": [0] * len(chunk), "offset": positions,
            "timestamp": [1_700_000_000_000] * len(chunk), "key": [m.key for m in chunk],
            "value": [m.value for m in chunk], EXPIRED: [0] * len(chunk)}, schema=ARROW_SCHEMA)


# --- the pipeline: mirrors and join + aggregate + top-n, per format ------------------------------------

#: short name of each format's sources and tables
PREFIX = {"canal-json": "canal", "maxwell-json": "maxwell", "ogg-json": "ogg", "debezium-json": "dbz"}
#: where each format's keys come from: every place a key can be known is used by some format
KEYS_FROM = {"canal-json": "source and table", "maxwell-json": "table (the graph takes the table's key)",
             "ogg-json": "source (graph); the table's key is learnt from the message keys",
             "debezium-json": "source and table"}

GRAPH_TABLES = {   # suffix -> (primary key, columns, DuckDB query over the final customers and orders)
    "orders_enriched": (["order_id"], ["order_id", "customer_id", "amount", "id", "name", "region"],
                        ("SELECT o.order_id, o.customer_id, o.amount, c.id, c.name, c.region "
                         "FROM orders o LEFT JOIN customers c ON o.customer_id = c.id")),
    "region_sales": (["region"], ["region", "orders", "total"],
                     ("SELECT c.region, count(*) AS orders, sum(o.amount) AS total "
                      "FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.region")),
    "top_regions": (["rnk"], ["rnk", "region", "orders", "total"],
                    ("SELECT * FROM (SELECT row_number() OVER (ORDER BY total DESC, region) AS rnk, * FROM ("
                     "SELECT c.region, count(*) AS orders, sum(o.amount) AS total "
                     "FROM orders o JOIN customers c ON o.customer_id = c.id GROUP BY c.region)) WHERE rnk <= 2")),
}


def topic(topic_prefix: str, fmt: str, table: str) -> str:
    return f"{topic_prefix}-{PREFIX[fmt]}.{table}"


def pipeline_sections(topic_prefix: str, formats=FORMATS, *, views: bool = True) -> dict[str, list]:
    """``sources``, ``views`` and ``tables`` of the config: per format, both tables mirrored, and
    ``orders LEFT JOIN customers`` -> matched rows by region -> top 2 regions."""
    sources, tables, graph = [], [], []
    for fmt in formats:
        p = PREFIX[fmt]
        for table, spec in TABLES.items():
            key = [spec["key"]]
            source = {"name": f"{p}_{table}", "topics": [topic(topic_prefix, fmt, table)], "format": fmt,
                      "columns": spec["columns"], "on_error": "fail", "table": f"{p}_{table}"}
            if fmt != "maxwell-json":
                source["primary_key"] = key
            sources.append(source)
            tables.append({"name": f"{p}_{table}"} | ({} if fmt == "ogg-json" else {"primary_key": key}))
        if views:
            graph += [
                {"name": f"{p}_enriched", "join": {"left": f"{p}_orders", "right": f"{p}_customers",
                                                   "on": {"customer_id": "id"}, "how": "left"}},
                {"name": f"{p}_matched", "from": f"{p}_enriched", "filter": "region IS NOT NULL"},
                {"name": f"{p}_sales", "from": f"{p}_matched", "group_by": ["region"],
                 "aggregates": {"orders": "count(*)", "total": "sum(amount)"}},
                {"name": f"{p}_top", "from": f"{p}_sales",
                 "top_n": {"n": 2, "order_by": ["total desc", "region"], "rank_column": "rnk"}},
            ]
            views_of = {"orders_enriched": "enriched", "region_sales": "sales", "top_regions": "top"}
            tables += [{"name": f"{p}_{t}", "from": f"{p}_{views_of[t]}", "primary_key": pk}
                       for t, (pk, _, _) in GRAPH_TABLES.items()]
    return {"sources": sources, "views": graph, "tables": tables}


def expected_graph_tables(db: KeyChangeDatabase) -> dict[str, set[tuple]]:
    """Each graph table (by suffix) as DuckDB computes it over the database's final state."""
    import duckdb
    import pyarrow as pa

    from changelake.types import arrow_schema

    con = duckdb.connect()
    for table, spec in TABLES.items():
        con.register(table, pa.Table.from_pylist(list(db.state[table].values()),
                                                 schema=arrow_schema(spec["columns"])))
    out = {t: {tuple(r) for r in con.sql(f"SELECT {', '.join(cols)} FROM ({sql})").fetchall()}
           for t, (_, cols, sql) in GRAPH_TABLES.items()}
    con.close()
    return out
