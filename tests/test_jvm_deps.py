"""The project's JVM sets (changelake/jvm_deps.py): pinned by jvm/pom.xml and jvm/jvm.lock, installed into
.jvm/<set>/, and a clear message, naming the set and how to install it, wherever one is missing."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from changelake import jvm_deps
from tests.jars import need

pytestmark = pytest.mark.unit


def test_the_lock_was_written_from_the_pom_as_it_is_and_pins_every_set():
    pom_digest, sets = jvm_deps.read_lock()
    assert pom_digest == hashlib.sha256(jvm_deps.pom_path().read_bytes()).hexdigest(), \
        "jvm/pom.xml changed after jvm/jvm.lock was written: run `python -m changelake.jvm_deps lock`"
    profiles = re.findall(r"<profile>\s*(?:<!--.*?-->\s*)?<id>([^<]+)</id>", jvm_deps.pom_path().read_text(), re.S)
    assert sorted(profiles) == sorted(jvm_deps.SETS)
    for name in jvm_deps.SETS:
        assert sets[name], f"jvm/jvm.lock pins no jar for {name!r}"
        assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in sets[name].values())
    assert any(f.startswith("kafka_2.13-") for f in sets["kafka"])
    assert any(f.startswith("connect-runtime-") for f in sets["connect"])
    assert any(f.startswith("debezium-connector-postgres-3.6.1.Final") for f in sets["debezium-postgres"])
    assert any(f.startswith("debezium-connector-mariadb-") for f in sets["debezium-mariadb"])


def test_the_connect_workers_classpath_holds_no_connector_and_a_plugin_folder_nothing_the_worker_provides():
    """Two Debezium versions on one classpath break the MariaDB connector's task; a plugin folder's own
    connect-api or kafka-clients would shadow the worker's (docs/operations.md, "JVM dependencies")."""
    _, sets = jvm_deps.read_lock()
    assert not [f for f in sets["connect"] if f.startswith("debezium-")]
    assert any(f.startswith("log4j-slf4j-impl-") for f in sets["connect"])
    for name in jvm_deps.PLUGINS:
        assert not [f for f in sets[name] if f.startswith(("connect-api-", "kafka-clients-"))], name


def test_plugin_path_links_the_installed_plugin_folders_and_names_a_missing_one(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(tmp_path / "jvm"))
    with pytest.raises(jvm_deps.JvmDepsMissing, match="'debezium-mariadb'.*make install"):
        jvm_deps.plugin_path(["debezium-mariadb"], tmp_path / "plugins")
    with pytest.raises(jvm_deps.JvmDepsMissing, match="not a Connect plugin set"):
        jvm_deps.plugin_path(["connect"], tmp_path / "plugins")
    _, sets = jvm_deps.read_lock()
    folder = tmp_path / "jvm" / "debezium-postgres"
    folder.mkdir(parents=True)
    (folder / ".installed").write_text("\n".join(f"debezium-postgres {f} {d}"
                                                  for f, d in sorted(sets["debezium-postgres"].items())) + "\n")
    plugins = jvm_deps.plugin_path(["debezium-postgres"], tmp_path / "plugins")
    assert [p.name for p in plugins.iterdir()] == ["debezium-postgres"]
    assert (plugins / "debezium-postgres").resolve() == folder.resolve()


def test_a_set_not_installed_says_which_and_how(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(tmp_path))
    why = jvm_deps.missing("kafka")
    assert why and "'kafka'" in why and str(tmp_path / "kafka") in why and "make install" in why
    with pytest.raises(jvm_deps.JvmDepsMissing, match="make install"):
        jvm_deps.jars("kafka")
    with pytest.raises(jvm_deps.JvmDepsMissing, match="the sets are kafka, connect"):
        jvm_deps.missing("kafak")


def test_an_install_without_maven_reports_the_set_and_fails_only_when_required(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    assert jvm_deps.install(["delta"], required=False) == 0
    err = capsys.readouterr().err
    assert "'delta'" in err and "NOT installed" in err and "`mvn`" in err
    assert jvm_deps.install(["delta"], required=True) == 1
    assert jvm_deps.missing("delta")


def test_an_installed_set_differing_from_the_lock_is_not_taken(monkeypatch, tmp_path):
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(tmp_path))
    folder = tmp_path / "spark-kafka"
    folder.mkdir()
    (folder / ".installed").write_text("spark-kafka some.jar " + "0" * 64 + "\n")
    assert "not the one jvm/jvm.lock pins" in jvm_deps.missing("spark-kafka")


def test_an_installed_package_reads_the_lock_beside_the_sets(monkeypatch, tmp_path):
    """The image: changelake is installed in site-packages (no jvm/ there) and the sets with the lock are in
    CHANGELAKE_JVM_DEPS_HOME (Dockerfile, stage jvm): a set installed as that lock says is usable."""
    _, sets = jvm_deps.read_lock()
    home = tmp_path / "jvm"
    (home / "spark-kafka").mkdir(parents=True)
    (home / "jvm.lock").write_text(jvm_deps.lock_path().read_text())
    (home / "spark-kafka" / ".installed").write_text(
        "\n".join(f"spark-kafka {f} {d}" for f, d in sorted(sets["spark-kafka"].items())) + "\n")
    monkeypatch.setenv(jvm_deps.HOME_ENV, str(home))
    monkeypatch.setattr(jvm_deps, "project_root", lambda: tmp_path / "site-packages")
    assert jvm_deps.lock_path() == home / "jvm.lock"
    assert jvm_deps.missing("spark-kafka") is None
    (home / "jvm.lock").unlink()                  # no lock anywhere: nothing is taken as pinned
    assert "not the one jvm/jvm.lock pins" in jvm_deps.missing("spark-kafka")


@pytest.mark.parametrize("name", ["delta", "spark-kafka"])
def test_the_sets_for_sparks_classpath_bring_no_jar_pyspark_already_ships(name):
    import pyspark

    need(name)

    def artifact(jar: Path) -> str:      # the file name without its version
        return re.sub(r"-\d[\w.\-]*\.jar$", "", jar.name)

    ours = {artifact(j) for j in jvm_deps.jars(name)}
    theirs = {artifact(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert ours and not ours & theirs


def test_the_flink_kafka_set_brings_no_class_pyflink_already_ships():
    """The ``flink-kafka`` set goes into PyFlink's job (``pipeline.jars``) beside PyFlink's own lib/: none of its
    classes may be one that lib/ holds already (flink-dist bundles slf4j and commons-lang3; flink-json is there)."""
    import subprocess
    import zipfile

    from bench.common import DEFAULT_FLINK_PYTHON, pyflink_missing

    if jvm_deps.missing("flink-kafka"):
        pytest.skip(jvm_deps.missing("flink-kafka"))
    if pyflink_missing(DEFAULT_FLINK_PYTHON):
        pytest.skip(pyflink_missing(DEFAULT_FLINK_PYTHON))
    home = subprocess.run([DEFAULT_FLINK_PYTHON, "-c", "import os, pyflink; print(os.path.dirname(pyflink.__file__))"],
                          check=True, capture_output=True, text=True).stdout.strip()

    def classes(jars) -> set[str]:
        out = set()
        for jar in jars:
            with zipfile.ZipFile(jar) as z:
                out.update(n for n in z.namelist() if n.endswith(".class") and not n.endswith("module-info.class"))
        return out

    ours = classes(jvm_deps.jars("flink-kafka"))
    assert "org/apache/flink/connector/kafka/source/KafkaSource.class" in ours
    assert "org/apache/kafka/clients/consumer/KafkaConsumer.class" in ours
    theirs = classes(sorted(Path(home, "lib").glob("*.jar")))
    assert "org/apache/flink/formats/json/debezium/DebeziumJsonFormatFactory.class" in theirs
    assert not ours & theirs, sorted(ours & theirs)[:10]


def test_make_demo_installs_no_jvm_jars_and_no_test_tools_while_make_test_installs_both(tmp_path):
    # a newcomer's first `make demo` runs the embedded broker and delta-rs: it must not wait for Maven or
    # the test tools; `make test` (CI: CHANGELAKE_JVM_DEPS_REQUIRED=1) still installs every set
    import shutil
    import subprocess

    make = shutil.which("make")
    if make is None:
        pytest.skip("GNU make is not on PATH (Debian package make)")
    root = jvm_deps.project_root()

    def planned(target: str) -> str:
        done = subprocess.run([make, "-n", "-f", str(root / "Makefile"), target, f"VENV={tmp_path / 'venv'}"],
                              cwd=root, capture_output=True, text=True, check=True)
        return done.stdout

    demo, test = planned("demo"), planned("test")
    assert "pip install --quiet --prefer-binary -e ." in demo and "changelake demo" in demo
    assert "jvm_deps" not in demo and "[test]" not in demo and "test-requirements" not in demo
    assert "changelake.jvm_deps install" in test and "-r " + str(tmp_path / "venv" / "test-requirements.txt") in test
    assert test.index("-e .") < test.index("changelake.jvm_deps install") < test.index("-m pytest")
