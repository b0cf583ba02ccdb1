"""Delta maintenance: compaction and VACUUM on a schedule keep a table's files bounded without
changing what any reader sees, and table properties the user asks for are set."""

from __future__ import annotations

import os
import threading
from datetime import timedelta

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from changelake import metrics
from changelake.connectors.delta_sink import Maintenance

from .conftest import AROUND_THE_BATCH, engine_fixture
from .tables import changes, live

#: maintenance acts on the table, whatever form its batches came in: delta-rs and delta-spark
engine = engine_fixture(tuple(p for p in AROUND_THE_BATCH if not p.values[0].endswith("-frames")))


def _snapshot_rows(path: str, app_id: str) -> tuple[int | None, dict[int, str]]:
    """(the batch id a snapshot records, its rows {id: v}), both read from the same snapshot."""
    table = DeltaTable(path)
    batch = table.transaction_version(app_id)
    rows = pa.table(QueryBuilder().register("t", table).execute("SELECT id, v FROM t")).to_pylist()
    return batch, {r["id"]: r["v"] for r in rows}


def _parquet_files(path: str) -> int:
    """Data files on disk (the log's checkpoints left out)."""
    return sum(1 for d, _, files in os.walk(path) if "_delta_log" not in d for f in files if f.endswith(".parquet"))


#: (batches, compaction's file threshold, compactions at least, VACUUM every) per engine: delta-spark's
#: batch costs ~5 s of CPU in Spark jobs and its VACUUM ~60 jobs (25 batches took 190 s of CPU here), so
#: it runs 15 batches with a lower threshold (compaction is checked three times, and runs each time) and
#: only the final VACUUM (the schedule is the engines' shared code, run by delta-rs here)
TINY_BATCHES = {"delta-rs": (200, 12, 5, timedelta(minutes=30)), "delta-spark": (15, 3, 2, None)}


def test_hundreds_of_tiny_batches_keep_files_bounded_and_readers_see_the_same_rows(make_sink, engine, clock,
                                                                                   tmp_path):
    batches, min_files, compactions, vacuum_every = TINY_BATCHES[engine]
    sink = make_sink("t", maintenance=Maintenance(compact_every=timedelta(minutes=5), compact_min_files=min_files,
                                                  vacuum_every=vacuum_every,
                                                  vacuum_retention=timedelta(hours=1)))
    path = sink.spec.path
    compacted = metrics.MAINTENANCE.labels(table="t", operation="compact", result="ok")
    compacted_before = compacted._value.get()        # the counter is the process's: other engines' runs count too
    state: dict[int, str] = {}
    expected: dict[int, dict[int, str]] = {}       # batch id -> the table's rows once it committed
    mismatches: list[str] = []
    reads = [0]
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            if not DeltaTable.is_deltatable(path):
                continue
            batch, rows = _snapshot_rows(path, sink.app_id)
            if batch is not None:
                reads[0] += 1
                if rows != expected[batch]:
                    mismatches.append(f"snapshot of batch {batch}: {len(rows)} rows, expected {len(expected[batch])}")

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    most_files = 0
    seqno = 0
    try:
        for batch in range(batches):
            rows = []
            # as CDC of an orders table: two new keys (a MERGE that touches no file writes a new small
            # one), every tenth batch an update of the previous batch's last key, every fourth a delete
            for key in (2 * batch, 2 * batch + 1, 2 * batch - 1 if batch % 10 == 9 else None):
                if key is None:
                    continue
                seqno += 1
                rows.append(("+I" if key not in state else "+U", key, seqno, f"b{batch}"))
                state[key] = f"b{batch}"
            if batch % 4 == 3:
                key = 2 * batch - 2
                seqno += 1
                rows.append(("-D", key, seqno, None))
                del state[key]
            expected[batch] = dict(state)
            sink.apply(changes(rows), batch_id=batch)
            most_files = max(most_files, len(DeltaTable(path).file_uris()))
            clock.advance(timedelta(minutes=1))
    finally:
        stop.set()
        thread.join(timeout=60)

    assert not mismatches, mismatches[:5]
    assert reads[0] > 20, "the reader hardly ran beside the writer"
    # about one file per batch (one per batch without maintenance); compaction is checked every 5 batches
    # (5 minutes of the clock) and runs above min_files files, so at most 5 more files than that ever live
    assert most_files <= min_files + 5, most_files
    assert compacted._value.get() - compacted_before >= compactions
    assert {k: v for k, (v, _) in live(path).items()} == state
    files = len(DeltaTable(path).file_uris())
    assert metrics.TABLE_FILES.labels(table="t")._value.get() == files

    # files compaction replaced stay on disk for the retention (readers of older snapshots), then go
    assert _parquet_files(path) > files
    assert sink.vacuum(retention=timedelta(0)) > 0
    assert _parquet_files(path) == files
    assert _snapshot_rows(path, sink.app_id) == (batches - 1, state)


def test_table_properties_are_set_at_creation_and_on_an_existing_table(make_sink):
    # (Delta for Spark refuses a log retention below delta.deletedFileRetentionDuration, 7 days by default:
    # changelake validate says so, tests/service/test_validate_checks.py)
    sink = make_sink("p", properties={"delta.logRetentionDuration": "interval 8 days"})
    sink.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    config = DeltaTable(sink.spec.path).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 8 days"
    assert config["changelake.primaryKey"] == '["id"]'          # the sink's own stay
    # a checkpoint every 10 commits, on the table and its tombstone table, unless the properties name another
    assert config["delta.checkpointInterval"] == "10"
    sink.apply(changes([("-D", 1, 2, None)]), batch_id=1)
    assert DeltaTable(sink.tombstone_path).metadata().configuration["delta.checkpointInterval"] == "10"
    own = make_sink("q", properties={"delta.checkpointInterval": "50"})
    own.apply(changes([("+I", 1, 1, "a")]), batch_id=0)
    assert DeltaTable(own.spec.path).metadata().configuration["delta.checkpointInterval"] == "50"

    reopened = make_sink("p", properties={"delta.logRetentionDuration": "interval 10 days",
                                          "delta.enableChangeDataFeed": "true"})
    reopened.apply(changes([("+I", 1, 3, "b")]), batch_id=2)
    config = DeltaTable(sink.spec.path).metadata().configuration
    assert config["delta.logRetentionDuration"] == "interval 10 days"
    assert config["delta.enableChangeDataFeed"] == "true"
    assert live(sink.spec.path) == {1: ("b", "s0000000003")}


def test_a_restarted_sink_keeps_the_maintenance_schedule_its_commits_recorded(tmp_path, clock, monkeypatch):
    """A restart (a new sink on the same table) does not run every maintenance step in its first batch: the
    table's commits record when each step last ran, and the new sink runs a step only once it is due from
    then. A table whose latest commits record nothing (another writer's, an older changelake): due at once."""
    from changelake.connectors import delta_sink
    from changelake.connectors.delta_sink import TableSpec, open_sink

    spec = TableSpec(name="sched", path=str(tmp_path / "sched"), primary_key=("id",),
                     maintenance=Maintenance(compact_every=timedelta(minutes=15), compact_min_files=1,
                                             vacuum_every=timedelta(days=1), vacuum_retention=timedelta(hours=1)),
                     tombstone_expiry_interval=timedelta(hours=1))
    ran: list[str] = []
    for step, method in (("expiry", "expire_tombstones"), ("compact", "compact"), ("vacuum", "vacuum")):
        real = getattr(delta_sink.DeltaUpsertSink, method)
        monkeypatch.setattr(delta_sink.DeltaUpsertSink, method,
                            lambda self, *a, _step=step, _real=real, **k: ran.append(_step) or _real(self, *a, **k))

    def run(batches: range) -> list[str]:
        ran.clear()
        sink = open_sink(spec, pipeline_id="p", engine="delta-rs", clock=clock)     # a (re)started pipeline
        for b in batches:
            sink.apply(changes([("+I", 2 * b, 2 * b + 1, "a"), ("-D", 2 * b - 1, 2 * b + 1, None)]), batch_id=b)
            clock.advance(timedelta(minutes=1))
        return list(ran)

    assert run(range(0, 3)) == ["expiry", "vacuum"]     # the first start: all due (compaction checked: 1 file)
    assert run(range(3, 5)) == []                                   # restarted 3 minutes later: none due
    clock.advance(timedelta(minutes=12))
    assert run(range(5, 7)) == ["compact"]                          # 15 minutes since the compaction
    clock.advance(timedelta(hours=1))
    assert run(range(7, 8)) == ["expiry", "compact"]
    clock.advance(timedelta(days=1))
    assert run(range(8, 9)) == ["expiry", "compact", "vacuum"]

    from deltalake import write_deltalake

    empty = DeltaTable(spec.path).schema().to_arrow().empty_table()
    for _ in range(delta_sink.SCHEDULE_COMMITS):    # another writer's commits, the newest five: no record found
        write_deltalake(spec.path, empty, mode="append")
    assert run(range(9, 10)) == ["expiry", "compact", "vacuum"]
