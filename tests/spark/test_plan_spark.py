"""The Spark executor of a physical plan computes what the in-process LocalRunner computes.

One streaming query (file sources, one parquet file per source and micro-batch, foreachBatch,
availableNow) runs normalize -> filter -> join -> aggregate -> top-n plus a materialized sink:
six stateful nodes in four transformWithStateInPandas operators chained in one query, one per level
of the graph, each node once although two of them have two consumers each (the executed plan is
counted). Every sink table, folded as
the Delta sink folds it (latest change per key, -U ignored), must equal the LocalRunner's;
the aggregate's changes must equal it per key and in order.
"""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ, RowKind
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.pipeline import graph_sink_changes
from changelake.spark.compile import compile_packed
from changelake.spark.payloads import from_ipc
from changelake.spark.reports import ReportChannel

from .conftest import run_to_end, write_micro_batch

pytestmark = pytest.mark.spark

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "bigint"}
PRODUCTS = {"id": "bigint", "category": "string", "price": "bigint"}
K = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}

# three micro-batches per source: (kind, row); a re-delivered change (no-op after normalize),
# an order moving to another product, a product moving to another category, deletes, a re-insert
PRODUCT_BATCHES = [
    [("+I", (1, "tools", 10)), ("+I", (2, "garden", 20)), ("+I", (3, "tools", 5)), ("+I", (4, "toys", 7))],
    [("-U", (1, "tools", 10)), ("+U", (1, "toys", 11)), ("-D", (4, "toys", 7)), ("+I", (4, "toys", 7)),
     ("+I", (2, "garden", 20))],
    [("-U", (3, "tools", 5)), ("+U", (3, "garden", 6)), ("-D", (2, "garden", 20)), ("+I", (5, "auto", 1))],
]
ORDER_BATCHES = [
    [("+I", (10, 1, 2)), ("+I", (11, 2, 1)), ("+I", (12, 3, 4)), ("+I", (13, 3, 0)), ("+I", (14, 4, 3))],
    [("-U", (10, 1, 2)), ("+U", (10, 2, 5)), ("+I", (15, 1, 1)), ("-D", (11, 2, 1)), ("+I", (16, 4, 2)),
     ("+I", (12, 3, 4))],
    [("-U", (12, 3, 4)), ("+U", (12, 5, 4)), ("+I", (17, 3, 9)), ("-D", (14, 4, 3)), ("+I", (11, 1, 6))],
]


def shop() -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    products = p.source("products", columns=PRODUCTS, primary_key=["id"])
    enriched = orders.filter("qty > 0").join(products, on={"product_id": "id"}, name="enriched")
    by_category = enriched.group_by("category").agg(orders="count(*)", qty="sum(qty)", name="by_category")
    by_category.to_table("category_sales", primary_key=["category"])
    by_category.top_n(2, order_by=["qty desc", "category"], rank_column="rnk", name="top2") \
        .to_table("top_categories", primary_key=["rnk"])
    enriched.select(["order_id", "product_id", "category", "qty"]) \
        .to_table("lines_by_product", primary_key=["product_id", "order_id"])
    return p


def _batch(columns: dict[str, str], rows, batch_no: int) -> pa.Table:
    from changelake.types import arrow_schema

    schema = arrow_schema(columns)
    data = {name: pa.array([r[i] for _, r in rows], schema.field(name).type) for i, name in enumerate(columns)}
    data[KIND] = pa.array([K[k] for k, _ in rows], pa.int8())
    data[SEQ] = pa.array([f"{batch_no:04d}-{i:06d}" for i in range(len(rows))], pa.string())
    return pa.table(data)


def fold(changes: list[tuple[int, dict]], key: list[str]) -> dict:
    """What the Delta sink holds after applying ``changes`` (from sink_changes) in order: -U ignored,
    latest per key."""
    table: dict = {}
    for kind, row in changes:
        k = tuple(row[c] for c in key)
        if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            table[k] = row
        elif kind == RowKind.DELETE:
            table.pop(k, None)
    return table


def keys(plan) -> dict[str, list[str]]:
    return {n.table: list(n.primary_key) for n in plan.sinks}


def local_changes(plan, runner: LocalRunner) -> dict[str, list[tuple[int, dict]]]:
    out = collections.defaultdict(list)
    for i, (orders, products) in enumerate(zip(ORDER_BATCHES, PRODUCT_BATCHES)):
        step = runner.step({"orders": _batch(ORDERS, orders, i), "products": _batch(PRODUCTS, products, i)})
        for table, changes in step.items():
            for row in sink_changes(changes, primary_key=keys(plan)[table], batch_id=i).to_pylist():
                row.pop(SEQ)
                out[table].append((row.pop(KIND), row))
    return out


def spark_changes(spark, tmp_path, plan, channel, operators: list | None = None
                  ) -> tuple[dict[str, list[tuple[int, dict]]], list]:
    """Each table's changes and the batch ids, running ``plan`` on Spark; with ``operators``, the number
    of transformWithStateInPandas operators in the last batch's executed plan is appended to it."""
    from pyspark.sql.types import StructType

    dirs = {name: tmp_path / name for name in ("orders", "products")}
    for name, batches, columns in (("orders", ORDER_BATCHES, ORDERS), ("products", PRODUCT_BATCHES, PRODUCTS)):
        dirs[name].mkdir()
        for i, rows in enumerate(batches):
            write_micro_batch(_batch(columns, rows, i), dirs[name], i)

    def stream(name, columns):
        ddl = ", ".join(f"{c} {t}" for c, t in columns.items()) + ", _kind TINYINT, _seq STRING"
        return spark.readStream.schema(StructType.fromDDL(ddl)).option("maxFilesPerTrigger", 1) \
            .parquet(str(dirs[name]))

    packed, names = compile_packed(plan, {"orders": stream("orders", ORDERS), "products": stream("products", PRODUCTS)},
                                   buckets=3, channel=channel)
    out = collections.defaultdict(list)
    actions = []

    def collect(df, batch_id):
        got = df.toArrow()                 # the batch's only action
        if channel is not None:
            channel.drain()
        actions.append(batch_id)
        per_table = collections.defaultdict(list)
        for route, payload in zip(got["_route"].to_pylist(), got["payload"].to_pylist()):
            per_table[names[route]].append(from_ipc(payload))
        for table, parts in per_table.items():
            # what the service does: order by the graph's _seq (positions), then sink_changes
            changes = graph_sink_changes(pa.concat_tables(parts), primary_key=keys(plan)[table], batch_id=batch_id)
            for row in changes.to_pylist():
                row.pop(SEQ)
                out[table].append((row.pop(KIND), row))

    q = run_to_end(packed, collect, tmp_path / "ckpt")
    assert len([p for p in q.recentProgress if p["numInputRows"]]) == 3, "expected one micro-batch per file"
    if operators is not None:
        operators.append(stateful_operators(q))
    return out, actions


def levels(plan) -> int:
    """How many stateful operators the chain runs ``plan`` in on a new checkpoint: one per level of the
    graph (which nodes share one: tests/spark/test_chain_stages.py)."""
    from changelake.spark.chain import Chain
    from changelake.spark.groups import GroupLayout

    return len(Chain.of(plan, 3, 3, True, GroupLayout(2)).stages)


def stateful_operators(query) -> int:
    """How many transformWithStateInPandas operators the executed plan of ``query``'s last batch holds."""
    return query._jsq.streamingQuery().lastExecution().executedPlan().toString().count("TransformWithStateInPySpark")


def test_spark_executor_equals_local_runner(rocksdb, tmp_path):
    plan = shop().plan()
    assert [n.op for n in plan].count("materialize") == 1
    runner = LocalRunner(plan)
    want = local_changes(plan, runner)
    channel = ReportChannel(rocksdb)
    operators: list[int] = []
    got, actions = spark_changes(rocksdb, tmp_path, plan, channel, operators)
    assert actions == [0, 1, 2]
    # enriched and by_category have two consumers each; every stateful node still runs once per batch:
    # 6 stateful nodes on 4 levels, one operator per level (docs/state-design.md, "Running a plan on Spark")
    assert sum(n.stateful for n in plan) == 6 and operators == [levels(plan)] == [4]
    for table, key in keys(plan).items():
        assert fold(got[table], key) == fold(want[table], key), table
        assert fold(want[table], key), f"{table}: the input should leave rows in it"
    # one aggregate bucket holds all of a category's rows: its changes match per key and in order
    per_key = collections.defaultdict(lambda: collections.defaultdict(list))
    for who, changes in (("spark", got), ("local", want)):
        for kind, row in changes["category_sales"]:
            per_key[who][row["category"]].append((kind, row))
    assert per_key["spark"] == per_key["local"]
    # the state sizes reported from the Python workers add up to the one-kernel state of each node
    rows = {node: r for node, (r, _) in channel.state_totals().items()}
    assert rows == {node: k.state_rows for node, k in runner.kernels.items()}
    assert all(b > 0 for r, b in channel.state_totals().values() if r)
    # state survived from batch to batch: product 1 moved to toys in batch 1, order 10 left it
    assert fold(got["category_sales"], ["category"])[("toys",)]["orders"] == 3
