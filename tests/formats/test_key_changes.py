"""Updates that change a row's primary key, per format, on Arrow (no JVM, no broker).

Every decoder emits an update as ``-U(before), +U(after)`` at one ``_seq``; once the key is known,
``split_key_changes`` turns each pair whose key differs into ``-D(before), +I(after)`` at the same
positions. Folded as the Delta sink folds a batch (``latest_per_key``: the last change of each
key's greatest ``_seq``, ``-U`` ignored), the history of ``tests/keychange_history.py`` - key changes
to fresh keys, back and forth, chains, onto a just-deleted key, chains inside multi-row Canal
messages, re-deliveries - must give the database's final state in every format.
"""

from __future__ import annotations

import itertools

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND, SEQ, RowKind
from changelake.connectors.delta_sink_kernel import latest_per_key
from changelake.formats import make_decoder
from changelake.key_changes import split_key_changes
from changelake.types import arrow_schema
from tests.keychange_history import (
    FORMATS,
    TABLES,
    KeyChangeDatabase,
    Message,
    encode,
    raw_records,
)

from .avro_envelopes import ID, NAME, envelope, framed

pytestmark = pytest.mark.unit

I, UB, UA, D = (int(k) for k in RowKind)


def _decode(fmt: str, table: str, messages: list[Message]) -> pa.Table:
    decoder = make_decoder(fmt, columns=arrow_schema(TABLES[table]["columns"]))
    result = decoder.decode(raw_records([m for m in messages if m.topic.endswith("." + table)]))
    assert result.dead_letters.num_rows == 0, result.dead_letters["error"].to_pylist()[:3]
    return result.rows


def _folded(rows: pa.Table, key: str) -> dict[int, dict]:
    """The table the sink's reduction gives for ``rows`` applied to an empty table in one batch."""
    latest = latest_per_key(rows, primary_key=(key,))
    live = latest.filter(pc.not_equal(latest[KIND], pa.scalar(D, pa.int8())))
    columns = list(TABLES[next(t for t in TABLES if TABLES[t]["key"] == key)]["columns"])
    return {r[key]: r for r in live.select(columns).to_pylist()}


def _moves(db: KeyChangeDatabase, table: str) -> int:
    key = TABLES[table]["key"]
    return sum(1 for st in db.statements if st.table == table and st.op == "update"
               for before, after in st.rows if before[key] != after[key])


@pytest.fixture(scope="module")
def db() -> KeyChangeDatabase:
    db = KeyChangeDatabase(seed=5).history(changes=220)
    assert set(db.key_changes) == {"fresh", "back", "chain", "chain-in-statement", "onto-deleted"}
    return db


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("table", list(TABLES))
def test_a_history_full_of_key_changes_folds_to_the_final_state(db, fmt, table):
    key = TABLES[table]["key"]
    rows = _decode(fmt, table, encode(db, fmt, topic_prefix="shop"))
    split = split_key_changes(rows, (key,))
    assert _folded(split.changes, key) == db.state[table]
    assert split.moves >= _moves(db, table)        # re-delivered ones count again
    # Without the split, the sink drops every -U: the old keys of key changes stay behind (issue #16).
    stale = set(_folded(rows, key)) - set(db.state[table])
    assert stale, "the history should leave old keys behind without the split"


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_move_is_a_delete_then_an_insert_at_the_update_position(db, fmt):
    rows = _decode(fmt, "orders", encode(db, fmt, topic_prefix="shop", redeliver=0))
    out = split_key_changes(rows, ("order_id",)).changes
    kinds, seqs, ids = out[KIND].to_pylist(), out[SEQ].to_pylist(), out["order_id"].to_pylist()
    moved = [i for i in range(len(kinds) - 1) if kinds[i] == D and kinds[i + 1] == I and seqs[i] == seqs[i + 1]]
    assert len(moved) == _moves(db, "orders") and all(ids[i] != ids[i + 1] for i in moved)
    # same-key updates keep Flink's -U/+U
    kept = [i for i in range(len(kinds) - 1) if kinds[i] == UB]
    assert kept and all(kinds[i + 1] == UA and ids[i] == ids[i + 1] for i in kept)
    assert out.drop_columns([KIND]).equals(rows.drop_columns([KIND]))     # only kinds change


def _canal_update(data: list[dict], old: list[dict]) -> bytes:
    return orjson.dumps({"data": [{k: str(v) for k, v in r.items()} for r in data], "old": old,
                         "type": "UPDATE", "database": "shop", "table": "customers", "es": 1, "ts": 2,
                         "isDdl": False})


def test_a_chain_inside_one_canal_message():
    # UPDATE customers SET id = id + 1 WHERE id IN (5, 6) ORDER BY id DESC: 6 -> 7, then 5 -> 6
    raw = raw_records([
        Message("shop.customers", b"", orjson.dumps({
            "data": [{"id": "5", "name": "five", "region": "n"}, {"id": "6", "name": "six", "region": "s"}],
            "type": "INSERT", "database": "shop", "table": "customers", "es": 1, "ts": 2, "isDdl": False})),
        Message("shop.customers", b"", _canal_update(
            [{"id": 7, "name": "six", "region": "s"}, {"id": 6, "name": "five", "region": "n"}],
            [{"id": "6"}, {"id": "5"}]))])
    rows = make_decoder("canal-json", columns=arrow_schema(TABLES["customers"]["columns"])).decode(raw).rows
    assert rows[KIND].to_pylist() == [I, I, UB, UA, UB, UA]
    split = split_key_changes(rows, ("id",))
    assert split.moves == 2
    out = split.changes
    assert list(zip(out[KIND].to_pylist(), out["id"].to_pylist()))[2:] == [(D, 6), (I, 7), (D, 5), (I, 6)]
    assert len(set(out[SEQ].to_pylist()[2:])) == 1          # one message, one position
    assert _folded(out, "id") == {6: {"id": 6, "name": "five", "region": "n"},
                                  7: {"id": 7, "name": "six", "region": "s"}}


def test_a_key_change_with_a_composite_key_and_nulls():
    t = pa.table({"a": [1, 1, 1, 1, None, None, 2, 2], "b": ["x", "y", "x", "x", "z", "z", None, None],
                  "v": [1, 2, 3, 4, 5, 6, 7, 8],
                  KIND: pa.array([UB, UA, UB, UA, UB, UA, UB, UA], pa.int8()),
                  SEQ: ["s1", "s1", "s2", "s2", "s3", "s3", "s4", "s4"]})
    split = split_key_changes(t, ("a", "b"))
    assert split.moves == 1                                # only (1, x) -> (1, y); nulls equal nulls
    assert split.changes[KIND].to_pylist() == [D, I, UB, UA, UB, UA, UB, UA]
    assert split_key_changes(t, ("v",)).moves == 4
    assert split_key_changes(t, ()).changes is t           # key unknown: nothing to compare


def test_pairs_are_only_the_rows_of_one_update():
    # a -U whose next row is another message's +U (different _seq) is no pair
    t = pa.table({"id": [1, 2, 3, 3], KIND: pa.array([UB, UA, I, D], pa.int8()), SEQ: ["s1", "s2", "s3", "s4"]})
    assert split_key_changes(t, ("id",)).moves == 0
    again = split_key_changes(split_key_changes(
        pa.table({"id": [1, 2], KIND: pa.array([UB, UA], pa.int8()), SEQ: ["s", "s"]}), ("id",)).changes, ("id",))
    assert again.moves == 0 and again.changes[KIND].to_pylist() == [D, I]     # idempotent


def test_debezium_avro_update_with_different_keys():
    from changelake.formats.debezium_avro import DebeziumAvroDecoder

    schema = envelope([ID, NAME])
    decoder = DebeziumAvroDecoder(schema_lookup={7: schema}.__getitem__)
    raw = raw_records([Message("shop.items", b"", framed(7, schema, "c", pos=10, after={"id": 1, "name": "a"})),
                       Message("shop.items", b"", framed(7, schema, "u", pos=20, before={"id": 1, "name": "a"},
                                                         after={"id": 2, "name": "a"})),
                       Message("shop.items", b"", framed(7, schema, "u", pos=30, before={"id": 2, "name": "a"},
                                                         after={"id": 2, "name": "b"}))])
    rows = decoder.decode(raw).rows
    split = split_key_changes(rows, ("id",))
    assert split.moves == 1
    assert list(zip(split.changes[KIND].to_pylist(), split.changes["id"].to_pylist())) == [
        (I, 1), (D, 1), (I, 2), (UB, 2), (UA, 2)]
    folded = latest_per_key(split.changes, primary_key=("id",))
    assert sorted(zip(folded["id"].to_pylist(), folded[KIND].to_pylist(), folded["name"].to_pylist())) == [
        (1, D, "a"), (2, UA, "b")]


def _conformance_cases_with_updates() -> list:
    from tests.formats import conformance as cf

    params = []
    for fmt in ("debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json"):
        for param in cf.case_params(fmt):
            path = param.values[0]
            case = cf.load(path) if path is not None else {}
            if any(e["kind"] == "-U" for e in case.get("expected") or ()) and "pipeline" not in case:
                params.append(pytest.param(fmt, path, id=f"{fmt}/{path.name.removesuffix('.expected.json')}"))
    return params or [pytest.param(None, None, marks=pytest.mark.skip(reason="conformance cases not found"))]


@pytest.mark.parametrize("fmt, path", _conformance_cases_with_updates())
def test_flink_conformance_cases_keep_their_row_kinds_under_their_key(fmt, path):
    """Flink's cases never change ``id`` in an update: split by ``id`` they are Flink's changelog exactly.
    Declared with a key that an update does change, the result DELIBERATELY differs from Flink's row kinds:
    Flink keeps ``-U, +U``; changelake emits ``-D, +I`` for such a pair (same rows, same order), because
    the row moved to another key and an upsert by key must remove the old one."""
    from tests.formats import conformance as cf

    case = cf.load(path)
    decoder = None
    if fmt == "debezium-avro-confluent":          # the registry serves the case's schema (see its own test)
        from changelake.formats.debezium_avro import DebeziumAvroDecoder
        from changelake.formats.sqltypes import sql_schema

        text = (path.parent / "debezium-test-schema.json").read_text()
        decoder = DebeziumAvroDecoder(columns=sql_schema(case["schema"]), schema_lookup={81: text}.__getitem__)
    result = cf.run_case(fmt, path, decoder=decoder)            # Flink's kinds, as before
    rows = result.rows
    by_id = split_key_changes(rows, ("id",))
    assert by_id.moves == 0
    assert cf.changelog(by_id.changes, case["schema"]) == cf.expected_changelog(case["expected"], case["schema"])

    expected = cf.expected_changelog(case["expected"], case["schema"])
    names = [c[0] for c in case["schema"]]
    other = next(n for n in names[1:] if any(
        a["kind"] == "-U" and b["kind"] == "+U" and a["row"][names.index(n)] != b["row"][names.index(n)]
        for a, b in itertools.pairwise(expected)))
    by_other = split_key_changes(rows, (other,))
    differs = [(a["kind"], b["kind"]) == ("-U", "+U") and a["row"][names.index(other)] != b["row"][names.index(other)]
               for a, b in itertools.pairwise(expected)]
    deliberate = [dict(e) for e in expected]
    for i, moved in enumerate(differs):
        if moved:
            deliberate[i]["kind"], deliberate[i + 1]["kind"] = "-D", "+I"
    assert by_other.moves == sum(differs) > 0
    assert cf.changelog(by_other.changes, case["schema"]) == deliberate


# --- property: log positions order a move against its old key's changes in other partitions ----------

_lake = iter(range(10**6))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), fmt=st.sampled_from(["maxwell-json", "ogg-json", "debezium-json"]),
       rnd=st.randoms(use_true_random=False))
def test_with_log_positions_any_partitioning_and_batching_ends_in_the_final_state(tmp_path, seed, fmt, rnd):
    """Messages keyed by their row's new key spread over 3 partitions (a move lands in the new key's
    partition), read in any interleaving that keeps each partition's order, in any batching: the mirror
    (split by the key, then the delta-rs sink with its tombstones) ends in the database's final state."""
    from changelake.connectors.delta_read import read_delta
    from changelake.connectors.delta_sink import TableSpec, open_sink

    db = KeyChangeDatabase(seed=seed).history(customers=6, orders=4, changes=45)
    rows = _decode(fmt, "customers", encode(db, fmt, topic_prefix="shop"))
    messages = [rows.filter(pc.equal(rows["_offset"], o)) for o in sorted(set(rows["_offset"].to_pylist()))]
    partitions: list[list[pa.Table]] = [[], [], []]
    for m in messages:
        partitions[hash(m["id"][m.num_rows - 1].as_py()) % 3].append(m)
    order = []
    while any(partitions):
        order.append(rnd.choice([p for p in partitions if p]).pop(0))
    sink = open_sink(TableSpec(name="c", path=str(tmp_path / f"t{next(_lake)}"), primary_key=("id",)),
                     pipeline_id="prop", engine="delta-rs")
    batch_id = 0
    while order:
        n = rnd.randint(1, 12)
        batch, order = pa.concat_tables(order[:n]), order[n:]
        sink.apply(split_key_changes(batch, ("id",)).changes, batch_id=batch_id)
        batch_id += 1
    got = {r["id"]: r for r in read_delta(sink.spec.path, columns=["id", "name", "region"]).to_pylist()}
    assert got == db.state["customers"]
