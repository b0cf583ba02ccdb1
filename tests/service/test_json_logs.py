"""--log-format json: what the process and its children write to stderr becomes one JSON object per line."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from changelake.service.logs import stderr_record

pytestmark = pytest.mark.unit


def test_text_lines_become_records_with_level_and_logger():
    spark = json.loads(stderr_record("26/11/28 09:07:22 WARN NativeCodeLoader: Unable to load native-hadoop", []))
    assert (spark["level"], spark["logger"], spark["msg"]) == ("WARNING", "NativeCodeLoader",
                                                               "Unable to load native-hadoop")
    warning = json.loads(stderr_record("/x/y.py:3: FutureWarning: old API", []))
    assert (warning["level"], warning["logger"]) == ("WARNING", "py.warnings.FutureWarning")
    error = json.loads(stderr_record("changelake: cannot reach Kafka at h:1", []))
    assert (error["level"], error["logger"], error["msg"]) == ("ERROR", "changelake", "cannot reach Kafka at h:1")
    trace = json.loads(stderr_record("java.lang.IllegalStateException: boom", ["\tat a.B.c(B.java:1)"]))
    assert trace["exception"] == "\tat a.B.c(B.java:1)"


def test_the_process_and_its_children_write_json_lines_only(tmp_path):
    child = tmp_path / "child.sh"      # what Spark's JVM and its Python workers do: write text to fd 2
    child.write_text("echo '26/11/28 09:07:22 ERROR Executor: task failed' >&2\n"
                     "printf 'Traceback (most recent call last):\\n  File x\\nValueError: v\\n' >&2\n"
                     "echo '{\"ts\": \"t\", \"level\": \"INFO\", \"msg\": \"spark json\"}' >&2\n"
                     "echo 'worker chatter' >&2\n")
    script = textwrap.dedent(f"""
        import logging, subprocess, warnings
        from changelake.service.logs import configure_logging
        configure_logging("INFO", "json", whole_process=True)
        logging.getLogger("changelake.test").info("from the service")
        warnings.warn("a warning in the driver")
        subprocess.run(["sh", {str(child)!r}])
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert all(isinstance(r, dict) for r in records)
    by_msg = {r["msg"]: r for r in records}
    assert by_msg["from the service"]["logger"] == "changelake.test"
    assert any("a warning in the driver" in m for m in by_msg)
    assert by_msg["task failed"]["level"] == "ERROR" and by_msg["task failed"]["logger"] == "Executor"
    assert "spark json" in by_msg and "worker chatter" in by_msg
    traceback = next(r for r in records if r["msg"].startswith("Traceback"))
    assert "File x" in traceback["exception"]
