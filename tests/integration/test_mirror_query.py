"""A mirror never waits for a slow operator graph (``pipeline.mirrors: own_query``, changelake.service.split).

The inventory pipeline of tests/integration/test_graph_pipeline.py (three mirrors; orders JOIN products,
an aggregate, a Top-3 and a select) runs with its mirrors in a streaming query of their own. The graph's
first batch is made slow on purpose (``CHANGELAKE_SLOW_GRAPH``: it sleeps before its Delta commits), and
the process is killed with SIGKILL in the middle of the mirrors' batch 1, after one table's commit: by
then the mirrors have committed batch 0 while the graph has committed nothing. The restart (no hooks)
must give every table exactly the source's final state: the mirrors row for row, the graph tables equal
to DuckDB's batch query, and no table holds a batch twice.

Bad messages sit in the topics of ``products`` and ``orders``, which both queries read (mirrored, and read
by the views): each must be in the dead-letter table exactly once, with its bytes and position, across
the crash (the mirrors' query accounts for them, ``accounted_elsewhere``), and ``changelake dlq list``
must find them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import orjson
import pytest
from confluent_kafka import Producer

from changelake.connectors.delta_read import read_delta
from changelake.service.demo import verify
from changelake.service.split import mirror_checkpoint

from .helpers import write_history
from .test_graph_pipeline import GRAPH_TABLES, VIEWS, _actual, _expected, graph_config

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]


def _run(config_path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CHANGELAKE_FAULT", "CHANGELAKE_SLOW_GRAPH")}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "changelake.service.cli", "--log-level", "WARNING",
                           "run", "--available-now", "-c", str(config_path)],
                          env=env, capture_output=True, text=True, timeout=600)


def _txn_batches(table_dir) -> list[int]:
    """The sink transaction versions of a Delta table's commits, in version order."""
    out = []
    for f in sorted((table_dir / "_delta_log").glob("*.json")):
        for line in f.read_bytes().splitlines():
            action = orjson.loads(line)
            if "txn" in action and action["txn"]["appId"].startswith("changelake:"):
                out.append(action["txn"]["version"])
    return out


def _produce_bad(servers: str, prefix: str) -> dict[tuple[str, int, int], bytes]:
    """Malformed messages and an unknown op into topics both queries read; returns each one's position."""
    bad = [(f"{prefix}.inventory.products", 0, b'{"op": "c", "after": {"id": 1'),
           (f"{prefix}.inventory.orders", 1, b"\xff\xfe not json"),
           (f"{prefix}.inventory.products", 2, b'{"op": "x", "after": {"id": 9}}')]
    where: dict[tuple[str, int, int], bytes] = {}

    def delivered(err, msg) -> None:
        assert err is None, err
        where[(msg.topic(), msg.partition(), msg.offset())] = msg.value()

    producer = Producer({"bootstrap.servers": servers, "log_level": 3})
    for topic, partition, value in bad:
        producer.produce(topic, key=b'{"id": 1}', value=value, partition=partition, on_delivery=delivered)
    assert producer.flush(30) == 0 and len(where) == len(bad)
    return where


def test_mirror_commits_while_the_graph_batch_is_slow_and_a_sigkill_restart_applies_each_change_once(kafka, tmp_path):
    prefix = kafka.topic("mirrorq")
    db = write_history(kafka.bootstrap_servers, seed=11, changes=300, topic_prefix=prefix, redeliver=30,
                       sizes={"customers": 10, "products": 15, "orders": 40})
    bad = _produce_bad(kafka.bootstrap_servers, prefix)
    graph = {"views": VIEWS, "tables": [{"name": t, "from": src, "primary_key": key} for (t, (key, _)), src in
                                        zip(GRAPH_TABLES.items(), ("by_category", "top3", "lines"))],
             "pipeline": {"mirrors": "own_query",
                          "spark_conf": {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"}}}
    config, path = graph_config(kafka.bootstrap_servers, tmp_path, prefix, graph)
    lake = tmp_path / "lake"

    crashed = _run(path, {"CHANGELAKE_SLOW_GRAPH": "300@0", "CHANGELAKE_FAULT": "after-first-table@1@mirrors"})
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    mirrored = [t for t in db.state if (lake / t).exists()]
    assert mirrored, "the mirrors' batch 0 should have been committed before the crash"
    assert not any((lake / t).exists() for t in GRAPH_TABLES), \
        "the graph's slow batch 0 should not have committed: the mirrors committed without waiting for it"
    assert (tmp_path / "checkpoints").exists() and os.path.isdir(mirror_checkpoint(config))

    restarted = _run(path, {})
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert verify(config, db.state) == {t: "ok" for t in db.state}
    assert _actual(config) == _expected(db)
    for table in [*db.state, *GRAPH_TABLES]:        # each batch committed once per table
        batches = _txn_batches(lake / table)
        assert batches == sorted(set(batches)), (table, batches)

    letters = read_delta(config.dead_letter_path()).to_pylist()
    positions = [(r["topic"], r["partition"], r["offset"]) for r in letters]
    assert sorted(positions) == sorted(bad), "each bad message once, across the crash and both queries"
    assert all(r["value"] == bad[(r["topic"], r["partition"], r["offset"])] for r in letters)
    assert {r["reason"] for r in letters} <= {"malformed", "unknown-op"} and all(r["error"] for r in letters)
    listed = subprocess.run([sys.executable, "-m", "changelake.service.cli", "dlq", "list", "-c", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-3000:]
    for topic, partition, offset in bad:
        assert f"{topic}/{partition}/{offset}" in listed.stdout, listed.stdout
    assert f"{len(bad)} dead letter(s)" in listed.stdout, listed.stdout
