"""What a steady batch reads of the Delta logs on an object store (moto's S3 behind the counting proxy).

delta-rs's ``transaction_version`` replays the log from its last checkpoint on every call; the sink asked for
it several times per batch for its table and its tombstone table, so every batch read every commit since
the checkpoint again, a few times over (changelake.connectors.delta_log)."""

from __future__ import annotations

import re

import pytest

from changelake.connectors.delta_sink import TableSpec, open_sink

from ..sink.tables import changes, live, tombstones

pytestmark = [pytest.mark.integration]

_LOG_ENTRY = re.compile(r"/_delta_log/\d{20}\.json$")


def _batch(n: int):
    """Ten upserts and two deletes of keys of earlier batches: both tables commit each batch."""
    rows = [("+I", 100 * n + i, 100 * n + i, f"v{n}.{i}") for i in range(10)]
    if n:
        rows += [("-D", 100 * (n - 1) + i, 100 * n + 50 + i, None) for i in range(2)]
    return changes(rows)


def test_a_batch_reads_only_the_log_entries_written_since_the_one_before(s3, bucket, proxy):
    options = s3.options(proxy.endpoint)
    path = f"s3://{bucket}/orders"
    sink = open_sink(TableSpec(name="orders", path=path, primary_key=("id",), storage_options=options),
                     pipeline_id="reads", engine="delta-rs")
    for n in range(10):     # 10 commits of each table since their first version, no checkpoint yet
        sink.apply(_batch(n), batch_id=n)
    proxy.record = True
    sink.apply(_batch(10), batch_id=10)
    proxy.record = False
    entries = [p for m, p in proxy.seen if m == "GET" and _LOG_ENTRY.search(p.split("?")[0])]
    # each table's new commits, read by delta-rs's update and once by the sink; before the sink followed the
    # logs itself, every commit since version 0, a few times over (25 here, growing with every commit)
    assert len(entries) <= 6, entries

    # exactly once still holds with what the sink follows: a replay of the last batch writes nothing
    again = open_sink(TableSpec(name="orders", path=path, primary_key=("id",), storage_options=options),
                      pipeline_id="reads", engine="delta-rs")
    assert again.apply(_batch(10), batch_id=10).committed is False
    assert again.apply(_batch(11), batch_id=11).committed is True
    # read from moto directly: delta-rs's is_deltatable holds the GIL, which the proxy's threads in this process need
    direct = s3.options()
    assert set(live(path, direct)) == {100 * n + i for n in range(12) for i in range(10)} - \
        {100 * n + i for n in range(11) for i in range(2)}
    assert len(tombstones(f"s3://{bucket}/_changelake_tombstones/orders", direct)) == 22
