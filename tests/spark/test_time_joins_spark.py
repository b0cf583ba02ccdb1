"""On Spark, the interval and the temporal join compute what the in-process LocalRunner computes.

Three micro-batches (one parquet file per source and batch) through one streaming query with
both joins, 3 state buckets: every bucket must reach the same watermark from the heartbeats
although most keys live in one bucket, outer rows must be padded when their window closes
(also in buckets that got no row of the batch), and late rows must come out through the
report channel, counted per side and, with late_rows: dead_letter, as rows.
"""

from __future__ import annotations

import collections
import json

import pyarrow as pa
import pytest

from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.pipeline import graph_sink_changes
from changelake.spark.compile import compile_packed
from changelake.spark.payloads import from_ipc
from changelake.spark.reports import ReportChannel

from .conftest import run_to_end, write_micro_batch
from .test_plan_spark import _batch, fold

pytestmark = pytest.mark.spark

ORDERS = {"order_id": "bigint", "currency": "string", "amount": "bigint", "ts": "bigint"}
SHIPS = {"ship_id": "bigint", "order_id": "bigint", "sts": "bigint"}
RATES = {"currency": "string", "rate": "bigint", "rts": "bigint"}

ORDER_BATCHES = [
    [("+I", (1, "EUR", 10, 1000)), ("+I", (2, "USD", 20, 1500)), ("+I", (3, "EUR", 30, 2000)),
     ("+I", (4, "GBP", 40, 2500))],
    [("+I", (5, "USD", 50, 6000)), ("+I", (6, "EUR", 60, 900)), ("+I", (7, "EUR", 70, 7000))],   # 6 is late
    [("+I", (8, "USD", 80, 20000)), ("+I", (9, "GBP", 90, 21000))],
]
SHIP_BATCHES = [
    [("+I", (100, 1, 1200)), ("+I", (101, 3, 5500)), ("+I", (102, 4, 2400))],
    [("+I", (103, 2, 2600)), ("+I", (104, 5, 6100)), ("+I", (105, 9, 100))],                     # 105 is late
    [("+I", (106, 7, 7500)), ("+I", (107, 8, 25000))],
]
RATE_BATCHES = [
    [("+I", ("EUR", 2, 0)), ("+I", ("USD", 3, 0)), ("+I", ("GBP", 5, 1800))],
    [("-U", ("EUR", 2, 0)), ("+U", ("EUR", 4, 1900)), ("-D", ("GBP", 5, 4000))],
    [("-U", ("USD", 3, 0)), ("+U", ("USD", 6, 8000)), ("+I", ("GBP", 7, 19000))],
]
BATCHES = {"orders": (ORDERS, ORDER_BATCHES), "ships": (SHIPS, SHIP_BATCHES), "rates": (RATES, RATE_BATCHES)}


def pipeline() -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, append_only=True, event_time="ts", watermark_delay="1 second")
    ships = p.source("ships", columns=SHIPS, append_only=True, event_time="sts")
    rates = p.source("rates", columns=RATES, primary_key=["currency"], event_time="rts")
    orders.interval_join(ships, on=["order_id"], before="3 seconds", after="0 seconds", how="full",
                         late_rows="dead_letter", name="shipped") \
        .select({"order_id": "coalesce(order_id, ships_order_id)", "ship_id": "coalesce(ship_id, -1)",
                 "amount": "amount", "sts": "sts"}) \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    orders.temporal_join(rates, on=["currency"], how="left", name="priced") \
        .to_table("priced", primary_key=["order_id"])
    return p


def test_time_joins_on_spark_equal_local_runner(rocksdb, tmp_path):
    from pyspark.sql.types import StructType

    plan = pipeline().plan()
    keys = {n.table: list(n.primary_key) for n in plan.sinks}
    runner = LocalRunner(plan)
    want = collections.defaultdict(list)
    for i in range(3):
        step = runner.step({name: _batch(cols, batches[i], i) for name, (cols, batches) in BATCHES.items()})
        for table, changes in step.items():
            want[table].extend(_pairs(sink_changes(changes, primary_key=keys[table], batch_id=i)))
    local_late = {node: pa.concat_tables(parts).to_pylist() for node, parts in runner.late.items()}

    streams = {}
    for name, (cols, batches) in BATCHES.items():
        (tmp_path / name).mkdir()
        for i, rows in enumerate(batches):
            write_micro_batch(_batch(cols, rows, i), tmp_path / name, i)
        ddl = ", ".join(f"{c} {t}" for c, t in cols.items()) + ", _kind TINYINT, _seq STRING"
        streams[name] = rocksdb.readStream.schema(StructType.fromDDL(ddl)).option("maxFilesPerTrigger", 1) \
            .parquet(str(tmp_path / name))
    channel = ReportChannel(rocksdb)
    packed, names = compile_packed(plan, streams, buckets=3, channel=channel)
    got = collections.defaultdict(list)
    late_per_batch = []

    def collect(df, batch_id):
        rows = df.toArrow()
        late_per_batch.append(channel.drain().late)
        parts = collections.defaultdict(list)
        for route, payload in zip(rows["_route"].to_pylist(), rows["payload"].to_pylist()):
            parts[names[route]].append(from_ipc(payload))
        for table, tables in parts.items():
            got[table].extend(_pairs(graph_sink_changes(pa.concat_tables(tables), primary_key=keys[table],
                                                        batch_id=batch_id)))

    run_to_end(packed, collect, tmp_path / "ckpt")

    for table, key in keys.items():
        assert fold(got[table], key) == fold(want[table], key), table
    shipped = fold(want["shipped"], keys["shipped"])
    # order 1 met ship 100; ship 101 (5.5 s) is 3.5 s after order 3 (2 s): both padded; order 6 was late
    assert (1, 100) in shipped and (3, -1) in shipped and (3, 101) in shipped and not any(k[0] == 6 for k in shipped)
    priced = fold(want["priced"], keys["priced"])
    assert priced[(3,)]["rate"] == 4 and priced[(1,)]["rate"] == 2 and priced[(4,)]["rate"] == 5
    # the late rows: order 6 and ship 105, once each, in the batch that brought them
    counts = collections.Counter()
    for report in late_per_batch:
        for (node, side), (n, rows) in report.items():
            counts[(node, side)] += n
            if node == "shipped":
                assert [json.loads(r)["order_id" if side == "left" else "ship_id"] for r in rows] == \
                    ([6] if side == "left" else [105])
            else:
                assert rows == [], "priced drops its late rows: they are counted, not shipped"
    assert counts == {("shipped", "left"): 1, ("shipped", "right"): 1, ("priced", "left"): 1}
    assert {node: len(rows) for node, rows in local_late.items()} == {"shipped": 2, "priced": 1}


def _pairs(changes: pa.Table) -> list[tuple[int, dict]]:
    out = []
    for row in changes.to_pylist():
        row.pop("_seq")
        out.append((row.pop("_kind"), row))
    return out
