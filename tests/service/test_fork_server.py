"""Spark's Python processes started as forks of the warm server behave as ``python -m module`` started anew:
the same ``__name__``, argv, working directory, path, environment, stdin/stdout/stderr and exit code, and a
SIGTERM to the process Spark started reaches the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from changelake.spark import fork_server

pytestmark = pytest.mark.unit

PROBE = """\
import gc, json, os, sys
line = sys.stdin.readline().strip()
gc.collect()
print(json.dumps({'name': __name__, 'argv': sys.argv, 'path0': sys.path[0], 'cwd': os.getcwd(), 'stdin': line,
                  'env': os.environ.get('PROBE_VALUE'), 'pid': os.getpid(), 'pyarrow': 'pyarrow' in sys.modules,
                  'frozen': gc.get_freeze_count(), 'tracked': len(gc.get_objects())}))
print('to stderr', file=sys.stderr)
sys.exit(int(os.environ.get('PROBE_EXIT', '0')))
"""

CLIENT = "import sys; from changelake.spark.worker_python import run_forked; code = run_forked(sys.argv[1:]); " \
         "sys.exit(99 if code is None else code)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fork") / "server.sock")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "changelake.spark.fork_server", path], env=env,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        assert proc.poll() is None and time.monotonic() < deadline, "the fork server did not start"
        time.sleep(0.1)
    yield path
    proc.kill()
    proc.wait()


def _client(server: str, cwd, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, fork_server.ENV: server, "PROBE_VALUE": "from-the-client", **env}
    return subprocess.run([sys.executable, "-c", CLIENT, *args], cwd=cwd, env=full, input="hello\n",
                          capture_output=True, text=True, timeout=60)


def test_a_forked_module_runs_as_python_m_would(server, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    done = _client(server, tmp_path, "probe", "a", "--b")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["name"] == "__main__" and got["argv"][1:] == ["a", "--b"]
    assert got["path0"] == str(tmp_path) == got["cwd"]
    assert got["stdin"] == "hello" and got["env"] == "from-the-client"
    assert got["pyarrow"], "the fork starts with the server's imports"
    assert "to stderr" in done.stderr


def test_a_forks_collections_leave_the_servers_imports_alone(server, tmp_path):
    """pyspark's daemon collects after every task of a reused worker: the imports it shares with the server are
    frozen (gc.freeze), so such a pass neither walks them nor copies their pages."""
    (tmp_path / "probe.py").write_text(PROBE)
    got = json.loads(_client(server, tmp_path, "probe").stdout)
    assert got["frozen"] > 50_000, got              # pyspark, pyarrow, pandas, changelake's modules
    assert got["tracked"] < got["frozen"] / 5, got  # what a collection still walks: the fork's own objects


def test_the_exit_code_comes_back(server, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    assert _client(server, tmp_path, "probe", PROBE_EXIT="3").returncode == 3


def test_a_request_with_another_hash_seed_is_left_to_a_new_interpreter(server, tmp_path):
    (tmp_path / "probe.py").write_text(PROBE)
    assert _client(server, tmp_path, "probe", PYTHONHASHSEED="7").returncode == 99       # run_forked: None


def test_without_a_server_the_caller_starts_the_module_itself(tmp_path):
    assert _client(str(tmp_path / "nothing.sock"), tmp_path, "probe").returncode == 99
    assert _client("off", tmp_path, "probe").returncode == 99


def test_sigterm_to_the_started_process_reaches_the_fork(server, tmp_path):
    (tmp_path / "sleeper.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")
    env = {**os.environ, fork_server.ENV: server}
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, "sleeper"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 42


def test_a_sigterm_before_the_client_passes_signals_on_still_reaches_the_fork(server, tmp_path):
    """The window between the fork's start and the client's handlers (a SIGTERM there stopped the client and
    left the fork running; it showed once as a failure of the test above under load): held open here by a
    client whose handlers take a second to install, the signal still reaches the fork."""
    (tmp_path / "sleeper.py").write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(42))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")
    slow_handlers = ("import signal, time; real = signal.signal; "
                     "signal.signal = lambda *a: (time.sleep(1), real(*a))[1]; ")
    env = {**os.environ, fork_server.ENV: server}
    proc = subprocess.Popen([sys.executable, "-c", slow_handlers + CLIENT, "sleeper"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)        # within the client's first second of installing its handlers
    assert proc.wait(30) == 42


def test_a_module_the_server_imported_runs_as_main_without_a_warning(server, tmp_path):
    """pyspark's daemon, which the server imports before it serves, runs as ``__main__`` in the fork (it writes
    its port) without runpy's warning about a module found in ``sys.modules``; with stdin closed it stops."""
    full = {**os.environ, fork_server.ENV: server}
    for module in ("pyspark.daemon", "changelake.spark.worker_python"):     # pyspark's, and the UDF daemon
        done = subprocess.run([sys.executable, "-c", CLIENT, module], cwd=tmp_path, env=full,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        assert len(done.stdout) >= 4, (module, done.stderr.decode())
        assert b"RuntimeWarning" not in done.stderr, (module, done.stderr.decode())


def test_a_driver_gone_while_the_server_still_imports_ends_the_server(tmp_path):
    """A start refused (or a driver killed) while the server is still importing its preload must not leave the
    server running: it would hold the terminal's pipes and serve nobody, for ever."""
    driver = ("import os; from changelake.spark import fork_server; fork_server.start(); "
              "print(fork_server.server_pid(), flush=True); os._exit(0)")      # gone before the imports are done
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != fork_server.ENV})
    pid = int(done.stdout.split()[0])
    deadline = time.monotonic() + 60
    while _running(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the fork server outlived the driver that started it")
        time.sleep(0.2)


def _running(pid: int) -> bool:
    """Not ended: an ended process that init has not reaped yet (a zombie) counts as ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

