"""Property: every input message ends as exactly one of rows, one dead letter, or a counted
skip - whatever the bytes - and no exception escapes a decoder."""

from __future__ import annotations

import io
import json
import struct

import fastavro
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.formats import REASONS, make_decoder
from changelake.formats.debezium_avro import DebeziumAvroDecoder
from changelake.formats.debezium_bulk import decode_json_chunk
from changelake.formats.sqltypes import sql_schema
from tests.formats import fuzz_cases as fz
from tests.formats.helpers import change, records

pytestmark = pytest.mark.unit

COLUMNS = sql_schema([("id", "INT NOT NULL"), ("name", "STRING"), ("price", "DOUBLE"), ("ok", "BOOLEAN")])

scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                   st.text(max_size=8), st.just("12"), st.just("1.5"))
good_row = st.fixed_dictionaries({"id": st.integers(0, 10**6), "name": st.text(max_size=10),
                                  "price": st.floats(-1e6, 1e6), "ok": st.booleans()})
any_row = st.dictionaries(st.sampled_from(["id", "name", "price", "ok", "extra"]), scalar, max_size=5)
op = st.sampled_from(["c", "r", "u", "d", "t", "m", "x", None, 1])


@st.composite
def message(draw) -> bytes | None:
    kind = draw(st.sampled_from(["good", "good", "shaped", "truncated", "bytes", "non-utf8", "tombstone", "json"]))
    if kind == "tombstone":
        return draw(st.sampled_from([None, b""]))
    if kind == "bytes":
        return draw(st.binary(min_size=1, max_size=40))
    if kind == "json":
        return json.dumps(draw(st.one_of(scalar, st.lists(scalar, max_size=3)))).encode()
    if kind == "good":
        o = draw(st.sampled_from(["c", "u", "d"]))
        before = draw(good_row) if o in ("u", "d") else None
        after = draw(good_row) if o in ("c", "u") else None
        return orjson.dumps(change(o, before=before, after=after))
    # stdlib json: it writes integers beyond 64 bits, which orjson refuses to
    body = json.dumps(change(draw(op), before=draw(st.one_of(st.none(), any_row)),
                             after=draw(st.one_of(st.none(), any_row)))).encode()
    if kind == "truncated":
        return body[:draw(st.integers(1, max(1, len(body) - 1)))]
    if kind == "non-utf8":
        cut = draw(st.integers(0, len(body)))
        return body[:cut] + b"\xff\xfe" + body[cut:]
    return body


def _check_accounting(values: list, result) -> None:
    n = len(values)
    assert result.dead_letters.schema == DEAD_LETTER_SCHEMA
    row_offsets = set(result.rows.column("_offset").to_pylist())
    dead_offsets = result.dead_letters.column("offset").to_pylist()
    assert len(dead_offsets) == len(set(dead_offsets)), "a message produced two dead letters"
    assert not row_offsets & set(dead_offsets), "a message produced rows and a dead letter"
    assert set(result.dead_letters.column("reason").to_pylist()) <= set(REASONS)
    # every message is accounted for exactly once: rows, a dead letter, a truncate or a counted skip
    truncate_offsets = result.truncates.column("offset").to_pylist()
    assert not set(truncate_offsets) & (row_offsets | set(dead_offsets))
    assert len(row_offsets) + len(dead_offsets) + len(truncate_offsets) + sum(result.skipped.values()) == n
    tombstones = sum(1 for v in values if not v)
    assert result.skipped.get("tombstone", 0) >= tombstones
    # dead letters keep the raw bytes of their message
    first = 100
    for d in result.dead_letters.to_pylist():
        assert d["value"] == values[d["offset"] - first]
        assert d["error"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message(), max_size=25), st.booleans())
def test_debezium_json_accounts_for_every_message(values, upsert) -> None:
    decoder = make_decoder("debezium-json", columns=COLUMNS, options={"upsert": upsert})
    _check_accounting(values, decoder.decode(records(values)))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message(), max_size=25))
def test_debezium_json_inferred_columns_accounts_for_every_message(values) -> None:
    decoder = make_decoder("debezium-json")
    _check_accounting(values, decoder.decode(records(values)))


@st.composite
def canal_message(draw) -> bytes | None:
    kind = draw(st.sampled_from(["good", "shaped", "truncated", "tombstone", "ddl"]))
    if kind == "tombstone":
        return None
    if kind == "ddl":
        return orjson.dumps({"data": None, "database": "db", "table": "t", "isDdl": True, "type": "CREATE"})
    t = draw(st.sampled_from(["INSERT", "UPDATE", "DELETE", "ERASE", "BOGUS"]))
    text_row = st.fixed_dictionaries({"id": st.integers(0, 99).map(str), "name": st.text(max_size=5),
                                      "price": st.floats(0, 10).map(repr), "ok": st.sampled_from(["1", "0"])})
    rows = draw(st.lists(text_row if kind == "good" else any_row, min_size=0 if kind == "shaped" else 1, max_size=3))
    old = [dict(list(r.items())[:1]) for r in rows] if t == "UPDATE" or kind != "good" else None
    body = json.dumps({"data": rows, "old": old, "database": "db", "table": "t", "type": t, "es": 1, "ts": 2,
                       "isDdl": False}).encode()
    if kind == "truncated":
        return body[:draw(st.integers(1, len(body) - 1))]
    return body


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(canal_message(), max_size=20))
def test_canal_json_accounts_for_every_message(values) -> None:
    decoder = make_decoder("canal-json", columns=COLUMNS)
    _check_accounting(values, decoder.decode(records(values)))


AVRO_ROW = {"type": "record", "name": "Row", "fields": [
    {"name": "id", "type": "int"}, {"name": "name", "type": ["null", "string"], "default": None},
    {"name": "price", "type": ["null", "double"], "default": None},
    {"name": "ok", "type": ["null", "boolean"], "default": None}]}
AVRO_ENVELOPE = fastavro.parse_schema({"type": "record", "name": "Envelope", "fields": [
    {"name": "before", "type": ["null", AVRO_ROW], "default": None},
    {"name": "after", "type": ["null", "Row"], "default": None},
    {"name": "op", "type": "string"}]})


@st.composite
def avro_message(draw) -> bytes | None:
    kind = draw(st.sampled_from(["good", "good", "truncated", "bad-magic", "unknown-id", "tombstone", "bytes"]))
    if kind == "tombstone":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=12))
    o = draw(st.sampled_from(["c", "u", "d", "x"]))
    row = st.fixed_dictionaries({"id": st.integers(-2**31, 2**31 - 1), "name": st.one_of(st.none(), st.text()),
                                 "price": st.floats(allow_nan=False), "ok": st.booleans()})
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, AVRO_ENVELOPE, {"before": draw(row) if o in ("u", "d") else None,
                                                    "after": draw(row) if o in ("c", "u") else None, "op": o})
    schema_id = 9 if kind == "unknown-id" else 1
    framed = (b"\x01" if kind == "bad-magic" else b"\x00") + struct.pack(">I", schema_id) + buf.getvalue()
    if kind == "truncated":
        return framed[:draw(st.integers(1, len(framed) - 1))]
    return framed


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(avro_message(), max_size=20))
def test_debezium_avro_accounts_for_every_message(values) -> None:
    def lookup(schema_id: int):
        if schema_id != 1:
            raise KeyError(schema_id)
        return AVRO_ENVELOPE

    decoder = DebeziumAvroDecoder(columns=COLUMNS, schema_lookup=lookup)
    _check_accounting(values, decoder.decode(records(values)))


def test_rows_only_come_from_decodable_messages() -> None:
    """A fixed mix, counted by hand: 2 good (3 rows), 1 tombstone, 3 bad."""
    values = [orjson.dumps(change("c", after={"id": 1, "name": "a", "price": 1.0, "ok": True})), None,
              b'{"before":', b"\xff", orjson.dumps(change("q", after={"id": 2})),
              orjson.dumps(change("u", before={"id": 3}, after={"id": 3, "name": "b"}))]
    result = make_decoder("debezium-json", columns=COLUMNS).decode(records(values))
    assert result.rows.num_rows == 3
    assert result.dead_letters.column("reason").to_pylist() == ["malformed", "malformed", "unknown-op"]
    assert result.skipped == {"tombstone": 1}
    assert pa.compute.sum(result.rows.column("_offset")).as_py() == 100 + 105 + 105


# --- every format and path: malformed messages are dead letters, the rest equals the truth ------
#
# Issue #11: 100% of malformed messages (truncated, non-UTF-8 inside a string value or a field
# name, wrong types, out-of-range values, unknown op, empty, not JSON, not an envelope) end in the
# dead letters with their raw bytes and nothing of them reaches the rows; the well-formed rest
# decodes to exactly the values it was written from (fuzz_cases: every kind of value a source
# database holds). Bulk paths are held to the same truth with chunks they must take.

TRUTH_VARIANTS = {
    "debezium-json": lambda: fz.DebeziumBare(),
    "debezium-json+schema": lambda: fz.DebeziumEnvelope(),
    "debezium-json+schema, columns from the schema": lambda: fz.DebeziumEnvelope(declared_columns=False),
    "debezium-avro": lambda: fz.DebeziumAvro(),
    "debezium-avro, columns from the writer schema": lambda: fz.DebeziumAvro(declared_columns=False),
    "canal-json": lambda: fz.Canal(),
    "canal-json, columns from mysqlType": lambda: fz.Canal(declared_columns=False),
    "maxwell-json": lambda: fz.Maxwell(),
    "ogg-json": lambda: fz.Ogg(),
}


@st.composite
def changes(draw, names, *, finite: bool = False) -> list[fz.Change]:
    out = []
    for i in range(draw(st.integers(1, 10))):
        op = draw(st.sampled_from("cud"))
        rows = [draw(fz.truth_row(tuple(names), finite=finite)) | {"id": i} for _ in range(2)]
        out.append(fz.Change(op, rows[0] if op in "ud" else None, rows[1] if op in "cu" else None))
    return out


@st.composite
def mixed_batch(draw, f: fz.Format):
    """(messages, well-formed changes by index, malformed kind by index); some tombstones."""
    messages, good, bad = [], {}, {}
    for i, c in enumerate(draw(changes(f.names))):
        roll = draw(st.integers(0, 9))
        if roll < 3:
            bad[len(messages)] = kind = draw(st.sampled_from(f.kinds))
            messages.append(fz.spoil(draw, f, c, kind))
        elif roll == 3:
            messages.append(None)
        else:
            good[len(messages)] = c
            messages.append(f.write(c))
    return messages, good, bad


def _decoder(f: fz.Format):
    args = f.decoder_args()
    if f.fmt == "debezium-avro-confluent":
        return DebeziumAvroDecoder(**args)
    return make_decoder(f.fmt, **args)


def _expected(f: fz.Format, good: dict[int, fz.Change], first: int = 100) -> list[dict]:
    return [{**{n: fz.comparable(row[n]) for n in f.names}, "_kind": kind, "_offset": first + i}
            for i, c in sorted(good.items()) for kind, row in c.rows()]


def _got(f: fz.Format, rows: pa.Table) -> list[dict]:
    if rows.num_rows == 0:
        return []   # (columns taken from the data are unknown while no message was good)
    return [{k: fz.comparable(v) for k, v in r.items()} for r in rows.select([*f.names, "_kind", "_offset"]).to_pylist()]


def _check_truth(f: fz.Format, messages: list, good: dict, bad: dict, result) -> None:
    result.rows.validate(full=True)   # no invalid UTF-8 and no broken array anywhere
    letters = {d["offset"] - 100: d for d in result.dead_letters.to_pylist()}
    assert set(letters) == set(bad), (f"malformed {sorted(bad)} but dead letters {sorted(letters)}: "
                                      f"{[(i, d['reason'], d['error']) for i, d in letters.items() if i not in bad]}")
    for i, kind in bad.items():
        assert letters[i]["value"] == messages[i], "a dead letter lost its raw bytes"
        assert letters[i]["reason"] in fz.SPOILED[kind], (kind, letters[i]["reason"], letters[i]["error"])
        assert letters[i]["error"]
    assert not set(result.rows.column("_offset").to_pylist()) & {100 + i for i in bad}
    assert _got(f, result.rows) == _expected(f, good)
    assert result.skipped.get("tombstone", 0) == sum(1 for m in messages if m is None)


@pytest.mark.parametrize("variant", sorted(TRUTH_VARIANTS))
def test_every_format_dead_letters_the_malformed_and_decodes_the_rest_exactly(variant: str) -> None:
    f = TRUTH_VARIANTS[variant]()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(mixed_batch(f))
    def run(batch) -> None:
        messages, good, bad = batch
        _check_truth(f, messages, good, bad, _decoder(f).decode(records(messages)))
        # the well-formed messages alone (a healthy chunk: the bulk path where there is one)
        only_good = [messages[i] for i in sorted(good)]
        _check_truth(f, only_good, dict(enumerate(good[i] for i in sorted(good))), {},
                     _decoder(f).decode(records(only_good)))

    run()


BULK_VARIANTS = {
    "debezium-json": lambda: fz.DebeziumBare(fz.BULK_NAMES),
    "debezium-json+schema": lambda: fz.DebeziumEnvelope([n for n in fz.BULK_NAMES if n != "dec"]),
}


@pytest.mark.parametrize("variant", sorted(BULK_VARIANTS))
def test_debezium_json_bulk_path_equals_the_truth(variant: str) -> None:
    """Chunks the Arrow JSON reader must take (the full value ranges of the types it reads; doubles
    finite, as JSON numbers), decoded both ways."""
    f = BULK_VARIANTS[variant]()

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(changes(f.names, finite=True))
    def run(cs) -> None:
        messages = [f.write(c) for c in cs]
        decoder = _decoder(f)
        if isinstance(f, fz.DebeziumEnvelope):
            decoder.decode(records(messages[:1]))   # the first envelope tells the encodings
        table = records(messages)
        bulk = decode_json_chunk(decoder._bulk_plan(), table, key=decoder._key)
        assert bulk is not None, "the bulk path declined a healthy chunk"
        for result in (bulk, decoder._decode(table)):
            _check_truth(f, messages, dict(enumerate(cs)), {}, result)

    run()


@pytest.mark.skipif(not __import__("changelake.formats.debezium_avro_bulk", fromlist=["AVAILABLE"]).AVAILABLE,
                    reason="polars is not installed")
@pytest.mark.parametrize("declared_columns", [True, False], ids=["declared", "writer-schema"])
def test_debezium_avro_bulk_path_equals_the_truth(declared_columns: bool) -> None:
    """Every type but the ZonedTimestamp text, which the polars path leaves to fastavro."""
    f = fz.DebeziumAvro([n for n in fz.NAMES if n != "ltz"], declared_columns=declared_columns)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(changes(f.names))
    def run(cs) -> None:
        messages = [f.write(c) for c in cs]
        decoder = _decoder(f)
        table = records(messages)
        decoder._read_writer_schemas(table)
        bulk = decoder._bulk(table)
        assert bulk is not None, "the polars path declined a healthy chunk"
        for result in (bulk, decoder._decode(table)):
            _check_truth(f, messages, dict(enumerate(cs)), {}, result)

    run()


INFERRED_VARIANTS = {
    "debezium-json": lambda: fz.DebeziumBare(),
    "maxwell-json": lambda: fz.Maxwell(),
    "ogg-json": lambda: fz.Ogg(),
}


@pytest.mark.parametrize("variant", sorted(INFERRED_VARIANTS))
def test_inferred_columns_dead_letter_every_malformed_message(variant: str) -> None:
    """Without declared columns nothing is of a wrong type, but every message that is not valid
    JSON, not UTF-8, not a change or of an unknown op is still a dead letter with its bytes."""
    f = INFERRED_VARIANTS[variant]()
    f.kinds = tuple(k for k in f.kinds if k not in ("wrong-type", "out-of-range"))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(mixed_batch(f))
    def run(batch) -> None:
        messages, _, bad = batch
        result = make_decoder(f.fmt).decode(records(messages))
        result.rows.validate(full=True)
        letters = {d["offset"] - 100: d for d in result.dead_letters.to_pylist()}
        assert set(bad) <= set(letters)
        assert all(letters[i]["value"] == messages[i] for i in letters)
        assert not set(result.rows.column("_offset").to_pylist()) & {100 + i for i in letters}

    run()
