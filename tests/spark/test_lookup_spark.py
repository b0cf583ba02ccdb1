"""The Spark executor of a lookup join computes what the in-process LocalRunner computes, and the
lookup figures counted in the Python workers reach the driver's registry.

Orders (three micro-batches of a file stream) are looked up in a Delta dimension: a left lookup
join into a table keyed by the order, and an inner lookup join feeding an aggregate.
"""

from __future__ import annotations

import collections
import datetime

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake import metrics
from changelake.changelog import KIND, SEQ
from changelake.plan import CacheOptions, Lookup, Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.pipeline import graph_sink_changes
from changelake.spark.compile import compile_packed
from changelake.spark.payloads import from_ipc
from changelake.spark.reports import ReportChannel

from .conftest import run_to_end, write_micro_batch
from .test_plan_spark import _batch, fold

pytestmark = pytest.mark.spark

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "bigint"}
ORDER_BATCHES = [
    [("+I", (10, 1, 2)), ("+I", (11, 2, 1)), ("+I", (12, 3, 4)), ("+I", (13, 9, 1)), ("+I", (14, None, 3))],
    [("-U", (10, 1, 2)), ("+U", (10, 2, 5)), ("+I", (15, 1, 1)), ("-D", (11, 2, 1)), ("+I", (16, 4, 2))],
    [("-U", (12, 3, 4)), ("+U", (12, 9, 4)), ("+I", (17, 3, 9)), ("-D", (14, None, 3)), ("+I", (11, 1, 6))],
]


def shop(path: str) -> Pipeline:
    # a timestamp column: Spark's Arrow schemas need the session time zone for it
    products = Lookup.delta("products", path, columns={"id": "bigint", "category": "string", "since": "timestamp"},
                            key=["id"],
                            cache=CacheOptions(max_rows=100, ttl="1 hour"))
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    orders.lookup_join(products, on={"product_id": "id"}, how="left", name="lines") \
        .to_table("order_lines", primary_key=["order_id"])
    orders.lookup_join(products, on={"product_id": "id"}, name="matched") \
        .group_by("category").agg(orders="count(*)", qty="sum(qty)", name="by_category") \
        .to_table("category_sales", primary_key=["category"])
    return p


def test_spark_lookup_join_equals_local_runner_and_reports_to_the_driver(rocksdb, tmp_path):
    spark = rocksdb
    dim = str(tmp_path / "products")
    since = pa.array([datetime.datetime(2026, 1, d, tzinfo=datetime.timezone.utc) for d in (1, 2, 3, 4)],
                     pa.timestamp("us", tz="UTC"))
    write_deltalake(dim, pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()),
                                   "category": ["tools", "garden", "tools", "toys"], "since": since}))
    plan = shop(dim).plan()
    keys = {n.table: list(n.primary_key) for n in plan.sinks}

    def sample(result: str) -> float:
        return metrics.REGISTRY.get_sample_value("changelake_lookup_requests_total",
                                                 {"lookup": "products", "result": result}) or 0.0

    runner = LocalRunner(plan)
    want = collections.defaultdict(list)
    before = sample("hit") + sample("miss")
    for i, rows in enumerate(ORDER_BATCHES):
        for table, changes in runner.step({"orders": _batch(ORDERS, rows, i)}).items():
            for row in sink_changes(changes, primary_key=keys[table], batch_id=i).to_pylist():
                row.pop(SEQ)
                want[table].append((row.pop(KIND), row))
    runner.close()
    requests = sample("hit") + sample("miss") - before             # the in-process runner observes directly
    assert requests == 20                                           # distinct non-null keys per batch and node

    src = tmp_path / "orders"
    src.mkdir()
    for i, rows in enumerate(ORDER_BATCHES):
        write_micro_batch(_batch(ORDERS, rows, i), src, i)
    from pyspark.sql.types import StructType

    ddl = ", ".join(f"{c} {t}" for c, t in ORDERS.items()) + ", _kind TINYINT, _seq STRING"
    stream = spark.readStream.schema(StructType.fromDDL(ddl)).option("maxFilesPerTrigger", 1).parquet(str(src))
    channel = ReportChannel(spark)
    packed, names = compile_packed(plan, {"orders": stream}, buckets=3, channel=channel)
    got = collections.defaultdict(list)
    drained = []

    def collect(df, batch_id):
        out = df.toArrow()
        per_table = collections.defaultdict(list)
        for route, payload in zip(out["_route"].to_pylist(), out["payload"].to_pylist()):
            per_table[names[route]].append(from_ipc(payload))
        for table, parts in per_table.items():
            changes = graph_sink_changes(pa.concat_tables(parts), primary_key=keys[table], batch_id=batch_id)
            for row in changes.to_pylist():
                row.pop(SEQ)
                got[table].append((row.pop(KIND), row))
        drained.append(channel.drain().lookups)        # what the pipeline's query does after each batch

    before = sample("hit") + sample("miss")
    run_to_end(packed, collect, tmp_path / "ckpt")

    for table, key in keys.items():
        assert fold(got[table], key) == fold(want[table], key), table
    assert fold(want["order_lines"], ["order_id"])[(13,)]["category"] is None       # left: a missing product
    assert fold(want["category_sales"], ["category"])[("tools",)]["orders"] == 3     # 15, 17, 11

    # per batch, each distinct key of a partition is one request: the same totals as in-process
    per_batch = [d["products"] for d in drained if "products" in d]
    assert sum(s.hits + s.misses for s in per_batch) == requests
    assert sum(len(s.latencies) for s in per_batch) >= 1 and all(s.cache_rows > 0 for s in per_batch)
    assert sample("hit") + sample("miss") - before == requests
    assert metrics.REGISTRY.get_sample_value("changelake_lookup_cache_rows", {"lookup": "products"}) > 0
    assert metrics.REGISTRY.get_sample_value("changelake_lookup_latency_seconds_count", {"lookup": "products"}) >= 1
