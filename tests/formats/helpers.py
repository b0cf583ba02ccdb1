"""Small builders for decoder tests."""

from __future__ import annotations

import orjson
import pyarrow as pa

from changelake.changelog import RAW_SCHEMA


def records(values: list, *, topic: str = "shop.products", partition: int = 2, first_offset: int = 100,
            keys: list | None = None) -> pa.Table:
    """Raw Kafka records; dict/list values are JSON-encoded, bytes/None pass through."""
    encoded = [orjson.dumps(v) if isinstance(v, (dict, list)) else v for v in values]
    n = len(encoded)
    return pa.Table.from_pydict({
        "topic": [topic] * n, "partition": [partition] * n,
        "offset": list(range(first_offset, first_offset + n)),
        "timestamp": [1_700_000_000_000] * n,
        "key": keys if keys is not None else [b"k%d" % i for i in range(n)],
        "value": encoded}, schema=RAW_SCHEMA)


def mysql_source(**extra) -> dict:
    return {"version": "2.5.0.Final", "connector": "mysql", "name": "shop", "ts_ms": 1_700_000_000_123,
            "snapshot": "false", "db": "shop", "table": "products", "server_id": 1,
            "file": "mysql-bin.000003", "pos": 154, "row": 1, **extra}


def pg_source(**extra) -> dict:
    return {"version": "2.5.0.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1_700_000_000_456,
            "db": "postgres", "schema": "public", "table": "orders", "txId": 601, "lsn": 34078720, **extra}


def change(op: str, before: dict | None = None, after: dict | None = None, source: dict | None = None) -> dict:
    return {"before": before, "after": after, "source": source if source is not None else mysql_source(),
            "op": op, "ts_ms": 1_700_000_000_999}


def kinds(table: pa.Table) -> list[str]:
    return [{0: "+I", 1: "-U", 2: "+U", 3: "-D"}[k] for k in table.column("_kind").to_pylist()]
