"""The JVM artifacts changelake runs, installed once by the project and found here.

``jvm/pom.xml`` is the one pinned list: one Maven profile per *set*, resolved by Maven
(``maven-dependency-plugin:copy-dependencies``) into ``.jvm/<set>/`` of the project and checked
against ``jvm/jvm.lock`` (each jar's file name and SHA-256). ``make install`` runs
``python -m changelake.jvm_deps install``; nothing is fetched at run time (no Spark ``--packages``).

=====================  ===========================================================================
set                    what it is for
=====================  ===========================================================================
``kafka``              an Apache Kafka broker in KRaft mode (changelake/connectors/kafka_broker.py,
                       ``changelake broker``, the tests' broker)
``connect``            a Kafka Connect worker's classpath: connect-runtime, the JSON converter, the
                       log4j binding of its (and its connectors') SLF4J logs; no connector
``debezium-postgres``  a Connect plugin folder: Debezium's PostgreSQL connector 3.6.1.Final
``debezium-mariadb``   a Connect plugin folder: Debezium's MariaDB connector 3.5.0.Final (the newest
                       on Maven Central)
``delta``              Delta Lake for Spark (delta-spark engine), beside pyspark's own jars
``spark-kafka``        Spark's own Kafka source and sink, beside pyspark's own jars
``flink-kafka``        Flink's Kafka table connector for the PyFlink peer of bench/operators.py (its
                       job's ``pipeline.jars``; PyFlink ships flink-json itself)
=====================  ===========================================================================

A plugin folder (:data:`PLUGINS`) is never put on a classpath: the worker loads each from its
``plugin.path`` with a class loader of its own (two Debezium versions conflict on one classpath), and
the folder leaves out what the worker provides (``connect-api``, ``kafka-clients``).
:func:`plugin_path` makes the directory of the folders that a worker's ``plugin.path`` names.

When a set cannot be resolved (no ``mvn``, Maven Central unreachable), ``install`` says so loudly,
names the set and what will not run, and goes on: the tests that need the set skip with
:func:`missing`'s message. With ``CHANGELAKE_JVM_DEPS_REQUIRED=1`` (set by ``.ci/run``) that is a
failure instead. Jars that differ from the lock always fail the install: a run is the same
everywhere or it does not start. ``CHANGELAKE_JVM_DEPS_HOME`` moves ``.jvm`` elsewhere (e.g. an
image's ``/opt/changelake/jvm``).

After an edit of ``jvm/pom.xml``: ``python -m changelake.jvm_deps lock`` resolves every set again and
rewrites the lock (review its diff: it lists every jar that comes or goes).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from changelake.errors import ChangelakeError

#: set -> what it is for (the profiles of jvm/pom.xml)
SETS: dict[str, str] = {
    "kafka": "the Apache Kafka broker (changelake broker, the kafka and integration tests)",
    "connect": "the Kafka Connect worker's classpath",
    "debezium-postgres": "Debezium's PostgreSQL connector, a Connect plugin folder",
    "debezium-mariadb": "Debezium's MariaDB connector, a Connect plugin folder",
    "delta": "Delta Lake's jars for Spark (the delta-spark engine)",
    "spark-kafka": "Spark's own Kafka source and sink",
    "flink-kafka": "Flink's Kafka connector for the PyFlink peer of the benchmarks",
}
#: the sets that are Kafka Connect plugin folders (a worker's plugin.path), not classpaths
PLUGINS = ("debezium-postgres", "debezium-mariadb")
HOME_ENV = "CHANGELAKE_JVM_DEPS_HOME"
REQUIRED_ENV = "CHANGELAKE_JVM_DEPS_REQUIRED"
#: the plugin that copies a profile's runtime jars, pinned like the jars themselves
COPY_GOAL = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_MARKER = ".installed"


class JvmDepsMissing(ChangelakeError):
    """A set of JVM artifacts is not installed (or not as jvm/jvm.lock says)."""


def project_root() -> Path:
    return Path(__file__).resolve().parents[1]


def pom_path() -> Path:
    return project_root() / "jvm" / "pom.xml"


def lock_path() -> Path:
    return project_root() / "jvm" / "jvm.lock"


def home() -> Path:
    return Path(os.environ.get(HOME_ENV) or project_root() / ".jvm")


def set_dir(name: str) -> Path:
    _known(name)
    return home() / name


def _known(name: str) -> None:
    if name not in SETS:
        raise JvmDepsMissing(f"unknown JVM set {name!r}: the sets are {', '.join(SETS)} (jvm/pom.xml)")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_lock(path: Path | None = None) -> tuple[str | None, dict[str, dict[str, str]]]:
    """(the pom's SHA-256 the lock was written from, set -> {jar file name -> SHA-256})."""
    path = path or lock_path()
    pom_digest, sets = None, {name: {} for name in SETS}
    if not path.exists():
        return None, sets
    for line in path.read_text().splitlines():
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        if fields[0] == "pom":
            pom_digest = fields[1]
        else:
            sets.setdefault(fields[0], {})[fields[1]] = fields[2]
    return pom_digest, sets


def _lock_lines(name: str, files: dict[str, str]) -> list[str]:
    return [f"{name} {file} {digest}" for file, digest in sorted(files.items())]


def missing(name: str) -> str | None:
    """Why set ``name`` cannot be used now (a sentence that says how to install it), or None."""
    _known(name)
    folder = set_dir(name)
    how = (f"run `make install` (or `python -m changelake.jvm_deps install {name}`: it needs `mvn` and Maven "
           f"Central)")
    if not (folder / _MARKER).exists():
        return f"the JVM set {name!r} ({SETS[name]}) is not installed in {folder}: {how}"
    _, sets = read_lock()
    if (folder / _MARKER).read_text().splitlines() != _lock_lines(name, sets.get(name, {})):
        return f"the JVM set {name!r} in {folder} is not the one jvm/jvm.lock pins: {how}"
    return None


def jars(name: str) -> list[Path]:
    """The jar files of set ``name``; :class:`JvmDepsMissing` (saying how to install it) when absent."""
    why = missing(name)
    if why:
        raise JvmDepsMissing(why)
    return sorted(set_dir(name).glob("*.jar"))


def classpath(name: str) -> str:
    return os.pathsep.join(str(j) for j in jars(name))


def plugin_path(names: list[str] | tuple[str, ...], into: Path) -> Path:
    """``into``, made to hold a link to each plugin folder of ``names`` (a Connect worker's ``plugin.path``
    takes directories of plugin folders, and ``.jvm`` holds other sets too); :class:`JvmDepsMissing` when
    one is not installed."""
    into.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name not in PLUGINS:
            raise JvmDepsMissing(f"{name!r} is not a Connect plugin set: those are {', '.join(PLUGINS)}")
        why = missing(name)
        if why:
            raise JvmDepsMissing(why)
        link = into / name
        if not link.is_symlink():
            link.symlink_to(set_dir(name), target_is_directory=True)
    return into


def _resolve(name: str, into: Path) -> dict[str, str]:
    """Copy set ``name``'s runtime jars into ``into`` with Maven; {file name -> SHA-256}."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JvmDepsMissing("`mvn` (Apache Maven) is not on PATH")
    cmd = [mvn, "-q", "-B", "-f", str(pom_path()), "-P", name, COPY_GOAL, "-DincludeScope=runtime",
           f"-DoutputDirectory={into}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise JvmDepsMissing(f"Maven could not resolve the set {name!r} (`{' '.join(cmd[1:])}`):\n{tail}")
    return {p.name: _sha256(p) for p in sorted(into.glob("*.jar"))}


def install(names: list[str], *, required: bool) -> int:
    """Install the sets ``names`` (all when empty); 0 when they are usable (or, unless ``required``,
    merely unresolvable, which is reported), 1 on jars that differ from the lock."""
    pom_digest, locked = read_lock()
    if pom_digest != _sha256(pom_path()):
        print("jvm_deps: jvm/pom.xml changed since jvm/jvm.lock was written: run `python -m changelake.jvm_deps "
              "lock` and commit the lock", file=sys.stderr)
        return 1
    status = 0
    for name in names or list(SETS):
        if missing(name) is None:
            continue
        home().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=home()) as tmp:
            try:
                got = _resolve(name, Path(tmp) / name)
            except JvmDepsMissing as exc:
                print(f"\n*** jvm_deps: the JVM set {name!r} ({SETS[name]}) is NOT installed: {exc}\n"
                      f"*** what needs it will not run (its tests skip, naming it)\n", file=sys.stderr)
                status = 1 if required else status
                continue
            want = locked.get(name, {})
            if got != want:
                extra = sorted(set(got) - set(want))
                lost = sorted(set(want) - set(got))
                changed = sorted(f for f in set(got) & set(want) if got[f] != want[f])
                print(f"jvm_deps: the jars Maven resolved for {name!r} differ from jvm/jvm.lock "
                      f"(not in the lock: {extra}; missing: {lost}; other SHA-256: {changed}); nothing installed",
                      file=sys.stderr)
                status = 1
                continue
            (Path(tmp) / name / _MARKER).write_text("\n".join(_lock_lines(name, got)) + "\n")
            shutil.rmtree(set_dir(name), ignore_errors=True)
            os.replace(Path(tmp) / name, set_dir(name))
        size = sum(p.stat().st_size for p in set_dir(name).glob("*.jar")) >> 20
        print(f"jvm_deps: installed {name!r}: {len(got)} jars, {size} MiB in {set_dir(name)}")
    ready = [name for name in names or list(SETS) if missing(name) is None]
    print(f"jvm_deps: {', '.join(ready) or 'no set'} installed as jvm/jvm.lock pins, in {home()}")
    return status


def write_lock() -> None:
    """Resolve every set and write jvm/jvm.lock."""
    lines = ["# The JVM jars of each set of jvm/pom.xml, as `python -m changelake.jvm_deps lock` resolved them.",
             "# `make install` installs exactly these (file name, SHA-256); do not edit by hand.",
             f"pom {_sha256(pom_path())}"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in SETS:
            lines.extend(_lock_lines(name, _resolve(name, Path(tmp) / name)))
    lock_path().write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = ("usage: python -m changelake.jvm_deps install [SET...] | lock | classpath SET | status\n"
             f"sets: {', '.join(SETS)}")
    if not args:
        print(usage, file=sys.stderr)
        return 2
    verb, rest = args[0], args[1:]
    try:
        if verb == "install":
            for name in rest:
                _known(name)
            return install(rest, required=os.environ.get(REQUIRED_ENV, "") not in ("", "0"))
        if verb == "lock":
            write_lock()
            return 0
        if verb == "classpath" and len(rest) == 1:
            print(classpath(rest[0]))
            return 0
        if verb == "status":
            for name in SETS:
                print(f"{name}: {missing(name) or 'installed in ' + str(set_dir(name))}")
            return 0
    except JvmDepsMissing as exc:
        print(f"jvm_deps: {exc}", file=sys.stderr)
        return 1
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
