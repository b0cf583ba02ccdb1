"""Spark's Python processes start without Spark's zips of an installed pyspark on the path, and nothing else changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from changelake.spark import worker_python
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
    monkeypatch.setattr(worker_python, "_installed_version", {"py4j": "0.10.9.9"}.get)
    zips, site = _pip_layout(tmp_path)
    path = zips + ["/usr/lib/python311.zip", "/work/user-code.zip", site]
    assert worker_python.redundant_zips(path) == zips


def test_a_spark_distributions_zips_are_its_only_copy_and_stay(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_python, "_installed_version", {"py4j": "0.10.9.9"}.get)
    lib = tmp_path / "spark-4.2.0-bin-hadoop3" / "python" / "lib"       # SPARK_HOME=/opt/spark-...
    lib.mkdir(parents=True)
    path = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    assert worker_python.redundant_zips(path) == []


def test_py4j_stays_on_the_zip_when_the_installed_one_is_another_version(tmp_path, monkeypatch):
    zips, _ = _pip_layout(tmp_path, py4j_version="0.10.9.9")
    monkeypatch.setattr(worker_python, "_installed_version", {"py4j": "0.10.9.7"}.get)
    assert worker_python.redundant_zips(zips) == zips[:1]
    monkeypatch.setattr(worker_python, "_installed_version", lambda name: None)
    assert worker_python.redundant_zips(zips) == zips[:1]


def test_the_daemon_is_a_code_default_the_user_can_replace():
    assert session_settings(master=None, conf=None, launcher={}).conf["spark.python.daemon.module"] == \
        "changelake.spark.worker_python" == DEFAULTS["spark.python.daemon.module"]
    mine = session_settings(master=None, conf={"spark.python.daemon.module": "pyspark.daemon"}, launcher={})
    assert mine.conf["spark.python.daemon.module"] == "pyspark.daemon"


def _loaded_by_importing_the_module(*names: str) -> list[str]:
    """The modules among ``names`` (a top-level package: all of it) that importing
    ``changelake.spark.worker_python`` loads, in a new interpreter."""
    code = ("import json, sys; import changelake.spark.worker_python; "
            f"print(json.dumps(sorted(m for m in sys.modules if m in {names!r} or m.split('.')[0] in {names!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_starting_the_module_imports_no_pyspark_before_the_path_is_set():
    """What ``python -m changelake.spark.worker_python`` and the console script import before they set
    the path: no pyspark, so the zips cannot have been read yet."""
    assert _loaded_by_importing_the_module("pyspark", "py4j") == []


def test_a_process_the_fork_server_serves_loads_nothing_heavy_before_it_asks():
    """Every Python process Spark starts is first a ``changelake-worker-python`` that passes its request to the fork
    server and waits for the fork's exit code, for the fork's whole life (six of them through a query of
    bench/operators.py). What it imports to get there is memory each one holds: no package metadata (email,
    zipfile, pathlib: ~3.5 MB each), no pyarrow, pandas or numpy."""
    assert _loaded_by_importing_the_module("importlib.metadata", "email", "zipfile", "pyarrow", "pandas", "numpy") == []


def _script():
    script = worker_python.script_path()
    if script is None:
        pytest.skip(f"{worker_python.SCRIPT} is not installed beside {sys.executable} (pip install -e . makes it)")
    return script


def test_the_script_runs_a_module_as_python_m_does(tmp_path):
    (tmp_path / "probe.py").write_text(
        "import sys, json\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv, 'path0': sys.path[0],\n"
        "                  'pyspark_zip': [p for p in sys.path if p.endswith('pyspark.zip')]}))\n")
    expected = subprocess.run([sys.executable, "-m", "probe", "a", "--b"], cwd=tmp_path, capture_output=True,
                              text=True, check=True).stdout
    got = subprocess.run([_script(), "-m", "probe", "a", "--b"], cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout
    assert got == expected
    assert '"name": "__main__"' in got and '"a", "--b"' in got


def test_the_script_takes_spark_zips_off_the_path_before_the_module_runs(tmp_path):
    import pyspark

    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    zips = [os.path.join(lib, "pyspark.zip")] + [os.path.join(lib, n) for n in os.listdir(lib) if n.startswith("py4j")]
    if not os.path.isfile(zips[0]):
        pytest.skip(f"pyspark at {os.path.dirname(pyspark.__file__)} is not pip's layout (no python/lib/pyspark.zip)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips + [os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "probe.py").write_text("import sys, pyspark\nprint(pyspark.__file__)\n")
    plain = subprocess.run([sys.executable, "-m", "probe"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    fixed = subprocess.run([_script(), "-m", "probe"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert plain.startswith(zips[0])                 # what Spark's PYTHONPATH does to plain python
    assert os.path.realpath(fixed) == os.path.realpath(pyspark.__file__)


def test_any_other_command_line_is_plain_python():
    out = subprocess.run([_script(), "-c", "import sys; print(sys.argv[1:], 6 * 7)", "x"], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "['x'] 42"


def test_the_daemon_module_through_the_script_starts_pyspark_s_daemon_without_a_warning():
    """Spark runs ``changelake-worker-python -m changelake.spark.worker_python`` (the script and the daemon
    setting together): the daemon starts (it writes its port) and runpy does not warn that the module
    was imported twice. With stdin closed the daemon stops at once."""
    out = subprocess.run([_script(), "-m", "changelake.spark.worker_python"], stdin=subprocess.DEVNULL,
                         capture_output=True, timeout=60)
    assert len(out.stdout) >= 4, out.stderr.decode()          # pyspark.daemon: its port, as a 4-byte int
    assert b"RuntimeWarning" not in out.stderr, out.stderr.decode()


def test_pyspark_s_chatty_planning_worker_prints_nothing_to_the_console(tmp_path, monkeypatch, capsys):
    (tmp_path / "chatty_probe.py").write_text(
        "import pathlib, sys\n"
        "print('Starting Streaming TransformWithStateInPandas Python worker.')\n"
        "pathlib.Path(sys.argv[1]).write_text('ran')\n")
    assert "pyspark.sql.streaming.transform_with_state_driver_worker" in worker_python.CHATTY_MODULES
    monkeypatch.chdir(tmp_path)
    # run here, not by a fork server that a Spark session of this test process started
    monkeypatch.setenv("CHANGELAKE_FORK_SERVER", "off")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "stdout", sys.stdout)           # restored after the module replaced it
    monkeypatch.setattr(worker_python, "CHATTY_MODULES", frozenset({"chatty_probe"}))
    worker_python.interpreter_main(["-m", "chatty_probe", str(tmp_path / "ran")])
    assert (tmp_path / "ran").read_text() == "ran"
    assert "TransformWithStateInPandas" not in capsys.readouterr().out


def test_the_daemon_imports_what_its_workers_need_before_it_forks(monkeypatch):
    """The UDF daemon imports pyspark's worker, pyarrow, pandas and changelake's task modules once, before
    pyspark's daemon runs (and forks its workers): each worker starts with them instead of importing them."""
    seen: dict[str, bool] = {}

    def run_module(name, **_):
        seen["ran"] = name == "pyspark.daemon"
        seen["loaded"] = all(m in sys.modules for m in worker_python.PRELOAD)

    import runpy

    monkeypatch.setattr(runpy, "run_module", run_module)
    worker_python.daemon_main()
    assert seen == {"ran": True, "loaded": True}


def test_a_module_that_fails_to_preload_is_left_to_the_worker():
    assert worker_python.preload(("json", "changelake.no_such_module")) == ["changelake.no_such_module"]


def test_a_task_s_decode_stage_unpickles_in_a_preloaded_worker_without_importing_anything(tmp_path):
    """What a Kafka read task unpickles first is the pipeline's decode stage, which holds the pipeline's routes
    and their source specs. In a process that imported :data:`PRELOAD` (a fork of the daemon or the fork server)
    unpickling it imports no module of changelake's or of the libraries it rests on: every worker that had to
    import them (the pipeline, the config model, the SQL planner, the Delta sinks) spent ~0.5 s of CPU on it."""
    from pyspark import cloudpickle

    from changelake.service.demo import demo_config, write_demo_config
    from changelake.service.pipeline import BatchProcessor

    config = write_demo_config(demo_config(bootstrap_servers="127.0.0.1:9", workdir=tmp_path, metrics_port=0),
                               tmp_path / "pipeline.yaml")
    stage = tmp_path / "stage.pickle"
    stage.write_bytes(cloudpickle.dumps(BatchProcessor(config, graph=None).stage))
    probe = ("import sys\n"
             "from changelake.spark import worker_python\n"
             "assert worker_python.preload() == []\n"
             "assert 'polars' not in sys.modules, 'polars starts threads a fork does not reset'\n"
             "before = set(sys.modules)\n"
             "from pyspark import cloudpickle\n"
             f"cloudpickle.loads(open({str(stage)!r}, 'rb').read())\n"
             "new = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in\n"
             "             ('changelake', 'pyspark', 'pydantic', 'duckdb', 'deltalake', 'yaml', 'confluent_kafka'))\n"
             "print(new)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "CHANGELAKE_FORK_SERVER": "off"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
