"""``_seq`` positions of a step's output: zero-padded, so that downstream buckets order the rows as they came."""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.spark.binding import POSITION_DIGITS, positions, with_positions

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 1001])
def test_positions_are_the_row_numbers_zero_padded(n):
    got = positions(n)
    assert got.type == pa.string()
    assert got.to_pylist() == [str(i).zfill(POSITION_DIGITS) for i in range(n)]


def test_positions_order_as_strings_as_the_rows_came():
    got = positions(1500).to_pylist()
    assert got == sorted(got) and len(set(got)) == 1500


def test_with_positions_appends_the_seq_column():
    out = with_positions(pa.table({"a": [5, 3, 4]}))
    assert out.column_names == ["a", "_seq"]
    assert out.column("_seq").to_pylist() == ["000000000000", "000000000001", "000000000002"]
