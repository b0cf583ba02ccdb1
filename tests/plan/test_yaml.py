"""The operator graph in the service YAML: views and tables[].from."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.service.views import pipeline_from_config
from changelake.service.cli import main
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

SHOP = """
pipeline: {id: shop, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - name: orders
    topics: [shop.orders]
    columns: {order_id: bigint, product_id: bigint, qty: int}
    primary_key: [order_id]
  - name: products
    topics: [shop.products]
    columns: {id: bigint, category: string, price: bigint}
    table: products
views:
  - name: enriched
    join: {left: orders, right: products, on: {product_id: id}, how: inner}
  - name: by_category
    from: enriched
    group_by: [category]
    aggregates: {orders: "count(*)", revenue: "sum(price)"}
  - name: top2
    from: by_category
    top_n: {n: 2, order_by: [revenue desc], rank_column: rnk}
tables:
  - {name: products, primary_key: [id]}
  - {name: category_sales, from: by_category, primary_key: [category]}
  - {name: top_categories, from: top2, primary_key: [rnk]}
"""


def test_yaml_graph_plans_like_the_same_python_graph():
    config = parse_config(SHOP, environ={})
    plan = pipeline_from_config(config).plan()
    assert [n.id for n in plan.sinks] == ["sink_category_sales", "sink_top_categories"]
    assert plan["enriched"].op == "join" and plan["by_category"].upsert_key == ("category",)
    assert plan["top2"].schema.names == ["category", "orders", "revenue", "rnk"]
    # products mirrors into its table and feeds the join; its key comes from its table
    assert plan["normalize_products"].state_keys == (("id",),)


def test_a_config_without_views_has_no_graph():
    text = """
pipeline: {id: p, checkpoint: /tmp/c}
kafka: {bootstrap_servers: "k:9092"}
sources: [{name: p, topics: [t], table: products}]
tables: [{name: products, primary_key: [id]}]
"""
    assert pipeline_from_config(parse_config(text, environ={})) is None


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("from: enriched\n", "from: nowhere\n"), "reads 'nowhere', which is neither a source"),
    (lambda t: t.replace("    top_n:", "    filter: 'revenue > 0'\n    top_n:"), "exactly one of"),
    (lambda t: t.replace("{name: top_categories, from: top2, primary_key: [rnk]}",
                         "{name: top_categories, primary_key: [rnk]}"), "'top_categories' has no writer"),
    (lambda t: t.replace("    primary_key: [order_id]\n", "    primary_key: [order_id]\n    table: category_sales\n"),
     "is also the table of source"),
    (lambda t: t.replace("  - {name: category_sales, from: by_category, primary_key: [category]}\n", "")
                .replace("  - name: top2", "  - name: by_category_2\n    from: by_category\n    filter: 'orders > 0'\n"
                                           "  - name: top2"),
     "by_category_2"),
])
def test_graph_mistakes_name_the_view_and_the_fix(edit, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(edit(SHOP), environ={})


def test_source_read_by_a_view_must_declare_columns():
    text = SHOP.replace("    columns: {order_id: bigint, product_id: bigint, qty: int}\n", "")
    with pytest.raises(ConfigError, match="source 'orders' feeds views .* must declare its columns"):
        pipeline_from_config(parse_config(text, environ={}))


def test_cli_validate_plans_and_explain_prints_the_graph(tmp_path, capsys):
    path = tmp_path / "shop.yaml"
    path.write_text(SHOP)
    assert main(["validate", "-c", str(path)]) == 0
    assert "3 view(s)" in capsys.readouterr().out
    assert main(["explain", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Sink(table=[products]" in out                                  # the mirror
    assert "Sink(name=[sink_category_sales], table=[category_sales]" in out
    assert "Rank(name=[top2], strategy=[retract], rankRange=[1..2]" in out
    path.write_text(SHOP.replace("sum(price)", "sum(category)"))
    assert main(["validate", "-c", str(path)]) == 2
    assert "SUM(category) needs a numeric column" in capsys.readouterr().err


def test_state_ttl_and_stale_policy_reach_the_kernels_and_explain():
    text = SHOP.replace("pipeline: {id: shop, checkpoint: /tmp/ckpt}",
                        "pipeline: {id: shop, checkpoint: /tmp/ckpt, state_ttl: 1 day}")
    text = text.replace("    aggregates: {orders:", "    state_ttl: 2 hours\n    on_stale_retraction: fail\n"
                                                     "    aggregates: {orders:")
    plan = pipeline_from_config(parse_config(text, environ={})).plan()
    agg = plan["by_category"].config
    assert (agg.state_ttl_ms, agg.on_stale_retraction) == (7_200_000, "fail")
    join = plan["enriched"].config
    assert (join.left_state_ttl_ms, join.right_state_ttl_ms, join.on_stale_retraction) == (86_400_000,) * 2 + ("warn",)
    assert plan["normalize_orders"].config.state_ttl_ms == 86_400_000
    from changelake.plan.explain import explain_plan
    assert "stateTtl=[7200000 ms]" in explain_plan(plan)
    with pytest.raises(ConfigError, match="views.1.state_ttl"):
        parse_config(text.replace("2 hours", "soon"), environ={})
