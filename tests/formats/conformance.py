"""Loading Flink's decoder conformance cases (see shared/conformance/README.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from changelake.changelog import RAW_SCHEMA, RowKind, user_columns

ENV = "CHANGELAKE_CONFORMANCE_DIR"


def conformance_dir() -> Path:
    """``$CHANGELAKE_CONFORMANCE_DIR``, else ``shared/conformance`` next to the repository root."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path(__file__).resolve().parents[2].parent / "shared" / "conformance"


def format_dir(fmt: str) -> Path:
    return conformance_dir() / "formats" / fmt


def case_params(fmt: str) -> list[Any]:
    """One pytest param per ``<case>.expected.json`` (options files excluded); a single skipping
    param when the directory is missing, naming it."""
    directory = format_dir(fmt)
    if not directory.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(
            reason=f"conformance cases not found: {directory} (set {ENV} to the conformance directory)"),
            id="missing-conformance-dir")]
    files = sorted(p for p in directory.glob("*.expected.json") if p.name != "options.expected.json")
    return [pytest.param(p, id=p.name.removesuffix(".expected.json")) for p in files]


def options_file(fmt: str) -> Path:
    path = format_dir(fmt) / "options.expected.json"
    if not path.is_file():
        pytest.skip(f"conformance options file not found: {path} (set {ENV} to the conformance directory)")
    return path


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def input_values(case: dict, directory: Path) -> list[bytes | None]:
    """The message values a case feeds, as Kafka would deliver them."""
    if case.get("input_file"):
        data = (directory / case["input_file"]).read_bytes()
        if case["input_file"].endswith(".avro"):
            return [data]
        lines = data.decode("utf-8").splitlines()
        if case.get("input_lines") == "first line only":
            lines = lines[:1]
        return [line.encode("utf-8") for line in lines]
    return [None if m is None else m.encode("utf-8") for m in case["input_messages"]]


def raw_records(values: list[bytes | None], *, topic: str = "t", partition: int = 0,
                keys: list[bytes | None] | None = None) -> pa.Table:
    n = len(values)
    return pa.Table.from_pydict({
        "topic": [topic] * n,
        "partition": [partition] * n,
        "offset": list(range(n)),
        "timestamp": [1_700_000_000_000 + i for i in range(n)],
        "key": keys if keys is not None else [None] * n,
        "value": values,
    }, schema=RAW_SCHEMA)


def changelog(rows: pa.Table, schema: list[list[str]]) -> list[dict]:
    """Decoded rows as ``{"kind", "row"}`` over the case's physical columns, FLOAT rounded to float32."""
    names = [c[0] for c in schema]
    is_float = [c[1].upper().startswith("FLOAT") for c in schema]
    data = rows.select(names).to_pylist()
    kinds = rows.column("_kind").to_pylist()
    out = []
    for kind, row in zip(kinds, data):
        values = [row[n] for n in names]
        values = [_f32(v) if f else v for v, f in zip(values, is_float)]
        out.append({"kind": RowKind(kind).short, "row": values})
    return out


def expected_changelog(expected: list[dict], schema: list[list[str]]) -> list[dict]:
    is_float = [c[1].upper().startswith("FLOAT") for c in schema]
    return [{"kind": e["kind"], "row": [_f32(v) if f else v for v, f in zip(e["row"], is_float)]}
            for e in expected]


def _f32(v: Any) -> Any:
    return None if v is None else float(np.float32(v))


def check_metadata(rows: pa.Table, case: dict) -> None:
    """Apply the case's metadata checks to the requested metadata columns (after the physical ones)."""
    spec = case["expected_metadata"]
    names = user_columns(rows)
    row = rows.slice(spec["row_index"], 1).to_pylist()[0]
    for check in spec["checks"]:
        column = names[check["index"]]
        assert column == check["column"], f"column {check['index']} is {column}, expected {check['column']}"
        value = row[column]
        kind = check["check"]
        if kind == "equals":
            assert value == check["value"], (column, value)
        elif kind == "is_null":
            assert value is None, (column, value)
        elif kind == "startswith":
            assert isinstance(value, str) and value.startswith(check["value"]), (column, value)
        elif kind == "epoch_millis":
            assert value is not None and int(value.timestamp() * 1000) == check["value"], (column, value)
        elif kind == "map_size":
            assert value is not None and len(value) == check["value"], (column, value)
        elif kind == "array_element":
            assert value is not None and value[check["element"]] == check["value"], (column, value)
        else:
            raise AssertionError(f"unknown metadata check {kind!r}")


def run_case(fmt: str, path: Path, *, decoder_options: dict | None = None, decoder=None):
    """Decode a case's input and check it against ``expected`` (or count + first row) and metadata.

    Returns the :class:`DecodeResult` for format-specific extra checks.
    """
    from changelake.formats import make_decoder
    from changelake.formats.sqltypes import sql_schema

    case = load(path)
    options = {k: v for k, v in case["options"].items() if k != "connector"}
    options.update(decoder_options or {})
    if case.get("metadata_columns"):
        options["metadata"] = [m[0] for m in case["metadata_columns"]]
    if decoder is None:
        decoder = make_decoder(fmt, columns=sql_schema(case["schema"]), options=options)
    values = input_values(case, path.parent)
    result = decoder.decode(raw_records(values))
    assert result.dead_letters.num_rows == 0, result.dead_letters.to_pylist()
    got = changelog(result.rows, case["schema"])
    if case["expected_compare"] == "row_count_and_first_row":
        assert len(got) == case["expected_count"]
        first = expected_changelog([case["expected_first_row"]], case["schema"])[0]
        assert got[0]["row"] == first["row"]
        if case["expected_first_row"].get("kind_asserted", True):
            assert got[0]["kind"] == first["kind"]
    else:
        assert case["expected_compare"] == "exact_order"
        if "pipeline" in case:
            return result   # the expectation is after a round trip: see test_json_encoders.py
        assert got == expected_changelog(case["expected"], case["schema"])
        if not case["expected"]:
            assert result.skipped.get("tombstone") == len(values)
    if case.get("expected_metadata"):
        check_metadata(result.rows, case)
    return result


def options_cases(fmt: str) -> dict:
    return load(options_file(fmt))
