"""Flink's maxwell-json and ogg-json decoder expectations (shared/conformance/formats/...)."""

from __future__ import annotations

from pathlib import Path

import pytest

from changelake.errors import ConfigError
from changelake.formats import make_decoder
from tests.formats import conformance as cf

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", cf.case_params("maxwell-json"))
def test_maxwell_case(path: Path) -> None:
    cf.run_case("maxwell-json", path)


@pytest.mark.parametrize("path", cf.case_params("ogg-json"))
def test_ogg_case(path: Path) -> None:
    cf.run_case("ogg-json", path)


@pytest.mark.parametrize("fmt", ["maxwell-json", "ogg-json"])
def test_options_all(fmt: str) -> None:
    spec = cf.options_cases(fmt)
    decoder = make_decoder(fmt, options=spec["all_options"])
    for name, value in spec["all_options_result"].get("decoder", {}).items():
        assert getattr(decoder, name) == value, name


@pytest.mark.parametrize("fmt", ["maxwell-json", "ogg-json"])
@pytest.mark.parametrize("index", range(3))
def test_options_invalid(fmt: str, index: int) -> None:
    spec = cf.options_cases(fmt)
    bad = spec["invalid_values"][index]
    with pytest.raises(ConfigError) as err:
        make_decoder(fmt, options={**spec["all_options"], bad["option"]: bad["value"]})
    assert bad["error_contains"] in str(err.value)
