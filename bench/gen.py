"""Realistic generated change messages for the decode benchmark (20 columns, mixed types)."""

from __future__ import annotations

import random

import orjson
import pyarrow as pa

from changelake.changelog import RAW_SCHEMA
from changelake.formats.sqltypes import sql_schema

COLUMNS = [
    ("id", "BIGINT NOT NULL"), ("customer_id", "INT"), ("sku", "STRING"), ("title", "STRING"),
    ("description", "STRING"), ("category", "STRING"), ("price", "DOUBLE"), ("weight", "FLOAT"),
    ("quantity", "INT"), ("in_stock", "BOOLEAN"), ("rating", "DOUBLE"), ("created_at", "TIMESTAMP(3)"),
    ("updated_at", "TIMESTAMP(3)"), ("country", "STRING"), ("city", "STRING"), ("zip", "STRING"),
    ("discount", "DOUBLE"), ("version", "BIGINT"), ("flags", "SMALLINT"), ("note", "STRING"),
]
SCHEMA = sql_schema(COLUMNS)
_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()


def _row(rng: random.Random, key: int) -> dict:
    return {
        "id": key, "customer_id": rng.randrange(1_000_000), "sku": f"SKU-{rng.randrange(10**8):08d}",
        "title": " ".join(rng.choices(_WORDS, k=3)), "description": " ".join(rng.choices(_WORDS, k=12)),
        "category": rng.choice(_WORDS), "price": round(rng.uniform(1, 999), 2),
        "weight": round(rng.uniform(0.1, 50), 3), "quantity": rng.randrange(500),
        "in_stock": rng.random() < 0.8, "rating": round(rng.uniform(0, 5), 1),
        "created_at": 1_600_000_000_000 + rng.randrange(10**10),
        "updated_at": 1_700_000_000_000 + rng.randrange(10**9),
        "country": rng.choice(["DE", "FR", "US", "JP", "BR"]), "city": rng.choice(_WORDS).title(),
        "zip": f"{rng.randrange(10**5):05d}", "discount": rng.choice([0.0, 0.05, 0.1, 0.25]),
        "version": rng.randrange(10**6), "flags": rng.randrange(256),
        "note": None if rng.random() < 0.5 else " ".join(rng.choices(_WORDS, k=5)),
    }


def changes(n: int, *, seed: int = 7, keys: int = 50_000):
    """(op, before, after, position) for ``n`` changes: ~10% inserts, ~85% updates, ~5% deletes."""
    rng = random.Random(seed)
    for i in range(n):
        key = rng.randrange(keys)
        roll = rng.random()
        if roll < 0.10:
            yield "c", None, _row(rng, key), i
        elif roll < 0.95:
            before = _row(rng, key)
            after = dict(before, price=round(rng.uniform(1, 999), 2), quantity=rng.randrange(500),
                         updated_at=before["updated_at"] + 1000)
            yield "u", before, after, i
        else:
            yield "d", _row(rng, key), None, i


def debezium_envelope(op: str, before: dict | None, after: dict | None, *, table: str, pos: int, ts: int,
                      snapshot: str = "false") -> bytes:
    """One Debezium JSON change event (MySQL connector, no schema envelope) at binlog position ``pos``."""
    return orjson.dumps({"before": before, "after": after, "source": {
        "version": "2.7.0.Final", "connector": "mysql", "name": "bench", "ts_ms": ts, "snapshot": snapshot,
        "db": "shop", "table": table, "server_id": 1, "file": "mysql-bin.000007", "pos": pos, "row": 0},
        "op": op, "ts_ms": ts + 2, "transaction": None})


def debezium_json(n: int) -> list[bytes]:
    out = []
    for op, before, after, i in changes(n):
        source = {"version": "2.5.0.Final", "connector": "mysql", "name": "shop", "ts_ms": 1_700_000_000_000 + i,
                  "snapshot": "false", "db": "shop", "table": "products", "server_id": 1, "gtid": None,
                  "file": "mysql-bin.000042", "pos": 4 + 200 * i, "row": 0, "thread": 7, "query": None}
        out.append(orjson.dumps({"before": before, "after": after, "source": source, "op": op,
                                 "ts_ms": 1_700_000_000_100 + i, "transaction": None}))
    return out


def records(values: list[bytes | None], topic: str = "shop.products") -> pa.Table:
    n = len(values)
    return pa.Table.from_pydict({
        "topic": [topic] * n, "partition": [0] * n, "offset": list(range(n)),
        "timestamp": [1_700_000_000_000] * n, "key": [None] * n, "value": values}, schema=RAW_SCHEMA)


def _text(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int) and v > 10**11:      # epoch millis -> MySQL DATETIME(3) text
        import datetime as dt
        return dt.datetime.fromtimestamp(v / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return str(v)


_MYSQL_TYPES = {"BIGINT NOT NULL": "bigint(20)", "INT": "int(11)", "STRING": "varchar(255)", "DOUBLE": "double",
                "FLOAT": "float", "BOOLEAN": "tinyint(1)", "TIMESTAMP(3)": "datetime(3)", "BIGINT": "bigint(20)",
                "SMALLINT": "smallint(6)"}
_JDBC_TYPES = {"BIGINT NOT NULL": -5, "INT": 4, "STRING": 12, "DOUBLE": 8, "FLOAT": 7, "BOOLEAN": -6,
               "TIMESTAMP(3)": 93, "BIGINT": -5, "SMALLINT": 5}


def canal_json(n: int, *, seed: int = 11) -> tuple[list[bytes], int]:
    """``n`` Canal flat messages with 1-4 rows each (values as text); returns (messages, changelog rows)."""
    rng = random.Random(seed)
    mysql_type = {c: _MYSQL_TYPES[t] for c, t in COLUMNS}
    sql_type = {c: _JDBC_TYPES[t] for c, t in COLUMNS}
    out, rows = [], 0
    it = changes(n * 4, seed=seed)
    for i in range(n):
        batch = [next(it) for _ in range(rng.choice([1, 1, 2, 4]))]
        op = batch[0][0]
        kind = {"c": "INSERT", "u": "UPDATE", "d": "DELETE"}[op]
        data, old = [], []
        for _, before, after, _ in batch:
            image = after if after is not None else before
            if op == "u" and before is not None and after is not None:
                old.append({k: _text(before[k]) for k in ("price", "quantity", "updated_at")})
            elif op == "u":
                old.append({"price": _text(image["price"])})
            data.append({k: _text(v) for k, v in image.items()})
        rows += len(data) * (2 if op == "u" else 1)
        out.append(orjson.dumps({
            "data": data, "database": "shop", "es": 1_700_000_000_000 + i, "id": i, "isDdl": False,
            "mysqlType": mysql_type, "old": old if op == "u" else None, "pkNames": ["id"], "sql": "",
            "sqlType": sql_type, "table": "products", "ts": 1_700_000_000_100 + i, "type": kind}))
    return out, rows


_AVRO = {"BIGINT NOT NULL": "long", "INT": "int", "STRING": "string", "DOUBLE": "double", "FLOAT": "float",
         "BOOLEAN": "boolean", "BIGINT": "long", "SMALLINT": "int"}


def avro_envelope_schema() -> dict:
    fields = []
    for c, t in COLUMNS:
        if t == "TIMESTAMP(3)":
            avro = {"type": "long", "connect.version": 1, "connect.name": "io.debezium.time.Timestamp"}
        else:
            avro = _AVRO[t]
        fields.append({"name": c, "type": avro} if t.endswith("NOT NULL") else
                      {"name": c, "type": ["null", avro], "default": None})
    row = {"type": "record", "name": "Value", "namespace": "shop.products", "fields": fields}
    source = {"type": "record", "name": "Source", "namespace": "io.debezium.connector.mysql", "fields": [
        {"name": "version", "type": "string"}, {"name": "connector", "type": "string"},
        {"name": "name", "type": "string"}, {"name": "ts_ms", "type": "long"},
        {"name": "db", "type": "string"}, {"name": "table", "type": ["null", "string"], "default": None},
        {"name": "server_id", "type": "long"}, {"name": "file", "type": "string"},
        {"name": "pos", "type": "long"}, {"name": "row", "type": "int"}]}
    return {"type": "record", "name": "Envelope", "namespace": "shop.products", "fields": [
        {"name": "before", "type": ["null", row], "default": None},
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "source", "type": source}, {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None}]}


def debezium_avro(n: int, schema_id: int = 1) -> list[bytes]:
    import io
    import struct

    import fastavro
    parsed = fastavro.parse_schema(avro_envelope_schema())
    header = b"\x00" + struct.pack(">I", schema_id)
    out = []
    for op, before, after, i in changes(n):
        source = {"version": "2.5.0.Final", "connector": "mysql", "name": "shop", "ts_ms": 1_700_000_000_000 + i,
                  "db": "shop", "table": "products", "server_id": 1, "file": "mysql-bin.000042",
                  "pos": 4 + 200 * i, "row": 0}
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, {"before": before, "after": after, "source": source, "op": op,
                                                 "ts_ms": 1_700_000_000_100 + i})
        out.append(header + buf.getvalue())
    return out
