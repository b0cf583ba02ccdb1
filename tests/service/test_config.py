from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.service.config import load_config, parse_config

pytestmark = pytest.mark.unit

GOOD = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092", properties: {sasl.password: "${KAFKA_PW}"}}
sources: [{name: p, topics: [a.b.products], table: products}]
tables: [{name: products, primary_key: [id]}]
"""


def test_every_error_is_reported_with_its_path():
    bad = """
pipeline: {id: "has space", checkpoint: /tmp/c, trigger_interval: soon}
kafka: {bootstrap_servers: "x:1"}
sources: [{name: s, format: avro, table: missing, topics: [t]}]
tables: [{name: t, primary_key: []}]
"""
    with pytest.raises(ConfigError) as info:
        parse_config(bad, environ={})
    text = str(info.value)
    for path in ("pipeline.id", "pipeline.trigger_interval", "sources.0.format", "tables.0.primary_key"):
        assert path in text
    assert "error(s)" in text


def test_a_source_must_write_to_a_declared_table():
    with pytest.raises(ConfigError, match="not under 'tables'"):
        parse_config(GOOD.replace("table: products}", "table: nope}"), environ={"KAFKA_PW": "x"})


def test_env_references_overrides_and_secret_files(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = parse_config(GOOD, environ={"KAFKA_PW": "hunter2",
                                      "CHANGELAKE_KAFKA__BOOTSTRAP_SERVERS": "broker:9093",
                                      "CHANGELAKE_PIPELINE__MAX_RECORDS_PER_BATCH": "500"})
    assert cfg.kafka.plain_properties() == {"sasl.password": "hunter2"}
    assert cfg.kafka.bootstrap_servers == "broker:9093"
    assert cfg.pipeline.max_records_per_batch == 500
    from_file = parse_config(GOOD.replace('sasl.password: "${KAFKA_PW}"', f"sasl.password_file: {secret}"),
                             environ={})
    assert from_file.kafka.plain_properties() == {"sasl.password": "from-file"}
    env_secret = parse_config(GOOD, environ={"KAFKA_PW": "a", "CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD": "b"})
    assert env_secret.kafka.plain_properties()["sasl.password"] == "b"


def test_secrets_are_hidden_in_the_log_safe_dump():
    cfg = parse_config(GOOD, environ={"KAFKA_PW": "hunter2"})
    assert "hunter2" not in repr(cfg.redacted()) and "hunter2" not in repr(cfg)


def test_a_missing_environment_variable_is_an_error_not_an_empty_secret():
    with pytest.raises(ConfigError, match="KAFKA_PW is not set"):
        parse_config(GOOD, environ={})


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the pipeline file"):
        load_config(tmp_path / "nope.yaml")


def test_dead_letter_topic_per_source_overrides_the_global_one_and_primary_key_is_optional():
    two = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: a, topics: [a], table: a}
  - {name: b, topics: [b], table: b, dead_letter_topic: b.dlq}
tables: [{name: a}, {name: b, primary_key: [id]}]
"""
    cfg = parse_config(two, environ={})
    assert cfg.dead_letter_topic("a") is None and cfg.dead_letter_topic("b") == "b.dlq"
    assert cfg.table("a").primary_key is None and cfg.table("b").primary_key == ["id"]
    cfg = parse_config(two + "dead_letter: {topic: all.dlq}\n", environ={})
    assert cfg.dead_letter_topic("a") == "all.dlq" and cfg.dead_letter_topic("b") == "b.dlq"


GRAPH = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [o], columns: {id: bigint, product_id: bigint, qty: int}, primary_key: [id]}
  - {name: products, topics: [p], columns: {id: bigint, price: double}, primary_key: [id]}
views:
  - {name: big, from: orders, filter: "qty > 10"}
  - {name: j, join: {left: orders, right: products, on: {product_id: id}}}
  - {name: s, from: big, select: {a: "qty"}}
tables:
  - {name: t1, from: s, primary_key: [a]}
  - {name: t2, from: j, primary_key: [id]}
"""


def _validate(tmp_path, text: str, environ: dict[str, str] | None = None) -> list[str]:
    """What ``changelake validate`` lists: the configuration's problems, then the graph's."""
    from changelake.service.config import check_config
    from changelake.service.views import graph_problems

    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    config, problems, origins = check_config(path, environ=environ or {})
    if config is not None:
        problems += [origins.problem(loc, message) for loc, message in graph_problems(config)]
    return problems


def test_validate_lists_every_planner_error_with_its_path_in_one_run(tmp_path):
    assert _validate(tmp_path, GRAPH) == []
    bad = GRAPH.replace("qty > 10", "nope > 10").replace("{product_id: id}", "{product_idx: id}")
    problems = _validate(tmp_path, bad)
    assert len(problems) == 2, problems
    assert problems[0].startswith("views.0.filter: filter 'big'") and "nope" in problems[0]
    assert problems[0].endswith(f"[{tmp_path / 'pipeline.yaml'}:8]")
    assert problems[1].startswith("views.1.join:") and "product_idx" in problems[1]
    assert problems[1].endswith(":9]")
    # the select behind the broken filter is not reported again; a table of a broken view is not either


def test_unknown_keys_get_a_did_you_mean_and_the_line_they_are_on(tmp_path):
    problems = _validate(tmp_path, GRAPH.replace("primary_key: [id]}\n  - {name: products", "primary_key: [id], "
                                                 "formt: canal-json}\n  - {name: products")
                         .replace("pipeline: {id: inv,", "pipeline: {id: inv, trigger_intervall: 1s,"))
    assert any(p.startswith("pipeline.trigger_intervall: unknown key 'trigger_intervall'; did you mean "
                            "'trigger_interval'?") and p.endswith(":2]") for p in problems), problems
    assert any(p.startswith("sources.0.formt: unknown key 'formt'; did you mean 'format'?") and p.endswith(":5]")
               for p in problems), problems


def test_duplicate_names_are_rejected_in_every_section(tmp_path):
    twice = GRAPH.replace("  - {name: products, topics: [p]", "  - {name: orders, topics: [p]")
    problems = _validate(tmp_path, twice)
    assert any(p.startswith("sources.1.name: sources names must be unique; 'orders' is also sources.0")
               for p in problems), problems
    views = GRAPH.replace("{name: s, from: big", "{name: big, from: big")
    assert any(p.startswith("views.2.name: views names must be unique; 'big' is also views.0")
               for p in _validate(tmp_path, views))
    tables = GRAPH.replace("{name: t2, from: j", "{name: t1, from: j")
    assert any(p.startswith("tables.1.name: tables names must be unique") for p in _validate(tmp_path, tables))
    with pytest.raises(ConfigError, match="sources names must be unique"):
        parse_config(twice, environ={})


def test_reference_errors_are_all_listed_with_their_paths(tmp_path):
    problems = _validate(tmp_path, GRAPH.replace("from: s,", "from: ss,").replace("left: orders", "left: order"))
    assert any(p.startswith("views.1.join.left: view 'j' reads 'order'") and "did you mean 'orders'" in p
               for p in problems), problems
    assert any(p.startswith("tables.0.from: table 't1' reads from 'ss'") and "did you mean 's'" in p
               for p in problems), problems


def test_environment_overrides_reach_list_items_by_name_or_index(tmp_path):
    cfg = parse_config(GRAPH, environ={"CHANGELAKE_SOURCES__products__FORMAT": "canal-json",
                                       "CHANGELAKE_SOURCES__0__TOPICS": "[o1, o2]",
                                       "CHANGELAKE_TABLES__t1__PATH": "s3://lake/t1"})
    assert cfg.sources[1].format == "canal-json"
    assert cfg.sources[0].topics == ["o1", "o2"]
    assert cfg.table_path("t1") == "s3://lake/t1"


@pytest.mark.parametrize("variable, value, expected", [
    ("CHANGELAKE_SOURCES__0__FORMAT", "bogus",
     "sources.0.format: Input should be 'debezium-json'"),
    ("CHANGELAKE_SOURCES__7__FORMAT", "canal-json", "sources has 2 item(s), so there is no index 7"),
    ("CHANGELAKE_SOURCES__prods__FORMAT", "canal-json", "no item of sources is named 'prods'; did you mean 'products'?"),
    ("CHANGELAKE_SOURCES__orders__FORMATT", "canal-json", "sources.0.formatt: unknown key 'formatt'"),
    ("CHANGELAKE_PIPELIN__ID", "x", "no configuration section 'pipelin'; did you mean 'pipeline'?"),
    ("CHANGELAKE_LOOKUPS__0__PATH", "x", "the file has no 'lookups' list"),
])
def test_an_environment_override_that_names_nothing_fails_loudly(tmp_path, variable, value, expected):
    problems = _validate(tmp_path, GRAPH, {variable: value})
    assert any(expected in p for p in problems), problems
    if problems[0].startswith("sources.0."):
        assert problems[0].endswith(f"[environment variable {variable}]")


def test_a_value_from_a_reference_or_a_secret_file_says_so(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("x")
    problems = _validate(tmp_path, GRAPH.replace("qty > 10", "${PREDICATE}"), {"PREDICATE": "nope > 1"})
    assert any(p.startswith("views.0.filter:") and "[environment variable PREDICATE, referenced at " in p
               for p in problems), problems
    problems = _validate(tmp_path, GRAPH.replace('kafka: {bootstrap_servers: "localhost:9092"}',
                                                 f'kafka: {{bootstrap_servers: "localhost:9092"}}\n'
                                                 f'metrics: {{port_file: {secret}}}'))
    assert any(p.startswith("metrics.port:") and f"[secret file {secret} (" in p for p in problems), problems


_SEQUENCE_BY = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: a, topics: [a], table: a, columns: {id: bigint, updated_at: timestamp, note: string}, sequence_by: SEQ}
tables: [{name: a, primary_key: [id]}]
"""


@pytest.mark.parametrize("sequence_by, wanted", [
    ("source", None), ("kafka", None), ("{column: updated_at}", None),
    ("{column: updated}", "sources.0.sequence_by.column: source 'a': sequence_by names column 'updated', which is not "
                          "among its columns"),
    ("{column: note}", "sources.0.sequence_by.column: source 'a': sequence_by column 'note' is string; it must be"),
])
def test_validate_checks_the_sequence_by_column(tmp_path, sequence_by, wanted):
    problems = _validate(tmp_path, _SEQUENCE_BY.replace("SEQ", sequence_by))
    if wanted is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(wanted), problems
        assert "updated_at" in problems[0] or "kafka" in problems[0]
