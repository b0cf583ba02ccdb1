"""``tables[].history`` / ``track_history`` in the YAML: what the config accepts and refuses."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

BASE = """
pipeline: {id: h, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: customers, topics: [db.crm.customers], format: debezium-json, table: customers%s}
tables:
  - {name: customers, primary_key: [id]%s}
"""


def test_a_history_table_with_tracked_columns_is_accepted():
    config = parse_config(BASE % ("", ", history: scd2, track_history: [tier]"), environ={})
    assert config.table("customers").history == "scd2"
    assert config.table("customers").track_history == ["tier"]


def test_track_history_without_history_is_refused():
    with pytest.raises(ConfigError, match="add history: scd2"):
        parse_config(BASE % ("", ", track_history: [tier]"), environ={})


def test_a_history_table_refuses_a_source_that_applies_truncates():
    with pytest.raises(ConfigError, match="does not apply truncates"):
        parse_config(BASE % (", on_truncate: apply", ", history: scd2"), environ={})


def test_an_unknown_history_kind_is_refused():
    with pytest.raises(ConfigError, match="history"):
        parse_config(BASE % ("", ", history: scd3"), environ={})


def test_the_docs_pipelines_md_history_example_validates_and_plans():
    import re
    from pathlib import Path

    from changelake.service.views import pipeline_from_config

    doc = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    section = doc[doc.index("## History tables"):doc.index("## Truncates and views")]
    text = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL) if lang == "yaml")
    config = parse_config("pipeline: {id: h, checkpoint: /tmp/c}\nkafka: {bootstrap_servers: 'k:9092'}\n" + text,
                          environ={})
    assert {t.name: (t.history, t.track_history) for t in config.tables} == {
        "customers": ("scd2", ["tier", "email"]), "category_history": ("scd2", None)}
    assert [n.table for n in pipeline_from_config(config).plan().sinks] == ["category_history"]
