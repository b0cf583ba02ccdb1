"""A local Apache Kafka broker, run from the project's own jars (the ``kafka`` set of jvm/pom.xml).

:class:`LocalKafka` starts ``kafka.Kafka`` (KRaft, every node both broker and controller) in one JVM
per node, on localhost ports, with its storage and log under one directory:

==================  ============================================================================
nodes=1             a single node: replication factor 1 everywhere (trying the product, most tests)
nodes=3             three nodes: replication factor 3, ``min.insync.replicas`` 2, a three-voter
                    controller quorum (fault tests: :meth:`LocalKafka.kill`, ``start``, ``stop_all``,
                    ``start_all``, :meth:`LocalKafka.leader` of a partition)
==================  ============================================================================

``<workdir>/node-<id>/server.log`` keeps each node's log (also after :meth:`LocalKafka.stop`, which
removes the data of a broker that made its own temporary directory). :meth:`LocalKafka.ready` asks
the brokers themselves (a metadata request through confluent-kafka's AdminClient) whether every
node answers. Topics are not auto-created with a partition count a reader may expect: create them
with :func:`create_topics`. ``changelake broker`` runs one for a user (docs/operations.md).
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from changelake import jvm_deps
from changelake.errors import ChangelakeError

log = logging.getLogger(__name__)

#: the broker JVM's options unless given: a small heap, the serial collector (a local broker on a
#: few cores; Kafka's page-cache use does not need a large heap)
DEFAULT_JAVA_OPTIONS = ("-Xmx512m", "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = WARN
"""


class BrokerError(ChangelakeError):
    """The local Kafka broker could not start or stopped answering."""


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: runs before the JVM, in a fresh single-threaded interpreter that then becomes it (exec): the JVM gets
#: SIGTERM when the process that started it dies (Linux's PR_SET_PDEATHSIG), so no broker outlives its
#: test run or ``changelake broker``. (A ``preexec_fn`` would do it in the forked child of a process
#: with threads, such as Spark's py4j, which can deadlock.)
_EXEC_WITH_PDEATHSIG = ("import ctypes, os, signal, sys\n"
                        "try:\n    ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM)\nexcept OSError:\n    pass\n"
                        "os.execvp(sys.argv[1], sys.argv[1:])")


class LocalKafka:
    """An Apache Kafka cluster of ``nodes`` KRaft nodes on this machine. Use as a context manager, or
    :meth:`start` then :meth:`stop`.

    ``port``: the first node's client port (0: any free one). ``workdir``: storage and logs (kept;
    default a temporary directory whose data :meth:`stop` removes, logs kept). ``settings``: broker
    properties over the defaults of :meth:`properties`.
    """

    def __init__(self, *, nodes: int = 1, port: int = 0, host: str = "127.0.0.1", workdir: str | Path | None = None,
                 java_options: tuple[str, ...] | None = None, settings: Mapping[str, str] | None = None,
                 start_timeout_s: float = 120.0) -> None:
        if nodes < 1:
            raise ValueError("a Kafka cluster has at least one node")
        self.nodes = nodes
        self.host = host
        self._port = port
        self._own_dir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="changelake-kafka-"))
        self.java_options = tuple(DEFAULT_JAVA_OPTIONS if java_options is None else java_options)
        self._settings = dict(settings or {})
        self.start_timeout_s = start_timeout_s
        self._ports: dict[int, tuple[int, int]] = {}     # node id -> (client port, controller port)
        self._procs: dict[int, subprocess.Popen] = {}
        self._log_handles: dict[int, object] = {}

    # -- addresses and files ------------------------------------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.host}:{self._ports[n][0]}" for n in self.node_ids)

    def log_file(self, node: int = 1) -> Path:
        return self.workdir / f"node-{node}" / "server.log"

    @property
    def log_files(self) -> list[Path]:
        return [self.log_file(n) for n in self.node_ids]

    def properties(self, node: int) -> dict[str, str]:
        """The broker properties of ``node``: combined mode, replication as the module docstring says, and
        settings that make a small local cluster start and hand out group coordinators at once."""
        replicas = min(self.nodes, 3)
        min_isr = "2" if replicas >= 3 else "1"
        client, controller = self._ports[node]
        voters = ",".join(f"{n}@{self.host}:{self._ports[n][1]}" for n in self.node_ids)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.host}:{client},CONTROLLER://{self.host}:{controller}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{client}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.workdir / f"node-{node}" / "data"),
            "num.partitions": "1",
            "default.replication.factor": str(replicas),
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": str(replicas),
            "offsets.topic.num.partitions": "10",
            "transaction.state.log.replication.factor": str(replicas),
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": str(replicas),
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
        }
        if self.nodes > 1:
            # a node that stops heartbeating is fenced (its partitions get new leaders) after 3 s, not 9 s
            props.update({"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"})
        props.update(self._settings)
        return props

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> "LocalKafka":
        """Format the nodes' storage (once per workdir), start every node and wait until all answer."""
        classpath = jvm_deps.classpath("kafka")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        id_file = self.workdir / "cluster.id"
        if not id_file.exists():
            id_file.write_text(base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())
        cluster_id = id_file.read_text().strip()
        for n in self.node_ids:
            port = self._port + n - 1 if self._port else _free_port(self.host)
            self._ports[n] = (port, _free_port(self.host))
        formats = []
        for n in self.node_ids:
            config = self._write_config(n)
            formats.append((n, subprocess.Popen(
                # "--cluster-id=": a random id may begin with "-", which "-t ID" would take for an option
                [*self._java(classpath), "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                 "-c", str(config), "--ignore-formatted"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for n, proc in formats:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise BrokerError(f"formatting the storage of Kafka node {n} in {self.workdir} failed:\n{out[-2000:]}")
        for n in self.node_ids:
            self.start_node(n, wait=False)
        self.wait_ready(self.start_timeout_s)
        log.info("Apache Kafka (%d node%s) at %s; logs in %s", self.nodes, "s" * (self.nodes > 1),
                 self.bootstrap_servers, self.workdir)
        return self

    def _java(self, classpath: str) -> list[str]:
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
        return [java, *self.java_options, f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", classpath]

    def _write_config(self, node: int) -> Path:
        folder = self.workdir / f"node-{node}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties(node).items()))
        return path

    def start_node(self, node: int, *, wait: bool = True) -> None:
        """Start ``node`` (again, after :meth:`stop_node`), on its former ports."""
        if node in self._procs and self._procs[node].poll() is None:
            return
        config = self._write_config(node)
        handle = open(self.log_file(node), "a")
        self._log_handles[node] = handle
        self._procs[node] = subprocess.Popen(
            [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *self._java(jvm_deps.classpath("kafka")), "kafka.Kafka",
             str(config)], stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(self.start_timeout_s)

    def stop_node(self, node: int, *, kill: bool = False, timeout_s: float = 60.0) -> None:
        """Stop ``node``: a controlled shutdown (SIGTERM), or ``kill`` (SIGKILL) as a crash would."""
        proc = self._procs.pop(node, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("Kafka node %d did not stop within %.0f s of SIGTERM; killing it", node, timeout_s)
                proc.kill()
                proc.wait()
        handle = self._log_handles.pop(node, None)
        if handle is not None:
            handle.close()

    # -- faults (tests/integration/test_broker_faults.py, bench/soak.py) ---------------------------------

    def kill(self, node: int, sig: int = signal.SIGKILL) -> None:
        """Crash ``node``: ``sig`` (SIGKILL: no controlled shutdown, no leadership handed over), then reap it."""
        proc = self._procs.get(node)
        if proc is None or proc.poll() is not None:
            raise BrokerError(f"Kafka node {node} is not running")
        if sig == signal.SIGKILL:
            self.stop_node(node, kill=True)
        else:
            proc.send_signal(sig)

    def running_nodes(self) -> list[int]:
        return sorted(n for n, p in self._procs.items() if p.poll() is None)

    def stop_all(self, *, kill: bool = False) -> None:
        """Stop every node (the whole cluster down: SIGTERM, or SIGKILL with ``kill``); storage kept."""
        for n in self.running_nodes():
            self._procs[n].send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        for n in list(self._procs):
            self.stop_node(n, kill=kill)

    def start_all(self, *, wait: bool = True) -> None:
        """Start every stopped node again, on the ports it had; ``wait``: until all of them answer."""
        for n in self.node_ids:
            self.start_node(n, wait=False)
        if wait:
            self.wait_ready(self.start_timeout_s)

    def leader(self, topic: str, partition: int, *, timeout_s: float = 10.0) -> int:
        """The node that leads ``topic[partition]`` now, as the brokers' metadata says (-1: none)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                             "logger": logging.getLogger("changelake.kafka_probe")})
        return admin.list_topics(topic, timeout=timeout_s).topics[topic].partitions[partition].leader

    def ready(self, timeout_s: float = 2.0, *, nodes: int | None = None) -> bool:
        """True when a metadata request answers and lists ``nodes`` brokers (default: all of them)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0,
                             "logger": logging.getLogger("changelake.kafka_probe")})
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except Exception:  # KafkaException: no broker answered in time
            return False
        return len(metadata.brokers) >= (self.nodes if nodes is None else nodes)

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            dead = self.exited_nodes()
            if dead:
                raise BrokerError(f"Kafka node {dead[0]} exited (code {self._procs[dead[0]].returncode}) while "
                                  f"starting; its log, {self.log_file(dead[0])}, ends:\n{self._tail(dead[0])}")
            if self.ready(min(2.0, max(0.5, deadline - time.monotonic()))):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"Kafka at {self.bootstrap_servers} did not answer within {timeout_s:.0f} s; "
                                  f"the log of node 1, {self.log_file(1)}, ends:\n{self._tail(1)}")
            time.sleep(0.2)

    def exited_nodes(self) -> list[int]:
        """The nodes started and not stopped through :meth:`stop_node` whose JVM has exited."""
        return [n for n, p in self._procs.items() if p.poll() is not None]

    def _tail(self, node: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file(node).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after a minute); a temporary workdir loses its data, not its logs."""
        for n in list(self._procs):
            self._procs[n].send_signal(signal.SIGTERM) if self._procs[n].poll() is None else None
        for n in list(self._procs):
            self.stop_node(n)
        if self._own_dir:
            for n in self.node_ids:
                shutil.rmtree(self.workdir / f"node-{n}" / "data", ignore_errors=True)

    def __enter__(self) -> "LocalKafka":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_topics(bootstrap_servers: str, topics: Mapping[str, int], *, replication_factor: int = -1,
                  config: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
    """Create ``topics`` (name -> partition count) unless they exist; -1: the broker's default replication."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    wanted = [NewTopic(name, num_partitions=n, replication_factor=replication_factor, config=dict(config or {}))
              for name, n in topics.items()]
    for name, future in admin.create_topics(wanted, operation_timeout=timeout_s, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"could not create topic {name!r} on {bootstrap_servers}: {exc.args[0].str()}") from exc
