"""Two-level Top-N (``top_n(..., two_level=K)``): the planner's rewrite, its keys and modes, explain, YAML."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.plan import Pipeline
from changelake.plan.graph import StateOptions
from changelake.service.views import pipeline_from_config
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int", "status": "string"}


def shop(two_level: int | None, *, partition_by=(), rank_column=None, table_key=None, primary_key=("order_id",),
         state: StateOptions | None = None) -> Pipeline:
    p = Pipeline(state=state)
    orders = p.source("orders", columns=ORDERS, primary_key=list(primary_key) if primary_key else None)
    top = orders.top_n(3, order_by=["qty desc", "order_id"], partition_by=partition_by, rank_column=rank_column,
                       two_level=two_level, name="top")
    top.to_table("t", primary_key=table_key or ([*partition_by, rank_column] if rank_column else ["order_id"]))
    return p


def test_two_level_plans_bucket_local_candidates_and_the_merge_under_the_users_name():
    plan = shop(4, partition_by=["status"], rank_column="rnk").plan()
    assert [(n.id, n.op) for n in plan] == [
        ("orders", "source"), ("normalize_orders", "normalize"), ("top_bucket", "project"), ("top_local", "rank"),
        ("top_candidates", "project"), ("top", "rank"), ("sink_t", "sink")]
    bucket, local, candidates, top = plan["top_bucket"], plan["top_local"], plan["top_candidates"], plan["top"]
    assert bucket.schema.names == [*ORDERS, "topn_bucket"] and str(bucket.schema.field("topn_bucket").type) == "int32"
    assert "hash(`order_id`)" in dict(bucket.projections)["topn_bucket"] and "% 4" in dict(bucket.projections)["topn_bucket"]
    # level 1: partition + bucket, the same n and order, no rank number, -U for the retracting merge
    assert local.state_keys == (("status", "topn_bucket"),)
    assert local.config.rank_end == 3 and local.config.output_rank_number is False
    assert local.config.strategy == "retract" and local.config.generate_update_before is True
    assert local.config.sort_keys == top.config.sort_keys
    # the bucket column is gone before the merge; level 2 carries the user's rank column
    assert candidates.schema.names == list(ORDERS)
    assert top.state_keys == (("status",),) and top.config.output_rank_number is True
    assert top.config.strategy == "retract"


@pytest.mark.parametrize("partition_by, rank_column, table_key, primary_key", [
    ((), None, None, ("order_id",)),             # global Top-N keyed by the row key
    ((), "rnk", None, ("order_id",)),            # global Top-N keyed by rank
    (("status",), None, None, ("order_id",)),    # partition outside the key: no upsert key, a materializer
    (("status",), "rnk", None, ("order_id",)),
    (("order_id",), None, None, ("order_id",)),  # partition inside the key: the key carries over
    ((), None, ["order_id"], None),              # input without a key: the whole row is hashed
    (("status",), "rnk", ["status"], ("order_id",)),   # table keyed by something else
])
def test_the_final_node_has_the_single_level_schema_key_and_mode(partition_by, rank_column, table_key, primary_key):
    single = shop(None, partition_by=partition_by, rank_column=rank_column, table_key=table_key,
                  primary_key=primary_key).plan()
    double = shop(3, partition_by=partition_by, rank_column=rank_column, table_key=table_key,
                  primary_key=primary_key).plan()
    a, b = single["top"], double["top"]
    assert b.schema == a.schema and b.upsert_key == a.upsert_key and b.mode == a.mode
    assert b.config.generate_update_before == a.config.generate_update_before
    assert b.state_keys == a.state_keys and b.config.output_rank_number == a.config.output_rank_number
    # the sinks behave the same: the same materializer (or none) in front of the same table
    assert [n.op for n in single if n.id.startswith(("materialize", "sink"))] == \
        [n.op for n in double if n.id.startswith(("materialize", "sink"))]
    assert single["sink_t"].mode == double["sink_t"].mode
    if primary_key is None:
        assert "hash(`order_id`, `product_id`, `qty`, `status`)" in dict(double["top_bucket"].projections)["topn_bucket"]


def test_a_user_column_named_like_the_bucket_or_a_keyword_is_kept_apart():
    p = Pipeline()
    s = p.source("s", columns={"id": "bigint", "topn_bucket": "int", "order": "bigint"}, primary_key=["id"])
    s.top_n(2, order_by=["order desc"], two_level=2, name="top").to_table("t", primary_key=["id"])
    plan = p.plan()
    assert plan["top_bucket"].schema.names == ["id", "topn_bucket", "order", "topn_bucket_"]
    assert plan["top_local"].state_keys == (("topn_bucket_",),)
    assert plan["top"].schema.names == ["id", "topn_bucket", "order"]


@pytest.mark.parametrize("k", [1, 0, True, 2.5, "4"])
def test_two_level_must_be_an_integer_of_at_least_two(k):
    p = Pipeline()
    s = p.source("s", columns={"id": "bigint"}, primary_key=["id"])
    with pytest.raises(ConfigError, match="two_level must be an integer >= 2"):
        s.top_n(2, order_by=["id"], two_level=k)


def test_a_view_named_like_a_level_the_planner_adds_is_refused():
    p = shop(2)
    p.stream("orders").filter("qty > 0", name="top_local").to_table("u", primary_key=["order_id"])
    with pytest.raises(ConfigError, match="two plan nodes are named 'top_local'.*rename the view"):
        p.plan()


def test_explain_shows_both_levels_with_why_their_state_and_ttl():
    text = shop(4, partition_by=["status"], rank_column="rnk", state=StateOptions(ttl="1 hour")).explain()
    lines = text.splitlines()
    assert lines[1].startswith("+- Rank(name=[top], strategy=[retract], rankRange=[1..3], partitionBy=[status], "
                               "rankNumber=[True])")
    assert "state=[['status'] -> candidate rows (at most 4 x 3), sorted by qty DESC, order_id ASC" in lines[1]
    assert "stateTtl=[3600000 ms]" in lines[1] and "two-level Top-N level 2 of 2 (two_level: 4)" in lines[1]
    assert lines[2].startswith("   +- Calc(name=[top_candidates], select=[order_id, product_id, qty, status])")
    assert "drops topn_bucket before the merge" in lines[2]
    assert lines[3].startswith("      +- Rank(name=[top_local], strategy=[retract], rankRange=[1..3], "
                               "partitionBy=[status, topn_bucket], rankNumber=[False])")
    assert "state=[['status', 'topn_bucket'] -> every row of the bucket" in lines[3]
    assert "stateTtl=[3600000 ms]" in lines[3] and "a bucket's state goes with its last row" in lines[3]
    assert lines[4].startswith("         +- Calc(name=[top_bucket], select=[order_id, product_id, qty, status, "
                               "CAST(((hash(`order_id`) % 4) + 4) % 4 AS INT) AS topn_bucket])")
    assert "hash of the row key ['order_id'] mod 4" in lines[4]


YAML = """
pipeline: {id: shop, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - name: orders
    topics: [shop.orders]
    columns: {order_id: bigint, product_id: bigint, qty: int}
    primary_key: [order_id]
views:
  - name: top_orders
    from: orders
    top_n: {n: 10, order_by: [qty desc, order_id], rank_column: rnk, two_level: TWO_LEVEL}
tables:
  - {name: top_orders, from: top_orders, primary_key: [rnk]}
"""


def test_yaml_two_level_plans_like_python():
    plan = pipeline_from_config(parse_config(YAML.replace("TWO_LEVEL", "8"), environ={})).plan()
    assert [n.id for n in plan if n.op == "rank"] == ["top_orders_local", "top_orders"]
    assert plan["top_orders_local"].state_keys == (("topn_bucket",),)
    assert "% 8" in dict(plan["top_orders_bucket"].projections)["topn_bucket"]
    assert plan["top_orders"].schema.names == ["order_id", "product_id", "qty", "rnk"]
    single = pipeline_from_config(parse_config(YAML.replace(", two_level: TWO_LEVEL", ""), environ={})).plan()
    assert [n.id for n in single if n.op == "rank"] == ["top_orders"]


def test_yaml_two_level_below_two_is_reported_with_its_path():
    with pytest.raises(ConfigError, match=r"views\.0\.top_n\.two_level"):
        parse_config(YAML.replace("TWO_LEVEL", "1"), environ={})


def test_the_docs_section_examples_plan_and_explain_as_shown():
    import re
    from pathlib import Path

    from changelake.plan.explain import explain_plan

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    section = doc[doc.index("## Two-level Top-N"):]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL)
    view = next(body for lang, body in blocks if lang == "yaml")
    code = next(body for lang, body in blocks if lang == "python")
    shown = next(body for lang, body in blocks if lang == "" and body.startswith("Sink("))
    scope: dict = {}
    exec(compile(code.replace("print(p.explain())", ""), "docs/pipelines.md", "exec"), scope)
    assert explain_plan(scope["p"].plan()).strip().splitlines() == shown.strip().splitlines()
    text = f"""
pipeline: {{id: docs, checkpoint: /tmp/ckpt}}
kafka: {{bootstrap_servers: "localhost:9092"}}
sources:
  - {{name: shop_sales, topics: [shop.sales], columns: {{shop_id: bigint, shop_name: string, sales: bigint}},
     primary_key: [shop_id]}}
views:
{view}tables:
  - {{name: top_shops, from: top10, primary_key: [rownum]}}
"""
    plan = pipeline_from_config(parse_config(text, environ={})).plan()
    assert explain_plan(plan).strip().splitlines() == shown.strip().splitlines()
