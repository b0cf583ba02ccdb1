"""Flink's debezium-json decoder expectations (shared/conformance/formats/debezium-json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelake.errors import ConfigError
from changelake.formats import make_decoder
from changelake.formats.sqltypes import sql_schema
from tests.formats import conformance as cf

FORMAT = "debezium-json"
pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", cf.case_params(FORMAT))
def test_case(path: Path) -> None:
    case = cf.load(path)
    if not case.get("expected_error"):
        cf.run_case(FORMAT, path)
        return
    # Flink raises; changelake turns the message into a dead letter that says what to fix
    values = cf.input_values(case, path.parent)
    decoder = make_decoder(FORMAT, columns=sql_schema(case["schema"]), options=case["options"])
    result = decoder.decode(cf.raw_records(values))
    first = result.dead_letters.slice(0, 1).to_pylist()[0]
    assert first["offset"] == case["expected_error"]["first_failing_line_derived"] - 1
    assert first["reason"] == "missing-before"
    assert "set REPLICA IDENTITY FULL on the table, or declare the source as upsert" in first["error"]
    assert first["value"] == values[first["offset"]]
    # every message is accounted for: rows, dead letter or nothing
    decoded = set(result.rows.column("_offset").to_pylist())
    dead = set(result.dead_letters.column("offset").to_pylist())
    assert not decoded & dead
    assert decoded | dead == set(range(len(values)))


def test_options_all() -> None:
    spec = cf.options_cases(FORMAT)
    decoder = make_decoder(FORMAT, options=spec["all_options"])
    for name, value in spec["all_options_result"]["decoder"].items():
        assert getattr(decoder, name) == value, name


def test_options_schema_include() -> None:
    spec = cf.options_cases(FORMAT)
    change = spec["schema_include_true"]
    decoder = make_decoder(FORMAT, options={**spec["all_options"], **change["options_change"]})
    for name, value in change["decoder"].items():
        assert getattr(decoder, name) == value, name


@pytest.mark.parametrize("index", range(3))
def test_options_invalid(index: int) -> None:
    spec = cf.options_cases(FORMAT)
    bad = spec["invalid_values"][index]
    with pytest.raises(ConfigError) as err:
        make_decoder(FORMAT, options={**spec["all_options"], bad["option"]: bad["value"]})
    assert bad["error_contains"] in str(err.value)
