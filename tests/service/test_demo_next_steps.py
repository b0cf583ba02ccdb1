"""The demo's last lines: how to read the result tables, and that its pipeline.yaml names a broker that is gone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest
import yaml

from changelake.service.config import parse_config
from changelake.service.demo import demo_config, next_steps

pytestmark = pytest.mark.unit


def test_the_printed_python_snippet_reads_the_result_table(tmp_path):
    from deltalake import write_deltalake

    config = parse_config(yaml.safe_dump(demo_config(bootstrap_servers="127.0.0.1:41234", workdir=tmp_path,
                                                     metrics_port=0)))
    write_deltalake(config.table_path("top_categories"), pa.table({
        "category": ["books", "toys"], "orders": pa.array([3, 2], pa.int64()), "units": pa.array([9, 4], pa.int64()),
        "rank": pa.array([1, 2], pa.int64())}))
    text = next_steps(config, tmp_path, "127.0.0.1:41234")
    lines = text.splitlines()
    start = lines.index("  with Python (the deltalake package comes with changelake):") + 1
    snippet = textwrap.dedent("\n".join(lines[start:start + 3]))
    done = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "books" in done.stdout and "toys" in done.stdout and "rank" in done.stdout
    # Spark SQL names the same table; the note says the broker is gone and what to change
    assert f"delta.`{config.table_path('top_categories')}`" in text
    assert "127.0.0.1:41234" in text and "stopped with the demo" in text and "kafka.bootstrap_servers" in text
