"""Fixtures shared by every test tier.

* ``spark``: one local Spark session per test process (``make test`` runs two, pytest-xdist workers with a
  test file kept in one: Makefile ``TEST_WORKERS``).
* ``kafka``: an Apache Kafka broker, taken in this order: ``KAFKA_BOOTSTRAP_SERVERS``
  when set; a testcontainers Kafka when a Docker engine answers; otherwise a local single-node
  broker from the project's jars (changelake/connectors/kafka_broker.py, the ``kafka`` set of
  jvm/pom.xml), started once per test process; without those jars the tests skip, saying how to
  install them. Tests use fresh topic names and create the topics they need with a partition
  count (``kafka.create_topics``). librdkafka's mock cluster (the embedded broker) is left to the
  demo and benchmarks.

Every Spark driver JVM the tests start (this process's session, the CLI runs, the benchmarks' smoke
runs) gets ``SPARK_SUBMIT_OPTS``: C1 only, the serial collector, and a class-data archive of Spark's
classes (see ``pytest_collection_finish``); set the variable yourself to run them otherwise.

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
_OWN_JVM_OPTIONS = "SPARK_SUBMIT_OPTS" in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
#: the JVM's own notes about its class archive (e.g. one left from another Java) stay off the outputs tests read
_QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off,class+path=off"


def pytest_collection_finish(session) -> None:
    """When the selected tests start Spark drivers, they load Spark's classes from a class-data archive
    (CDS) made once per machine, Java and pyspark (kept in the temp directory): a session then starts on
    about half the CPU. Without it (it could not be made) they load them as usual."""
    if _OWN_JVM_OPTIONS or not any(m in item.keywords for item in session.items for m in ("spark", "integration")):
        return
    archive = _spark_class_archive()
    if archive is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{TEST_JVM_OPTIONS} -XX:SharedArchiveFile={archive} {_QUIET_CDS}"


#: changes of the demo run whose JVM dumps the tests' class archive: enough for every kind of batch
#: (snapshot, updates, deletes, the graph's operators), few enough to take seconds
ARCHIVE_CHANGES = 300


def _spark_class_archive() -> str | None:
    """The archive ``changelake jvm-archive`` writes (changelake/spark/jvm_archive.py: a short demo run, the
    mirrors and the graph, whose JVM dumps every class it loaded), for the tests' JVM options. A pipeline
    run loads some 3,000 classes besides those of a session's start (streaming, the Python data source,
    Arrow, the state store): 1-2 s less CPU per pipeline start than an archive of a bare session's classes
    (the demo's graph 19 -> 17 s, a mirrors-only CLI run ~0.8 s less), for a demo run instead of a bare
    session, once, to write it."""
    import fcntl
    import hashlib
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    try:
        import pyspark
    except ImportError:
        return None
    from changelake.spark import jvm_archive

    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if java is None:
        return None
    key = hashlib.sha256(f"{os.path.realpath(java)}|{pyspark.__file__}|{pyspark.__version__}|{TEST_JVM_OPTIONS}|"
                         f"demo-run {ARCHIVE_CHANGES}".encode()).hexdigest()[:16]
    archive = Path(tempfile.gettempdir()) / f"changelake-tests-spark-{key}.jsa"
    # make test's workers (pytest-xdist) collect at once: one writes the archive, the others wait for it
    with open(f"{archive}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return str(archive)
        try:        # the child's JVM runs with SPARK_SUBMIT_OPTS = TEST_JVM_OPTIONS, plus the option that dumps
            jvm_archive.write([sys.executable, "-m", "changelake.service.cli", "jvm-archive",
                               "--changes", str(ARCHIVE_CHANGES)], archive, timeout=600)
        except (RuntimeError, OSError, subprocess.SubprocessError):
            return None
    _drop_stale_archives(archive)
    return str(archive)


def _drop_stale_archives(kept, older_than_s: float = 86_400) -> None:
    """Delete the test archives beside ``kept`` (a Path; ~170 MB each: one per checkout, Java and pyspark)
    not used for a day, so that test runs from many clones do not fill the temporary directory."""
    import time

    for other in kept.parent.glob("changelake-tests-spark-*.jsa"):
        try:
            if other != kept and time.time() - other.stat().st_atime > older_than_s:
                other.unlink()
        except OSError:
            pass

#: seconds (setup + call + teardown) and tests per directory under tests/, and per file, for the summary below
_DIRECTORY_SECONDS: dict[str, list] = {}
_FILE_SECONDS: dict[str, list] = {}
#: how many of the slowest files the summary names
SLOWEST_FILES = 25


def pytest_runtest_logreport(report) -> None:
    path = report.nodeid.split("::")[0]
    parts = path.split("/")
    where = parts[1] if len(parts) > 2 else parts[-1]          # tests/<dir>/..., or a module at the top
    for table, key in ((_DIRECTORY_SECONDS, where), (_FILE_SECONDS, path)):
        seconds = table.setdefault(key, [0.0, 0])
        seconds[0] += report.duration
        seconds[1] += report.when == "call"


def pytest_terminal_summary(terminalreporter) -> None:
    """Where the run's time went, per directory under tests/ (the project's guide keeps ``make test`` under
    ~40 minutes on a 2-core CI machine: shrink the slowest first; ``--durations`` names the tests)."""
    if len(_DIRECTORY_SECONDS) < 2:
        return
    total = sum(s for s, _ in _DIRECTORY_SECONDS.values())
    terminalreporter.section("seconds per directory")
    for where, (seconds, tests) in sorted(_DIRECTORY_SECONDS.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{seconds:8.0f} s {100 * seconds / max(total, 1e-9):5.1f} % {tests:6d} tests  "
                                    f"tests/{where}")
    terminalreporter.write_line(f"{total:8.0f} s in tests (the rest of the wall time: collection, the session's "
                                "start and end)")
    terminalreporter.section(f"the {SLOWEST_FILES} slowest files")
    slowest = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1][0])[:SLOWEST_FILES]
    for path, (seconds, tests) in slowest:
        terminalreporter.write_line(f"{seconds:8.0f} s {tests:6d} tests  {path}")


_MIN_DOCKER_TIMEOUT_S = 3


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap_servers: str
    kind: str   # "external", "testcontainers" or "local" (Apache Kafka from .jvm/kafka)
    #: the local broker's process and log (kind "local")
    local: object | None = None

    def topic(self, prefix: str = "t", *, partitions: int | None = None) -> str:
        """A fresh topic name; created with ``partitions`` partitions when given."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if partitions is not None:
            self.create_topics({name: partitions})
        return name

    def create_topics(self, topics: dict[str, int], **config: str) -> None:
        """Create ``topics`` (name -> partitions) unless they exist; ``config``: topic settings."""
        from changelake.connectors.kafka_broker import create_topics

        create_topics(self.bootstrap_servers, topics, config={k.replace("_", "."): v for k, v in config.items()})


def _docker_answers() -> bool:
    try:
        import docker
        client = docker.from_env(timeout=_MIN_DOCKER_TIMEOUT_S)
        client.ping()
        return True
    except Exception:
        return False


#: the test broker's JVM: C1 only and a small heap (it lives minutes; see TEST_JVM_OPTIONS)
TEST_BROKER_JAVA_OPTIONS = ("-Xmx512m", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                            "-Djava.awt.headless=true")
#: the test broker keeps records of any age (tests write CreateTimes weeks in the past, which Kafka's
#: default 7-day retention deletes at once), applies a topic's retention.bytes within a second
#: (tests/source: reading past a retention), and gives a topic a producer creates 4 partitions (so keyed
#: messages spread as in production; a test that relies on a count creates its topics with it)
TEST_BROKER_SETTINGS = {"log.retention.ms": "-1", "log.retention.check.interval.ms": "1000",
                        "log.initial.task.delay.ms": "0", "log.segment.delete.delay.ms": "0", "num.partitions": "4"}


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    servers = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if servers:
        yield KafkaBroker(servers, "external")
        return
    if _docker_answers():
        from testcontainers.kafka import KafkaContainer
        with KafkaContainer() as container:
            yield KafkaBroker(container.get_bootstrap_server(), "testcontainers")
        return
    from changelake import jvm_deps
    from changelake.connectors.kafka_broker import LocalKafka

    why = jvm_deps.missing("kafka")
    if why:
        from tests.jars import unavailable

        unavailable(f"no Kafka broker: KAFKA_BOOTSTRAP_SERVERS is not set, no Docker engine answers, and {why}")
    with LocalKafka(workdir=tmp_path_factory.mktemp("kafka"), java_options=TEST_BROKER_JAVA_OPTIONS,
                    settings=TEST_BROKER_SETTINGS) as broker:
        yield KafkaBroker(broker.bootstrap_servers, "local", broker)


@pytest.fixture(scope="session")
def spark():
    from changelake import jvm_deps
    from changelake.spark.session import build_session

    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    # Spark's own Kafka source where its set is installed (kafka.reader: spark-kafka; tests/integration skip
    # without it, naming the install)
    jar_sets = () if jvm_deps.missing("spark-kafka") else ("spark-kafka",)
    session = build_session(app_name="changelake-tests", master="local[2]", conf=conf, ui=False, jar_sets=jar_sets)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of this test session (tests/postgres_server.py), started from the OS
    package's binaries; tests skip, saying what is missing, where there are none (under ``.ci/run``
    they fail: ``tests/jars.py``)."""
    from tests.postgres_server import PostgresServer, missing

    from tests.jars import unavailable

    unavailable(missing())
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()
