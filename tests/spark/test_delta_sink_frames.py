"""The sink's kernel on Spark DataFrames gives the rows the Arrow kernel gives.

Seeded histories of many small cases (the case number is part of the key, so one Spark job checks
them all): out-of-order and duplicated deliveries, ties of one ``_seq`` (one message, as a key change
gives: -D of the old key, +I of the new), before-images, unavailable-value placeholders after values,
NULLs and deletes, tombstones older and newer than the batch; keys and values at their corners
(64-bit limits, DECIMAL(38,10), dates of years 1..9999, any Unicode, NULL keys, NaN and -0.0).
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
from datetime import datetime, timezone

import pyarrow as pa
import pytest

from changelake.changelog import KIND, SEQ, RowKind
from changelake.connectors import delta_sink_kernel as arrow_kernel
from changelake.spark import delta_sink_frames as frames

pytestmark = pytest.mark.spark

NOW = datetime(2026, 1, 1, 12, 30, tzinfo=timezone.utc)
PLACEHOLDER = "__debezium_unavailable_value"

I64 = [-(2**63), 2**63 - 1, 0, -1, 1, 42]
DEC = [decimal.Decimal(v).scaleb(-10, decimal.Context(prec=38)) for v in (10**38 - 1, -(10**38 - 1), 0, 10**10 + 1)]   # DECIMAL(38,10)
DATES = [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1970, 1, 1), dt.date(2000, 2, 29)]
TEXT = ["", "a", "ä", "日本語", "😀 emoji", "tab\tand\nnewline", "A", "\u0301e"]
FLOATS = [float("nan"), -0.0, 0.0, math.inf, -math.inf, 1.5]

KEY_DOMAINS = {
    "int64": (pa.int64(), I64),
    "decimal": (pa.decimal128(38, 10), DEC),
    "date": (pa.date32(), DATES),
    "text": (pa.string(), TEXT),
    "double": (pa.float64(), FLOATS),
}


def _history(rng: random.Random, domain: list, cases: int) -> list[dict]:
    """Rows of ``cases`` independent cases, each a few keys' changes delivered out of order."""
    rows = []
    for case in range(cases):
        keys = rng.sample(domain, k=min(len(domain), rng.randint(1, 3))) + ([None] if rng.random() < 0.3 else [])
        messages = []
        for n in range(rng.randint(1, 8)):
            s = f"l{rng.randint(1, 6):08d}"                          # few positions: ties and duplicates
            key = rng.choice(keys)
            kind = rng.choice(["+I", "+U", "+U", "-D", "-U", "keychange"])
            if kind == "keychange":                                   # one message: -D old key, +I new key
                new = rng.choice(keys)
                messages.append([("-D", key, s), ("+I", new, s)])
            elif kind == "+U" and rng.random() < 0.5:
                messages.append([("-U", key, s), ("+U", key, s)])
            else:
                messages.append([(kind, key, s)])
        if rng.random() < 0.3:
            messages.append(rng.choice(messages))                     # a redelivered message
        rng.shuffle(messages)                                         # out of order
        for message in messages:
            for kind, key, s in message:
                deleted = kind == "-D"
                rows.append({
                    "case": case, "k": key, KIND: int({"+I": RowKind.INSERT, "-U": RowKind.UPDATE_BEFORE,
                                                      "+U": RowKind.UPDATE_AFTER, "-D": RowKind.DELETE}[kind]),
                    SEQ: s,
                    "v": None if deleted else rng.choice([PLACEHOLDER, PLACEHOLDER, None, *TEXT]),
                    "b": None if deleted else rng.choice([PLACEHOLDER.encode(), None, b"\x00\xff", b""]),
                    "n": rng.choice([None, *I64]),
                    "d": rng.choice([None, *DEC]),
                    "day": rng.choice([None, *DATES]),
                })
    return rows


def _batch(rows: list[dict], key_type: pa.DataType) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("case", pa.int32()), ("k", key_type), ("v", pa.string()), ("b", pa.binary()), ("n", pa.int64()),
        ("d", pa.decimal128(38, 10)), ("day", pa.date32()), (KIND, pa.int8()), (SEQ, pa.string())]))


def _tombstones(rng: random.Random, rows: list[dict], key_type: pa.DataType) -> pa.Table:
    seen = {(r["case"], _norm(r["k"])): r["k"] for r in rows}
    picked = [(case, k) for (case, _), k in seen.items() if rng.random() < 0.4]
    return pa.Table.from_pylist(
        [{"case": c, "k": k, SEQ: f"l{rng.randint(1, 6):08d}"} for c, k in picked],
        schema=pa.schema([("case", pa.int32()), ("k", key_type), (SEQ, pa.string())]))


def _norm(value):
    """A value as the MERGE compares it: NaN equal to NaN, -0.0 equal to 0.0; datetimes in UTC."""
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else value + 0.0
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def _rows(table: pa.Table, columns: list[str]) -> list[tuple]:
    return sorted((tuple(_norm(v) for v in row) for row in zip(*[table[c].to_pylist() for c in columns])), key=repr)


def _target(batch: pa.Table) -> pa.Schema:
    """The table's schema: the batch's stored columns plus one the batch does not send."""
    stored = [f for f in batch.schema if f.name != KIND]
    return pa.schema(stored + [pa.field("added_later", pa.int64())])


@pytest.mark.parametrize("key", sorted(KEY_DOMAINS))
def test_the_frame_kernel_reduces_and_splits_like_the_arrow_kernel(spark, key):
    key_type, domain = KEY_DOMAINS[key]
    rng = random.Random(f"frames-{key}")
    rows = _history(rng, domain, cases=150)
    batch, tombs = _batch(rows, key_type), _tombstones(rng, rows, key_type)
    pk = ("case", "k")
    target = _target(batch)

    filled = arrow_kernel.fill_unavailable(batch, primary_key=pk, placeholder=PLACEHOLDER)
    reduced = arrow_kernel.align_to_table(arrow_kernel.latest_per_key(filled, primary_key=pk), target)
    expected = arrow_kernel.split_against_tombstones(reduced, tombs, primary_key=pk, now=NOW)

    df = frames.with_position(spark.createDataFrame(batch))
    df = frames.fill_unavailable(df, primary_key=pk, placeholder=PLACEHOLDER)
    got_reduced = frames.align_to_table(frames.latest_per_key(df, primary_key=pk), target)
    split = frames.split_against_tombstones(got_reduced, spark.createDataFrame(tombs), primary_key=pk, now=NOW)

    columns = [*target.names, KIND]
    table_changes = split.table_changes.toArrow()
    assert table_changes.column_names == columns
    assert _rows(table_changes, columns) == _rows(expected.table_changes, columns)
    tomb_columns = [*pk, SEQ, KIND, "_deleted_at"]
    assert _rows(split.tombstone_changes.toArrow(), tomb_columns) == _rows(expected.tombstone_changes, tomb_columns)
    counted = frames.split_counts(split)
    assert (counted.resurrections_prevented, counted.stale_deletes, counted.tombstone_changes, counted.table_changes,
            counted.table_deletes) == (expected.resurrections_prevented, expected.stale_deletes,
                                       expected.tombstone_changes.num_rows, expected.table_changes.num_rows,
                                       arrow_kernel.count_deletes(expected.table_changes))
    # the history reached the corners it is meant to: placeholders filled and kept, both kinds of drop
    assert expected.resurrections_prevented and expected.stale_deletes
    assert PLACEHOLDER in expected.table_changes["v"].to_pylist()
    assert filled["v"].to_pylist() != batch["v"].to_pylist() and filled["b"].to_pylist() != batch["b"].to_pylist()


def test_without_tombstones_and_with_a_truncate(spark):
    rng = random.Random("frames-truncate")
    rows = _history(rng, I64, cases=60)
    batch = _batch(rows, pa.int64())
    pk = ("case", "k")
    horizon = "l00000003"
    kept, _ = arrow_kernel.drop_before_truncate(batch, horizon)
    reduced = arrow_kernel.align_to_table(arrow_kernel.latest_per_key(kept, primary_key=pk), _target(batch))
    expected = arrow_kernel.split_against_tombstones(reduced, pa.table({SEQ: pa.array([], pa.string())}),
                                                     primary_key=pk, now=NOW)

    df = frames.drop_before_truncate(frames.with_position(spark.createDataFrame(batch)), horizon)
    got = frames.split_against_tombstones(frames.align_to_table(frames.latest_per_key(df, primary_key=pk),
                                                                _target(batch)), None, primary_key=pk, now=NOW)
    columns = [*_target(batch).names, KIND]
    assert _rows(got.table_changes.toArrow(), columns) == _rows(expected.table_changes, columns)
    assert min(got.table_changes.toArrow()[SEQ].to_pylist()) >= horizon
    tomb_columns = [*pk, SEQ, KIND]
    assert _rows(got.tombstone_changes.toArrow(), tomb_columns) == _rows(expected.tombstone_changes, tomb_columns)


@pytest.mark.parametrize("rows, message", [
    ([(None, 0, "l1")], "1 row\\(s\\) with a null 'k'"),
    ([(1, 7, "l1"), (2, 9, "l2")], "2 row\\(s\\) with an unknown _kind code"),
    ([(1, 0, None)], "null '_seq'"),
])
@pytest.mark.parametrize("counted", [False, True], ids=["by the sink", "with the query's kinds count"])
def test_a_distributed_batch_is_validated_before_anything_is_written(spark, tmp_path, rows, message, counted):
    from changelake.connectors.delta_sink import TableSpec
    from changelake.errors import SinkCommitError
    from changelake.spark.batch_frames import count_kinds
    from changelake.spark.delta_sink import DeltaSparkSink

    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("k",))
    sink = DeltaSparkSink(spec, pipeline_id="p", spark=spark, clock=lambda: NOW, max_commit_retries=0)
    batch = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), KIND: pa.array([r[1] for r in rows], pa.int8()),
                      SEQ: pa.array([r[2] for r in rows], pa.string())})
    frame = spark.createDataFrame(batch)
    checks = count_kinds({"t": frame}, {"t": ("k",)})["t"][1] if counted else None
    with pytest.raises(SinkCommitError, match=message):
        sink.apply_frame(frame, batch_id=0, checks=checks)
    assert not (tmp_path / "t").exists()


def test_the_kinds_count_gives_each_table_its_kinds_and_nulls(spark):
    """One aggregation over tables of different keys: each table's rows per kind (the report's labels; a
    NULL or unknown code only in its checks), and the NULLs of its own key columns and ``_seq``."""
    from changelake.spark.batch_frames import count_kinds

    one = spark.createDataFrame(pa.table({"k": pa.array([1, None, 3], pa.int64()), KIND: pa.array([0, 2, 3], pa.int8()),
                                          SEQ: pa.array(["a", "b", None])}))
    two = spark.createDataFrame(pa.table({"a": pa.array(["x", "y"]), "b": pa.array([None, 2], pa.int32()),
                                          KIND: pa.array([0, 9], pa.int8()), SEQ: pa.array(["a", "b"])}))
    counted = count_kinds({"one": one, "two": two}, {"one": ("k",), "two": ("a", "b")})
    assert counted["one"][0] == {"+I": 1, "+U": 1, "-D": 1}
    assert counted["one"][1] == frames.FrameChecks(kinds={0: 1, 2: 1, 3: 1}, nulls={"k": 1, SEQ: 1})
    assert counted["two"][0] == {"+I": 1}
    assert counted["two"][1] == frames.FrameChecks(kinds={0: 1, 9: 1}, nulls={"a": 0, "b": 1, SEQ: 0})
