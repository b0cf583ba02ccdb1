"""Throughput of DeltaUpsertSink.apply(): changes merged per second.

    PYTHONPATH=. python bench/sink.py                  # 1M changes, 200k keys, batches of 100k
    PYTHONPATH=. python bench/sink.py --preload 1000000 --changes 100000 --hot recent
    PYTHONPATH=. python bench/sink.py --preload 1000000 --changes 100000 --hot uniform
    PYTHONPATH=. python bench/sink.py --quick          # smoke run: 20k changes, 4k keys, 2k preloaded
    PYTHONPATH=. python bench/sink.py --engine delta-spark --preload 1000000 --hot uniform   # Delta's MERGE in Spark
    PYTHONPATH=. python bench/sink.py --engine delta-spark --frame --jobs   # apply_frame, with its Spark jobs listed

Prints the table's data files after the preload and at the end: a MERGE rewrites every file holding a
changed key, so its cost follows the files the keys touch (``--hot``), not the batch alone.

Every change is a +I (first change of a key), +U or -D (``--delete-ratio``), with
strictly increasing ``_seq`` per key; each batch is shuffled, and ``--late-ratio``
of the changes are held back one batch (out-of-order delivery across batches).
``--preload N`` first inserts N rows (ids 0..N-1, not timed); the changed keys are
then either the newest ids half inside and half beyond the preloaded range
(``--hot recent``: updates of recent rows plus inserts, as with auto-increment keys)
or spread over the whole table (``--hot uniform``: every file is touched).
The whole table is checked against the expected final state at the end.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, QueryBuilder

from changelake.changelog import seq_from_kafka
from changelake.connectors.delta_sink import TableSpec, open_sink

sys.path.insert(0, str(Path(__file__).resolve().parent))

KIND_I, KIND_U, KIND_D = 0, 2, 3


def make_changes(key: np.ndarray, delete_ratio: float, rng: np.random.Generator, *,
                 first_offset: int = 0) -> pa.Table:
    """One change per entry of ``key``; Kafka offsets (hence ``_seq``) count up from ``first_offset``."""
    n = len(key)
    offset = np.arange(first_offset, first_offset + n, dtype=np.int64)
    order = np.lexsort((offset, key))
    first = np.ones(n, dtype=bool)
    first[order[1:]] = key[order[1:]] != key[order[:-1]]
    kind = np.where(first, KIND_I, np.where(rng.random(n) < delete_ratio, KIND_D, KIND_U)).astype(np.int8)
    after_delete = np.zeros(n, dtype=bool)
    after_delete[order[1:]] = (kind[order[:-1]] == KIND_D) & ~first[order[1:]]
    kind[after_delete] = KIND_I
    seqs = pa.array([seq_from_kafka(int(k % 4), int(o)) for k, o in zip(key, offset)], pa.string())
    return pa.table({
        "id": key,
        "name": pa.array(np.char.add("item-", (offset % 9973).astype(str)), pa.string()),
        "price": rng.random(n) * 100,
        "qty": rng.integers(0, 1000, n, dtype=np.int32),
        "_kind": kind,
        "_seq": seqs,
        "_topic": pa.array(["bench.items"] * n, pa.string()),
        "_partition": pa.array((key % 4).astype(np.int32)),
        "_offset": offset,
        "_source_ts": pa.array(1_700_000_000_000 + offset, pa.timestamp("ms", tz="UTC")),
    })


def instrument_phases() -> dict[str, float]:
    """Wrap the sink's phases with timers (bench only); returns the running totals in seconds."""
    from changelake.connectors import delta_sink
    from changelake.connectors.delta_sink_rs import DeltaRsSink
    from changelake.spark.delta_sink import DeltaSparkSink

    phases = [
        (delta_sink, ("validate_changes", "latest_per_key", "align_to_table", "split_against_tombstones")),
        (delta_sink.DeltaUpsertSink, ("_state", "_begin", "_record_files", "_maintain")),
        (DeltaRsSink, ("_create_table", "_read_tombstones", "_merge_tombstones", "_merge_table",
                       "_delete_tombstones_before", "_compact_tombstones")),
        (DeltaSparkSink, ("apply_frame", "_tombstone_frame", "_merge_tombstones", "_merge", "_merge_table",
                          "_metrics_of_commit", "_frame_freshness")),
    ]
    totals: dict[str, float] = {}

    def timer(name: str, original):
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - started
        return timed

    for owner, names in phases:
        for name in names:
            setattr(owner, name, timer(name, getattr(owner, name)))
    return totals


def batch_frame(spark, batch: pa.Table):
    """``batch`` as the pipeline hands a framed table to ``apply_frame``: a DataFrame on the executors,
    persisted and counted (``count_kinds`` fills its cache), in 2 partitions; and the checks counted with
    its kinds (``apply_frame(..., checks=)``)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from changelake.spark.batch_frames import count_kinds

    frame = spark.createDataFrame(batch, schema=from_arrow_schema(batch.schema, prefer_timestamp_ntz=True))
    frame = frame.repartition(2).persist()   # not batch order, which _seq orders anyway (one change per offset)
    _, checks = count_kinds({"bench": frame}, {"bench": ("id",)})["bench"]
    return frame, checks


def expected_state(changes: pa.Table) -> dict[int, str]:
    last = changes.group_by("id").aggregate([("_seq", "max")])
    winners = changes.join(last, keys=["id", "_seq"], right_keys=["id", "_seq_max"], join_type="inner")
    live = winners.filter(pc.not_equal(winners["_kind"], KIND_D))
    return dict(zip(live["id"].to_pylist(), live["_seq"].to_pylist()))


def batches(changes: pa.Table, size: int, late_ratio: float, rng: np.random.Generator):
    held = None
    for start in range(0, changes.num_rows, size):
        batch = changes.slice(start, size)
        late = rng.random(batch.num_rows) < late_ratio
        now = batch.filter(pa.array(~late))
        if held is not None:
            now = pa.concat_tables([now, held])
        held = batch.filter(pa.array(late))
        yield now.take(rng.permutation(now.num_rows))
    if held is not None and held.num_rows:
        yield held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--changes", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100_000)
    parser.add_argument("--delete-ratio", type=float, default=0.05)
    parser.add_argument("--late-ratio", type=float, default=0.02)
    parser.add_argument("--preload", type=int, default=0, help="rows inserted (not timed) before the run")
    parser.add_argument("--hot", choices=["recent", "uniform"], default="recent",
                        help="with --preload: which existing rows the changes hit")
    parser.add_argument("--engine", default="delta-rs", choices=["delta-rs", "delta-spark"],
                        help="delta-spark: the MERGE in a local[2] Spark session with the project's `delta` JVM set")
    parser.add_argument("--frame", action="store_true",
                        help="the timed batches as persisted Spark DataFrames through apply_frame (as the pipeline "
                             "gives them with storage.reduce_on executors); needs a Spark engine session")
    parser.add_argument("--jobs", action="store_true",
                        help="with a Spark session: list each timed batch's Spark jobs from Spark's event log")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting of the benchmark's session (repeatable)")
    parser.add_argument("--dir", default=None, help="where to write the table (default: a temp dir)")
    parser.add_argument("--profile", action="store_true", help="print time per sink phase (timed batches)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 20,000 changes over 4,000 keys in batches of 5,000, 2,000 rows preloaded")
    args = parser.parse_args()
    if args.quick:
        args.changes, args.keys, args.batch, args.preload = 20_000, 4_000, 5_000, 2_000
    phases = instrument_phases() if args.profile else {}

    rng = np.random.default_rng(7)
    root = Path(args.dir or tempfile.mkdtemp(prefix="changelake-bench-"))
    shutil.rmtree(root / "lake", ignore_errors=True)
    spec = TableSpec(name="bench", path=str(root / "lake" / "items"), primary_key=("id",))
    eventlog = root / "eventlog"
    spark = None
    if args.engine == "delta-spark" or args.frame:
        from changelake.spark.delta_sink import open_sink as open_spark_sink
        from changelake.spark.session import build_session

        conf = dict(item.split("=", 1) for item in args.conf)
        if args.jobs:
            shutil.rmtree(eventlog, ignore_errors=True)
            eventlog.mkdir(parents=True)
            conf |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": str(eventlog),
                    "spark.eventLog.compress": "false"}
        spark = build_session(app_name="bench-sink", master="local[2]", ui=False, engine=args.engine, conf=conf)
        sink = open_spark_sink(spec, pipeline_id="bench", engine=args.engine, spark=spark)
    else:
        sink = open_sink(spec, pipeline_id="bench", engine=args.engine)
    batch_id = 0
    preload = make_changes(np.arange(args.preload, dtype=np.int64), 0.0, rng)
    for start in range(0, args.preload, args.batch):  # built over several batches, like a live table
        sink.apply(preload.slice(start, args.batch), batch_id=batch_id)
        batch_id += 1
    if args.preload and args.hot == "uniform":
        pool = np.linspace(0, args.preload - 1, args.keys).astype(np.int64)
    else:
        pool = np.arange(args.keys, dtype=np.int64) + max(args.preload - args.keys // 2, 0)

    changes = make_changes(pool[rng.integers(0, len(pool), args.changes)], args.delete_ratio, rng,
                           first_offset=args.preload)
    if args.preload:
        print(f"preloaded {args.preload:,} rows: {len(DeltaTable(spec.path).file_uris())} data files")
    phases.clear()  # only the timed batches
    applied = 0
    elapsed = 0.0
    for batch in batches(changes, args.batch, args.late_ratio, rng):
        frame = None
        if args.frame:
            frame, checks = batch_frame(spark, batch)
            spark.sparkContext.setLocalProperty("streaming.sql.batchId", str(batch_id))  # the job listing's key
        started = time.perf_counter()
        result = sink.apply(batch, batch_id=batch_id) if frame is None else sink.apply_frame(frame, batch_id=batch_id, checks=checks)
        took = time.perf_counter() - started
        if frame is not None:
            frame.unpersist()
            spark.sparkContext.setLocalProperty("streaming.sql.batchId", None)
        elapsed += took
        applied += batch.num_rows
        print(f"batch {batch_id}: {batch.num_rows} changes in {took:.3f} s "
              f"(upserts {result.upserts}, deletes {result.deletes}, stale {result.stale_ignored}, "
              f"resurrections prevented {result.resurrections_prevented})")
        batch_id += 1

    table = DeltaTable(spec.path)
    got = pa.table(QueryBuilder().register("t", table).execute("SELECT id, _seq FROM t"))
    actual = dict(zip(got["id"].to_pylist(), got["_seq"].to_pylist()))
    ok = actual == expected_state(pa.concat_tables([preload, changes]))
    layout = f"preloaded {args.preload} rows, {args.hot} keys" if args.preload else "empty table"
    print(f"engine {args.engine}; table at the end: {len(table.file_uris())} data files")
    print(f"{applied} changes over {args.keys} keys in batches of {args.batch} ({layout}): "
          f"{elapsed:.2f} s, {applied / elapsed:,.0f} changes/s; "
          f"final state {'matches' if ok else 'DOES NOT MATCH'} the expected rows")
    for name, seconds in sorted(phases.items(), key=lambda item: -item[1]):
        print(f"  {name:28s} {seconds:7.3f} s  {100 * seconds / elapsed:5.1f} %")
    if args.jobs and spark is not None:
        spark.stop()                    # flushes the event log
        from spark_timing import print_batch_jobs
        print_batch_jobs(eventlog)
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
