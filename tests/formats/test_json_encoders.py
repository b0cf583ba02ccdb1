"""The JSON writers against Flink's serialization expectations, and the filesystem round trips
(decode, write back, decode again) of the conformance corpus."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from changelake.changelog import KIND, RowKind
from changelake.errors import ConfigError
from changelake.formats import make_decoder
from changelake.formats.json_encoders import ENCODER_FORMATS, encode, java_float_text
from changelake.formats.sqltypes import sql_schema
from tests.formats import conformance as cf

pytestmark = pytest.mark.unit


def _cases(kind: str) -> list:
    params = []
    for fmt in ENCODER_FORMATS:
        for p in cf.case_params(fmt):
            path = p.values[0]
            if path is None:        # the corpus is missing: keep its skip, with the arity of this test
                params.append(pytest.param(fmt, None, marks=p.marks, id=f"{fmt}/{p.id}"))
                continue
            case = cf.load(path)
            if (kind == "serialization" and "serialization" in case) or (kind == "pipeline" and "pipeline" in case):
                params.append(pytest.param(fmt, path, id=f"{fmt}/{path.name.removesuffix('.expected.json')}"))
    return params


def _table(schema: list, changes: list[dict]) -> pa.Table:
    arrow = sql_schema(schema)
    columns = {f.name: pa.array([c["row"][i] for c in changes], type=f.type) for i, f in enumerate(arrow)}
    columns[KIND] = pa.array([int(RowKind.from_short(c["kind"])) for c in changes], type=pa.int8())
    return pa.table(columns)


@pytest.mark.parametrize("fmt, path", _cases("serialization"))
def test_serialization_matches_flink(fmt: str, path: Path) -> None:
    case = cf.load(path)
    lines = encode(fmt, _table(case["schema"], case["expected"]), options=case["serialization"]["options"])
    assert [line.decode() for line in lines] == case["serialization"]["expected_lines"]


@pytest.mark.parametrize("fmt, path", _cases("pipeline"))
def test_filesystem_round_trip(fmt: str, path: Path) -> None:
    """source file -> decode -> SELECT id, name, UPPER(name), description, weight -> write as the same
    format -> read back -> SELECT id, upper_name, description, weight."""
    case = cf.load(path)
    schema = case["schema"]
    source = make_decoder(fmt, columns=sql_schema(schema))
    rows = source.decode(cf.raw_records(cf.input_values(case, path.parent))).rows
    sink_schema = [schema[0], schema[1], ["upper_name", "STRING"], *schema[2:]]
    sink = pa.table({"id": rows["id"], "name": rows["name"], "upper_name": pc.utf8_upper(rows["name"]),
                     "description": rows["description"], "weight": rows["weight"], KIND: rows[KIND]})
    written = encode(fmt, sink)
    back = make_decoder(fmt, columns=sql_schema(sink_schema)).decode(cf.raw_records(written))
    assert back.dead_letters.num_rows == 0
    selected = back.rows.select(["id", "upper_name", "description", "weight", KIND])
    got = cf.changelog(selected.rename_columns(["id", "name", "description", "weight", KIND]), schema)
    assert got == cf.expected_changelog(case["expected"], schema)


def test_schema_include_is_refused_like_flink() -> None:
    spec = cf.options_cases("debezium-json")["schema_include_true"]
    with pytest.raises(ConfigError) as err:
        encode("debezium-json", pa.table({"id": [1], KIND: pa.array([0], pa.int8())}),
               options={"schema-include": "true"})
    assert spec["sink_error_contains"] in str(err.value)


@pytest.mark.parametrize("value, single, text", [
    (3.140000104904175, True, "3.14"), (1.0, True, "1.0"), (1e-05, False, "1.0E-5"),
    (12345678.0, False, "1.2345678E7"), (0.001, False, "0.001"), (-0.0, False, "-0.0")])
def test_java_float_text(value: float, single: bool, text: str) -> None:
    assert java_float_text(value, single=single) == text
