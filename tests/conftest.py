"""Fixtures shared by every test tier.

* ``spark``: one local Spark session per test process.
* ``kafka``: a Kafka-protocol broker, taken in this order: ``KAFKA_BOOTSTRAP_SERVERS``
  when set; a testcontainers Kafka when a Docker engine answers; otherwise the
  embedded broker (librdkafka's mock cluster). Tests use fresh topic names.

Property tests explore new examples on every local run; under CI (``CI`` set) hypothesis runs
derandomized, so a submission lands or not on its own merits, not on the draw. A failure found
locally prints its seed (``--hypothesis-seed``) and is fixed, never skipped.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

#: JVM options of every Spark driver the tests start: this process's session, the CLI runs and the
#: benchmarks' smoke runs (their subprocesses inherit the variable; Spark's launcher passes it to the
#: driver JVM and nothing else). A test's JVM lives seconds to minutes, mostly starting up: the C2
#: compiler's threads and the parallel collector cost CPU that never pays back on two cores (a
#: SIGKILL-and-restart test took 24% less CPU without them). Same bytecode, same results; a
#: SPARK_SUBMIT_OPTS of your own is kept.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)

_MIN_DOCKER_TIMEOUT_S = 3


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap_servers: str
    kind: str   # "external", "testcontainers" or "embedded"

    def topic(self, prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _docker_answers() -> bool:
    try:
        import docker
        client = docker.from_env(timeout=_MIN_DOCKER_TIMEOUT_S)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka():
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if servers:
        yield KafkaBroker(servers, "external")
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer
        with KafkaContainer() as container:
            yield KafkaBroker(container.get_bootstrap_server(), "testcontainers")
        return
    from changelake.connectors.embedded_broker import EmbeddedBroker
    with EmbeddedBroker() as broker:
        yield KafkaBroker(broker.bootstrap_servers, "embedded")


@pytest.fixture(scope="session")
def spark():
    from changelake.spark.session import build_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    session = build_session(app_name="changelake-tests", master="local[2]", conf=conf, ui=False)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of this test session (tests/postgres_server.py), started from the OS
    package's binaries; tests skip, saying what is missing, where there are none."""
    from tests.postgres_server import PostgresServer, missing

    why = missing()
    if why:
        pytest.skip(why)
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()
