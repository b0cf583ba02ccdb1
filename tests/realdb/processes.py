"""External processes of the real-database tests, one small class each: ``start()``, ``ready()`` (a real
protocol probe), ``stop()``, and a log file that stays in the directory given to ``start``.

* :class:`KafkaBroker`: a single-node KRaft broker from the ``kafka_2.13`` jars (a development stand-in
  for the project's broker fixture: the tests only use its ``bootstrap_servers``).
* :class:`ConnectWorker`: a Kafka Connect standalone worker (``connect-runtime``) with the Debezium
  connectors on its classpath; connectors are added through its REST API, each with its own
  JSON converter settings.
* :class:`MariaDbServer`: a MariaDB server (Debian's ``mariadb-server``) with a ROW binlog, run as the
  ``mysql`` user under ``runuser`` when the tests run as root.

PostgreSQL is ``tests/postgres_server.py`` (with ``settings={"wal_level": "logical"}``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid

from tests.realdb import jvm

#: JVM options of the broker and the worker: small heaps, C1 only, the serial collector (2 cores)
JVM_OPTIONS = ["-Xms64m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
_LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.connect.name = org.apache.kafka.connect.runtime.WorkerSourceTask
logger.connect.level = INFO
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(probe, *, timeout: float, what: str, log: str | None = None, process=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}{_tail(log)}")
        if probe():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s{_tail(log)}")


def _tail(log: str | None, lines: int = 40) -> str:
    if not log or not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        return f"\n--- last lines of {log}:\n" + "".join(f.readlines()[-lines:])


class _JavaProcess:
    name = "java"

    def _launch(self, log_dir: str, main: str, args: list[str], heap: str) -> None:
        if not getattr(self, "workdir", None):
            self.workdir = tempfile.mkdtemp(prefix=f"changelake-{self.name}-")
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"{self.name}.log")
        log4j = os.path.join(self.workdir, "log4j2.properties")
        with open(log4j, "w") as f:
            f.write(_LOG4J2)
        cmd = [jvm.java(), f"-Xmx{heap}", *JVM_OPTIONS, f"-Dlog4j2.configurationFile={log4j}",
               "-cp", jvm.classpath(), main, *args]
        self._log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                        start_new_session=True)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class KafkaBroker(_JavaProcess):
    """One KRaft node, broker and controller in one JVM, PLAINTEXT on a free port of 127.0.0.1."""

    name = "kafka"

    @classmethod
    def start(cls, log_dir: str, *, heap: str = "384m") -> "KafkaBroker":
        self = cls()
        port, controller = free_port(), free_port()
        self.bootstrap_servers = f"127.0.0.1:{port}"
        self.workdir = tempfile.mkdtemp(prefix="changelake-kafka-")
        props = {
            "process.roles": "broker,controller", "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER", "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": os.path.join(self.workdir, "data"), "num.partitions": "1",
            "offsets.topic.replication.factor": "1", "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1", "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4", "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1", "group.initial.rebalance.delay.ms": "0",
        }
        config = os.path.join(self.workdir, "server.properties")
        with open(config, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in props.items())
        fmt = subprocess.run([jvm.java(), "-Xmx128m", *JVM_OPTIONS, "-cp", jvm.classpath(), "kafka.tools.StorageTool",
                              "format", "-t", uuid.uuid4().hex[:22], "-c", config],
                             capture_output=True, text=True, timeout=120)
        if fmt.returncode:
            raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
        self._launch(log_dir, "kafka.Kafka", [config], heap)
        wait_until(self.ready, timeout=120, what="kafka broker", log=self.log_path, process=self.process)
        return self

    def ready(self) -> bool:
        from confluent_kafka.admin import AdminClient

        host, port = self.bootstrap_servers.split(":")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            md = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0}).list_topics(timeout=5)
            return bool(md.brokers)
        except Exception:
            return False


class ConnectWorker(_JavaProcess):
    """A Kafka Connect standalone worker; ``add_connector`` creates a connector through the REST API."""

    name = "connect"

    @classmethod
    def start(cls, bootstrap_servers: str, log_dir: str, *, heap: str = "512m") -> "ConnectWorker":
        self = cls()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home = tempfile.mkdtemp(prefix="changelake-connect-home-")
        props = {
            "bootstrap.servers": bootstrap_servers, "listeners": self.url,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": os.path.join(home, "offsets"),
            "offset.flush.interval.ms": "1000", "plugin.discovery": "only_scan",
            "plugin.path": jvm.connect_plugins(),
        }
        config = os.path.join(home, "worker.properties")
        with open(config, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in props.items())
        self.workdir = home
        self._launch(log_dir, "org.apache.kafka.connect.cli.ConnectStandalone", [config], heap)
        wait_until(self.ready, timeout=180, what="kafka connect worker", log=self.log_path, process=self.process)
        return self

    def _request(self, method: str, path: str, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read()
            return json.loads(text) if text else None

    def ready(self) -> bool:
        try:
            return "version" in self._request("GET", "/")
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def add_connector(self, name: str, config: dict[str, str], *, timeout: float = 120) -> None:
        """Create (or reconfigure) ``name`` and wait until the connector and its task run."""
        self._request("PUT", f"/connectors/{name}/config", config)

        def running() -> bool:
            try:
                status = self._request("GET", f"/connectors/{name}/status")
            except urllib.error.HTTPError:
                return False
            failed = [t for t in status.get("tasks", []) if t["state"] == "FAILED"]
            if failed or status["connector"]["state"] == "FAILED":
                raise RuntimeError(f"connector {name} failed: {json.dumps(status)[:3000]}")
            return status["connector"]["state"] == "RUNNING" and any(
                t["state"] == "RUNNING" for t in status.get("tasks", []))

        wait_until(running, timeout=timeout, what=f"connector {name}", log=self.log_path, process=self.process)

    def delete_connector(self, name: str) -> None:
        self._request("DELETE", f"/connectors/{name}")


class MariaDbServer:
    """A MariaDB server with a ROW binlog on a free port of 127.0.0.1; user ``changelake`` may do anything."""

    user = "changelake"
    password = "changelake-test"

    @staticmethod
    def missing() -> str | None:
        for tool in ("mariadbd", "mariadb-install-db"):
            if not (shutil.which(tool) or os.path.exists(f"/usr/sbin/{tool}")):
                return f"{tool} not found: install the Debian package mariadb-server (apt-get install mariadb-server)"
        if os.geteuid() == 0 and shutil.which("runuser") is None:
            return "running as root, the MariaDB fixture needs runuser (util-linux) to start the server as mysql"
        return None

    @classmethod
    def start(cls, log_dir: str) -> "MariaDbServer":
        why = cls.missing()
        if why:
            raise RuntimeError(why)
        self = cls()
        self.root = tempfile.mkdtemp(prefix="changelake-mariadb-")
        self.port = free_port()
        as_root = os.geteuid() == 0
        self.log_dir = log_dir   # the server's log is copied there by stop() (mysql may not reach it)
        self.log_path = os.path.join(self.root, "mariadb.log")
        if as_root:
            shutil.chown(self.root, "mysql", "mysql")
        prefix = ["runuser", "-u", "mysql", "--"] if as_root else []
        data = os.path.join(self.root, "data")
        init = subprocess.run(prefix + [shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db",
                                        "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
                                        "--skip-test-db"], capture_output=True, text=True, timeout=180)
        if init.returncode:
            raise RuntimeError(f"mariadb-install-db failed:\n{init.stdout}\n{init.stderr}")
        self.socket = os.path.join(self.root, "mysqld.sock")
        cmd = prefix + [shutil.which("mariadbd") or "/usr/sbin/mariadbd", "--no-defaults", f"--datadir={data}",
                        f"--port={self.port}", "--bind-address=127.0.0.1", f"--socket={self.socket}",
                        f"--pid-file={os.path.join(self.root, 'mysqld.pid')}", f"--log-error={self.log_path}",
                        "--server-id=1", "--log-bin=mysql-bin", "--binlog-format=ROW", "--binlog-row-image=FULL",
                        "--innodb-buffer-pool-size=32M", "--performance-schema=OFF", "--skip-name-resolve",
                        "--character-set-server=utf8mb4", "--collation-server=utf8mb4_unicode_ci"]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        wait_until(lambda: self._probe(user="root", password=""), timeout=120, what="mariadb",
                   log=self.log_path, process=self.process)
        with self._connect(user="root", password="") as conn, conn.cursor() as cur:
            cur.execute(f"CREATE USER '{cls.user}'@'%' IDENTIFIED BY '{cls.password}'")
            cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{cls.user}'@'%' WITH GRANT OPTION")
        return self

    def _connect(self, *, user: str | None = None, password: str | None = None, database: str | None = None):
        import pymysql

        return pymysql.connect(host="127.0.0.1", port=self.port, user=user or self.user,
                               password=self.password if password is None else password, database=database,
                               autocommit=True, charset="utf8mb4")

    def connect(self, database: str | None = None):
        return self._connect(database=database)

    def _probe(self, **kw) -> bool:
        try:
            with self._connect(**kw) as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
                return cur.fetchone() == (1,)
        except Exception:
            return False

    def ready(self) -> bool:
        return self._probe()

    def execute(self, *statements: str, database: str | None = None) -> None:
        with self.connect(database) as conn, conn.cursor() as cur:
            for s in statements:
                cur.execute(s)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if os.path.exists(self.log_path):
            os.makedirs(self.log_dir, exist_ok=True)
            shutil.copyfile(self.log_path, os.path.join(self.log_dir, "mariadb.log"))
        shutil.rmtree(self.root, ignore_errors=True)
