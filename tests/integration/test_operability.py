"""What an operator relies on: /metrics after real work, and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from changelake import metrics
from changelake.service.demo import verify
from changelake.service.runner import PipelineRunner

from .helpers import pipeline_config, write_history

pytestmark = [pytest.mark.integration, pytest.mark.kafka]


def _samples(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _total(samples, name, **labels) -> float:
    return sum(s.value for s in samples.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.mark.spark
def test_metrics_after_a_run_are_present_and_sane(spark, kafka, tmp_path):
    prefix = kafka.topic("metrics")
    db = write_history(kafka.bootstrap_servers, seed=31, changes=600, topic_prefix=prefix)
    topic = f"{prefix}.inventory.orders"
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "log_level": 3})
    p.produce(topic, key=b'{"order_id": 1}', value=b"{truncated")
    p.produce(topic, key=b'{"order_id": 2}', value=b"\x00\x01binary")
    p.flush(30)
    config, _ = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=900)
    runner = PipelineRunner(config, spark=spark)
    runner.serve_http_after_stop = True
    before = time.time()
    # the counters are the process's: other tests of this process may have run pipelines in it before
    batches_before = metrics.REGISTRY.get_sample_value("changelake_batches_total") or 0.0
    result = runner.run(available_now=True, install_signal_handlers=False)
    try:
        s = _samples(result.metrics_url)
    finally:
        runner.endpoint.stop()
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    tables = list(db.state)
    topics = {f"{prefix}.inventory.{t}" for t in tables}
    # records in: every record of this run's topics, by format
    assert sum(_total(s, "changelake_records_in_total", topic=t, format="debezium-json") for t in topics) \
        == result.totals.records
    for t in tables:
        assert _total(s, "changelake_changes_in_total", table=t, kind="+I") >= db.counts[t]["r"]
        assert _total(s, "changelake_rows_out_total", table=t, kind="+I") > 0
        assert _total(s, "changelake_delta_table_version", table=t) >= 1
        assert _total(s, "changelake_delta_commit_duration_seconds_count", table=t) >= 1
    assert _total(s, "changelake_dead_letters_total", topic=topic) == 2
    assert _total(s, "changelake_decode_errors_total", topic=topic) == 2
    assert all(x.value == 0 for x in s["changelake_consumer_lag_records"] if x.labels["topic"] in topics)
    assert {x.labels["topic"] for x in s["changelake_consumer_lag_records"]} >= topics
    assert _total(s, "changelake_batches_total") >= 1
    # --available-now: the endpoint's last figures count every batch that read records, the last one included
    with_input = {p["batchId"] for p in result.progress if p.get("numInputRows", 0) > 0}
    assert _total(s, "changelake_batches_total") - batches_before == len(with_input) >= 2
    # freshness of every mirrored change (source time -> commit) and lag in seconds, 0 once caught up
    for t in tables:
        assert _total(s, "changelake_table_freshness_seconds_count", table=t) > 0
        assert _total(s, "changelake_table_freshness_seconds_sum", table=t) > 0
    lag_s = [x for x in s["changelake_consumer_lag_seconds"] if x.labels["topic"] in topics]
    assert lag_s and all(x.value == 0 for x in lag_s)
    assert s["changelake_build_info"][0].value == 1
    assert _total(s, "process_resident_memory_bytes") > 0
    assert not [n for n in s if n.endswith("_created")]
    # the last batch's Kafka records (batches of 900 but the last), not the rows Spark saw (decoded payloads)
    assert _total(s, "changelake_batch_input_rows") == (result.totals.records % 900 or 900)
    assert before <= _total(s, "changelake_last_batch_timestamp_seconds") <= time.time()
    assert _total(s, "changelake_batch_duration_seconds_count") >= 1


def _wait_ready(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        try:
            if urllib.request.urlopen(url, timeout=2).status == 200:
                return
        except Exception:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} never became ready")


def _served_pipeline(kafka, tmp_path, name: str, *, seed: int, changes: int):
    """A history on ``name``'s topics and its pipeline, serving /metrics and /readyz on a free port:
    (database, config, config path, port)."""
    import socket

    prefix = kafka.topic(name)
    db = write_history(kafka.bootstrap_servers, seed=seed, changes=changes, topic_prefix=prefix)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=300,
                                   overrides={"metrics": {"port": port, "host": "127.0.0.1"},
                                              "pipeline": {"trigger_interval": "1 second"}})
    return db, config, path, port


def test_sigterm_stops_between_batches_and_the_restart_continues(kafka, tmp_path):
    db, config, path, port = _served_pipeline(kafka, tmp_path, "sigterm", seed=41, changes=800)
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    cmd = [sys.executable, "-m", "changelake.service.cli", "--log-level", "INFO", "run", "-c", str(path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_ready(f"http://127.0.0.1:{port}/readyz", proc, timeout_s=300)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "(signal)" in out
    # Every table holds the same committed batches: no batch was half applied when it stopped.
    from deltalake import DeltaTable
    committed = {t: DeltaTable(config.table_path(t)).transaction_version(f"changelake:{config.pipeline.id}:{t}")
                 for t in db.state if (tmp_path / "lake" / t).exists()}
    assert committed and len(set(committed.values())) == 1, committed

    restarted = subprocess.run(cmd[:-3] + ["--log-format", "json", "run", "--available-now", "-c", str(path)],
                               env=env, capture_output=True, text=True, timeout=600)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    # --log-format json: every stderr line is one JSON object, Spark's and the workers' included, and a
    # clean exit leaves no listener-bus stack trace
    records = [json.loads(line) for line in restarted.stderr.splitlines() if line.strip()]
    assert all(isinstance(r, dict) and {"ts", "level", "msg"} <= set(r) for r in records)
    assert any(r.get("logger", "").startswith("changelake.") for r in records)
    assert not [r for r in records if "Py4JException" in json.dumps(r) or r["level"] == "ERROR"], \
        [r for r in records if r["level"] == "ERROR"][:3]


def test_a_killed_session_s_scratch_files_are_deleted_and_ctrl_c_stops_between_batches(kafka, tmp_path):
    """SIGKILL of the whole pipeline (the OOM killer, a container's restart) leaves its JVM's shuffle files, state
    store copies and unpacked native libraries behind: 200-250 MB per kill. The next start deletes them
    (changelake/spark/scratch.py), so a crash loop does not fill the pod's volume. That start then gets Ctrl-C
    (SIGINT): the runner's graceful stop, not pyspark's handler, which cancels the running jobs and raises
    KeyboardInterrupt wherever the driver is (the Spark session starts outside the main thread, where pyspark
    installs no handler)."""
    from changelake.spark import scratch

    _, _, path, port = _served_pipeline(kafka, tmp_path, "scratch", seed=47, changes=300)
    env = {**{k: v for k, v in os.environ.items() if k not in ("CHANGELAKE_FAULT", "SPARK_LOCAL_DIRS")},
           scratch.ENV: str(tmp_path / "scratch")}
    cmd = [sys.executable, "-m", "changelake.service.cli", "--log-level", "INFO", "run", "-c", str(path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    killed = tmp_path / "scratch" / scratch.ROOT / scratch.own_name(proc.pid)
    _wait_ready(f"http://127.0.0.1:{port}/readyz", proc, timeout_s=300)
    assert any(p.name.startswith("blockmgr-") for p in killed.iterdir())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert killed.exists()          # nobody cleaned up after the kill

    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_ready(f"http://127.0.0.1:{port}/readyz", proc, timeout_s=300)
    assert not killed.exists()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "(signal)" in out and "KeyboardInterrupt" not in err
