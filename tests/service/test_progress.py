"""Spark's progress reports -> offsets and lag."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.unit


def test_offsets_that_spark_reports_as_null_are_none():
    # A restarted available-now query whose only batch replays the one a crash interrupted reports
    # latestOffset "null" in its last progress: the run must still end cleanly.
    from changelake.spark.progress import lag_by_partition, parse_offsets

    assert parse_offsets("null") == {} and parse_offsets(None) == {}
    assert lag_by_partition({"latestOffset": "null", "endOffset": '{"t": {"0": 5}}'}) == {}
    assert lag_by_partition({"latestOffset": '{"t": {"0": 7}}', "endOffset": '{"t": {"0": 5}}'}) == {("t", "0"): 2}


def test_the_catch_up_line_counts_per_source_from_the_runs_first_offsets():
    from changelake.service.catchup import CatchUpTracker, SourceProgress, format_progress_line

    now = [100.0]
    tracker = CatchUpTracker({"db.orders": "orders", "db.products": "products"}.get, clock=lambda: now[0])
    now[0] = 102.0
    first = tracker.observe({"sources": [{
        "startOffset": '{"db.orders": {"0": 1000, "1": 0}, "db.products": {"0": 0}}',
        "endOffset": '{"db.orders": {"0": 1600, "1": 400}, "db.products": {"0": 50}}',
        "latestOffset": '{"db.orders": {"0": 5000, "1": 1000}, "db.products": {"0": 50}, "other": {"0": 9}}'}]})
    assert first == [SourceProgress("orders", 1000, 4000, 500.0), SourceProgress("products", 50, 0, 25.0)]
    now[0] = 104.0
    second = tracker.observe({"sources": [{
        "startOffset": '{"db.orders": {"0": 1600, "1": 400}, "db.products": {"0": 50}}',
        "endOffset": '{"db.orders": {"0": 2600, "1": 400}, "db.products": {"0": 50}}',
        "latestOffset": '{"db.orders": {"0": 5000, "1": 1000}, "db.products": {"0": 50}}'}]})
    orders = second[0]
    # the rate counts from the first report on: 1,000 records in the 2 s since
    assert (orders.done, orders.remaining, orders.rate, orders.eta_seconds) == (2000, 3000, 500.0, 6.0)
    assert format_progress_line(second) == ("orders: 2,000 done, 3,000 left, 500/s, ETA 6 s | "
                                            "products: 50 done, 0 left, 0/s, ETA 0 s")
    assert format_progress_line([SourceProgress("x", 0, 7_200_000, 0.0)]) == "x: 0 done, 7,200,000 left, 0/s, ETA ?"
    assert "ETA 2 h 00 min" in format_progress_line([SourceProgress("x", 1000, 7_200_000, 1000.0)])


def test_the_rate_leaves_out_spark_start_up():
    # Spark took 120 s to start and plan before the first batch, which read 6,000 records in 3 s; then
    # 12,000 more in 6 s. The rate is the batches' (2,000/s), not 18,000 over 129 s (140/s, ETA 7x too long).
    from changelake.service.catchup import CatchUpTracker

    now = [0.0]
    tracker = CatchUpTracker({"t": "s"}.get, clock=lambda: now[0])
    now[0] = 123.0
    first = tracker.observe({"durationMs": {"triggerExecution": 3000}, "sources": [{
        "startOffset": '{"t": {"0": 0}}', "endOffset": '{"t": {"0": 6000}}', "latestOffset": '{"t": {"0": 60000}}'}]})
    assert first[0].rate == 2000.0 and first[0].eta_seconds == 27.0
    now[0] = 129.0
    later = tracker.observe({"durationMs": {"triggerExecution": 3000}, "sources": [{
        "startOffset": '{"t": {"0": 12000}}', "endOffset": '{"t": {"0": 18000}}',
        "latestOffset": '{"t": {"0": 60000}}'}]})
    assert (later[0].done, later[0].rate, later[0].eta_seconds) == (18000, 2000.0, 21.0)


def _config(tmp_path):
    from changelake.service.config import parse_config

    return parse_config(f"""
pipeline: {{id: p, checkpoint: {tmp_path}/cp}}
kafka: {{bootstrap_servers: "localhost:1"}}
sources: [{{name: orders, topics: [db.orders], format: debezium-json, table: orders}}]
tables: [{{name: orders, primary_key: [id]}}]
storage: {{root: {tmp_path}/lake}}
""")


def _report(end: int, latest: int) -> dict:
    return {"durationMs": {"triggerExecution": 1000}, "sources": [{
        "startOffset": '{"db.orders": {"0": 0}}', "endOffset": f'{{"db.orders": {{"0": {end}}}}}',
        "latestOffset": f'{{"db.orders": {{"0": {latest}}}}}'}]}


def _screen(written: str) -> list[str]:
    """The lines a terminal shows for ``written``: "\\r" then erase-line empties the line being drawn."""
    return [segment.split("\r\x1b[K")[-1] for segment in written.split("\n")]


def test_lines_of_the_jvm_and_of_python_logs_go_above_the_terminal_progress_line(tmp_path):
    # Spark's JVM and its Python workers write to file descriptor 2 directly (a child process stands in for
    # the JVM, started after the progress line took over stderr, as the runner starts Spark): every line of
    # theirs, and the service's own log lines, must show on a line of its own above the progress line.
    import logging
    import os
    import subprocess
    import sys
    import time

    from changelake.service.logs import TerminalStderr, configure_logging
    from changelake.service.runner import _CatchUpLine

    terminal = tmp_path / "terminal"
    saved = os.dup(2)
    with open(terminal, "wb") as f:
        os.dup2(f.fileno(), 2)
    try:
        configure_logging("INFO")
        handler = next(h for h in logging.getLogger().handlers if getattr(h, "_changelake", False))
        handler.setStream(open(2, "w", buffering=1, closefd=False))   # sys.stderr, were pytest not capturing it
        line = _CatchUpLine(_config(tmp_path), TerminalStderr.install())
        line.show(_report(100, 1000))
        jvm = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                                "sys.stderr.write('26/11/28 09:07:22 WARN TaskSetManager: Stage 3 contains a task "
                                "of very large size\\n'); sys.stderr.flush(); time.sleep(0.3)\n"
                                "sys.stderr.write('a worker prompt without its newline'); sys.stderr.flush()\n"
                                "time.sleep(1.0)"])
        time.sleep(0.2)
        logging.getLogger("changelake.test").warning("something happened")
        jvm.wait()
        line.show(_report(1000, 1000))
        line.end()
        logging.getLogger("changelake.test").warning("after the end")
        TerminalStderr.uninstall()
        configure_logging("INFO")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        TerminalStderr.uninstall()
    written = terminal.read_bytes().decode()   # not read_text: its universal newlines turn "\r" into "\n"
    screen = [s for s in _screen(written) if s]
    jvm_lines = ["26/11/28 09:07:22 WARN TaskSetManager: Stage 3 contains a task of very large size",
                 "a worker prompt without its newline"]
    # each line on a line of its own, whole; the progress line once, at the end, before the log line after it
    assert sorted(s for s in screen if s in jvm_lines) == sorted(jvm_lines)
    assert len(screen) == 5 and screen[-1].endswith("WARNING changelake.test: after the end")
    assert screen[-2].startswith("orders: 1,000 done, 0 left")
    assert [s for s in screen[:-2] if s not in jvm_lines][0].endswith("WARNING changelake.test: something happened")
    # and the progress line came back under each line written while it was shown
    for text in [*jvm_lines, "something happened"]:
        assert written.split(text + "\n", 1)[1].startswith("orders: 100 done, 900 left")


def test_without_a_terminal_progress_is_logged_periodically_with_records_left_and_eta(tmp_path, caplog):
    import logging

    from changelake.service.runner import _CatchUpLine

    now = [0.0]
    line = _CatchUpLine(_config(tmp_path), None, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="changelake.service.runner"):
        for t, end in ((1, 100), (10, 200), (31, 300), (40, 400), (62, 1000), (70, 1000)):
            now[0] = float(t)
            line.show(_report(end, 1000))
    lines = [r.getMessage() for r in caplog.records if r.name == "changelake.service.runner"]
    assert lines == ["catching up: orders: 100 done, 900 left, 100/s, ETA 9 s",
                     "catching up: orders: 300 done, 700 left, 7/s, ETA 1 min 45 s",
                     "caught up: orders: 1,000 done, 0 left, 15/s, ETA 0 s"]
