"""A local session's scratch files (shuffle, state store copies, the JVM's unpacked native libraries) go to the
directory of its process (changelake/spark/scratch.py), where a later start finds and deletes them once the
process is gone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from changelake.spark import scratch

pytestmark = pytest.mark.spark


def test_a_local_session_writes_its_scratch_files_in_its_process_s_directory(spark):
    if os.environ.get("SPARK_LOCAL_DIRS"):
        pytest.skip("SPARK_LOCAL_DIRS is set in this environment: the user's choice, which changelake leaves as it is")
    mine = Path(os.environ.get(scratch.ENV) or tempfile.gettempdir()) / scratch.ROOT / scratch.own_name()
    assert spark.sparkContext._jvm.System.getenv("SPARK_LOCAL_DIRS") == str(mine)
    assert "SPARK_LOCAL_DIRS" not in os.environ         # the JVM's alone: this process's other children choose their own
    assert spark.sparkContext._jvm.System.getProperty("java.io.tmpdir") == str(mine)
    assert spark.range(1000).repartition(3).count() == 1000       # a shuffle: its block manager's files
    assert any(p.name.startswith("blockmgr-") for p in mine.iterdir())
