"""``changelake status``'s parts that need no broker: the checkpoint's last batch, table files, the listing."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake.service.status import LastBatch, PartitionLag, PipelineStatus, TableFiles, format_status, table_files
from changelake.spark.checkpoint import batch_end_offsets, last_committed_batch

pytestmark = pytest.mark.unit


def test_the_last_batch_and_its_offsets_come_from_the_checkpoint_logs(tmp_path):
    assert last_committed_batch(str(tmp_path)) is None          # nothing committed yet
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    for batch, end in ((0, 5), (1, 9), (2, 12)):
        (tmp_path / "offsets" / str(batch)).write_text(
            'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"db.orders": {"0": %d, "1": 3}}' % end)
    for batch in (0, 1):                                          # batch 2 planned, not committed
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    batch, when = last_committed_batch(str(tmp_path))
    assert batch == 1 and when.tzinfo is not None
    assert batch_end_offsets(str(tmp_path), 1) == {"db.orders": {"0": 9, "1": 3}}
    assert batch_end_offsets(str(tmp_path), 7) == {}


def test_table_files_and_the_listing(tmp_path):
    path = str(tmp_path / "orders")
    assert table_files("orders", path, None) == TableFiles("orders", path, None)
    write_deltalake(path, pa.table({"id": [1, 2]}))
    write_deltalake(path, pa.table({"id": [3]}), mode="append")
    files = table_files("orders", path, None)
    assert (files.version, files.files) == (1, 2) and files.bytes > 0

    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=timezone.utc)
    status = PipelineStatus(pipeline_id="p", group="changelake.p",
                            partitions=[PartitionLag("db.orders", 0, 9, 12), PartitionLag("db.orders", 1, None, 4)],
                            last_batch=LastBatch(1, datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc), {}),
                            tables=[files], dead_letters={("orders", "malformed"): 2})
    out = format_status(status, now=now)
    assert "pipeline p (consumer group changelake.p)" in out
    assert "db.orders                                   0            9           12          3" in out
    assert "db.orders                                   1            -            4          -" in out
    assert "total lag: 3 (partitions without a committed offset: '-')" in out
    assert "last batch: 1, committed 2026-01-01 12:00:00 UTC (30 s ago)" in out
    assert f"orders                                          1        2 {files.bytes:>14,}" in out
    assert "orders / malformed: 2" in out


def test_the_lease_and_the_running_instances_brokers_from_its_metrics(tmp_path):
    from changelake.service.broker_watch import BrokerWatch
    from changelake.service.http import Health, HttpEndpoint
    from changelake.service.lease import Lease, lease_path
    from changelake.service.status import live_metrics
    from tests.service.test_broker_watch import _stats

    lease = Lease(lease_path(str(tmp_path), "st"), pipeline_id="st", ttl_s=60)
    lease.acquire()
    watch = BrokerWatch("h:1")
    watch.on_stats(_stats(**{"status-a:9092/1": ("UP", 1, 0), "status-b:9092/2": ("UP", 1, 0)}))
    watch.on_stats(_stats(**{"status-a:9092/1": ("UP", 3, 2), "status-b:9092/2": ("DOWN", 1, 1)}))
    endpoint = HttpEndpoint(Health(max_silence_s=60), host="127.0.0.1", port=0).start()
    try:
        other = PipelineStatus(pipeline_id="other", group="g")
        live_metrics(other, "127.0.0.1", endpoint.port, pipeline_id="other")    # another pipeline's process
        assert other.live_url is None and other.brokers == {}
        status = PipelineStatus(pipeline_id="st", group="g", lease=("vm:1:x", "renew", 1_800_000_000.0, 60.0))
        live_metrics(status, "127.0.0.1", endpoint.port, pipeline_id="st")
    finally:
        endpoint.stop()
        lease.release()
    assert status.lease_state == "held"
    assert status.brokers["status-a:9092/1"] == (True, 2, 1) and status.brokers["status-b:9092/2"] == (False, 1, 0)
    out = format_status(status, now=datetime.fromtimestamp(1_800_000_030.0, timezone.utc))
    assert "held: vm:1:x, last renew 30 s ago" in out
    assert "lease held" in out
    assert "status-b:9092/2                                 NO           1          0" in out
    late = format_status(status, now=datetime.fromtimestamp(1_800_000_090.0, timezone.utc))
    assert "expired (not renewed within lease_ttl 60 s" in late
