"""Flink's canal-json decoder expectations (shared/conformance/formats/canal-json)."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelake.errors import ConfigError
from changelake.formats import make_decoder
from tests.formats import conformance as cf

FORMAT = "canal-json"
pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", cf.case_params(FORMAT))
def test_case(path: Path) -> None:
    result = cf.run_case(FORMAT, path)
    case = cf.load(path)
    if case.get("input_file") and case.get("input_lines") != "first line only":
        # the DDL (CREATE) messages are skipped and counted, never silently dropped
        lines = (path.parent / case["input_file"]).read_text().splitlines()
        ddl = sum('"type":"CREATE"' in line for line in lines)
        assert result.skipped.get("ddl", 0) + result.skipped.get("filtered", 0) >= ddl
        decoded = set(result.rows.column("_offset").to_pylist())
        assert len(decoded) + sum(result.skipped.values()) == len(lines)


def test_options_defaults() -> None:
    spec = cf.options_cases(FORMAT)["defaults"]
    decoder = make_decoder(FORMAT, options=spec["options"])
    for name, value in spec["decoder"].items():
        assert getattr(decoder, name) == value, name


def test_options_user_defined() -> None:
    spec = cf.options_cases(FORMAT)["user_defined"]
    decoder = make_decoder(FORMAT, options=spec["options"])
    for name, value in spec["decoder"].items():
        assert getattr(decoder, name) == value, name


@pytest.mark.parametrize("index", range(3))
def test_options_invalid(index: int) -> None:
    bad = cf.options_cases(FORMAT)["invalid_values"][index]
    with pytest.raises(ConfigError) as err:
        make_decoder(FORMAT, options={"format": FORMAT, bad["option"]: bad["value"]})
    assert bad["error_contains"] in str(err.value)
