"""Every value of every supported column type survives every operator kind on Spark (issue #11).

Random at-least-once histories of two keyed sources whose rows reach the corners of the value
domain (BIGINT, INT, SMALLINT and TINYINT limits with NULLs; DECIMAL(38, s); DOUBLE and FLOAT NaN,
infinities, -0.0 and subnormals; TIMESTAMP, TIMESTAMP_LTZ, TIMESTAMP_NTZ and DATE from 0001-01-01
to 9999-12-31 at the microsecond; strings with NUL, emoji, combining marks and right-to-left text;
BINARY) run on Spark through one plan holding every operator kind::

    a, b          keyed sources -> ChangelogNormalize (deduplicate keep-last)       -> mirror_a
    a | filter    inner join b on the typed composite key  -> group aggregate        -> agg_rows
    a             left join b on id (one to one)                                      -> left_rows
    a             full join b on the typed composite key -> project -> materializer  -> full_rows
    a             Top-N per k_s, ordered by double, bigint, timestamp and id          -> top_rows
    a             group aggregate by a BIGINT with NULLs (vectorised) -> filter       -> by_i64

The values ride as keys (the sources' BIGINT ids, the composite join and group keys of every key
type, the Top-N partition and sort keys, the sink tables' primary keys) and as payload columns of
every operator, where the pandas conversion used to break them. The Delta tables the delta-rs
sink wrote from the Spark query must equal, value for value, the in-process LocalRunner's tables
and DuckDB's batch query over the sources' final state. Values compare exactly: doubles by their
bits (a NaN's sign and payload, -0.0 apart from 0.0), decimals with their scale, timestamps to the
microsecond.

Deliberate restrictions (each one is a semantic choice, not a value the seam may lose):

* SUM runs over INT, SMALLINT, TINYINT, DECIMAL(18, 4) and DECIMAL(38, 12) values below 10^24 (36
  digits, more than Python's default decimal context keeps), whose sums cannot leave their result
  type (BIGINT, DECIMAL(38, s)) in histories this size. A SUM of BIGINT or full-range DECIMAL(38, s)
  values can: DuckDB widens it (HUGEINT), changelake raises ValueOverflowError as Spark's ANSI mode
  does (``test_a_sum_beyond_bigint_is_an_error_not_a_wrapped_value``). SUM over DOUBLE is left out:
  a retracted float sum is not exact in any engine (0.1 + 0.2 - 0.1 != 0.2).
* Where SQL calls two values one (-0.0 = 0.0, NaN = NaN), which of them a MIN/MAX result or a
  group key carries is not defined (DuckDB returns the last one it read), so
  those columns (MIN/MAX of a double, the DOUBLE group key) compare by SQL equality. Everywhere
  else a zero keeps its sign and a NaN its bits.
* Group, join and primary keys are drawn without NULLs where a NULL would reach a sink's primary
  key (the sink sends such rows to the dead-letter path by design); NULL join keys are drawn, and
  never match.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import math
import random
import struct
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND, SEQ, RowKind
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.types import arrow_schema, arrow_type
from tests.plan.histories import deliver, key_histories

pytestmark = pytest.mark.spark

# --- the value domain -----------------------------------------------------------------------------
I64_MAX = 2**63 - 1
UTC = dt.timezone.utc
D = decimal.Decimal

#: key columns: the composite join key of a and b, the group key of the aggregate
KEYS = {"k_i64": "bigint", "k_dec": "decimal(38,0)", "k_ts": "timestamp", "k_dt": "date", "k_s": "string",
        "k_bin": "binary", "k_i8": "tinyint", "k_flag": "boolean", "k_f64": "double"}
#: payload columns: every supported type
PAYLOAD = {"i64": "bigint", "i32": "int", "i16": "smallint", "i8": "tinyint", "d38": "decimal(38,10)",
           "d18": "decimal(18,4)", "dsum": "decimal(38,12)", "f64": "double", "f32": "float", "ts": "timestamp",
           "ltz": "timestamp_ltz", "ntz": "timestamp_ntz", "day": "date", "s": "string", "bin": "binary",
           "flag": "boolean"}
COLUMNS = {"id": "bigint", **KEYS, **PAYLOAD}
SCHEMA = arrow_schema(COLUMNS)

NAN, INF = float("nan"), float("inf")
#: a negative NaN with a payload: its bits must survive too
ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0123))[0]
F32_MAX, F32_TINY = struct.unpack("<f", struct.pack("<I", 0x7F7FFFFF))[0], struct.unpack("<f", b"\x01\0\0\0")[0]
TS_CORNERS = [dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1000, 1, 1),
              dt.datetime(1677, 9, 21, 0, 12, 43, 145224), dt.datetime(2262, 4, 11, 23, 47, 16, 854776),
              dt.datetime(1582, 10, 4, 23, 59, 59, 999999), dt.datetime(1969, 12, 31, 23, 59, 59, 999999),
              dt.datetime(1970, 1, 1)]
DATE_CORNERS = [dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.date(1000, 1, 1), dt.date(1582, 10, 4),
                dt.date(1582, 10, 15), dt.date(1677, 9, 20), dt.date(2262, 4, 12), dt.date(1969, 12, 31)]
STRINGS = ["", "\x00", "a\x00b", "\U0001F600", "\U0001F44D\U0001F3FD", "e\u0301", "\u05e9\u05dc\u05d5\u05dd",
           "\u202eevil\u202c", "\U0010FFFF", "\u00df", "a" * 300]
BINARIES = [b"", b"\x00", b"\xff" * 17, b"\x00\xff\x00", bytes(range(256))]


def corners(values, ordinary):
    """Corner values (NULL included) in about half of the draws, ordinary draws in the rest."""
    return st.one_of(st.sampled_from([*values, None]), ordinary)


def _ts(tz):
    naive = st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999))
    return corners([t.replace(tzinfo=tz) for t in TS_CORNERS], naive.map(lambda t: t.replace(tzinfo=tz)))


def _dec(scale: int, top: D):
    """DECIMAL(p, scale) with ``top`` its largest value (negated with copy_negate: unary minus would
    round to the 28 digits of the default decimal context)."""
    ordinary = st.decimals(min_value=top.copy_negate(), max_value=top, places=scale, allow_nan=False,
                           allow_infinity=False)
    tiny = D(1).scaleb(-scale)
    return corners([top, top.copy_negate(), D(0).scaleb(-scale), tiny, tiny.copy_negate()], ordinary)


VALUES = {
    "bigint": corners([I64_MAX, -I64_MAX, -I64_MAX - 1, 2**53 + 1, -(2**53 + 1), 0],
                      st.integers(-I64_MAX - 1, I64_MAX)),
    "int": corners([2**31 - 1, -2**31, 0], st.integers(-2**31, 2**31 - 1)),
    "smallint": corners([2**15 - 1, -2**15], st.integers(-2**15, 2**15 - 1)),
    "tinyint": corners([127, -128], st.integers(-128, 127)),
    "decimal(38,10)": _dec(10, D("9999999999999999999999999999.9999999999")),
    "decimal(38,0)": _dec(0, D(10**38 - 1)),
    "decimal(18,4)": _dec(4, D("99999999999999.9999")),
    # 36 significant digits, beyond the 28 of Python's default decimal context, yet summable
    "decimal(38,12)": _dec(12, D("999999999999999999999999.999999999999")),
    "double": corners([NAN, INF, -INF, -0.0, 0.0, 5e-324, -5e-324, 1.7976931348623157e308, -1.7976931348623157e308,
                       2.0**53 + 2, ODD_NAN], st.floats()),
    "float": corners([NAN, INF, -INF, -0.0, F32_MAX, -F32_MAX, F32_TINY], st.floats(width=32)),
    "timestamp": _ts(UTC),
    "timestamp_ltz": _ts(UTC),
    "timestamp_ntz": _ts(None),
    "date": corners(DATE_CORNERS, st.dates()),
    "string": corners(STRINGS, st.text(max_size=8)),
    "binary": corners(BINARIES, st.binary(max_size=8)),
    "boolean": st.sampled_from([True, False, None]),
}


def non_null(strategy):
    return strategy.filter(lambda v: v is not None)


#: a composite key of every type that can be one: NULL only in k_i64 (a join key that never matches);
#: the others are group and Top-N partition keys, and a sink's primary key holds no NULL
key_tuple = st.tuples(*[VALUES[t] if c == "k_i64" else non_null(VALUES[t]) for c, t in KEYS.items()])
payload = st.tuples(*[VALUES[t] for t in PAYLOAD.values()])
#: source primary keys: BIGINT corners (0 is the full join's "no row" marker, so never an id)
ids = st.sampled_from([I64_MAX, -I64_MAX - 1, -I64_MAX, 2**53 + 1, 1, -1, 7])


# --- the plan --------------------------------------------------------------------------------------
FILTER = "i8 IS NULL OR i8 <> -128"
KEY_NAMES = list(KEYS)
SUMS = {"s_i32": "i32", "s_i16": "b_i16", "s_i8": "i8", "s_d18": "d18", "s_dsum": "b_dsum"}
MINMAX = {"mx_i64": ("max", "i64"), "mn_i64": ("min", "b_i64"), "mx_i32": ("max", "i32"),
          "mn_i16": ("min", "b_i16"), "mx_i8": ("max", "i8"), "mx_d38": ("max", "d38"), "mn_d38": ("min", "b_d38"),
          "mx_d18": ("max", "b_d18"), "mx_f64": ("max", "f64"), "mn_f64": ("min", "b_f64"), "mx_f32": ("max", "f32"),
          "mn_f32": ("min", "b_f32"), "mx_ts": ("max", "ts"), "mn_ltz": ("min", "b_ltz"), "mx_ntz": ("max", "ntz"),
          "mn_day": ("min", "day"), "mx_s": ("max", "s"), "mn_s": ("min", "b_s"), "mx_bin": ("max", "bin"),
          "mn_bin": ("min", "b_bin"), "mx_flag": ("max", "flag"), "mn_flag": ("min", "b_flag"),
          "mx_k_ts": ("max", "b_k_ts")}
COUNTS = {"n": None, "n_f64": "b_f64", "n_s": "s"}
AGGS = {**{out: f"count({col or '*'})" for out, col in COUNTS.items()},
        **{out: f"sum({col})" for out, col in SUMS.items()},
        **{out: f"{fn}({col})" for out, (fn, col) in MINMAX.items()}}
#: per table, the columns compared by SQL equality (-0.0 = 0.0, any NaN = any NaN; see the module
#: docstring): MIN/MAX of a double and a double group key
SQL_EQUAL = {"agg_rows": {"k_f64"} | {out for out, (_, col) in MINMAX.items() if col.endswith(("f64", "f32"))}}
#: the aggregate that takes the vectorised path (COUNT and integer SUM only): by a BIGINT with NULLs
BY_I64 = {"n": "count(*)", "s_i32": "sum(i32)", "s_i16": "sum(i16)", "n_f64": "count(f64)"}
TOP_ORDER = ["f64 desc nulls first", "i64 desc nulls first", "ts asc nulls last", "id"]
#: the full join's projection: both ids (0 for the padded side), every payload value of both sides,
#: and a computed BIGINT that reaches both limits of the type
FULL_SELECT = {"aid": "coalesce(id, 0)", "bid": "coalesce(b_id, 0)", "wide": "CAST(i32 AS BIGINT) * 4294967296",
               **{c: c for c in PAYLOAD}, **{f"b_{c}": f"b_{c}" for c in PAYLOAD}}


def pipeline() -> Pipeline:
    p = Pipeline()
    a = p.source("a", columns=COLUMNS, primary_key=["id"])
    b = p.source("b", columns=COLUMNS, primary_key=["id"])
    a.to_table("mirror_a", primary_key=["id"])
    kept = a.filter(FILTER, name="kept")
    kept.join(b, on=KEY_NAMES, how="inner", name="inner_j").group_by(*KEY_NAMES).agg(AGGS, name="agg") \
        .to_table("agg_rows", primary_key=KEY_NAMES)
    a.join(b, on=["id"], how="left", name="left_j").to_table("left_rows", primary_key=["id"])
    a.join(b, on=KEY_NAMES, how="full", name="full_j").select(FULL_SELECT, name="full_p") \
        .to_table("full_rows", primary_key=["aid", "bid"])
    a.top_n(2, order_by=TOP_ORDER, partition_by=["k_s"], rank_column="rnk", name="top") \
        .to_table("top_rows", primary_key=["k_s", "rnk"])
    a.group_by("i64").agg(BY_I64, name="by_i64").filter("i64 IS NOT NULL", name="by_i64_kept") \
        .to_table("by_i64", primary_key=["i64"])
    return p


PLAN = pipeline().plan()
TABLES = {n.table: n for n in PLAN.sinks}


# --- the oracle: DuckDB over the final state --------------------------------------------------------
def _cols(prefix: str, alias: str = "") -> str:
    return ", ".join(f"{prefix}.{c} AS {alias}{c}" for c in COLUMNS)


_ON = " AND ".join(f"a.{k} = b.{k}" for k in KEY_NAMES)


def _side(col: str) -> str:
    """A join output column as the oracle names it: b_x is b.x, the rest are a's."""
    return f"b.{col[2:]}" if col.startswith("b_") else f"a.{col}"


_AGG_SQL = ", ".join([f"count({'*' if col is None else _side(col)}) AS {out}" for out, col in COUNTS.items()]
                     + [f"sum({_side(col)}) AS {out}" for out, col in SUMS.items()]
                     + [f"{fn}({_side(col)}) AS {out}" for out, (fn, col) in MINMAX.items()])
ORACLE = {
    "mirror_a": "SELECT * FROM a",
    "agg_rows": f"SELECT {', '.join('a.' + k for k in KEY_NAMES)}, {_AGG_SQL} "
                f"FROM (SELECT * FROM a WHERE {FILTER}) a JOIN b ON {_ON} GROUP BY ALL",
    "left_rows": f"SELECT {_cols('a')}, {_cols('b', 'b_')} FROM a LEFT JOIN b ON a.id = b.id",
    "full_rows": "SELECT coalesce(a.id, 0) AS aid, coalesce(b.id, 0) AS bid, "
                 "CAST(a.i32 AS BIGINT) * 4294967296 AS wide, "
                 + ", ".join(f"a.{c} AS {c}" for c in PAYLOAD) + ", "
                 + ", ".join(f"b.{c} AS b_{c}" for c in PAYLOAD) + f" FROM a FULL JOIN b ON {_ON}",
    "top_rows": "SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY k_s ORDER BY "
                + ", ".join(TOP_ORDER[:-1]) + ", id) AS rnk FROM a) WHERE rnk <= 2",
    "by_i64": "SELECT i64, " + ", ".join(f"{text} AS {out}" for out, text in BY_I64.items())
              + " FROM a WHERE i64 IS NOT NULL GROUP BY i64",
}


def oracle(final: dict[str, dict]) -> dict[str, pa.Table]:
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    for name, rows in final.items():
        con.register(name, rows_table(list(rows.values())))
    out = {t: con.sql(q).to_arrow_table() for t, q in ORACLE.items()}
    con.close()
    return out


# --- histories ---------------------------------------------------------------------------------------
def flat(row: tuple) -> tuple:
    """``(id, key tuple, payload tuple)`` as key_histories keeps it -> one flat row of COLUMNS."""
    return (row[0], *row[1], *row[2])


def rows_table(rows: list[tuple], kinds: list[int] | None = None, batch: int = 0) -> pa.Table:
    cols = list(zip(*rows)) if rows else [[] for _ in SCHEMA]
    arrays = [pa.array(list(c), type=f.type) for c, f in zip(cols, SCHEMA)]
    if kinds is None:
        return pa.Table.from_arrays(arrays, schema=SCHEMA)
    arrays += [pa.array(kinds, pa.int8()), pa.array([f"{batch:04d}-{i:06d}" for i in range(len(rows))])]
    return pa.Table.from_arrays(arrays, names=SCHEMA.names + [KIND, SEQ])


def histories(draw_ops: dict[str, list], rnd: random.Random, n_batches: int):
    """-> (micro-batches: per batch {source: changelog table}, final rows per source)."""
    per_source, final = {}, {}
    for source, ops in draw_ops.items():
        per_source[source], final[source] = key_histories(ops, source)
        final[source] = {k: flat(r) for k, r in final[source].items()}
    delivered = deliver({(s, k): v for s, keyed in per_source.items() for k, v in keyed.items()}, rnd)
    cuts = sorted(rnd.sample(range(1, len(delivered)), n_batches - 1)) if len(delivered) >= n_batches else []
    batches = []
    for lo, hi in zip([0, *cuts], [*cuts, len(delivered)]):
        msgs = [r for msg in delivered[lo:hi] for r in msg]
        b = len(batches)
        batches.append({s: rows_table([flat(r) for t, _, r in msgs if t == s], [k for t, k, _ in msgs if t == s], b)
                        for s in draw_ops})
    return batches, final


# --- exact comparison --------------------------------------------------------------------------------
_LAYOUTS = {pa.string_view(): pa.string(), pa.large_string(): pa.string(), pa.binary_view(): pa.binary(),
            pa.large_binary(): pa.binary()}


def token(value, loose: bool = False):
    """A value as something that compares exactly: a float by its bits (NaN sign and payload, the sign
    of zero; ``loose``: as SQL equality, every NaN one value and -0.0 = 0.0), a decimal with its
    scale, a timestamp as microseconds and its zone, bytes and text as they are."""
    if value is None:
        return None
    if isinstance(value, float):
        if loose and math.isnan(value):
            return ("float", "NaN")
        if loose and value == 0:
            return ("float", 0.0)
        return ("float", struct.pack(">d", value))
    if isinstance(value, decimal.Decimal):
        return ("decimal", value.as_tuple())
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return ("ntz", (value - dt.datetime(1970, 1, 1)) // dt.timedelta(microseconds=1))
        return ("ltz", (value - dt.datetime(1970, 1, 1, tzinfo=UTC)) // dt.timedelta(microseconds=1))
    if isinstance(value, dt.date):
        return ("date", value.toordinal())
    if isinstance(value, (str, bytes)):
        return (type(value).__name__, value)
    raise TypeError(f"no exact token for {type(value).__name__}: {value!r}")


def tokens(table: pa.Table, schema: pa.Schema, loose: set[str] = frozenset(), *, cast: bool = False
           ) -> collections.Counter:
    """The rows of ``table`` (its ``schema`` columns, which must have the planned types, or ``cast`` to
    them: DuckDB's SUM is HUGEINT) as exact tokens; the ``loose`` columns by SQL equality. A string
    or binary column may come as a view or large layout (deltalake's QueryBuilder reads views)."""
    table = table.select(schema.names)
    if not cast:
        types = [_LAYOUTS.get(f.type, f.type) for f in table.schema]
        assert types == [f.type for f in schema], f"column types {table.schema} are not the planned {schema}"
    table = table.cast(schema)
    return collections.Counter(tuple(token(r[f.name], f.name in loose) for f in schema) for r in table.to_pylist())


# --- in-process -----------------------------------------------------------------------------------------
def fold(changes: list[tuple[int, dict]], key: list[str]) -> dict:
    """What the Delta sink holds after ``changes`` (from sink_changes, in order): -U ignored, latest per
    key; keys compare as the sink's MERGE compares them (-0.0 = 0.0, NaN = NaN)."""
    table: dict = {}
    for kind, row in changes:
        k = tuple(token(row[c], loose=True) for c in key)
        if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
            table[k] = row
        elif kind == RowKind.DELETE:
            table.pop(k, None)
    return table


def local_tables(batches: list[dict]) -> dict[str, pa.Table]:
    runner = LocalRunner(PLAN)
    out = collections.defaultdict(list)
    for i, batch in enumerate(batches):
        for table, changes in runner.step(batch).items():
            for row in sink_changes(changes, primary_key=TABLES[table].primary_key, batch_id=i).to_pylist():
                row.pop(SEQ)
                out[table].append((row.pop(KIND), row))
    result = {}
    for table, node in TABLES.items():
        rows = list(fold(out[table], list(node.primary_key)).values())
        result[table] = pa.Table.from_pylist(rows, schema=node.schema) if rows else node.schema.empty_table()
    return result


def check(got: dict[str, pa.Table], want: dict[str, pa.Table], what: str, *, cast_want: bool = False) -> None:
    for table, node in TABLES.items():
        loose = SQL_EQUAL.get(table, set())
        g, w = tokens(got[table], node.schema, loose), tokens(want[table], node.schema, loose, cast=cast_want)
        assert g == w, (f"{table}: {what}\n only in got:  {sorted(g - w, key=repr)[:3]}\n"
                        f" only in want: {sorted(w - g, key=repr)[:3]}")


# --- on Spark -------------------------------------------------------------------------------------------
def read_table(path: Path, schema: pa.Schema) -> pa.Table:
    """A Delta table's current rows through deltalake.QueryBuilder (not to_pyarrow_table, which can
    abort the process at exit); an absent table (no commit) is empty."""
    from deltalake import DeltaTable, QueryBuilder

    if not (path / "_delta_log").exists():
        return schema.empty_table()
    columns = ", ".join(f'"{c}"' for c in schema.names)
    return pa.table(QueryBuilder().register("t", DeltaTable(str(path))).execute(f"SELECT {columns} FROM t"))


def spark_tables(spark, root: Path, plan, batches: list[dict[str, pa.Table]]) -> dict[str, pa.Table]:
    """Run ``plan`` as one streaming query over one parquet file per source and micro-batch, each
    micro-batch's changes merged by the delta-rs sink; returns every sink table as read back."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import ByteType, StringType, StructField, StructType

    from changelake.connectors.delta_sink import TableSpec, open_sink
    from changelake.service.pipeline import graph_sink_changes
    from changelake.spark.compile import compile_packed
    from changelake.spark.payloads import from_ipc

    from .conftest import run_to_end, write_micro_batch

    streams = {}
    for node in plan.sources:
        directory = root / "in" / node.source
        directory.mkdir(parents=True)
        for i, batch in enumerate(batches):
            write_micro_batch(batch[node.source], directory, i)
        schema = StructType(from_arrow_schema(node.schema).fields
                            + [StructField(KIND, ByteType()), StructField(SEQ, StringType())])
        streams[node.source] = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(str(directory))
    sinks = {n.table: open_sink(TableSpec(name=n.table, path=str(root / "lake" / n.table), primary_key=n.primary_key),
                                pipeline_id="values", engine="delta-rs") for n in plan.sinks}
    packed, names = compile_packed(plan, streams, buckets=2)
    batch_ids = []

    def collect(df, batch_id):
        got = df.toArrow()
        batch_ids.append(batch_id)
        parts = collections.defaultdict(list)
        for route, payload in zip(got["_route"].to_pylist(), got["payload"].to_pylist()):
            parts[names[route]].append(from_ipc(payload))
        for table, tables in parts.items():
            sink = sinks[table]
            changes = graph_sink_changes(pa.concat_tables(tables), primary_key=sink.spec.primary_key,
                                         batch_id=batch_id)
            sink.apply(changes, batch_id=batch_id)

    run_to_end(packed, collect, root / "checkpoint")
    assert batch_ids == list(range(len(batches))), f"one micro-batch per file expected, ran {batch_ids}"
    return {n.table: read_table(root / "lake" / n.table, n.schema) for n in plan.sinks}


def draw_histories(data, rnd: random.Random):
    pool = data.draw(st.lists(key_tuple, min_size=2, max_size=3), label="key pool")
    op = st.tuples(ids, st.sampled_from(pool), payload, st.sampled_from([False, False, False, True]))
    ops = {s: data.draw(st.lists(op, min_size=4, max_size=9), label=f"changes of {s}") for s in ("a", "b")}
    return histories(ops, rnd, data.draw(st.integers(2, 3), label="micro-batches"))


@settings(max_examples=3, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.large_base_example,
                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), rnd=st.randoms(use_true_random=False))
def test_every_value_survives_every_operator_on_spark(rocksdb, tmp_path_factory, data, rnd):
    """Shrinking is off: each example is a Spark query of several seconds; the failing example is
    printed as drawn."""
    batches, final = draw_histories(data, rnd)
    want = oracle(final)
    local = local_tables(batches)
    check(local, want, "in-process runner vs DuckDB over the final state", cast_want=True)
    assert local["mirror_a"].num_rows or not final["a"], "the tables should hold rows"
    got = spark_tables(rocksdb, tmp_path_factory.mktemp("values"), PLAN, batches)
    check(got, local, "Delta tables written from Spark vs the in-process runner")


def test_the_plan_holds_every_operator_kind_and_every_column_type():
    from changelake.operators._group_fold import vectorisable
    from changelake.spark.compile import is_two_phase
    from changelake.types import _SIMPLE

    ops = [n.op for n in PLAN]
    assert {"normalize", "filter", "join", "aggregate", "project", "rank", "materialize", "sink"} <= set(ops)
    assert sorted(n.config.join_type for n in PLAN if n.op == "join") == ["FULL", "INNER", "LEFT"]
    assert [n.id for n in PLAN if n.op == "materialize"] == ["materialize_full_rows"]
    # on Spark both aggregates run two-phase; by_i64's local step is the vectorised fold, agg's the row kernel
    aggs = {n.id: n for n in PLAN if n.op == "aggregate"}
    assert all(is_two_phase(n) for n in aggs.values())
    assert [i for i, n in aggs.items() if vectorisable(n.config.aggregates, n.config.functions,
                                                       PLAN[n.inputs[0]].schema)] == ["by_i64"]
    assert {arrow_type(t) for t in _SIMPLE} <= {f.type for f in SCHEMA}
    assert any(pa.types.is_decimal(f.type) and f.type.precision == 38 for f in SCHEMA)


# --- the two crashes reported before the Arrow seam -------------------------------------------------------
#: a nullable BIGINT (pandas made it float64: 2^63-1 failed to convert back) and MySQL DATETIMEs of
#: year 1000 and 9999 (pandas made them nanoseconds: outside 1677..2262 they failed)
EVENTS = {"id": "bigint", "grp": "string", "big": "bigint", "at": "timestamp", "local": "timestamp_ntz"}
Y9999 = dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
Y1000 = dt.datetime(1000, 1, 1)


def events(rows: list[tuple[str, tuple]], batch: int) -> pa.Table:
    schema = arrow_schema(EVENTS)
    cols = list(zip(*[r for _, r in rows]))
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema)]
                                + [pa.array([int(RowKind.from_short(k)) for k, _ in rows], pa.int8()),
                                   pa.array([f"{batch:04d}-{i:06d}" for i in range(len(rows))])],
                                names=schema.names + [KIND, SEQ])


def event(i, grp, big, at):
    return (i, grp, big, None if at is None else at.replace(tzinfo=UTC), at)


CRASH_BATCHES = [
    {"orders": events([("+I", event(1, "x", I64_MAX, Y9999)), ("+I", event(2, "x", None, Y1000)),
                       ("+I", event(3, "y", -I64_MAX - 1, None))], 0),
     "notes": events([("+I", event(1, "n", None, Y1000)), ("+I", event(3, "n", I64_MAX, Y9999))], 0)},
    {"orders": events([("-U", event(3, "y", -I64_MAX - 1, None)), ("+U", event(3, "y", I64_MAX, Y9999)),
                       ("-D", event(2, "x", None, Y1000)),
                       ("+I", event(4, "x", I64_MAX - 1, Y1000 + dt.timedelta(microseconds=1)))], 1),
     "notes": events([("-D", event(1, "n", None, Y1000))], 1)},
]


def crash_pipeline() -> Pipeline:
    p = Pipeline()
    orders = p.source("orders", columns=EVENTS, primary_key=["id"])
    notes = p.source("notes", columns=EVENTS, primary_key=["id"])
    orders.join(notes, on=["id"], how="left", name="joined").to_table("joined", primary_key=["id"])
    orders.group_by("grp").agg(n="count(*)", n_big="count(big)", hi="max(big)", lo="min(big)", first="min(at)",
                               last="max(local)", name="per_grp").to_table("per_grp", primary_key=["grp"])
    return p


def test_nullable_bigint_max_and_datetimes_of_year_1000_and_9999_through_a_join_and_an_aggregate_on_spark(
        rocksdb, tmp_path):
    """The two crashes of transformWithStateInPandas: both values in state across two micro-batches,
    as join payload and as MIN/MAX inputs and results, exactly in the Delta tables."""
    plan = crash_pipeline().plan()
    got = spark_tables(rocksdb, tmp_path, plan, CRASH_BATCHES)
    y9999, first_x = Y9999.replace(tzinfo=UTC), (Y1000 + dt.timedelta(microseconds=1)).replace(tzinfo=UTC)
    want = {
        "per_grp": [("x", 2, 2, I64_MAX, I64_MAX - 1, first_x, Y9999), ("y", 1, 1, I64_MAX, I64_MAX, y9999, Y9999)],
        "joined": [(1, "x", I64_MAX, y9999, Y9999) + (None,) * 5,
                   (3, "y", I64_MAX, y9999, Y9999, 3, "n", I64_MAX, y9999, Y9999),
                   (4, "x", I64_MAX - 1, first_x, first_x.replace(tzinfo=None)) + (None,) * 5],
    }
    for n in plan.sinks:
        expected = pa.Table.from_pylist([dict(zip(n.schema.names, r)) for r in want[n.table]], schema=n.schema)
        assert tokens(got[n.table], n.schema) == tokens(expected, n.schema), n.table
    runner = LocalRunner(plan)
    local = collections.defaultdict(list)
    for i, batch in enumerate(CRASH_BATCHES):
        for table, changes in runner.step(batch).items():
            local[table] += [(r.pop(KIND), r) for r in sink_changes(changes, primary_key=plan[f"sink_{table}"]
                                                                      .primary_key, batch_id=i).to_pylist()]
    for n in plan.sinks:
        rows = list(fold(local[n.table], list(n.primary_key)).values())
        assert tokens(pa.Table.from_pylist(rows, schema=n.schema), n.schema) == tokens(got[n.table], n.schema), n.table


def test_a_sum_beyond_bigint_is_an_error_not_a_wrapped_value():
    """What each engine defines for SUM(BIGINT) past 2^63-1: DuckDB widens (HUGEINT), changelake's
    result column is BIGINT (as Flink's and Spark's) and the pipeline stops with ValueOverflowError
    naming the cast that widens it, as Spark's ANSI mode stops; it never wraps around (the NumPy fold
    did, silently). A sum that only passes 2^63 inside a micro-batch is exact."""
    from changelake.errors import ValueOverflowError

    p = Pipeline()
    p.source("t", columns={"id": "bigint", "v": "bigint"}, primary_key=["id"]) \
        .group_by().agg(total="sum(v)", name="total").to_table("total", primary_key=["total"])
    plan = p.plan()
    rows = pa.table({"id": [1, 2, 3], "v": [I64_MAX, I64_MAX, -I64_MAX], KIND: pa.array([0, 0, 0], pa.int8())})
    con = duckdb.connect()
    con.register("rows", rows)
    assert con.sql("SELECT sum(v) FROM rows").fetchall() == [(I64_MAX,)]
    assert con.sql("SELECT sum(v) FROM rows WHERE id < 3").fetchall() == [(2 * I64_MAX,)]
    con.close()
    passing = LocalRunner(plan).step({"t": rows})["total"]
    assert passing["total"].to_pylist() == [I64_MAX]
    with pytest.raises(ValueOverflowError, match="DECIMAL\\(38, 0\\)"):
        LocalRunner(plan).step({"t": rows.slice(0, 2)})
