"""Debezium's MariaDB connector on a real MariaDB (ROW binlog), a whole database routed into Delta.

Debezium 3.6.1.Final's MariaDB connector is not served by Maven Central and its MySQL connector fails on
MariaDB 10.11 (it sends ``SHOW BINARY LOG STATUS``): the worker runs ``debezium-connector-mariadb``
3.5.0.Final, the newest served, from its own plugin folder (the ``debezium-mariadb`` set of
jvm/pom.xml). One changelake source reads every table topic of the database (``topic_pattern``) and
routes each change to a Delta table named after its source table (``route``), creating the tables as
they come; keys are learnt from the message keys. The connector also writes its heartbeat and
schema-change topics (and is asked for transaction metadata, though with MariaDB 10.11 it wrote no
transaction topic), which the pattern leaves out (docs/pipelines.md: a routed source would make them
``unrouted`` dead letters).

Real SQL: a snapshot, inserts, updates, deletes, a primary-key update, multi-row statements, a
transaction over two tables, TRUNCATE, ALTER TABLE ADD COLUMN and a widening, NULLs, limits of
DECIMAL(38, 10), BIGINT (signed and unsigned), DATE and DATETIME(6), Unicode (utf8mb4), JSON, ENUM,
SET and VARBINARY. Each Delta table must equal the rows MariaDB returns; then more SQL, a run killed
with SIGKILL in the middle of a batch, a restart, and the same comparison.
"""

from __future__ import annotations

import datetime as dt
import json
import signal

import pytest

from changelake.spark.checkpoint import last_committed_batch

from .lake import (ONE_PARTITION, assert_same_rows, delta_rows, run_changelake, topics, wait_for_marker,
                   write_pipeline)

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

DB = "shop"
PREFIX = "mdb"
KEY = ["id"]
TABLES = ["customers", "orders", "extremes", "scratch", "marker"]
JSON_COLUMNS = {"customers": ("profile",)}
#: TIMESTAMP columns: MariaDB returns them in the session's zone (UTC here), Debezium in UTC
ZONED = {"customers": ("seen_ts",)}

SCHEMA = [
    f"CREATE DATABASE {DB}",
    f"""CREATE TABLE {DB}.customers (id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL, mood ENUM('sad', 'ok', 'happy'),
        tags SET('a', 'b', 'c'), balance DECIMAL(12, 2), profile JSON, born DATE, seen DATETIME(6),
        seen_ts TIMESTAMP(6) NULL, score DOUBLE, active BOOLEAN, level SMALLINT, data VARBINARY(16))""",
    f"CREATE TABLE {DB}.orders (id BIGINT PRIMARY KEY, customer_id BIGINT, amount DECIMAL(10, 2), qty INT, note VARCHAR(40))",
    f"""CREATE TABLE {DB}.extremes (id INT PRIMARY KEY, big BIGINT, ubig BIGINT UNSIGNED, d38 DECIMAL(38, 10), d DATE,
        ts DATETIME(6), tiny TINYINT, f DOUBLE)""",
    f"CREATE TABLE {DB}.scratch (id INT PRIMARY KEY, v TEXT)",
    f"CREATE TABLE {DB}.marker (id INT PRIMARY KEY, n INT)",
    f"INSERT INTO {DB}.marker VALUES (1, 0)",
]

SNAPSHOT = [
    """INSERT INTO customers VALUES
       (1, 'Ada', 'happy', 'a,b', 10.50, '{"vip": true, "n": [1, 2]}', '1990-01-31', '2024-02-29 12:34:56.123456',
        '2024-02-29 12:34:56.123456', 1.5, TRUE, 7, x'00ff10'),
       (2, 'Bob', 'sad', '', -0.01, '[]', '1970-01-01', '1970-01-01 00:00:00', '1970-01-01 00:00:01', -0.0, FALSE,
        -32768, x''),
       (3, 'Cy', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
       (4, 'Dee', 'ok', 'c', 0, '{"k": null}', '2000-02-29', '2000-02-29 23:59:59.999999', '2038-01-19 03:14:07.999999',
        1e300, TRUE, 32767, x'ffffffffffffffffffffffffffffffff'),
       (5, 'Eve', 'ok', 'a', 99.99, '"text"', '2024-12-31', '2024-12-31 00:00:00', '2024-12-31 00:00:00', 2.25, FALSE, 1,
        x'01')""",
    "INSERT INTO orders VALUES (1, 1, 5.00, 1, 'one'), (2, 2, 7.25, 2, NULL), (3, 1, 0.01, 3, 'three')",
    """INSERT INTO extremes VALUES
       (1, 9223372036854775807, 18446744073709551615, 9999999999999999999999999999.9999999999, '9999-12-31',
        '9999-12-31 23:59:59.999999', 127, 1.7976931348623157e308),
       (2, -9223372036854775808, 0, -9999999999999999999999999999.9999999999, '1000-01-01',
        '1000-01-01 00:00:00', -128, 4.9e-324)""",
    "INSERT INTO scratch VALUES (1, 'row 1'), (2, 'row 2'), (3, 'row 3')",
]

STREAM = [
    """INSERT INTO customers (id, name, mood, tags, balance, profile) VALUES
       (6, 'Zoë 😀', 'happy', 'a,c', 1.00, '{"name": "Zoë 😀", "rtl": "مرحبا"}'),
       (7, 'محمد', NULL, NULL, NULL, NULL),
       (8, CONCAT('e', _utf8mb4 x'cc81', ' tab\tnl\nend'), 'sad', 'b', 3.33, '{}')""",
    "UPDATE customers SET balance = balance + 1, score = 3.75 WHERE id <= 3",
    "DELETE FROM customers WHERE id = 4",
    "UPDATE customers SET id = 50 WHERE id = 5",
    "UPDATE orders SET id = 30, note = 'moved' WHERE id = 3",
    "START TRANSACTION",
    "INSERT INTO orders VALUES (4, 6, 12.34, 4, 'tx')",
    "UPDATE customers SET balance = balance - 12.34 WHERE id = 6",
    "DELETE FROM orders WHERE id = 2",
    "COMMIT",
    "TRUNCATE TABLE scratch",
    "INSERT INTO scratch VALUES (100, 'after the truncate')",
    "ALTER TABLE customers ADD COLUMN nickname VARCHAR(40)",
    "UPDATE customers SET nickname = CONCAT('nick ', id) WHERE id IN (1, 6)",
    "ALTER TABLE orders MODIFY qty BIGINT",
    "INSERT INTO orders VALUES (5, 7, 99999999.99, 1099511627776, 'wide')",
    "UPDATE extremes SET f = -1.7976931348623157e308, tiny = 0 WHERE id = 1",
    "CREATE TABLE later (id INT PRIMARY KEY, v VARCHAR(10))",        # a table created while streaming
    "INSERT INTO later VALUES (1, 'new'), (2, 'table')",
]

AFTER_FIRST_RUN = [
    "INSERT INTO customers (id, name, nickname, balance) SELECT seq, CONCAT('bulk ', seq), CONCAT('n', seq), seq "
    "FROM seq_200_to_239",
    "UPDATE customers SET balance = balance * 2 WHERE id BETWEEN 200 AND 219",
    "DELETE FROM customers WHERE id BETWEEN 230 AND 239",
    "INSERT INTO orders SELECT seq, 200, seq / 100, seq, 'bulk' FROM seq_100_to_129",
    "UPDATE orders SET amount = amount + 1 WHERE id BETWEEN 100 AND 109",
    "DELETE FROM orders WHERE id = 1",
    "INSERT INTO scratch SELECT seq, CONCAT('later ', seq) FROM seq_101_to_110",
    "UPDATE later SET v = 'changed' WHERE id = 2",
]


def _connector(db, bootstrap: str) -> dict[str, str]:
    converter = "org.apache.kafka.connect.json.JsonConverter"
    return {
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector", "tasks.max": "1",
        "database.hostname": "127.0.0.1", "database.port": str(db.port), "database.user": db.user,
        "database.password": db.password, "database.server.id": "5400", "topic.prefix": PREFIX,
        "database.include.list": DB, "snapshot.mode": "initial",
        "schema.history.internal.kafka.bootstrap.servers": bootstrap,
        "schema.history.internal.kafka.topic": f"schema-history.{PREFIX}",
        "skipped.operations": "none", "bigint.unsigned.handling.mode": "precise",
        "provide.transaction.metadata": "true", "heartbeat.interval.ms": "500",
        "key.converter": converter, "value.converter": converter,
        "key.converter.schemas.enable": "true", "value.converter.schemas.enable": "true",
        **ONE_PARTITION,
    }


def _db_rows(db, table: str) -> list[dict]:
    import pymysql.cursors

    with db.connect(DB) as conn, conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT * FROM {table}")
        rows = list(cur.fetchall())
    for r in rows:
        for c in JSON_COLUMNS.get(table, ()):       # MariaDB's JSON is text
            if r.get(c) is not None:
                r[c] = json.loads(r[c])
        for c in ZONED.get(table, ()):
            if r.get(c) is not None:
                r[c] = r[c].replace(tzinfo=dt.timezone.utc)
    return sorted(rows, key=lambda r: [r[k] for k in KEY])


@pytest.fixture(scope="module")
def shop(debezium_mariadb, mariadb, connect_worker, kafka_bootstrap):
    mariadb.execute(*SCHEMA)
    mariadb.execute(*SNAPSHOT, database=DB)
    connect_worker.add_connector(PREFIX, _connector(mariadb, kafka_bootstrap))
    marker = {"n": 0}

    def mark() -> None:
        marker["n"] += 1
        mariadb.execute(f"UPDATE marker SET n = {marker['n']}", database=DB)
        wait_for_marker(kafka_bootstrap, f"{PREFIX}.{DB}.marker", marker["n"])

    mariadb.mark = mark
    mark()       # a streamed change: the snapshot is over (a TRUNCATE during it fails it on MariaDB)
    yield mariadb
    connect_worker.delete_connector(PREFIX)


def _assert_lake_equals_database(db, workdir) -> None:
    for t in TABLES + ["later"]:
        assert_same_rows(_db_rows(db, t), delta_rows(str(workdir / "lake" / f"{PREFIX}_{t}"), KEY,
                                                     json_columns=JSON_COLUMNS.get(t, ())), table=t)


def test_a_routed_mariadb_database_equals_the_database_also_after_sigkill(shop, kafka_bootstrap, tmp_path):
    shop.execute(*STREAM, database=DB)
    shop.mark()
    # heartbeats and schema changes (topic PREFIX) are written; the connector wrote no transaction topic here
    assert {f"__debezium-heartbeat.{PREFIX}", PREFIX} <= topics(kafka_bootstrap)
    source = {"name": "shop", "topic_pattern": rf"{PREFIX}\.{DB}\..*", "format": "debezium-json",
              "options": {"schema-include": True}, "on_error": "fail", "on_truncate": "apply",
              "route": [{"source_table": rf"{DB}\.(.*)", "table": f"{PREFIX}_$1"}]}
    config = write_pipeline(tmp_path, pipeline_id="realdb-mariadb", bootstrap=kafka_bootstrap, sources=[source],
                            tables=[], max_records=40)
    first = run_changelake(config)
    assert first.returncode == 0, first.stderr[-4000:]
    _assert_lake_equals_database(shop, tmp_path)

    shop.execute(*AFTER_FIRST_RUN, database=DB)
    shop.mark()
    done = last_committed_batch(str(tmp_path / "checkpoint"))[0]
    crashed = run_changelake(config, fault=f"after-first-table@{done + 2}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-4000:]
    restarted = run_changelake(config)
    assert restarted.returncode == 0, restarted.stderr[-4000:]
    _assert_lake_equals_database(shop, tmp_path)
