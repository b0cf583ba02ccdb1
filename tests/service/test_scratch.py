"""A local session's scratch files live in a directory of its process; a start deletes those of processes that
are gone (a killed JVM leaves its shuffle files, state store copies and unpacked native libraries behind)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from changelake.spark import scratch, session

pytestmark = pytest.mark.unit


def test_a_start_deletes_the_directories_of_gone_processes_and_keeps_the_live_ones(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone_pid = int(done.stdout)
    root = tmp_path / scratch.ROOT
    root.mkdir()
    me = os.getpid()
    host = socket.gethostname()
    live = root / scratch.own_name()
    reused = root / f"{host}-{me}-{scratch.start_ticks(me) + 1}"     # this pid, but an earlier process's
    gone = root / f"{host}-{gone_pid}-{123}"
    foreign = root / "not-a-session"
    elsewhere = root / f"other-host-{gone_pid}-{123}"        # another container's on a shared volume: its pids
    for d in (live, reused, gone, foreign, elsewhere):
        (d / "blockmgr-x").mkdir(parents=True)
        (d / "blockmgr-x" / "shuffle_0_0_0.data").write_bytes(b"x" * 1000)
    assert sorted(p.name for p in scratch.sweep(root)) == sorted([reused.name, gone.name])
    assert live.exists() and foreign.exists() and elsewhere.exists() and not reused.exists() and not gone.exists()


def test_the_session_dir_is_this_process_s_and_sweeps_first(tmp_path, monkeypatch):
    monkeypatch.setenv(scratch.ENV, str(tmp_path))
    stale = tmp_path / scratch.ROOT / f"{socket.gethostname()}-999999999-1"
    stale.mkdir(parents=True)
    mine = scratch.session_dir()
    assert mine == tmp_path / scratch.ROOT / f"{socket.gethostname()}-{os.getpid()}-{scratch.start_ticks(os.getpid())}"
    assert mine.is_dir() and not stale.exists()


def test_the_jvm_s_temporary_directory_is_the_session_s_unless_the_user_chose_one(tmp_path):
    options = session.driver_java_options("local[2]", "", tmpdir=tmp_path)
    assert f"-Djava.io.tmpdir={tmp_path}" in options
    theirs = session.driver_java_options("local[2]", "-Djava.io.tmpdir=/data/tmp", tmpdir=tmp_path)
    assert "java.io.tmpdir" not in (theirs or "")
