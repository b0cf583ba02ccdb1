"""docs/configuration.md and the chart's pipeline schema are what the config model generates."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
import yaml

from changelake.service.config import ChangelakeConfig, parse_config
from changelake.service.config_reference import CHART_SCHEMA, DOC, _chart_schema_text, pipeline_schema, reference_markdown

pytestmark = pytest.mark.unit

REGENERATE = "stale: run `make config-reference` (python -m changelake.service.config_reference --write)"


def test_configuration_doc_is_current():
    assert DOC.read_text() == reference_markdown(), f"docs/configuration.md is {REGENERATE}"


def test_chart_schema_is_current():
    assert CHART_SCHEMA.read_text() == _chart_schema_text(), f"helm/changelake/values.schema.json is {REGENERATE}"


def test_check_mode_exits_zero_when_current():
    out = subprocess.run([sys.executable, "-m", "changelake.service.config_reference", "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_every_key_of_every_section_is_documented():
    doc = DOC.read_text()
    for name, field in ChangelakeConfig.model_fields.items():
        assert f"| `{name}` |" in doc
    from changelake.service.config_reference import _sections

    for path, model in _sections():
        assert f"\n## {path}\n" in doc
        section = doc.split(f"\n## {path}\n", 1)[1].split("\n## ", 1)[0]
        for name, field in model.model_fields.items():
            assert f"| `{field.alias or name}` |" in section, (path, name)


GOOD = yaml.safe_load("""
pipeline: {id: inv, checkpoint: /tmp/ckpt, max_records_per_batch: "${BATCH:-500}"}
kafka: {bootstrap_servers: "k:9092", properties: {sasl.password_file: /run/secrets/pw}}
sources:
  - {name: orders, topics: [o], columns: {id: bigint, ts: {type: timestamp, encoding: epoch-millis}},
     primary_key: [id], table: orders}
tables: [{name: orders, primary_key: [id]}]
metrics: {port_file: /run/port}
""")


def test_the_schema_takes_what_the_loader_takes_and_rejects_what_it_rejects():
    schema = pipeline_schema()
    jsonschema.validate(GOOD, schema)
    parse_config(yaml.safe_dump(GOOD).replace("port_file: /run/port", "port: 9108")
                 .replace("sasl.password_file: /run/secrets/pw", "sasl.password: x"), environ={})
    for broken, where in [
        ({"sources": [{**GOOD["sources"][0], "format": "bogus"}]}, "'bogus' is not one of"),
        ({"sources": [{**GOOD["sources"][0], "formt": "canal-json"}]}, "'formt' does not match any of the regexes"),
        ({"pipeline": {"id": "has space", "checkpoint": "/c"}}, "does not match"),
        ({"metrics": {"port": 70000}}, "70000"),
        ({"sources": []}, "should be non-empty"),
        ({"sources": [{**GOOD["sources"][0], "route": [{"table": "t"}]}]}, "'source_table' is a required property"),
    ]:
        with pytest.raises(jsonschema.ValidationError, match=where):
            jsonschema.validate({**GOOD, **broken}, schema)
    assert json.loads(CHART_SCHEMA.read_text())["properties"]["pipeline"] == schema
