"""Fixtures of the real-database tests: a Kafka Connect worker with the Debezium connectors and a
PostgreSQL with logical decoding, one per session each (both connectors in the one worker, writing to
the tests' Kafka broker, the ``kafka`` fixture of tests/conftest.py), and a MariaDB with a ROW binlog,
each with its log kept under pytest's temporary directory (``<basetemp>/realdb-logs*``).

The JVM artifacts are the project's pinned sets (changelake/jvm_deps.py): ``connect`` (the worker),
``debezium-postgres`` and ``debezium-mariadb`` (its plugin folders). A test skips, naming the set or
the Debian package that is missing, when one cannot be had; under ``.ci/run`` it fails instead
(``tests/jars.py``).
"""

from __future__ import annotations

import pytest

from changelake import jvm_deps
from tests.jars import unavailable
from tests.realdb.processes import ConnectWorker, MariaDbServer



@pytest.fixture(scope="session")
def realdb_logs(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("realdb-logs"))


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka) -> str:
    """The bootstrap servers of the tests' Kafka broker."""
    return kafka.bootstrap_servers


@pytest.fixture(scope="session")
def connect_worker(kafka_bootstrap, realdb_logs):
    """A Kafka Connect standalone worker writing to ``kafka_bootstrap``, with every Debezium plugin set
    that is installed on its ``plugin.path`` (a test needing one asks for its fixture below first)."""
    unavailable(ConnectWorker.missing())
    plugins = [name for name in jvm_deps.PLUGINS if jvm_deps.missing(name) is None]
    worker = ConnectWorker.start(kafka_bootstrap, realdb_logs, plugins=plugins)
    try:
        yield worker
    finally:
        worker.stop()


@pytest.fixture(scope="session")
def debezium_postgres() -> None:
    """Skips, naming the set and how to install it, unless Debezium's PostgreSQL connector is installed."""
    unavailable(jvm_deps.missing("debezium-postgres"))


@pytest.fixture(scope="session")
def debezium_mariadb() -> None:
    """Skips, naming the set and how to install it, unless Debezium's MariaDB connector is installed."""
    unavailable(jvm_deps.missing("debezium-mariadb"))


@pytest.fixture(scope="session")
def pg_logical(realdb_logs):
    """A PostgreSQL server with ``wal_level=logical`` (Debezium's pgoutput); each test module makes its own
    database (and replication slots) in it."""
    from tests.postgres_server import PostgresServer, missing

    unavailable(missing())
    server = PostgresServer.start(settings={"wal_level": "logical", "max_replication_slots": "8",
                                            "max_wal_senders": "8"}, log_dir=realdb_logs)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mariadb(realdb_logs):
    """A MariaDB server with a ROW binlog and full row images."""
    unavailable(MariaDbServer.missing())
    try:
        import pymysql  # noqa: F401
    except ImportError:
        unavailable("PyMySQL is not installed: pip install the project's test extras")
    server = MariaDbServer.start(realdb_logs)
    try:
        yield server
    finally:
        server.stop()
