"""The planner: upsert keys, changelog modes, -U only where needed, inserted operators, errors."""

from __future__ import annotations

import pytest

from changelake.changelog import RowKind
from changelake.errors import ConfigError
from changelake.operators import Deduplicate, GroupAggregate, SinkUpsertMaterializer
from changelake.plan import Pipeline

pytestmark = pytest.mark.unit

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int", "status": "string"}
PRODUCTS = {"id": "bigint", "category": "string", "price": "bigint"}


def shop(normalize: bool | None = None):
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"], normalize=normalize)
    products = p.source("products", columns=PRODUCTS, primary_key=["id"], normalize=normalize)
    return p, orders, products


def kinds(node) -> set[str]:
    return {k.short for k in node.mode.kinds}


def test_aggregate_into_a_table_keyed_by_the_group_key_emits_no_update_before():
    p, orders, _ = shop()
    orders.group_by("status").agg(n="count(*)", qty="sum(qty)").to_table("by_status", primary_key=["status"])
    plan = p.plan()
    agg = plan["aggregate_orders"]
    assert agg.op == "aggregate" and agg.upsert_key == ("status",)
    assert agg.config.generate_update_before is False
    assert kinds(agg) == {"+I", "+U", "-D"}
    assert [n.op for n in plan] == ["source", "normalize", "aggregate", "sink"]
    assert not any(n.op == "materialize" for n in plan)
    # the normalize feeds an aggregate, which must retract: it keeps -U
    assert plan["normalize_orders"].config.generate_update_before is True
    assert plan["normalize_orders"].drop_update_before


def test_a_second_consumer_that_retracts_keeps_update_before_on_the_shared_node():
    p, orders, _ = shop()
    agg = orders.group_by("status").agg(n="count(*)")
    agg.to_table("by_status", primary_key=["status"])
    agg.group_by("n").agg(statuses="count(*)").to_table("histogram", primary_key=["n"])
    plan = p.plan()
    assert plan["aggregate_orders"].config.generate_update_before is True
    assert RowKind.UPDATE_BEFORE in plan["aggregate_orders"].mode.kinds


def test_materializer_inserted_only_when_the_table_key_is_not_the_upsert_key():
    p, orders, _ = shop()
    shipments = p.source("shipments", columns={"order_id": "bigint", "carrier": "string"}, primary_key=["order_id"])
    shipped = orders.join(shipments, on=["order_id"])
    shipped.to_table("by_order", primary_key=["order_id"])
    shipped.to_table("by_carrier", primary_key=["carrier"])
    plan = p.plan()
    assert plan["join_orders_shipments"].upsert_key == ("order_id",)   # one shipment per order, same key
    assert plan["sink_by_order"].inputs == ("join_orders_shipments",)
    mat = plan["materialize_by_carrier"]
    assert plan["sink_by_carrier"].inputs == (mat.id,)
    assert mat.kernel is SinkUpsertMaterializer and mat.state_keys == (("carrier",),)
    assert mat.config.keys == (plan["join_orders_shipments"].schema.get_field_index("carrier"),)
    assert mat.config.upsert_key == (0,)
    assert "order_id" in mat.note and "carrier" in mat.note


def test_a_join_on_a_column_outside_the_unique_key_loses_the_upsert_key():
    # an order moving to another product is retracted under one join key and added under another:
    # the two may reach the sink in either order, so the table keyed by order_id is materialized
    p, orders, products = shop()
    orders.join(products, on={"product_id": "id"}).to_table("enriched", primary_key=["order_id"])
    plan = p.plan()
    assert plan["join_orders_products"].upsert_key is None
    assert plan["sink_enriched"].inputs == ("materialize_enriched",)
    assert "no upsert key" in plan["materialize_enriched"].note


def test_join_state_layouts_follow_the_unique_keys():
    p, orders, products = shop()
    orders.join(products, on={"product_id": "id"}).to_table("t", primary_key=["order_id"])
    cfg = p.plan()["join_orders_products"].config
    assert cfg.left_input.layout == "has_unique_key" and cfg.left_input.unique_key == (0,)
    assert cfg.right_input.layout == "join_key_contains_unique_key"
    p2 = Pipeline()
    events = p2.source("events", columns={"user": "string", "v": "int"}, normalize=False)
    users = p2.source("users", columns={"user": "string", "name": "string"}, primary_key=["user"])
    events.join(users, on=["user"], how="left").to_table("t", primary_key=["user"])
    plan2 = p2.plan()
    node = plan2["join_events_users"]
    assert node.config.left_input.layout == "no_unique_key" and node.upsert_key is None
    assert node.schema.names == ["user", "v", "users_user", "name"]      # the clash renamed
    assert plan2["sink_t"].inputs == ("materialize_t",)


def test_insert_only_input_keeps_first_row_and_emits_only_inserts():
    p = Pipeline()
    clicks = p.source("clicks", columns={"id": "bigint", "url": "string"}, normalize=False)
    firsts = clicks.filter("url IS NOT NULL").deduplicate(["id"], keep="first")
    firsts.to_table("first_clicks", primary_key=["id"])
    with pytest.raises(ConfigError, match="carries updates and deletes"):
        p.plan()     # a CDC source is not insert-only: keep-first cannot apply its deletes
    p2 = Pipeline()
    orders = p2.source("orders", columns=ORDERS, primary_key=["order_id"])
    latest = orders.deduplicate(["status"], keep="last")
    latest.to_table("t", primary_key=["status"])
    node = p2.plan()["deduplicate_orders"]
    assert node.kernel is Deduplicate and node.config.input_insert_only is False
    assert kinds(node) == {"+I", "+U", "-D"}


def test_top_n_with_rank_column_is_keyed_by_partition_and_rank():
    p, orders, _ = shop()
    sales = orders.group_by("status").agg(qty="sum(qty)")
    sales.top_n(2, order_by=["qty desc"], rank_column="rnk").to_table("top", primary_key=["rnk"])
    plan = p.plan()
    rank = plan["rank_aggregate_orders"]
    assert rank.upsert_key == ("rnk",) and rank.schema.names == ["status", "qty", "rnk"]
    assert rank.config.strategy == "retract" and rank.config.rank_end == 2
    assert rank.config.generate_update_before is False     # the sink is keyed by rnk: +U suffices
    assert plan["aggregate_orders"].config.generate_update_before is True   # the retract Top-N needs -U
    assert plan["sink_top"].inputs == ("rank_aggregate_orders",)


def test_projection_that_drops_the_key_needs_update_before_and_loses_the_upsert_key():
    p, orders, _ = shop()
    agg = orders.group_by("status").agg(qty="sum(qty)")
    agg.select({"status": "status", "double_qty": "qty * 2"}).to_table("keyed", primary_key=["status"])
    agg.select({"q": "qty"}).to_table("unkeyed", primary_key=["q"])
    plan = p.plan()
    keyed = plan["project_aggregate_orders"]
    assert keyed.upsert_key == ("status",) and str(keyed.schema.field("double_qty").type) == "int64"
    assert plan["project_aggregate_orders_2"].upsert_key is None
    assert plan["aggregate_orders"].config.generate_update_before is True
    assert plan["sink_unkeyed"].inputs == ("materialize_unkeyed",)


@pytest.mark.parametrize("build, message", [
    (lambda o, pr: o.group_by("nope").agg(n="count(*)"), r"group_by names column\(s\) \['nope'\]"),
    (lambda o, pr: o.group_by("status").agg(n="median(qty)"), "cannot read 'median\\(qty\\)'"),
    (lambda o, pr: o.group_by("status").agg(n="sum(status)"), "needs a numeric column"),
    (lambda o, pr: o.filter("nope > 1"), "filter 'filter_orders': cannot evaluate"),
    (lambda o, pr: o.filter("qty +"), "filter 'filter_orders': 'qty \\+' is not Spark SQL: Spark's parser rejects it"),
    (lambda o, pr: o.filter("qty + 1"), "not a boolean condition"),
    (lambda o, pr: o.join(pr, on={"status": "id"}), "key status is string on the left but id is int64"),
    (lambda o, pr: o.top_n(0, order_by=["qty"]), "n must be an integer >= 1"),
    (lambda o, pr: o.top_n(3, order_by=["qty sideways"]), "cannot read the sort key"),
    (lambda o, pr: o.select({"_x": "qty"}), "not start with '_'"),
])
def test_mistakes_are_reported_with_what_to_fix(build, message):
    p, orders, products = shop()
    with pytest.raises(ConfigError, match=message):
        build(orders, products).to_table("t", primary_key=["order_id"])
        p.plan()


def test_a_graph_without_a_table_and_duplicate_names_are_rejected():
    p, orders, _ = shop()
    orders.group_by("status").agg(n="count(*)", name="agg")
    with pytest.raises(ConfigError, match="writes no table"):
        p.plan()
    with pytest.raises(ConfigError, match="two nodes are named 'agg'"):
        orders.group_by("status").agg(n="count(*)", name="agg")


def test_explain_prints_each_table_tree_with_modes_keys_and_state():
    p, orders, products = shop()
    sales = orders.join(products, on={"product_id": "id"}).group_by("category").agg(revenue="sum(price)")
    sales.to_table("sales", primary_key=["category"])
    text = p.explain()
    lines = text.splitlines()
    assert lines[0].startswith("Sink(name=[sink_sales], table=[sales], primaryKey=[category], nullableKey=[category]) "
                               "changelogMode=[+I,+U,-D]")   # products.category may be NULL: one group
    assert lines[1].startswith("+- GroupAggregate(name=[aggregate_join_orders_products], groupBy=[category]")
    assert "changelogMode=[+I,+U,-D] upsertKey=[category]" in lines[1]
    assert "SUM(price) AS revenue" in lines[1]
    assert lines[2].startswith("   +- Join(") and "joinType=[INNER]" in lines[2] and "(product_id = id)" in lines[2]
    assert lines[3].startswith("      :- ChangelogNormalize(name=[normalize_orders], dropsInput=[-U])")
    assert lines[4].startswith("      :  +- Source(name=[orders]")
    assert lines[6].startswith("         +- Source(name=[products]")


def test_aggregate_uses_the_kernel_modes_it_declares():
    p, orders, _ = shop(normalize=False)
    orders.group_by("status").agg(lo="min(qty)", hi="max(qty)", avg="avg(qty)").to_table("t", primary_key=["status"])
    node = p.plan()["aggregate_orders"]
    assert node.kernel is GroupAggregate
    assert [str(f.type) for f in node.schema] == ["string", "int32", "int32", "int64"]
    assert p.plan()["aggregate_orders"].inputs == ("orders",)      # no normalize when switched off


def test_with_state_sets_ttl_and_policy_of_one_node_and_is_refused_where_there_is_no_state():
    from changelake.plan.graph import StateOptions

    p = Pipeline(state=StateOptions(ttl="10 minutes"))
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    agg = orders.group_by("status").agg(n="count(*)").with_state(ttl="1 hour", on_stale_retraction="fail")
    agg.to_table("t", primary_key=["status"])
    plan = p.plan()
    assert (plan["aggregate_orders"].config.state_ttl_ms, plan["aggregate_orders"].config.on_stale_retraction) == \
        (3_600_000, "fail")
    assert plan["normalize_orders"].config.state_ttl_ms == 600_000
    with pytest.raises(ConfigError, match="keeps no state"):
        orders.filter("qty > 1").with_state(ttl="1 hour")
    with pytest.raises(ConfigError, match="is not a duration"):
        StateOptions(ttl="a while")


def test_filters_and_projections_evaluate_timestamps_in_utc_whatever_the_machine_zone():
    """DuckDB's session zone defaulted to the machine's: on a machine in New York the in-process runner
    cast 2024-01-01 00:30 UTC to the date 2023-12-31 (Spark, whose session is UTC, to 2024-01-01),
    and a projected TIMESTAMP came back as timestamp[us, tz=America/New_York]."""
    import os
    import subprocess
    import sys

    code = (
        "import datetime as dt, pyarrow as pa\n"
        "from changelake.plan import sql\n"
        "utc = dt.timezone.utc\n"
        "t = pa.table({'ts': pa.array([dt.datetime(2024, 1, 1, 0, 30, tzinfo=utc)], pa.timestamp('us', tz='UTC')),"
        " '_kind': pa.array([0], pa.int8())})\n"
        "p = [('ts', 'ts'), ('d', 'CAST(ts AS DATE)'), ('h', 'hour(ts)')]\n"
        "schema = sql.project_schema('p', t.schema.remove(1), p)\n"
        "out = sql.apply_project(t, p, schema)\n"
        "kept = sql.apply_filter(t, \"CAST(ts AS DATE) = DATE '2024-01-01'\")\n"
        "print(schema.field('ts').type.tz, out['d'][0], out['h'][0], kept.num_rows)\n")
    env = {**os.environ, "TZ": "America/New_York"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.split() == ["UTC", "2024-01-01", "0", "1"]
