"""The state bucket of a row (``changelake.spark.buckets``): equal keys meet, and the function is fixed.

The bucket decides which state holds a key's history, so it is part of the checkpoint contract: the
figures pinned below must never change (a change would need every checkpoint rebuilt).
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pytest

from changelake.spark.buckets import bucket_of, split_by_bucket

pytestmark = pytest.mark.unit


def test_equal_keys_share_a_bucket_under_sql_equality():
    other_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0123))[0]
    t = pa.table({"d": pa.array([-0.0, 0.0, math.nan, other_nan, None, None]),
                  "f": pa.array([-0.0, 0.0, math.nan, -math.nan, None, None], pa.float32())})
    for column in ("d", "f"):
        b = bucket_of(t, [column], 97)
        assert b[0] == b[1] and b[2] == b[3] and b[4] == b[5], column
        assert len({b[0], b[2], b[4]}) == 3, f"{column}: 0.0, NaN and NULL are three keys"


def test_a_join_side_with_the_same_values_lands_in_the_same_buckets():
    left = pa.table({"k": pa.array([1, 2, None, 2**63 - 1], pa.int64()), "s": ["a", "ß", None, ""]})
    right = pa.table({"x": pa.array(["a", "ß", None, ""]), "y": pa.array([1, 2, None, 2**63 - 1], pa.int64())})
    assert bucket_of(left, ["k", "s"], 32).tolist() == bucket_of(right, ["y", "x"], 32).tolist()


def test_the_bucket_function_is_fixed():
    """Pinned values: stable across processes (no salted hash), runs and library versions."""
    t = pa.table({
        "i": pa.array([0, -1, 2**63 - 1, None], pa.int64()),
        "s": pa.array(["", "a", "\U0001F600", None]),
        "d": pa.array([Decimal("0.00"), Decimal("-1.50"), Decimal("99999999999999999999999999999999999.99"), None],
                      pa.decimal128(38, 2)),
        "t": pa.array([datetime(1, 1, 1, tzinfo=UTC), datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
                       datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), None],
                      pa.timestamp("us", tz="UTC")),
        "day": pa.array([date(1, 1, 1), date(1970, 1, 1), date(9999, 12, 31), None]),
        "x": pa.array([1.5, -0.0, math.inf, None]),
        "b": pa.array([True, False, None, True]),
        "bin": pa.array([b"", b"\x00", b"\xff" * 3, None]),
    })
    got = {c: bucket_of(t, [c], 1_000_003).tolist() for c in t.column_names}
    got["all"] = bucket_of(t, t.column_names, 1_000_003).tolist()
    assert got == PINNED


PINNED = {
    "i": [274437, 239446, 977464, 151176], "s": [854451, 990764, 199310, 151176],
    "d": [230302, 716739, 66825, 151176], "t": [196548, 675250, 583444, 151176],
    "day": [931103, 274437, 773775, 151176], "x": [588997, 274437, 2832, 151176],
    "b": [921581, 274437, 151176, 921581], "bin": [854451, 987776, 684295, 151176],
    "all": [338899, 70023, 620796, 871315],
}


def test_split_keeps_row_order_within_a_bucket():
    t = pa.table({"k": [3, 1, 3, 2, 1, 3], "n": [0, 1, 2, 3, 4, 5]})
    parts = split_by_bucket(t, ["k"], 4)
    assert sorted(b for b, _ in parts) == [b for b, _ in parts]
    for _, rows in parts:
        assert rows["n"].to_pylist() == sorted(rows["n"].to_pylist())
    assert sum(rows.num_rows for _, rows in parts) == 6
    assert split_by_bucket(t, [], 4) == [(0, t)]
