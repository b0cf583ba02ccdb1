"""Where the JVM processes of the real-database tests find their jars and Java.

One place to change when the project's pinned JVM artifacts land. :func:`connect_jars` is the folder of
the broker's and the Connect worker's jars (their classpath: ``kafka_2.13``, ``connect-runtime``,
``connect-json`` and their dependencies, one flat folder as ``mvn dependency:copy-dependencies``
writes it; ``$CHANGELAKE_CONNECT_JARS``, default the development copy ``/tmp/dbz-jvm/lib``).
:func:`connect_plugins` is the worker's ``plugin.path`` (``$CHANGELAKE_CONNECT_PLUGINS``, default
``/tmp/dbz-jvm/plugins``): one folder per Debezium connector, each loaded by its own class loader,
resolved with ``-DincludeScope=runtime`` and without ``connect-api`` and ``kafka-clients`` (the
worker provides them). The connectors must not be on the worker's classpath: two Debezium versions
meet there (the MariaDB connector's task then runs on the PostgreSQL connector's
``debezium-connector-common`` and fails).

| artifact | where | for |
| --- | --- | --- |
| ``org.apache.kafka:kafka_2.13:4.1.1`` | classpath | the KRaft broker (until the project's broker fixture replaces it) |
| ``org.apache.kafka:connect-runtime:4.1.1``, ``connect-json:4.1.1`` | classpath | the Connect standalone worker, JSON converter |
| ``org.apache.logging.log4j:log4j-slf4j-impl:2.24.3`` | classpath | the worker's and connectors' logs (SLF4J 1.7 to log4j 2) |
| ``io.debezium:debezium-connector-postgres:3.6.1.Final`` | ``plugins/debezium-postgres/`` | PostgreSQL (pgoutput) |
| ``io.debezium:debezium-connector-mariadb:3.5.0.Final`` | ``plugins/debezium-mariadb/`` | MariaDB: the newest version served (3.6.1.Final is not); ``debezium-connector-mysql`` 3.6.1.Final fails on MariaDB 10.11 (it sends ``SHOW BINARY LOG STATUS``) |
"""

from __future__ import annotations

import glob
import os
import shutil

DEFAULT_JARS = "/tmp/dbz-jvm/lib"
DEFAULT_PLUGINS = "/tmp/dbz-jvm/plugins"
#: jar name prefixes each JVM process needs in the folder
NEEDED = {
    "broker": ("kafka_2.13-", "kafka-server-", "kafka-raft-"),
    "connect": ("connect-runtime-", "connect-json-"),
}
#: the plugin folder and jar name prefix of each connector
PLUGINS = {"postgres": ("debezium-postgres", "debezium-connector-postgres-"),
           "mariadb": ("debezium-mariadb", "debezium-connector-mariadb-")}


def connect_jars() -> str:
    return os.environ.get("CHANGELAKE_CONNECT_JARS", DEFAULT_JARS)


def connect_plugins() -> str:
    return os.environ.get("CHANGELAKE_CONNECT_PLUGINS", DEFAULT_PLUGINS)


def java() -> str | None:
    if os.environ.get("JAVA_HOME"):
        return os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    return shutil.which("java")


def classpath() -> str:
    return os.path.join(connect_jars(), "*")


def missing(kind: str) -> str | None:
    """None when the ``kind`` process ("broker", "connect") or connector ("postgres", "mariadb") can start here, else what is missing."""
    if java() is None:
        return "no java: install Java 17 or set JAVA_HOME"
    folder = connect_jars()
    absent = [p for p in NEEDED.get(kind, ()) if not glob.glob(os.path.join(folder, p + "*.jar"))]
    if kind in PLUGINS:
        folder, prefix = PLUGINS[kind]
        plugin = os.path.join(connect_plugins(), folder)
        if not glob.glob(os.path.join(plugin, prefix + "*.jar")):
            return (f"{prefix.rstrip('-')} not in {plugin} ($CHANGELAKE_CONNECT_PLUGINS): resolve it as "
                    "tests/realdb/jvm.py says")
        return None
    if absent:
        return (f"jars {', '.join(p.rstrip('-') for p in absent)} not in {folder} ($CHANGELAKE_CONNECT_JARS): "
                "resolve the artifacts listed in tests/realdb/jvm.py with mvn dependency:copy-dependencies")
    return None
