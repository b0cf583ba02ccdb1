"""Transaction-consistent tables from the real Debezium PostgreSQL connector (``provide.transaction.metadata``).

Real SQL transactions on a small bank database: transfers between accounts (two updates), orders inserted with
their lines and cancelled with them (two tables). The table topics have four partitions, the transaction
metadata topic one. ``changelake run --available-now`` with ``consistency: transaction`` and small micro-batches
mirrors the three tables; every row of ``_changelake_consistency``, each table read at that row's version, must
be the database's state after that many transactions, as the database itself showed it (read back with SQL
after each commit), and the last one the database's rows now.
"""

from __future__ import annotations

import random
import time

import pytest

from changelake.connectors.delta_read import read_delta

from .lake import ONE_PARTITION, run_changelake, topic_values, write_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

DB = "bank"
PREFIX = "pgt"
TABLES = {"accounts": ["id", "balance"], "orders": ["id", "customer"], "order_lines": ["id", "order_id", "qty"]}
TRANSACTIONS = 30


def _state(pg) -> dict[str, dict[int, dict]]:
    with pg.connect() as conn:
        return {t: {r[0]: dict(zip(cols, r)) for r in conn.execute(f"SELECT {', '.join(cols)} FROM {t}").fetchall()}
                for t, cols in TABLES.items()}


def _transactions(pg, n: int, seed: int) -> list[dict]:
    """The opening transaction and ``n`` random ones; the database's state after each (index 0: before)."""
    rng = random.Random(seed)
    states = [_state(pg)]
    next_order, next_line = 1, 1
    with pg.connect() as conn:
        for k in range(n + 1):
            with conn.transaction():
                orders = [r[0] for r in conn.execute("SELECT id FROM orders").fetchall()]
                kind = "open" if k == 0 else rng.choice(["transfer", "transfer", "order", "order", "cancel"])
                if kind == "open":
                    conn.execute("INSERT INTO accounts SELECT i, 100 FROM generate_series(1, 6) i")
                elif kind == "transfer":
                    a, b = rng.sample(range(1, 7), 2)
                    amount = rng.randint(1, 30)
                    conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", [amount, a])
                    conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", [amount, b])
                elif kind == "order" or not orders:
                    conn.execute("INSERT INTO orders VALUES (%s, %s)", [next_order, rng.randint(1, 6)])
                    for _ in range(rng.randint(1, 3)):
                        conn.execute("INSERT INTO order_lines VALUES (%s, %s, %s)",
                                     [next_line, next_order, rng.randint(1, 9)])
                        next_line += 1
                    next_order += 1
                else:
                    oid = rng.choice(orders)
                    conn.execute("DELETE FROM order_lines WHERE order_id = %s", [oid])
                    conn.execute("DELETE FROM orders WHERE id = %s", [oid])
            states.append(_state(pg))
    return states


@pytest.fixture(scope="module")
def bank(debezium_postgres, pg_logical, connect_worker, kafka):
    pg_logical.execute(f"CREATE DATABASE {DB}")
    pg = type(pg_logical)(pg_logical.root, pg_logical.host, pg_logical.port, dbname=DB)
    pg.execute("CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint)",
               "CREATE TABLE orders (id bigint PRIMARY KEY, customer bigint)",
               "CREATE TABLE order_lines (id bigint PRIMARY KEY, order_id bigint, qty bigint)",
               *[f"ALTER TABLE {t} REPLICA IDENTITY FULL" for t in TABLES])
    kafka.create_topics({**{f"{PREFIX}.public.{t}": 4 for t in TABLES}, f"{PREFIX}.transaction": 1})
    converter = "org.apache.kafka.connect.json.JsonConverter"
    connect_worker.add_connector(PREFIX, {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": "1",
        "database.hostname": pg.host, "database.port": str(pg.port), "database.user": pg.user,
        "database.password": pg.password, "database.dbname": DB, "topic.prefix": PREFIX,
        "plugin.name": "pgoutput", "slot.name": f"changelake_{PREFIX}", "publication.name": f"changelake_{PREFIX}",
        "publication.autocreate.mode": "all_tables", "snapshot.mode": "initial",
        "provide.transaction.metadata": "true",
        "key.converter": converter, "value.converter": converter, **ONE_PARTITION})
    yield pg
    connect_worker.delete_connector(PREFIX)


def _wait_for_ends(bootstrap: str, n: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ends = [v for v in topic_values(bootstrap, f"{PREFIX}.transaction") if v and v.get("status") == "END"]
        if len(ends) >= n:
            return
        time.sleep(1)
    raise TimeoutError(f"Debezium wrote fewer than {n} END events to {PREFIX}.transaction within {timeout:.0f} s")


def test_every_cut_of_the_real_connector_is_a_state_the_database_had(bank, kafka, tmp_path):
    states = _transactions(bank, TRANSACTIONS, seed=7)
    _wait_for_ends(kafka.bootstrap_servers, TRANSACTIONS + 1)
    # the connector names a transaction <txId>:<LSN>, the LSN its event's in a change, the commit's in the END
    end = next(v for v in topic_values(kafka.bootstrap_servers, f"{PREFIX}.transaction") if v and v["status"] == "END")
    event = next(v for v in topic_values(kafka.bootstrap_servers, f"{PREFIX}.public.accounts") if v)
    assert end["id"].split(":")[0] == event["transaction"]["id"].split(":")[0] == str(event["source"]["txId"])
    sources = [{"name": t, "topics": [f"{PREFIX}.public.{t}"], "format": "debezium-json",
                "options": {"schema-include": True}, "table": t, "on_error": "fail", "consistency": "transaction"}
               for t in TABLES]
    config = write_pipeline(tmp_path, pipeline_id="realdb-pg-txn", bootstrap=kafka.bootstrap_servers,
                            sources=sources, tables=[{"name": t, "primary_key": ["id"]} for t in TABLES],
                            max_records=9)
    done = run_changelake(config)
    assert done.returncode == 0, done.stderr[-4000:]
    lake = tmp_path / "lake"
    cuts = sorted(read_delta(str(lake / "_changelake_consistency")).to_pylist(), key=lambda r: r["batch_id"])
    assert len(cuts) >= 5 and any(c["held_rows"] for c in cuts), cuts
    for cut in cuts:
        tables = {t: {} for t in TABLES}
        for name, version in cut["tables"]:
            rows = read_delta(str(lake / name), version=version, columns=TABLES[name]).to_pylist()
            tables[name] = {r["id"]: r for r in rows}
        assert tables == states[cut["transactions"]], f"batch {cut['batch_id']}: {cut}"
    assert cuts[-1]["transactions"] == TRANSACTIONS + 1 and cuts[-1]["held_rows"] == 0
    assert _state(bank) == states[-1]
