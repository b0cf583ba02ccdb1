"""The examples in docs/pipelines.md are the code's behaviour: they parse, plan and explain as shown."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from changelake.plan.explain import explain_plan
from changelake.service.views import pipeline_from_config
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

DOC = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.DOTALL)
HEADER = """
pipeline: {id: docs, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
"""


def test_the_yaml_example_validates_and_plans():
    yaml_text = next(body for lang, body in BLOCKS if lang == "yaml" and "views:" in body)
    plan = pipeline_from_config(parse_config(HEADER + yaml_text, environ={})).plan()
    assert {n.table for n in plan.sinks} == {"category_sales", "top_categories"}


def test_the_python_example_prints_the_explain_shown():
    code = next(body for lang, body in BLOCKS if lang == "python")
    shown = next(body for lang, body in BLOCKS if lang == "" and body.startswith("Sink("))
    scope: dict = {}
    exec(compile(code.replace("print(p.explain())", ""), "docs/pipelines.md", "exec"), scope)
    printed = explain_plan(scope["p"].plan())
    assert shown.strip().splitlines() == printed.strip().splitlines()[:len(shown.strip().splitlines())]


def test_the_readme_pipeline_example_validates_and_plans():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    text = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", readme, flags=re.DOTALL)
                if lang == "yaml" and "pipeline:" in body)
    config = parse_config(text, environ={"KAFKA_PASSWORD": "secret"})
    plan = pipeline_from_config(config).plan()
    assert [n.table for n in plan.sinks] == ["category_totals"]
    assert [s.table for s in config.sources] == ["products"]       # the mirror stays outside the graph


def test_the_time_bounded_join_examples_plan_as_described():
    start = DOC.index("## Time-bounded joins")
    end = DOC.find("\n## ", start + 1)
    section = DOC[start:] if end < 0 else DOC[start:end]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL)
    code = "\n".join(body for lang, body in blocks if lang == "python")
    scope: dict = {}
    exec(compile("from changelake.plan import Pipeline\n" + code, "docs/pipelines.md", "exec"), scope)
    scope["priced"].to_table("priced_orders", primary_key=["order_id"])
    plan = scope["p"].plan()
    assert plan["shipped"].config.before_ms == 4 * 3_600_000 and plan["shipped"].late_rows == "dead_letter"
    assert plan["priced"].op == "temporal_join"
    yamls = [body for lang, body in blocks if lang == "yaml"]
    sources = yamls[0].replace("sources:\n", "").rstrip() + """
  - {name: shipments, topics: [s], columns: {ship_id: bigint, order_id: bigint, ship_time: timestamp},
     append_only: true, event_time: ship_time}
  - {name: rates, topics: [r], columns: {currency: string, rate: double, rate_time: timestamp},
     primary_key: [currency], event_time: rate_time}
"""
    views = "views:\n" + "".join(y.replace("views:\n", "") for y in yamls[1:])
    config = parse_config(HEADER + "sources:\n" + sources + views + """tables:
  - {name: shipped_orders, from: shipped, primary_key: [order_id, ship_id]}
  - {name: priced_orders, from: priced, primary_key: [order_id]}
""", environ={})
    plan = pipeline_from_config(config).plan()
    assert plan["shipped"].time_columns == ("order_time", "ship_time") and plan["priced"].config.join_type == "LEFT"


def test_the_lookup_join_examples_plan_and_explain_as_shown():
    yaml_text = next(body for lang, body in BLOCKS if lang == "yaml" and "lookups:" in body)
    config = parse_config(HEADER + yaml_text, environ={})
    plan = pipeline_from_config(config).plan()
    assert [n.op for n in plan if n.op == "lookup_join"] == ["lookup_join", "lookup_join"]
    code = next(body for lang, body in BLOCKS if lang == "python" and "lookup_join(" in body and "Lookup." in body)
    scope: dict = {}
    exec(compile(code, "docs/pipelines.md", "exec"), scope)
    printed = explain_plan(scope["p"].plan()).splitlines()
    shown = next(body for lang, body in BLOCKS if lang == "" and body.startswith("LookupJoin(")).strip()
    assert shown in [line.lstrip(" +-") for line in printed]
    assert plan["stocked"].schema.names == ["order_id", "product_id", "qty", "id", "category", "price", "sku",
                                            "on_hand"]


def test_the_starting_position_example_asks_for_the_moment_in_epoch_ms():
    import json

    from changelake.service.query_start import kafka_reader_options

    start = DOC.index("## Starting positions")
    section = DOC[start:DOC.index("\n## ", start + 1)]
    text = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL) if lang == "yaml")
    opts = kafka_reader_options(parse_config(HEADER + text, environ={}))
    assert json.loads(opts["startingOffsets"]) == {"shop.orders": {"timestamp": 1_793_491_200_000}}
