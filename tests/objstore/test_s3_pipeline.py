"""The pipeline with its Delta tables and dead letters on an S3 API (moto's server, behind a proxy that fails
requests on demand), the Spark checkpoint on a local path (docs/operations.md, "Object storage").

* Mirrors and an operator graph end to end on S3, SIGKILLed after a batch's Delta commits and before Spark
  recorded the batch (``after-sinks@1``), then restarted while S3 refuses the first log writes (503) and
  loses the reply of one table commit it applied: each change once, tables equal to the source.
* Two ``changelake run`` processes of one pipeline: the second refuses to start while the first runs; the
  first, its lease then taken over, stops (exit code 2) without writing; the next instance starts at once
  (the lease, changelake.service.lease).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import yaml
from confluent_kafka import Producer
from deltalake import DeltaTable, QueryBuilder

from changelake.service.config import load_config
from changelake.service.demo import TABLES, verify
from changelake.service.lease import KEY, Lease, LeaseHeld, lease_path

from ..integration.helpers import pipeline_config, write_history
from ..integration.test_crash_recovery import _run_pipeline
from ..integration.test_graph_pipeline import GRAPH_TABLES, VIEWS, _expected
from .s3_server import Fault

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _on_s3(path, bucket: str, options: dict[str, str]):
    data = yaml.safe_load(path.read_text())
    data["storage"] = {"root": f"s3://{bucket}/lake", "engine": "delta-rs", "options": options}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path)


def _rows(config, table: str, columns: list[str]) -> list[tuple]:
    path = config.dead_letter_path() if table == "_dead_letters" else config.table_path(table)
    dt = DeltaTable(path, storage_options=config.storage.plain_options())
    sql = f"SELECT {', '.join(columns)} FROM t"
    return [tuple(r.values()) for r in pa.table(QueryBuilder().register("t", dt).execute(sql)).to_pylist()]


def _each_key_once(config, tables: dict[str, list[str]]) -> dict[str, int]:
    """Rows beyond one per primary key, per table (all 0: no change applied twice)."""
    out = {}
    for table, key in tables.items():
        keys = _rows(config, table, key)
        out[table] = len(keys) - len(set(keys))
    return out


def _bad_messages(servers: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": servers})
    for i in range(n):
        producer.produce(topic, key=b'{"id": %d}' % (900000 + i), value=b"{not json at all " + str(i).encode())
    producer.flush(30)


def test_mirrors_and_graph_on_s3_survive_sigkill_and_s3_errors_exactly_once(kafka, s3, bucket, proxy, tmp_path,
                                                                            monkeypatch):
    prefix = kafka.topic("s3graph")
    db = write_history(kafka.bootstrap_servers, seed=11, changes=300, topic_prefix=prefix, redeliver=30,
                       sizes={"customers": 10, "products": 15, "orders": 40})
    _bad_messages(kafka.bootstrap_servers, f"{prefix}.inventory.orders", 3)
    _, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix, max_records=150)
    data = yaml.safe_load(path.read_text())
    data["views"] = VIEWS
    data["tables"] += [{"name": t, "from": src, "primary_key": key} for (t, (key, _)), src in
                       zip(GRAPH_TABLES.items(), ("by_category", "top3", "lines"))]
    data["pipeline"]["spark_conf"] = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}
    for s in data["sources"]:
        s["primary_key"] = ["order_id" if s["name"] == "orders" else "id"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    options = s3.options(proxy.endpoint)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):    # credentials from the environment, as on a pod
        monkeypatch.setenv(key, options.pop(key))
    config = _on_s3(path, bucket, options)
    assert config.storage.plain_options()["aws_conditional_put"] == "etag"     # the S3 commit mode, by default
    want = _expected(db)

    crashed = _run_pipeline(path, fault="after-sinks@1")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert {o["Key"].split("/")[1] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]} >= {
        "orders", "category_sales"}                                   # batch 0 and 1 are on S3, not locally
    assert not (tmp_path / "lake").exists()

    refused = proxy.arm(Fault("refuse", "PUT", "/_delta_log/", times=6))
    lost = proxy.arm(Fault("lose-reply", "PUT", "/category_sales/_delta_log/0", times=1))
    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert refused.met == 6 and lost.met == 1                         # the store did fail as planned
    proxy.disarm()

    graph = {t: set(_rows(config, t, columns)) for t, (_, columns) in GRAPH_TABLES.items()}
    assert graph == want
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    keys = {t: [TABLES[t]["key"]] for t in db.state} | {t: key for t, (key, _) in GRAPH_TABLES.items()}
    assert _each_key_once(config, keys) == {t: 0 for t in keys}
    letters = _rows(config, "_dead_letters", ["topic", "\"partition\"", "\"offset\""])
    assert len(letters) == len(set(letters)) == 3                     # dead letters on S3, once each


def test_a_second_instance_refuses_to_start_and_a_taken_over_one_stops(kafka, s3, bucket, tmp_path):
    prefix = kafka.topic("s3twice")
    db = write_history(kafka.bootstrap_servers, seed=3, changes=200, topic_prefix=prefix, redeliver=10,
                       sizes={"customers": 10, "products": 10, "orders": 20})
    _, path = pipeline_config(kafka.bootstrap_servers, tmp_path, topic_prefix=prefix,
                              overrides={"pipeline": {"trigger_interval": "1 second", "lease_ttl": "15 seconds"}})
    config = _on_s3(path, bucket, s3.options())
    lease_table = lease_path(config.storage.root, config.pipeline.id)
    env = {k: v for k, v in os.environ.items() if k != "CHANGELAKE_FAULT"}
    cli = [sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING"]
    first = subprocess.Popen(cli + ["run", "-c", str(path)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while verify(config, db.state) != {t: "ok" for t in db.state}:      # the first instance caught up
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the first instance did not catch up within 300 s"
            time.sleep(1)

        started = time.monotonic()
        second = subprocess.run(cli + ["run", "--available-now", "-c", str(path)], env=env, capture_output=True,
                                text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "is already running" in second.stderr and "lease" in second.stderr
        assert time.monotonic() - started < 30         # refused before Spark starts: nothing of it written
        holder = DeltaTable(lease_table, storage_options=config.storage.plain_options()).history(1)[0][KEY]
        assert f'"pid": {first.pid}' in holder and first.poll() is None     # the first holds it and goes on

        # another instance takes the lease over, as after the first had stalled beyond lease_ttl
        taker = Lease(lease_table, pipeline_id=config.pipeline.id, ttl_s=15,
                      storage_options=config.storage.plain_options(), clock=lambda: time.time() + 3600)
        for attempt in range(5):       # the first still renews every 5 s: a take can meet a renewal's commit
            try:
                taker.acquire()
                break
            except LeaseHeld as conflict:
                assert "at the same moment" in str(conflict) and attempt < 4, conflict
        _, err = first.communicate(timeout=60)     # its next renewal finds the lease taken: it stops
        assert first.returncode == 2, err[-3000:]
        assert "took the lease" in err and taker.owner in err
        taker.release()
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()

    after = _run_pipeline(path)                        # the lease released: the next instance starts at once
    assert after.returncode == 0, after.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    assert _each_key_once(config, {t: [TABLES[t]["key"]] for t in db.state}) == {t: 0 for t in db.state}
