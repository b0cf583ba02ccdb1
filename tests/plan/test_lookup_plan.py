"""The lookup join in the planner, `explain` and the pipeline YAML."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.plan import CacheOptions, Lookup, Pipeline
from changelake.service.views import pipeline_from_config
from changelake.service.cli import main
from changelake.service.config import parse_config
from changelake.service.explain import explain

pytestmark = pytest.mark.unit

ORDERS = {"order_id": "bigint", "product_id": "bigint", "qty": "int", "price": "bigint"}
PRODUCTS = Lookup.delta("products", "/lake/products", columns={"id": "bigint", "category": "string", "price": "bigint"},
                        key=["id"], cache=CacheOptions(max_rows=5000, ttl="1 minute"))


def pipeline(how: str = "inner", lookup: Lookup = PRODUCTS, **kw) -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    orders.lookup_join(lookup, on=kw.get("on", {"product_id": "id"}), how=how, name="enriched") \
        .to_table("lines", primary_key=kw.get("pk", ["order_id"]))
    return p


def test_the_output_is_stream_columns_then_dimension_columns_keyed_like_the_stream():
    plan = pipeline("left").plan()
    node = plan["enriched"]
    assert node.op == "lookup_join" and not node.stateful
    assert node.schema.names == ["order_id", "product_id", "qty", "price", "id", "category", "products_price"]
    assert node.upsert_key == ("order_id",)
    assert node.state_keys == (("product_id",),)
    assert "materialize_lines" not in plan.by_id                  # keyed by the stream's key: no materializer
    assert node.mode == plan["normalize_orders"].mode


def test_inner_needs_update_before_from_its_input_left_does_not():
    # an inner lookup join may drop a row's +U (its new key is missing): the -U must retract the old row
    assert "-U" in {k.short for k in pipeline("inner").plan()["normalize_orders"].mode.kinds}
    assert "-U" not in {k.short for k in pipeline("left").plan()["normalize_orders"].mode.kinds}


@pytest.mark.parametrize("kw, message", [
    ({"on": {"nope": "id"}}, "names column"),
    ({"on": {"product_id": "category"}}, r"exactly the key of lookup 'products' \['id'\]"),
    ({"on": {"qty": "id"}}, "qty is int32 on the stream but products.id is int64"),
])
def test_planner_errors_say_what_to_fix(kw, message):
    with pytest.raises(ConfigError, match=message):
        pipeline(**kw).plan()


def test_lookup_join_options_are_checked():
    p = Pipeline()
    s = p.source("orders", columns=ORDERS, primary_key=["order_id"])
    with pytest.raises(ConfigError, match="how must be one of"):
        s.lookup_join(PRODUCTS, on={"product_id": "id"}, how="full")
    with pytest.raises(ConfigError, match="keeps no state"):
        s.lookup_join(PRODUCTS, on={"product_id": "id"}, name="lj").with_state(ttl="1 day")
    with pytest.raises(ConfigError, match="key column"):
        Lookup.delta("x", "/p", columns={"id": "bigint"}, key=["other"])


def test_explain_shows_table_key_cache_and_that_it_holds_no_state():
    text = pipeline("left").explain()
    line = next(l for l in text.splitlines() if "LookupJoin(" in l)
    assert ("LookupJoin(name=[enriched], lookup=[products], table=[delta:/lake/products], key=[id], joinType=[LEFT], "
            "on=[product_id = products.id], batchSize=[10000], maxConcurrency=[1])") in line
    assert "state=[no state (cache: LRU 5000 rows, TTL 1 minute)]" in line
    assert "joined with the dimension's current row" in line


def test_explain_of_a_postgres_lookup_hides_credentials():
    lookup = Lookup.postgres("products", "postgresql://reader:s3cret@db:6543/shop", table="public.products",
                             columns={"id": "bigint", "category": "string"}, key=["id"],
                             cache=CacheOptions(max_rows=0))
    text = pipeline(lookup=lookup).explain()
    assert "table=[postgresql://db:6543/shop table public.products]" in text
    assert "state=[no state (cache: off)]" in text and "s3cret" not in text and "s3cret" not in repr(lookup)


YAML = """
pipeline: {id: shop, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
storage: {root: ROOT}
sources:
  - name: orders
    topics: [shop.orders]
    columns: {order_id: bigint, product_id: bigint, qty: int}
    primary_key: [order_id]
lookups:
  - name: products
    delta: {path: products}
    columns: {id: bigint, category: string}
    key: [id]
    cache: {max_rows: 1000, ttl: 30 seconds}
  - name: stock
    postgres: {url: "jdbc:postgresql://db:5432/shop", table: stock, user: reader, password_env: STOCK_PW}
    columns: {sku: bigint, on_hand: int}
    key: [sku]
    batch_size: 500
    max_concurrency: 2
views:
  - name: enriched
    from: orders
    lookup_join: {lookup: products, on: {product_id: id}, how: left}
  - name: stocked
    from: enriched
    lookup_join: {lookup: stock, on: {product_id: sku}}
tables:
  - {name: lines, from: stocked, primary_key: [order_id]}
"""


def test_yaml_lookups_plan_like_the_python_api(tmp_path):
    config = parse_config(YAML.replace("ROOT", str(tmp_path)), environ={})
    plan = pipeline_from_config(config).plan()
    enriched, stocked = plan["enriched"].config, plan["stocked"].config
    assert enriched.lookup.where() == f"delta:{tmp_path}/products" and enriched.join_type == "LEFT"
    assert enriched.lookup.cache == CacheOptions(max_rows=1000, ttl="30 seconds")
    assert (stocked.lookup.batch_size, stocked.lookup.max_concurrency, stocked.join_type) == (500, 2, "INNER")
    assert plan["stocked"].schema.names == ["order_id", "product_id", "qty", "id", "category", "sku", "on_hand"]
    text = explain(config)
    assert "LookupJoin(name=[stocked], lookup=[stock], table=[postgresql://db:5432/shop table stock]" in text


@pytest.mark.parametrize("change, message", [
    (("lookup: products, on", "lookup: prodcts, on"), "lookup_join names lookup 'prodcts', which is not under 'lookups'"),
    (("on: {product_id: id}", "on: {product_id: idd}"), "names column"),
    (("on: {product_id: id}", "on: {prod: id}"), r"names column\(s\) \['prod'\]"),
    (("key: [sku]", "key: [sk]"), r"key column\(s\) \['sk'\] are not under its columns"),
    (('"jdbc:postgresql://db:5432/shop"', '"jdbc:postgresql://r:pw@db:5432/shop"'), "password_env"),
    (("delta: {path: products}", "delta: {path: products}\n    postgres: {url: x, table: y}"), "exactly one of"),
])
def test_validate_names_unknown_lookups_and_columns(tmp_path, capsys, change, message):
    path = tmp_path / "p.yaml"
    path.write_text(YAML.replace("ROOT", str(tmp_path)).replace(*change))
    with pytest.raises(ConfigError, match=message):
        config = parse_config(path.read_text(), environ={})
        pipeline_from_config(config).plan()
    assert main(["validate", "-c", str(path)]) != 0


def test_cli_explain_prints_the_lookup_node(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(YAML.replace("ROOT", str(tmp_path)))
    assert main(["explain", "-c", str(path)]) == 0
    assert "state=[no state (cache: LRU 1000 rows, TTL 30 seconds)]" in capsys.readouterr().out
