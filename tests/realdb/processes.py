"""External processes of the real-database tests, one small class each: ``start()``, ``ready()`` (a real
protocol probe), ``stop()``, and a log file that stays in the directory given to ``start``.

* :class:`ConnectWorker`: a Kafka Connect standalone worker, its classpath the ``connect`` set of
  jvm/pom.xml, each Debezium connector a plugin folder of its own on its ``plugin.path`` (the
  ``debezium-*`` sets, changelake/jvm_deps.py); connectors are added through its REST API, each with its
  own JSON converter settings. It writes to the tests' Kafka broker (the ``kafka`` fixture).
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
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from changelake import jvm_deps
from changelake.connectors.kafka_broker import _EXEC_WITH_PDEATHSIG

#: JVM options of the worker: a small heap, C1 only, the serial collector (2 cores)
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


def java() -> str | None:
    if os.environ.get("JAVA_HOME"):
        return os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    return shutil.which("java")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(probe, *, timeout: float, what: str, log: str | None = None, process=None,
               interval: float = 0.3) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what}: the process exited with {process.returncode}{_tail(log)}")
        if probe():
            return
        time.sleep(interval)
    raise TimeoutError(f"{what}: not ready after {timeout:.0f} s{_tail(log)}")


def _tail(log: str | None, lines: int = 40) -> str:
    if not log or not os.path.exists(log):
        return ""
    with open(log, errors="replace") as f:
        return f"\n--- last lines of {log}:\n" + "".join(f.readlines()[-lines:])


class ConnectWorker:
    """A Kafka Connect standalone worker; ``add_connector`` creates a connector through the REST API."""

    @classmethod
    def missing(cls) -> str | None:
        """None when a worker can start here, else what is missing (the ``connect`` set, Java)."""
        if java() is None:
            return "no java: install Java 17 or set JAVA_HOME"
        return jvm_deps.missing("connect")

    @classmethod
    def start(cls, bootstrap_servers: str, log_dir: str, *, plugins: list[str],
              heap: str = "512m") -> "ConnectWorker":
        """A worker whose ``plugin.path`` holds the installed plugin sets ``plugins`` (jvm_deps.PLUGINS)."""
        self = cls()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workdir = tempfile.mkdtemp(prefix="changelake-connect-")
        props = {
            "bootstrap.servers": bootstrap_servers, "listeners": self.url,
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter": "org.apache.kafka.connect.json.JsonConverter",
            "offset.storage.file.filename": os.path.join(self.workdir, "offsets"),
            # the connectors are found through their jars' ServiceLoader manifests (Debezium's have them),
            # not by scanning every class of the plugin folders: the worker is ready in about half the time
            "offset.flush.interval.ms": "1000", "plugin.discovery": "service_load",
            "plugin.path": str(jvm_deps.plugin_path(plugins, Path(self.workdir) / "plugins")),
        }
        config = os.path.join(self.workdir, "worker.properties")
        with open(config, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in props.items())
        log4j = os.path.join(self.workdir, "log4j2.properties")
        with open(log4j, "w") as f:
            f.write(_LOG4J2)
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, "connect.log")
        self._log = open(self.log_path, "ab")
        # the JVM dies with the test process (PR_SET_PDEATHSIG, as the tests' broker)
        cmd = [sys.executable, "-c", _EXEC_WITH_PDEATHSIG, java(), f"-Xmx{heap}", *JVM_OPTIONS,
               f"-Dlog4j2.configurationFile={log4j}", "-cp", jvm_deps.classpath("connect"),
               "org.apache.kafka.connect.cli.ConnectStandalone", config]
        self.process = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir,
                                        start_new_session=True)
        wait_until(self.ready, timeout=180, what="kafka connect worker", log=self.log_path, process=self.process)
        return self

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
