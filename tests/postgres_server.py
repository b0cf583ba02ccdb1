"""A throwaway PostgreSQL server for tests, started from the server binaries of the OS package.

``PostgresServer.start()`` runs ``initdb`` in a fresh temporary directory, then ``pg_ctl start``
with the server listening on a free TCP port of 127.0.0.1 (its Unix socket in that directory)
and password authentication over TCP; ``stop()`` stops it and removes the directory. initdb
refuses to run as root, so as root the binaries run as the ``postgres`` user (``runuser``),
which owns the directory.

``start(settings={"wal_level": "logical"}, log_dir=...)`` passes server settings (``-c name=value``;
logical decoding for Debezium needs ``wal_level=logical``) and writes the server log to
``<log_dir>/postgres.log`` (copied there by ``stop()``: the server's user may not reach a test's
temporary directory); ``ready()`` is a real protocol probe
(a ``SELECT 1`` over TCP).

Binaries are found in ``$PG_BINDIR``, else the newest ``/usr/lib/postgresql/<version>/bin``
(Debian's layout), else on ``PATH``. :func:`missing` says what is absent and how to install it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

TOOLS = ("initdb", "pg_ctl", "postgres")
PASSWORD = "changelake-test"


def bindir() -> str | None:
    candidates = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2])
                         if p.split("/")[-2].isdigit() else 0, reverse=True)
    for d in candidates:
        if all(os.access(os.path.join(d, t), os.X_OK) for t in TOOLS):
            return d
    found = [shutil.which(t) for t in TOOLS]
    if all(found):
        return os.path.dirname(found[0])
    return None


def missing() -> str | None:
    """None when a server can be started here, else what is missing and how to install it."""
    if bindir() is None:
        return ("PostgreSQL server binaries (initdb, pg_ctl, postgres) not found in $PG_BINDIR, "
                "/usr/lib/postgresql/*/bin or on PATH: install the Debian package postgresql "
                "(apt-get install postgresql) or set PG_BINDIR")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return ("running as root, initdb needs an unprivileged user and there is no 'postgres' user: "
                    "install the Debian package postgresql (it creates the user)")
        if shutil.which("runuser") is None:
            return "running as root, the PostgreSQL fixture needs runuser (util-linux) to start the server as postgres"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    root: str
    host: str
    port: int
    user: str = "postgres"
    password: str = PASSWORD
    dbname: str = "postgres"

    @property
    def url(self) -> str:
        """A JDBC URL, as users write them."""
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.dbname}"

    def connect(self):
        import psycopg

        return psycopg.connect(host=self.host, port=self.port, user=self.user, password=self.password,
                               dbname=self.dbname, autocommit=True)

    def execute(self, *statements: str, params: list | None = None) -> None:
        with self.connect() as conn:
            for s in statements:
                conn.execute(s, params)

    def ready(self) -> bool:
        """True when the server answers a query over TCP."""
        try:
            with self.connect() as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)
        except Exception:
            return False

    @classmethod
    def start(cls, *, settings: dict[str, str] | None = None, log_dir: str | None = None) -> "PostgresServer":
        why = missing()
        if why:
            raise RuntimeError(why)
        bins = bindir()
        root = tempfile.mkdtemp(prefix="changelake-pg-")
        as_root = os.geteuid() == 0
        if as_root:
            os.chmod(root, 0o700)
            shutil.chown(root, "postgres", "postgres")

        def run(*args: str) -> None:
            cmd = (["runuser", "-u", "postgres", "--"] if as_root else []) + list(args)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if out.returncode:
                raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")

        pwfile = os.path.join(root, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD + "\n")
        if as_root:
            shutil.chown(pwfile, "postgres", "postgres")
        data = os.path.join(root, "data")
        run(os.path.join(bins, "initdb"), "-D", data, "-U", "postgres", f"--pwfile={pwfile}", "-A", "scram-sha-256",
            "--auth-local=trust", "-E", "UTF8", "--no-sync")
        port = _free_port()
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        options += "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        log = os.path.join(root, "log")
        run(os.path.join(bins, "pg_ctl"), "-D", data, "-o", options, "-l", log, "-w", "-t", "60", "start")
        server = cls(root, "127.0.0.1", port)
        server.log_path = log
        server.log_dir = log_dir
        server._stop = lambda: run(os.path.join(bins, "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop")
        return server

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            time.sleep(0.1)
            if getattr(self, "log_dir", None) and os.path.exists(self.log_path):
                os.makedirs(self.log_dir, exist_ok=True)
                shutil.copyfile(self.log_path, os.path.join(self.log_dir, "postgres.log"))
            shutil.rmtree(self.root, ignore_errors=True)
