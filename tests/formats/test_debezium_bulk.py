"""The bulk (Arrow JSON reader) path of the Debezium JSON decoder gives exactly the rows of
the per-message path, and is really taken for healthy chunks."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import gen
from changelake.formats import make_decoder
from changelake.formats.debezium_bulk import decode_json_chunk
from changelake.formats.sqltypes import sql_schema
from tests.formats import conformance as cf
from tests.formats.helpers import change, pg_source, records

pytestmark = pytest.mark.unit


def both_paths(decoder, table):
    plan = decoder._bulk_plan()
    assert plan is not None, "the bulk path is not usable for these columns"
    bulk = decode_json_chunk(plan, table, key=decoder._key)
    assert bulk is not None, "the bulk path declined a healthy chunk"
    slow = decoder._decode(table)
    return bulk, slow


def assert_same(bulk, slow) -> None:
    assert bulk.rows.schema == slow.rows.schema
    assert bulk.rows.to_pylist() == slow.rows.to_pylist()
    assert bulk.skipped == slow.skipped
    assert slow.dead_letters.num_rows == 0


def test_generated_20_column_changes() -> None:
    decoder = make_decoder("debezium-json", columns=gen.SCHEMA,
                           options={"metadata": ["ingestion-timestamp", "source.table"]})
    table = gen.records(gen.debezium_json(3000) + [None, b""])
    assert_same(*both_paths(decoder, table))


@pytest.mark.parametrize("name", ["debezium-data-schema-exclude.txt", "debezium-postgres-data-schema-exclude.txt",
                                  "debezium-data-schema-include.txt", "debezium-postgres-data-schema-include.txt"])
def test_conformance_samples(name: str) -> None:
    path = cf.format_dir("debezium-json") / name
    if not path.is_file():
        pytest.skip(f"conformance sample not found: {path}")
    columns = sql_schema([["id", "INT NOT NULL"], ["name", "STRING"], ["description", "STRING"],
                          ["weight", "FLOAT"]])
    decoder = make_decoder("debezium-json", columns=columns,
                           options={"schema-include": "include" in name,
                                    "metadata": ["source.timestamp", "source.database", "source.schema"]})
    table = cf.raw_records([line.encode() for line in path.read_text().splitlines()])
    if "include" in name:
        assert decoder._bulk_plan() is None   # not before the first envelope has been read
        decoder.decode(table.slice(0, 1))
    assert_same(*both_paths(decoder, table))


def test_envelope_seen_without_schema_include_switches_the_bulk_plan() -> None:
    path = cf.format_dir("debezium-json") / "debezium-data-schema-include.txt"
    if not path.is_file():
        pytest.skip(f"conformance sample not found: {path}")
    columns = sql_schema([["id", "INT NOT NULL"], ["name", "STRING"], ["description", "STRING"],
                          ["weight", "FLOAT"]])
    decoder = make_decoder("debezium-json", columns=columns)
    table = cf.raw_records([line.encode() for line in path.read_text().splitlines()])
    first = decoder.decode(table)          # per-message: notices the envelope
    assert_same(*both_paths(decoder, table))
    assert decoder.decode(table).rows.equals(first.rows)


ROW = st.fixed_dictionaries({"id": st.integers(-2**31, 2**31 - 1), "name": st.one_of(st.none(), st.text()),
                             "price": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
                             "ok": st.one_of(st.none(), st.booleans())})


@st.composite
def healthy(draw):
    op = draw(st.sampled_from(["c", "r", "u", "d"]))
    source = draw(st.sampled_from([None, pg_source(lsn=draw(st.integers(0, 2**40))),
                                   {"db": "x", "file": draw(st.sampled_from(["mysql-bin.000001", "binlog"])),
                                    "pos": draw(st.integers(0, 10**9)), "row": draw(st.one_of(st.none(),
                                                                                              st.integers(0, 9)))}]))
    return orjson.dumps(change(op, before=draw(ROW) if op in ("u", "d") else None,
                               after=draw(ROW) if op != "d" else None, source=source))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(healthy(), st.just(None)), min_size=1, max_size=30).filter(lambda v: any(v)))
def test_random_healthy_chunks(values) -> None:
    columns = sql_schema([("id", "INT NOT NULL"), ("name", "STRING"), ("price", "DOUBLE"), ("ok", "BOOLEAN")])
    decoder = make_decoder("debezium-json", columns=columns, options={"metadata": ["source.database"]})
    assert_same(*both_paths(decoder, records(values)))


def test_a_bad_message_sends_only_its_chunk_down_the_slow_path() -> None:
    columns = sql_schema([("id", "INT NOT NULL")])
    decoder = make_decoder("debezium-json", columns=columns)
    good = orjson.dumps(change("c", after={"id": 1}))
    result = decoder.decode(records([good] * 10 + [b"{bad"] + [good] * 5))
    assert result.rows.num_rows == 15 and result.dead_letters.column("offset").to_pylist() == [110]


@pytest.mark.parametrize("odd", [b"null", b"42", b"[]", b"{} {}", b'{"op":"c"}\n{"op":"c"}', b" {}", b"{}\x00"])
def test_values_that_are_not_one_json_object_never_reach_the_bulk_reader(odd: bytes) -> None:
    columns = sql_schema([("id", "INT NOT NULL")])
    decoder = make_decoder("debezium-json", columns=columns)
    good = orjson.dumps(change("c", after={"id": 1}))
    table = records([odd, good, good])
    assert decode_json_chunk(decoder._bulk_plan(), table, key=()) is None
    result = decoder.decode(table)
    assert result.rows.num_rows == 2
    assert result.dead_letters.column("offset").to_pylist() == [100]


def test_column_wise_seq_matches_the_per_message_seq() -> None:
    import pyarrow as pa

    from changelake.formats.debezium import sequence
    from changelake.formats.debezium_bulk import _SOURCE, _sequences

    sources = [
        {"file": "mysql-bin.000003", "pos": 154, "row": 2}, {"file": "mysql-bin.1234567", "pos": 0, "row": None},
        {"file": "a.b.000010", "pos": 7, "row": -1}, {"file": "binlog", "pos": 7, "lsn": 99},
        {"file": "mysql-bin.000003", "pos": -1, "lsn": 5}, {"lsn": 0}, {"lsn": -4}, {"file": None, "pos": 3},
        {"file": "x.000000", "pos": 1, "row": 0}, {},
    ]
    struct = pa.array([{k: s.get(k) for k in ("ts_ms", "db", "schema", "table", "file", "pos", "row", "lsn")}
                       for s in sources], type=_SOURCE)
    partitions = pa.array([3, 12345, 0, 1, 2, 3, 4, 5, 6, 7], pa.int32())
    offsets = pa.array([0, 10**12, 5, 6, 7, 8, 9, 10, 11, 12], pa.int64())
    expected = [sequence(s, p, o) for s, p, o in zip(sources, partitions.to_pylist(), offsets.to_pylist())]
    assert _sequences(struct, partitions, offsets).to_pylist() == expected
