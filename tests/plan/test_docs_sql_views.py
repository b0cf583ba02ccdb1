"""docs/pipelines.md "Views in SQL": every SQL example plans to the explain of the step form shown next to it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from changelake.plan import Lookup, Pipeline
from changelake.service.config import parse_config
from changelake.service.views import pipeline_from_config

pytestmark = pytest.mark.unit

DOC = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
SECTION = DOC[DOC.index("## Views in SQL"):DOC.index("## What the planner decides")]
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", SECTION, flags=re.DOTALL)
PAIRS = [(body, BLOCKS[i + 1][1]) for i, (lang, body) in enumerate(BLOCKS[:-1])
         if lang == "sql" and BLOCKS[i + 1][0] == "python"]


def sources(sql: str) -> Pipeline:
    p = Pipeline()
    if "shipments" in sql or "rates" in sql:
        p.source("orders", columns={"order_id": "bigint", "currency": "string", "amount": "bigint",
                                    "order_time": "timestamp"}, append_only=True, event_time="order_time",
                 watermark_delay="5 seconds")
        p.source("shipments", columns={"ship_id": "bigint", "order_id": "bigint", "ship_time": "timestamp"},
                 append_only=True, event_time="ship_time")
        p.source("rates", columns={"currency": "string", "rate": "double", "rate_time": "timestamp"},
                 primary_key=["currency"], event_time="rate_time")
    else:
        p.source("orders", columns={"order_id": "bigint", "product_id": "bigint", "qty": "int", "status": "string"},
                 primary_key=["order_id"])
        p.source("products", columns={"id": "bigint", "category": "string", "price": "bigint"}, primary_key=["id"])
    return p


DIM = Lookup.delta("dim", "/lake/dim", columns={"id": "bigint", "label": "string"}, key=["id"])


def test_every_construct_has_an_example_pair():
    assert len(PAIRS) == 10


@pytest.mark.parametrize("sql, steps", PAIRS, ids=[s.split("\n")[0][:40] for s, _ in PAIRS])
def test_the_sql_example_explains_as_its_step_form(sql, steps):
    step = sources(sql)
    exec(compile(steps, "docs/pipelines.md", "exec"), {"p": step, "dim": DIM})
    sink = next(n for n in step.nodes.values() if n.op == "sink")
    written = sources(sql)
    written.sql("v", sql, lookups={"dim": DIM}).to_table("v", primary_key=sink.params["primary_key"])
    assert written.explain() == step.explain()


def test_the_yaml_example_plans():
    yaml_text = next(body for lang, body in BLOCKS if lang == "yaml")
    config = parse_config("""
pipeline: {id: docs, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [o], columns: {order_id: bigint, product_id: bigint, qty: int, status: string},
     primary_key: [order_id]}
  - {name: products, topics: [p], columns: {id: bigint, category: string, price: bigint}, primary_key: [id]}
""" + yaml_text, environ={})
    plan = pipeline_from_config(config).plan()
    assert [n.id for n in plan if n.id.startswith("by_category")] == [
        "by_category_join", "by_category_where", "by_category_pre", "by_category"]
    assert plan["by_category"].config.state_ttl_ms == 86_400_000
