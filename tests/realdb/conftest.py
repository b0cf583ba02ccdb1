"""Fixtures of the real-database tests: a Kafka broker, a Kafka Connect worker with the Debezium
connectors, a PostgreSQL with logical decoding and a MariaDB with a ROW binlog, each started once
(the broker and the worker per session, a database per module) with its log kept under pytest's
temporary directory (``<basetemp>/realdb-logs*``).

``kafka_bootstrap`` and ``tests/realdb/jvm.py`` (the jars) are the two places that say where the
broker and the JVM artifacts come from; a test skips, naming what is missing, when they cannot be had.
"""

from __future__ import annotations

import pytest

from tests.realdb import jvm
from tests.realdb.processes import ConnectWorker, KafkaBroker, MariaDbServer


def _skip_if(why: str | None) -> None:
    if why:
        pytest.skip(why)


@pytest.fixture(scope="session")
def realdb_logs(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("realdb-logs"))


@pytest.fixture(scope="session")
def kafka_bootstrap(realdb_logs):
    """The bootstrap servers of a real Apache Kafka broker (KRaft, one node)."""
    _skip_if(jvm.missing("broker"))
    broker = KafkaBroker.start(realdb_logs)
    try:
        yield broker.bootstrap_servers
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def connect_worker(kafka_bootstrap, realdb_logs):
    """A Kafka Connect standalone worker with the Debezium connectors, writing to ``kafka_bootstrap``."""
    _skip_if(jvm.missing("connect"))
    worker = ConnectWorker.start(kafka_bootstrap, realdb_logs)
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="module")
def pg_logical(realdb_logs):
    """A PostgreSQL server with ``wal_level=logical`` (Debezium's pgoutput)."""
    from tests.postgres_server import PostgresServer, missing

    _skip_if(missing())
    server = PostgresServer.start(settings={"wal_level": "logical", "max_replication_slots": "8",
                                            "max_wal_senders": "8"}, log_dir=realdb_logs)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mariadb(realdb_logs):
    """A MariaDB server with a ROW binlog and full row images."""
    _skip_if(MariaDbServer.missing())
    try:
        import pymysql  # noqa: F401
    except ImportError:
        pytest.skip("PyMySQL is not installed: pip install the project's test extras")
    server = MariaDbServer.start(realdb_logs)
    try:
        yield server
    finally:
        server.stop()
