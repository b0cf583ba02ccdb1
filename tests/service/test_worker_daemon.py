"""The Python workers' daemon takes Spark's zips of an installed pyspark off the path, nothing else."""

from __future__ import annotations

import subprocess
import sys

import pytest

from changelake.spark import worker_daemon
from changelake.spark.session import DEFAULTS, session_settings

pytestmark = pytest.mark.unit


def _pip_layout(root, py4j_version="0.10.9.9"):
    """``SPARK_HOME`` as pip installs pyspark: the package, with Spark's zips under python/lib."""
    package = root / "site-packages" / "pyspark"
    lib = package / "python" / "lib"
    lib.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    zips = [str(lib / "pyspark.zip"), str(lib / f"py4j-{py4j_version}-src.zip")]
    return zips, str(root / "site-packages")


def test_the_zips_of_an_installed_pyspark_are_dropped(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_daemon, "_installed_version", {"py4j": "0.10.9.9"}.get)
    zips, site = _pip_layout(tmp_path)
    path = zips + ["/usr/lib/python311.zip", "/work/user-code.zip", site]
    assert worker_daemon.redundant_zips(path) == zips


def test_a_spark_distributions_zips_are_its_only_copy_and_stay(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_daemon, "_installed_version", {"py4j": "0.10.9.9"}.get)
    lib = tmp_path / "spark-4.2.0-bin-hadoop3" / "python" / "lib"       # SPARK_HOME=/opt/spark-...
    lib.mkdir(parents=True)
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert worker_daemon.redundant_zips(path) == []


def test_py4j_stays_on_the_zip_when_the_installed_one_is_another_version(tmp_path, monkeypatch):
    zips, _ = _pip_layout(tmp_path, py4j_version="0.10.9.9")
    monkeypatch.setattr(worker_daemon, "_installed_version", {"py4j": "0.10.9.7"}.get)
    assert worker_daemon.redundant_zips(zips) == zips[:1]
    monkeypatch.setattr(worker_daemon, "_installed_version", lambda name: None)
    assert worker_daemon.redundant_zips(zips) == zips[:1]


def test_the_daemon_is_a_code_default_the_user_can_replace():
    assert session_settings(master=None, conf=None, launcher={}).conf["spark.python.daemon.module"] == \
        "changelake.spark.worker_daemon" == DEFAULTS["spark.python.daemon.module"]
    mine = session_settings(master=None, conf={"spark.python.daemon.module": "pyspark.daemon"}, launcher={})
    assert mine.conf["spark.python.daemon.module"] == "pyspark.daemon"


def test_starting_the_module_imports_no_pyspark_before_the_path_is_set():
    """What ``python -m changelake.spark.worker_daemon`` imports before main(): no pyspark, so the
    zips cannot have been read yet."""
    code = ("import sys, runpy; import changelake.spark.worker_daemon as d; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
