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
