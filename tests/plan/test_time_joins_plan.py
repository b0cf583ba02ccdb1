"""Planning the interval and temporal joins: inputs they accept, keys, modes, explain, YAML."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.plan import Pipeline
from changelake.service.views import pipeline_from_config
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

ORDERS = {"order_id": "bigint", "currency": "string", "amount": "bigint", "ts": "timestamp"}
SHIPS = {"ship_id": "bigint", "order_id": "bigint", "sts": "timestamp"}
RATES = {"currency": "string", "rate": "double", "rts": "timestamp"}


def shop(**orders_options) -> tuple[Pipeline, object, object, object]:
    p = Pipeline()
    options = {"append_only": True, "event_time": "ts", "watermark_delay": "5 seconds", **orders_options}
    orders = p.source("orders", columns=ORDERS, **options)
    ships = p.source("ships", columns=SHIPS, append_only=True, event_time="sts")
    rates = p.source("rates", columns=RATES, primary_key=["currency"], event_time="rts", watermark_delay="1 minute")
    return p, orders, ships, rates


def test_interval_join_is_insert_only_without_a_materializer_and_explains_its_cleanup():
    p, orders, ships, _ = shop()
    orders.interval_join(ships, on=["order_id"], before="1 hour", after="0 s", how="full", name="shipped") \
        .to_table("shipped", primary_key=["order_id", "ship_id"])
    plan = p.plan()
    assert [n.op for n in plan] == ["source", "source", "interval_join", "sink"]
    join = plan["shipped"]
    assert join.mode.is_insert_only and join.upsert_key is None
    assert join.time_columns == ("ts", "sts") and join.config.before_ms == 3_600_000 and join.config.after_ms == 0
    assert (join.config.left_delay_ms, join.config.right_delay_ms) == (5000, 0)
    assert join.schema.names == ["order_id", "currency", "amount", "ts", "ship_id", "ships_order_id", "sts"]
    assert all(f.nullable for f in join.schema)                       # full outer: both sides padded
    text = p.explain()
    assert "IntervalJoin(name=[shipped], joinType=[FULL], on=[order_id = order_id], time=[ts, sts])" in text
    assert "a left row is dropped once ts + 1 h < watermark" in text and "emitted null-padded" in text
    assert "watermark = min(ts - 5 s, sts - 0 ms)" in text and "SinkUpsertMaterializer" not in text


def test_temporal_join_reads_the_versions_without_normalize_and_drops_their_update_before():
    p, orders, _, rates = shop()
    orders.temporal_join(rates, on=["currency"], how="left", name="priced") \
        .select({"order_id": "order_id", "eur": "amount * rate", "ts": "ts"}).to_table("priced",
                                                                                      primary_key=["order_id"])
    plan = p.plan()
    assert [n.op for n in plan] == ["source", "source", "temporal_join", "project", "sink"]
    join = plan["priced"]
    assert join.inputs == ("orders", "rates") and join.drop_update_before and join.mode.is_insert_only
    text = p.explain()
    assert "TemporalJoin(name=[priced], joinType=[LEFT]" in text and "FOR SYSTEM_TIME AS OF ts" in text
    assert "ChangelogNormalize" not in text


def test_event_time_follows_filters_and_renaming_selects():
    p, orders, ships, _ = shop()
    renamed = orders.filter("amount > 0").select({"oid": "order_id", "at": "ts"})
    renamed.interval_join(ships, on={"oid": "order_id"}, before="1 minute", after="1 minute", name="j") \
        .to_table("j", primary_key=["oid", "ship_id"])
    assert p.plan()["j"].time_columns == ("at", "sts")


@pytest.mark.parametrize("build, message", [
    (lambda p, o, s, r: o.interval_join(r, on=["currency"], before="1 s", after="1 s"),
     "its right input 'normalize_rates' carries updates and deletes"),
    (lambda p, o, s, r: o.select(["order_id", "currency"]).interval_join(s, on=["order_id"], before="1 s",
                                                                        after="1 s"),
     "has no event time; declare the source's event_time"),
    (lambda p, o, s, r: o.interval_join(s, on=["order_id"], before="1 s", after="1 s", left_time="amount"),
     "left time column 'amount' is not an event-time column"),
    (lambda p, o, s, r: s.temporal_join(o, on=["order_id"]),
     "needs a primary key contained in the join key"),
    (lambda p, o, s, r: r.temporal_join(r, on=["currency"]),
     r"its fact \(left\) input .* carries updates"),
])
def test_mistakes_name_the_join_and_the_fix(build, message):
    p, orders, ships, rates = shop()
    with pytest.raises(ConfigError, match=message):
        build(p, orders, ships, rates).to_table("t", primary_key=["currency"])
        p.plan()


@pytest.mark.parametrize("kwargs, message", [
    ({"before": "-2 s", "after": "1 s"}, "the interval is empty"),
    ({"before": "soon", "after": "1 s"}, "before: 'soon' is not a duration"),
    ({"before": "1 s", "after": "1 s", "how": "semi"}, "how must be inner, left, right or full"),
    ({"before": "1 s", "after": "1 s", "late_rows": "keep"}, "late_rows must be one of"),
])
def test_interval_arguments_are_checked(kwargs, message):
    p, orders, ships, _ = shop()
    with pytest.raises(ConfigError, match=message):
        orders.interval_join(ships, on=["order_id"], **kwargs).to_table("t", primary_key=["order_id"])
        p.plan()


def test_source_event_time_must_be_a_time_column_and_delay_needs_it():
    p = Pipeline()
    with pytest.raises(ConfigError, match="event_time column 'currency' is string"):
        p.source("a", columns=ORDERS, event_time="currency")
    with pytest.raises(ConfigError, match="watermark_delay needs event_time"):
        p.source("b", columns=ORDERS, watermark_delay="1 s")


YAML = """
pipeline: {id: t, checkpoint: /tmp/ck}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [o], columns: {order_id: bigint, currency: string, ts: timestamp},
     append_only: true, event_time: ts, watermark_delay: 5 seconds}
  - {name: ships, topics: [s], columns: {ship_id: bigint, order_id: bigint, sts: timestamp},
     append_only: true, event_time: sts}
  - {name: rates, topics: [r], columns: {currency: string, rate: double, rts: timestamp},
     primary_key: [currency], event_time: rts}
views:
  - name: shipped
    interval_join: {left: orders, right: ships, on: {order_id: order_id}, before: 1 hour, after: 0 s, how: left,
                    late_rows: dead_letter}
  - name: priced
    temporal_join: {left: orders, right: rates, on: {currency: currency}, how: left}
tables:
  - {name: shipped, from: shipped, primary_key: [order_id, ship_id]}
  - {name: priced, from: priced, primary_key: [order_id]}
"""


def test_yaml_declares_both_joins_as_the_python_api_does():
    plan = pipeline_from_config(parse_config(YAML)).plan()
    shipped, priced = plan["shipped"], plan["priced"]
    assert shipped.op == "interval_join" and shipped.late_rows == "dead_letter"
    assert shipped.config.join_type == "LEFT" and shipped.config.left_delay_ms == 5000
    assert priced.op == "temporal_join" and priced.late_rows == "drop" and priced.time_columns == ("ts", "rts")


def test_yaml_rejects_an_outer_temporal_join_and_a_bad_delay():
    with pytest.raises(Exception, match="temporal_join.how"):
        parse_config(YAML.replace("on: {currency: currency}, how: left", "on: {currency: currency}, how: full"))
    with pytest.raises(Exception, match="watermark_delay"):
        parse_config(YAML.replace("watermark_delay: 5 seconds", "watermark_delay: later"))
