"""Interval-join benchmark (issue 6): events/s of the IntervalJoin in-process and on Spark.

    nice -n 19 /tmp/venv/bin/python bench/_interval.py [--events 1000000] [--keys 100000]
        [--batch 100000] [--buckets 32] [--engines local,spark] [--quick]

``run(events, quick)`` is the entry point ``bench/joins.py`` calls; this file also runs alone.

Query: ``orders.interval_join(shipments, on order key, ...)`` with
``orders.ts BETWEEN shipments.ts - 10 seconds AND shipments.ts + 0 seconds`` (a shipment within
ten seconds after its order), inner, both sources append-only with a 3-second watermark delay.

Data: two insert-only streams, half the events each, keys drawn uniformly among ``--keys``.
Orders come at 500 per second of event time. Four in five shipments follow a random order
(same key, 0-8 s after it); the rest are noise (any key, any time). Events arrive out of order:
each one lags its event time by up to 1 s (90%), 1-3 s (9.9%) or 3-20 s (0.1%: mostly late
rows). The arrival sequence is cut into micro-batches of ``--batch`` events.

* **local**: ``LocalRunner`` over the micro-batches (Arrow tables built beforehand, not timed).
* **spark**: ``changelake.spark.compile.compile_packed`` over two parquet file sources, one file per
  source and micro-batch (``maxFilesPerTrigger`` 1), RocksDB state store provider, ``local[2]``,
  shuffle partitions 2, ``foreachBatch`` collecting the packed changes, ``availableNow``; timed
  from query start to termination (the session start is reported apart).

Peak state rows: the largest state after a micro-batch (within one, the kernel also holds that
batch's rows until its end moves the watermark); on Spark from the report channel
(``changelake.spark.reports.ReportChannel``: each bucket's latest state size, summed over the
buckets), so each bucket's two watermark entries count.

Both results are checked against DuckDB's interval join over the rows that were in time (the
late rows computed from the documented watermark rule), and the late-row counts against it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PeakMemory, machine

ORDERS = {"order_id": "bigint", "k": "bigint", "amount": "bigint", "ts": "bigint"}
SHIPMENTS = {"ship_id": "bigint", "k": "bigint", "sts": "bigint"}
BEFORE_MS, AFTER_MS, DELAY_MS = 10_000, 0, 3_000
ORDER_SPACING_MS = 2                      # 500 orders per second of event time
FOLLOW_MS = 8_000                         # a shipment 0-8 s after its order


# -- data ---------------------------------------------------------------------------------------------
def generate(events: int, keys: int, batch: int, seed: int = 6) -> list[dict[str, pa.Table]]:
    """The micro-batches: per batch an Arrow changelog (columns, ``_kind``, ``_seq``) per source."""
    from changelake.changelog import KIND, SEQ

    rng = np.random.default_rng(seed)
    n_orders = events // 2
    n_ships = events - n_orders
    order_ts = np.arange(n_orders, dtype=np.int64) * ORDER_SPACING_MS + rng.integers(0, ORDER_SPACING_MS, n_orders)
    order_k = rng.integers(0, keys, n_orders)
    follows = rng.random(n_ships) < 0.8
    of = rng.integers(0, n_orders, n_ships)
    ship_k = np.where(follows, order_k[of], rng.integers(0, keys, n_ships))
    ship_ts = np.where(follows, order_ts[of] + rng.integers(0, FOLLOW_MS, n_ships),
                       rng.integers(0, int(order_ts[-1]) + FOLLOW_MS, n_ships))
    ts = np.concatenate([order_ts, ship_ts])
    r = rng.random(events)
    lag = np.where(r < 0.9, rng.integers(0, 1_000, events),
                   np.where(r < 0.999, rng.integers(1_000, 3_000, events), rng.integers(3_000, 20_000, events)))
    arrival = np.argsort(ts + lag, kind="stable")
    columns = {
        "orders": {"order_id": np.arange(n_orders), "k": order_k, "amount": rng.integers(1, 1000, n_orders),
                   "ts": order_ts},
        "shipments": {"ship_id": np.arange(n_ships), "k": ship_k, "sts": ship_ts},
    }
    batches = []
    for b, start in enumerate(range(0, events, batch)):
        taken = arrival[start:start + batch]
        out = {}
        # each source's rows of the batch in their arrival order
        for name, picked in (("orders", taken[taken < n_orders]), ("shipments", taken[taken >= n_orders] - n_orders)):
            table = {c: pa.array(v[picked], pa.int64()) for c, v in columns[name].items()}
            table[KIND] = pa.array(np.zeros(len(picked), np.int8))
            table[SEQ] = pa.array([f"{b:05d}-{i:07d}" for i in range(len(picked))], pa.string())
            out[name] = pa.table(table)
        batches.append(out)
    return batches


def pipeline():
    from changelake.plan import Pipeline

    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, append_only=True, event_time="ts", watermark_delay=f"{DELAY_MS} ms")
    ships = p.source("shipments", columns=SHIPMENTS, append_only=True, event_time="sts",
                     watermark_delay=f"{DELAY_MS} ms")
    orders.interval_join(ships, on=["k"], before=f"{BEFORE_MS} ms", after=f"{AFTER_MS} ms", how="inner",
                         name="shipped").to_table("shipped", primary_key=["order_id", "ship_id"])
    return p


def pairs(tables: list[pa.Table]) -> np.ndarray:
    """The (order_id, ship_id) pairs of output tables, encoded and sorted, for comparison."""
    if not tables:
        return np.zeros(0, np.int64)
    t = pa.concat_tables(tables)
    return np.sort(t["order_id"].to_numpy() * (1 << 32) + t["ship_id"].to_numpy())


# -- the oracle ---------------------------------------------------------------------------------------
def oracle(batches: list[dict[str, pa.Table]]) -> tuple[np.ndarray, int]:
    """DuckDB's interval join over the rows in time, and the number of late rows: a row is late when its
    event time is below min over the sources of (largest event time of the batches before - delay)."""
    import duckdb

    maxima: dict[str, int | None] = {"orders": None, "shipments": None}
    kept: dict[str, list[pa.Table]] = {"orders": [], "shipments": []}
    late = 0
    for batch in batches:
        w = None if None in maxima.values() else min(m - DELAY_MS for m in maxima.values())
        for name, column in (("orders", "ts"), ("shipments", "sts")):
            t = batch[name]
            times = t[column].to_numpy()
            ok = np.ones(len(times), bool) if w is None else times >= w
            late += int((~ok).sum())
            kept[name].append(t.filter(pa.array(ok)))
            if ok.any():
                top = int(times[ok].max())
                maxima[name] = top if maxima[name] is None else max(maxima[name], top)
    con = duckdb.connect()
    con.register("orders", pa.concat_tables(kept["orders"]))
    con.register("shipments", pa.concat_tables(kept["shipments"]))
    got = con.sql(f"""SELECT o.order_id, s.ship_id FROM orders o JOIN shipments s
                      ON o.k = s.k AND o.ts BETWEEN s.sts - {BEFORE_MS} AND s.sts + {AFTER_MS}""").to_arrow_table()
    con.close()
    return pairs([got]), late


# -- engines ------------------------------------------------------------------------------------------
def run_local(batches: list[dict[str, pa.Table]]) -> dict:
    from changelake.plan.local import LocalRunner

    runner = LocalRunner(pipeline().plan())
    kernel = runner.kernels["shipped"]
    out, peak = [], 0
    start = time.perf_counter()
    for batch in batches:
        out.append(runner.step(batch)["shipped"])
        peak = max(peak, kernel.state_rows)
    seconds = time.perf_counter() - start
    late = sum(t.num_rows for parts in runner.late.values() for t in parts)
    return {"seconds": seconds, "peak_state_rows": peak, "late_rows": late, "pairs": pairs(out),
            "output_rows": sum(t.num_rows for t in out)}


def run_spark(batches: list[dict[str, pa.Table]], work: Path, buckets: int) -> dict:
    import pyarrow.parquet as pq
    from pyspark.sql.types import StructType

    from changelake.spark.compile import compile_packed
    from changelake.spark.payloads import from_ipc
    from changelake.spark.query import ROCKSDB_PROVIDER
    from changelake.spark.reports import ReportChannel
    from changelake.spark.session import build_session

    streams_dir = {}
    for name in ("orders", "shipments"):
        d = streams_dir[name] = work / name
        d.mkdir(parents=True)
        for i, batch in enumerate(batches):
            path = d / f"part-{i:05d}.parquet"
            pq.write_table(batch[name], path)
            stamp = 1_700_000_000 + i                # read in batch order (the file source sorts by mtime)
            os.utime(path, (stamp, stamp))
    with PeakMemory() as mem:
        t = time.perf_counter()
        spark = build_session(app_name="bench-interval", master="local[2]", ui=False, conf={
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER, "spark.driver.memory": "4g"})
        startup = time.perf_counter() - t
        streams = {}
        for name, cols in (("orders", ORDERS), ("shipments", SHIPMENTS)):
            ddl = ", ".join(f"{c} {ty}" for c, ty in cols.items()) + ", _kind TINYINT, _seq STRING"
            streams[name] = spark.readStream.schema(StructType.fromDDL(ddl)).option("maxFilesPerTrigger", 1) \
                .parquet(str(streams_dir[name]))
        channel = ReportChannel(spark)
        plan = pipeline().plan()
        packed, names = compile_packed(plan, streams, buckets=buckets, channel=channel)
        out: list[pa.Table] = []
        peaks, late_rows = [0], [0]

        def collect(df, batch_id):
            rows = df.toArrow()
            for route, payload in zip(rows["_route"].to_pylist(), rows["payload"].to_pylist()):
                if names[route] == "shipped":
                    out.append(from_ipc(payload).select(["order_id", "ship_id"]))
            drained = channel.drain()       # as the service's foreachBatch does, after the batch's action
            peaks[0] = max(peaks[0], channel.state_totals().get("shipped", (0, 0))[0])
            late_rows[0] += sum(n for n, _ in drained.late.values())

        t = time.perf_counter()
        q = (packed.writeStream.foreachBatch(collect).option("checkpointLocation", str(work / "checkpoint"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        seconds = time.perf_counter() - t
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        spark.stop()
    return {"seconds": seconds, "session_start_s": startup, "peak_state_rows": peaks[0], "late_rows": late_rows[0],
            "pairs": pairs(out), "output_rows": sum(t.num_rows for t in out), "peak_mb": mem.total_mb}


# -- the benchmark ------------------------------------------------------------------------------------
def run(events: int = 1_000_000, quick: bool = False, *, keys: int | None = None, batch: int | None = None,
        buckets: int = 32, engines: tuple[str, ...] = ("local", "spark")) -> dict:
    """Generate, run each engine, check against DuckDB; returns the figures (also printed)."""
    if quick:
        events = min(events, 20_000)
    keys = keys or max(1, events // 10)
    batch = batch or max(1, events // (4 if quick else 10))
    load = os.getloadavg()
    print(f"interval join benchmark: {events:,} events, {keys:,} keys, micro-batches of {batch:,}; "
          f"{machine()}; load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    t = time.perf_counter()
    batches = generate(events, keys, batch)
    want, want_late = oracle(batches)
    print(f"generated {len(batches)} micro-batches and the DuckDB oracle in {time.perf_counter() - t:.1f}s: "
          f"{len(want):,} joined pairs, {want_late:,} late rows", flush=True)
    figures = {"events": events, "keys": keys, "batch": batch, "batches": len(batches), "load": load,
               "machine": machine(), "expected_pairs": int(len(want)), "expected_late_rows": want_late}
    work = Path(tempfile.mkdtemp(prefix="bench-interval-"))
    try:
        for engine in engines:
            if engine == "local":
                result = run_local(batches)
            elif engine == "spark":
                result = run_spark(batches, work / "spark", buckets)
            else:
                raise SystemExit(f"unknown engine {engine!r}; use local and/or spark")
            got = result.pop("pairs")
            result["agrees"] = bool(np.array_equal(got, want)) and result["late_rows"] == want_late
            result["events_per_s"] = events / result["seconds"]
            figures[engine] = result
            extra = (f", session start {result['session_start_s']:.1f}s, peak memory {result['peak_mb']:,.0f} MB"
                     if engine == "spark" else "")
            print(f"{engine}: {events:,} events in {result['seconds']:.1f}s -> {result['events_per_s']:,.0f} "
                  f"events/s; peak state {result['peak_state_rows']:,} rows; {result['output_rows']:,} joined, "
                  f"{result['late_rows']:,} late; equal to DuckDB: {result['agrees']}{extra}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| engine | events | seconds | events/s | peak state rows | equal to DuckDB |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for engine in engines:
        r = figures[engine]
        print(f"| {engine} | {events:,} | {r['seconds']:.1f} | {r['events_per_s']:,.0f} | {r['peak_state_rows']:,} "
              f"| {r['agrees']} |")
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=None, help="join keys (default: events / 10)")
    ap.add_argument("--batch", type=int, default=None, help="events per micro-batch (default: events / 10)")
    ap.add_argument("--buckets", type=int, default=32, help="state buckets of the join on Spark")
    ap.add_argument("--engines", default="local,spark")
    ap.add_argument("--quick", action="store_true", help="20k events in 4 micro-batches")
    args = ap.parse_args()
    figures = run(args.events, args.quick, keys=args.keys, batch=args.batch, buckets=args.buckets,
                  engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()))
    if not all(figures[e]["agrees"] for e in ("local", "spark") if e in figures):
        raise SystemExit("a result differs from DuckDB")


if __name__ == "__main__":
    main()
