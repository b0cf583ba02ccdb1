"""What /metrics exposes beyond the pipeline's counters: freshness, lag in seconds, build and process figures,
and no ``_created`` series."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from changelake import metrics
from changelake.connectors.delta_sink import record_freshness, source_times

pytestmark = pytest.mark.unit


def _samples() -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.REGISTRY).decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _value(samples, name, **labels) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


def test_freshness_is_commit_time_minus_source_time_per_change():
    now = 1_800_000_000.0
    ts = pa.array([int((now - d) * 1000) for d in (0.2, 3, 3, 45, 7200)] + [None], pa.int64())
    record_freshness("fresh_test", source_times(pa.table({"_source_ts": ts.cast(pa.timestamp("ms", tz="UTC"))})),
                     now=now)
    s = _samples()
    bucket = lambda le: _value(s, "changelake_table_freshness_seconds_bucket", table="fresh_test", le=le)  # noqa: E731
    assert _value(s, "changelake_table_freshness_seconds_count", table="fresh_test") == 5    # the null: no time
    assert (bucket("0.5"), bucket("5.0"), bucket("60.0"), bucket("3600.0"), bucket("+Inf")) == (1, 3, 4, 4, 5)
    assert _value(s, "changelake_table_freshness_seconds_sum", table="fresh_test") == pytest.approx(7251.2)
    assert source_times(pa.table({"id": [1]})) is None        # an aggregate's rows carry no source time


def test_lag_in_seconds_is_the_age_of_the_last_record_read_while_records_remain():
    times = metrics.ReadTimes()
    now, started = 1_800_000_100.0, 1_800_000_000.0
    assert times.lag_seconds("t", "0", 5, now=now, started=started) == 100.0       # none read yet: since start
    times.note("t", "0", 1_800_000_070_000)
    times.note("t", "0", 1_800_000_040_000)                                         # an older one changes nothing
    assert times.lag_seconds("t", "0", 5, now=now, started=started) == 30.0
    assert times.lag_seconds("t", "0", 0, now=now, started=started) == 0.0           # caught up
    times.note("t", "1", 1234)                                                      # a broker that stamps no time
    assert times.lag_seconds("t", "1", 5, now=now, started=started) == 100.0


def test_build_info_and_process_figures_and_no_created_series():
    metrics.BATCHES.inc(0)
    s = _samples()
    info = s["changelake_build_info"][0]
    assert info.value == 1 and set(info.labels) == {"version", "pyspark", "deltalake", "python"}
    assert info.labels["version"] == __import__("changelake").__version__
    assert _value(s, "process_resident_memory_bytes") > 0 and _value(s, "process_cpu_seconds_total") > 0
    assert not [n for n in s if n.endswith("_created")]


def _samples_once_workers_hold(size: int, *, within_s: float = 20):
    """The samples once the Python workers' resident memory is above ``size`` (or the last ones after
    ``within_s``): the children start and allocate in their own time."""
    deadline = time.monotonic() + within_s
    while True:
        s = _samples()
        if _value(s, "changelake_spark_python_workers_resident_memory_bytes") > size or time.monotonic() >= deadline:
            return s
        time.sleep(0.2)


def test_the_driver_jvm_memory_is_read_from_its_process(tmp_path):
    import os
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; x = bytearray(50_000_000); "
                              "subprocess.run([sys.executable, '-c', 'import time; y = bytearray(30_000_000); "
                              "time.sleep(30)'])"])
    try:
        metrics.JVM.watch(child.pid, heap=lambda: {"heap_used": 1, "heap_committed": 2, "heap_max": 3})
        s = _samples_once_workers_hold(30_000_000)
        assert _value(s, "changelake_jvm_resident_memory_bytes") > 50_000_000
        assert _value(s, "changelake_spark_python_workers_resident_memory_bytes") > 30_000_000
        assert _value(s, "changelake_jvm_memory_bytes", area="heap_max") == 3
    finally:
        metrics.JVM.watch(None)
        for p in metrics._descendants(child.pid):
            os.kill(p, 9)
        child.kill()
        child.wait()


def test_the_python_workers_proportional_memory_counts_a_page_their_forks_share_once():
    """Forks of one parent share its pages until they write to them: the resident sizes' sum counts such a page
    once per fork, the proportional one (PSS) once, which is what the processes hold."""
    import os
    import signal
    import subprocess
    import sys

    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = subprocess.Popen([sys.executable, "-c", "import os, time\n"
                               "x = bytearray(b'x' * 60_000_000)\n"        # written: resident in the parent
                               "for _ in range(3):\n"
                               "    if os.fork() == 0:\n"
                               "        time.sleep(30); os._exit(0)\n"
                               "time.sleep(30)"])
    try:
        metrics.JVM.watch(jvm.pid, workers_under=server.pid)
        s = _samples_once_workers_hold(4 * 60_000_000)
        rss = _value(s, "changelake_spark_python_workers_resident_memory_bytes")
        pss = _value(s, "changelake_spark_python_workers_proportional_memory_bytes")
        assert rss > 4 * 60_000_000                     # the server and its three forks each count the 60 MB
        assert 60_000_000 < pss < 2 * 60_000_000, (rss, pss)     # once between them
    finally:
        metrics.JVM.watch(None)
        for p in metrics._descendants(server.pid):
            os.kill(p, signal.SIGKILL)
        for p in (server, jvm):
            p.kill()
            p.wait()


def test_the_python_workers_under_the_fork_server_count_too():
    """Spark's Python processes forked by the fork server (changelake/spark/fork_server.py) are the server's
    children, not the JVM's: their memory is counted with the workers'."""
    import os
    import subprocess
    import sys

    jvm = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    server = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                               "'import time; y = bytearray(40_000_000); time.sleep(30)'])"])
    try:
        metrics.JVM.watch(jvm.pid, workers_under=server.pid)
        s = _samples_once_workers_hold(40_000_000)
        assert _value(s, "changelake_spark_python_workers_resident_memory_bytes") > 40_000_000
    finally:
        metrics.JVM.watch(None)
        for p in metrics._descendants(server.pid):
            os.kill(p, 9)
        for proc in (jvm, server):
            proc.kill()
            proc.wait()
