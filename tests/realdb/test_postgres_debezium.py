"""Debezium's PostgreSQL connector (pgoutput) on a real PostgreSQL, through a real Kafka, into Delta.

Real SQL drives a small shop database: a snapshot of existing rows, then inserts, updates, deletes, a
primary-key update, multi-row statements, a transaction over two tables, a TRUNCATE, ALTER TABLE ADD
COLUMN and a type widening, NULLs, numeric and temporal limits, Unicode, JSON, an enum and an array;
``docs`` has REPLICA IDENTITY DEFAULT and a TOASTed ``body`` that updates leave unchanged (Debezium
writes ``__debezium_unavailable_value`` for it), ``orders`` has REPLICA IDENTITY FULL. Two connectors
read the database: one with the JSON converter's schema envelope (topics ``pg.*``), one with
``schemas.enable=false`` (``pgs.*``), whose columns the pipeline declares with their wire encodings.

``changelake run --available-now`` (the CLI, as a subprocess) mirrors the topics, one source per table,
and routes the whole database a second time through one source (``topic_pattern`` + ``route``, tables
``pgr_<table>`` created as they come, keys learnt from the message keys; the pattern leaves out the
transaction-metadata and heartbeat topics, which a routed source would make ``unrouted`` dead
letters, docs/pipelines.md). Every source fails the run on a dead letter. Every Delta table
must equal the database's own rows, read back with SQL. Then more SQL, a run killed with SIGKILL in
the middle of a batch, a restart, and the same comparison.
"""

from __future__ import annotations

import signal

import pytest

from changelake.spark.checkpoint import last_committed_batch

from .lake import (ONE_PARTITION, assert_same_rows, delta_rows, run_changelake, topic_values, topics,
                   wait_for_marker, write_pipeline)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

DB = "shop"
KEY = ["id"]
JSON_COLUMNS = {"customers": ("profile",)}
#: the tables, in the order they are compared; REPLICA IDENTITY DEFAULT unless said
TABLES = ["customers", "docs", "orders", "extremes", "scratch", "marker"]

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    """CREATE TABLE customers (id bigint PRIMARY KEY, name text NOT NULL, mood mood, balance numeric(12, 2),
       tags text[], profile jsonb, born date, seen timestamp(6), seen_tz timestamptz, score double precision,
       active boolean, level smallint)""",
    "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer_id bigint, amount numeric(10, 2), qty int, note varchar(40))",
    "ALTER TABLE orders REPLICA IDENTITY FULL",
    """CREATE TABLE extremes (id int PRIMARY KEY, big bigint, small smallint, d38 numeric(38, 10), d date,
       ts timestamp(6), tstz timestamptz, r real, f double precision)""",
    "CREATE TABLE scratch (id int PRIMARY KEY, v text)",
    "CREATE TABLE marker (id int PRIMARY KEY, n int)",
    "INSERT INTO marker VALUES (1, 0)",
]

#: a text of ~40 KB that compresses to more than the 2 KB TOAST threshold: stored out of line
BIG = "(SELECT string_agg(md5(i::text || '{seed}'), '') FROM generate_series(1, 1250) i)"

SNAPSHOT = [
    """INSERT INTO customers VALUES
       (1, 'Ada', 'happy', 10.50, '{a,b}', '{"vip": true, "n": [1, 2]}', '1990-01-31', '2024-02-29 12:34:56.123456',
        '2024-02-29 12:34:56.123456+02', 1.5, true, 7),
       (2, 'Bob', 'sad', -0.01, '{}', '[]', '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:00+00', -0.0, false, -32768),
       (3, 'Cy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
       (4, 'Dee', 'ok', 0, '{"x y",NULL,"é"}', '{"k": null}', '2000-02-29', '2000-02-29 23:59:59.999999',
        '2000-02-29 23:59:59.999999-12', 1e300, true, 32767),
       (5, 'Eve', 'ok', 99.99, '{z}', '"text"', '2024-12-31', '2024-12-31 00:00:00', '2024-12-31 00:00:00+14', 2.25, false, 1)""",
    f"INSERT INTO docs VALUES (1, 'first', {BIG.format(seed='a')}), (2, 'second', {BIG.format(seed='b')}), "
    "(3, 'small', 'tiny')",
    "INSERT INTO orders VALUES (1, 1, 5.00, 1, 'one'), (2, 2, 7.25, 2, NULL), (3, 1, 0.01, 3, 'three')",
    """INSERT INTO extremes VALUES
       (1, 9223372036854775807, 32767, 9999999999999999999999999999.9999999999, '9999-12-31',
        '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59.999999+00', 3.4028235e38, 1.7976931348623157e308),
       (2, -9223372036854775808, -32768, -9999999999999999999999999999.9999999999, '0001-01-01',
        '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', -3.4028235e38, 4.9e-324)""",
    "INSERT INTO scratch SELECT i, 'row ' || i FROM generate_series(1, 5) i",
]

STREAM = [
    # multi-row insert with Unicode and NULLs
    """INSERT INTO customers (id, name, mood, balance, tags, profile) VALUES
       (6, 'Zoë 😀', 'happy', 1.00, '{"ü","😀"}', '{"name": "Zoë 😀", "rtl": "مرحبا"}'),
       (7, 'محمد', NULL, NULL, NULL, NULL),
       (8, 'e' || chr(769) || ' tab	nl' || chr(10) || 'end', 'sad', 3.33, '{}', '{}')""",
    "UPDATE customers SET balance = balance + 1, score = 3.75 WHERE id <= 3",   # multi-row update
    "UPDATE docs SET title = 'first, renamed' WHERE id = 1",                     # TOASTed body unchanged
    "UPDATE docs SET body = body || ' and more' WHERE id = 2",                   # TOASTed body changed
    "DELETE FROM customers WHERE id = 4",
    "UPDATE customers SET id = 50 WHERE id = 5",                                 # primary key update
    "UPDATE orders SET id = 30, note = 'moved' WHERE id = 3",                    # ... with REPLICA IDENTITY FULL
    # one transaction over two tables
    "BEGIN; INSERT INTO orders VALUES (4, 6, 12.34, 4, 'tx'); UPDATE customers SET balance = balance - 12.34 "
    "WHERE id = 6; DELETE FROM orders WHERE id = 2; COMMIT",
    "TRUNCATE scratch",
    "INSERT INTO scratch VALUES (100, 'after the truncate')",
    "ALTER TABLE customers ADD COLUMN nickname text",
    "UPDATE customers SET nickname = 'nick ' || id WHERE id IN (1, 6)",
    "ALTER TABLE orders ALTER COLUMN qty TYPE bigint",                           # widening int -> bigint
    "INSERT INTO orders VALUES (5, 7, 99999999.99, 1099511627776, 'wide')",
    "UPDATE extremes SET f = -1.7976931348623157e308, r = 1.17549435e-38 WHERE id = 1",
    "DELETE FROM docs WHERE id = 3",
]

AFTER_FIRST_RUN = [
    "INSERT INTO customers (id, name, nickname, balance) SELECT i, 'bulk ' || i, 'n' || i, i FROM generate_series(200, 239) i",
    "UPDATE customers SET balance = balance * 2 WHERE id BETWEEN 200 AND 219",
    "DELETE FROM customers WHERE id BETWEEN 230 AND 239",
    "UPDATE docs SET title = 'first, again' WHERE id = 1",
    "INSERT INTO orders SELECT i, 200, i / 100.0, i, 'bulk' FROM generate_series(100, 129) i",
    "UPDATE orders SET amount = amount + 1 WHERE id BETWEEN 100 AND 109",
    "DELETE FROM orders WHERE id = 1",
    "INSERT INTO scratch SELECT i, 'later ' || i FROM generate_series(101, 110) i",
]

#: the schema-less connector's columns, declared as docs/formats.md says (Postgres defaults)
SCHEMALESS_COLUMNS = {
    "customers": {"id": "bigint", "name": "string", "mood": "string",
                  "balance": {"type": "decimal(12,2)", "encoding": "org.apache.kafka.connect.data.Decimal"},
                  "tags": "string", "profile": "string",     # the YAML has no array type: JSON text
                  "born": {"type": "date", "encoding": "io.debezium.time.Date"},
                  "seen": {"type": "timestamp_ntz", "encoding": "io.debezium.time.MicroTimestamp"},
                  "seen_tz": {"type": "timestamp", "encoding": "io.debezium.time.ZonedTimestamp"},
                  "score": "double", "active": "boolean", "level": "smallint", "nickname": "string"},
    "extremes": {"id": "int", "big": "bigint", "small": "smallint",
                 "d38": {"type": "decimal(38,10)", "encoding": "org.apache.kafka.connect.data.Decimal"},
                 "d": {"type": "date", "encoding": "io.debezium.time.Date"},
                 "ts": {"type": "timestamp_ntz", "encoding": "io.debezium.time.MicroTimestamp"},
                 "tstz": {"type": "timestamp", "encoding": "io.debezium.time.ZonedTimestamp"},
                 "r": "float", "f": "double"},
    "marker": {"id": "int", "n": "int"},
}


def _connector(pg, prefix: str, *, schemas: bool) -> dict[str, str]:
    converter = "org.apache.kafka.connect.json.JsonConverter"
    return {
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector", "tasks.max": "1",
        "database.hostname": pg.host, "database.port": str(pg.port), "database.user": pg.user,
        "database.password": pg.password, "database.dbname": DB, "topic.prefix": prefix,
        "plugin.name": "pgoutput", "slot.name": f"changelake_{prefix}", "publication.name": f"changelake_{prefix}",
        "publication.autocreate.mode": "all_tables", "snapshot.mode": "initial",
        "skipped.operations": "none",                # Debezium skips truncates unless told otherwise
        "provide.transaction.metadata": "true", "heartbeat.interval.ms": "500",
        "key.converter": converter, "value.converter": converter,
        "key.converter.schemas.enable": str(schemas).lower(), "value.converter.schemas.enable": str(schemas).lower(),
        **ONE_PARTITION,
    }


def _db_rows(pg, table: str) -> list[dict]:
    import psycopg.rows

    with pg.connect() as conn:
        conn.execute("SET TIME ZONE 'UTC'")
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        cols = [r[0] for r in conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
            [table]).fetchall()]
        types = dict(conn.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
                                  [table]).fetchall())
        # a real is compared as the float it is (Delta holds float32)
        select = ", ".join(f"{c}::float8 AS {c}" if types[c] == "real" else
                           f"{c}::text AS {c}" if types[c] == "USER-DEFINED" else c for c in cols)
        rows = cur.execute(f"SELECT {select} FROM {table}").fetchall()
    return sorted(rows, key=lambda r: [r[k] for k in KEY])


@pytest.fixture(scope="module")
def shop(debezium_postgres, pg_logical, connect_worker, kafka_bootstrap):
    pg_logical.execute(f"CREATE DATABASE {DB}")
    pg = type(pg_logical)(pg_logical.root, pg_logical.host, pg_logical.port, dbname=DB)
    pg.execute(*SCHEMA)
    pg.execute(*SNAPSHOT)
    connect_worker.add_connector("pg", _connector(pg, "pg", schemas=True))
    connect_worker.add_connector("pgs", _connector(pg, "pgs", schemas=False))
    marker = {"n": 0}

    def mark() -> None:
        marker["n"] += 1
        pg.execute(f"UPDATE marker SET n = {marker['n']}")
        for prefix in ("pg", "pgs"):
            wait_for_marker(kafka_bootstrap, f"{prefix}.public.marker", marker["n"])

    pg.mark = mark
    mark()       # a streamed change: the snapshot is over (the SQL below is streamed, not snapshotted)
    yield pg
    for name in ("pg", "pgs"):
        connect_worker.delete_connector(name)


def _sources(prefix: str, schemas: bool) -> list[dict]:
    sources = []
    for t in (TABLES if schemas else list(SCHEMALESS_COLUMNS)):
        source = {"name": f"{prefix}_{t}", "topics": [f"{prefix}.public.{t}"], "format": "debezium-json",
                  "options": {"schema-include": schemas, "upsert": t != "orders"},
                  "table": f"{prefix}_{t}", "on_error": "fail"}
        if t == "scratch":
            source["on_truncate"] = "apply"
        if not schemas:
            source["columns"] = SCHEMALESS_COLUMNS[t]
        sources.append(source)
    return sources


#: the whole database through one routed source
ROUTED = {"name": "pg_routed", "topic_pattern": r"pg\.public\..*", "format": "debezium-json",
          "options": {"schema-include": True, "upsert": True}, "on_error": "fail", "on_truncate": "apply",
          "route": [{"source_table": r"shop\.public\.(.*)", "table": "pgr_$1"}]}


def _assert_lake_equals_database(pg, workdir) -> None:
    for t in TABLES:
        expected = _db_rows(pg, t)
        for table in (f"pg_{t}", f"pgr_{t}"):
            assert_same_rows(expected, delta_rows(str(workdir / "lake" / table), KEY,
                                                  json_columns=JSON_COLUMNS.get(t, ())), table=table)
    for t, columns in SCHEMALESS_COLUMNS.items():
        expected = [{k: v for k, v in r.items() if k in columns} for r in _db_rows(pg, t)]
        json_columns = JSON_COLUMNS.get(t, ()) + (("tags",) if t == "customers" else ())
        assert_same_rows(expected, delta_rows(str(workdir / "lake" / f"pgs_{t}"), KEY, json_columns=json_columns),
                         table=f"pgs_{t}")


def test_postgres_through_debezium_equals_the_database_also_after_sigkill(shop, kafka_bootstrap, tmp_path):
    shop.execute(*STREAM)
    shop.mark()
    # what the connector wrote holds what this test is about
    docs = [v for v in topic_values(kafka_bootstrap, "pg.public.docs") if v]
    assert any(v["op"] == "u" and v["after"]["body"] == "__debezium_unavailable_value" for v in docs)
    assert [v["op"] for v in docs[:3]] == ["r", "r", "r"]
    assert any(v and v["op"] == "t" for v in topic_values(kafka_bootstrap, "pgs.public.scratch"))
    assert {"pg.transaction", "__debezium-heartbeat.pg"} <= topics(kafka_bootstrap)
    config = write_pipeline(tmp_path, pipeline_id="realdb-pg", bootstrap=kafka_bootstrap,
                            sources=_sources("pg", True) + _sources("pgs", False) + [ROUTED], max_records=60)
    first = run_changelake(config)
    assert first.returncode == 0, first.stderr[-4000:]
    _assert_lake_equals_database(shop, tmp_path)

    shop.execute(*AFTER_FIRST_RUN)
    shop.mark()
    done = last_committed_batch(str(tmp_path / "checkpoint"))[0]
    crashed = run_changelake(config, fault=f"after-first-table@{done + 2}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-4000:]
    restarted = run_changelake(config)
    assert restarted.returncode == 0, restarted.stderr[-4000:]
    _assert_lake_equals_database(shop, tmp_path)
