"""Which schema a table follows (changelake.connectors.schema_positions): the one of the newest source position,
never the one read last; positions from Kafka order only within a partition; the sink records the position
before it changes the table, so a replay after a crash in between still makes the change."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from changelake.changelog import KIND, SEQ, seq_from_kafka, seq_from_log_position
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.connectors.schema_positions import PROP_SCHEMA_POSITION, SourceSchema, follow, position_order

from .conftest import ENGINES, engine_fixture

engine = engine_fixture(ENGINES)   # both delta-spark forms (conftest.py, DEFAULT_FORMS)

pytestmark = pytest.mark.unit

OLD = pa.schema([("id", pa.int32()), ("weight_g", pa.int16())])
NEW = pa.schema([("id", pa.int32()), ("weight_g", pa.int32()), ("lot", pa.string())])


def _log(pos: int) -> str:
    return seq_from_log_position(4, pos, 0, offset=pos)


def test_an_older_schema_read_last_changes_nothing_under_every_behaviour():
    for behaviour in ("evolve", "try_evolve", "lenient", "ignore", "exception"):
        got = follow(NEW, [SourceSchema(OLD, _log(10))], recorded=_log(20), behaviour=behaviour, primary_key=["id"])
        assert (got.target, got.changes, got.dropped, got.position, got.older) == (NEW, (), (), None, 1), behaviour


def test_under_lenient_an_older_schema_still_adds_and_widens_what_the_newer_one_dropped():
    # the table took position 30, where weight_g (widened to int32 at 15) and lot (added at 12) are dropped;
    # lenient kept weight_g as int16; the changes of 12..29 read late carry the wider weight_g and lot
    dropped = pa.schema([("id", pa.int32())])
    table = OLD
    got = follow(table, [SourceSchema(NEW, _log(20))], recorded=_log(30), behaviour="lenient", primary_key=["id"])
    assert got.target == NEW and got.dropped == () and got.position is None and got.older == 1
    assert {(c.kind, c.column, c.outcome) for c in got.changes} == {("widen_type", "weight_g", "apply"),
                                                                   ("add_column", "lot", "apply")}
    # nothing narrows or drops from it, and the other behaviours take nothing from it
    assert follow(NEW, [SourceSchema(dropped, _log(20))], recorded=_log(30), behaviour="lenient").target == NEW
    for behaviour in ("evolve", "try_evolve", "ignore", "exception"):
        assert follow(table, [SourceSchema(NEW, _log(20))], recorded=_log(30), behaviour=behaviour).target == OLD


def test_in_one_batch_the_schemas_are_taken_in_position_order_not_reading_order():
    # read: the newer schema first (partition 0), then the older one (partition 1, behind)
    got = follow(OLD, [SourceSchema(NEW, _log(30)), SourceSchema(OLD, _log(12))], recorded=_log(5),
                 behaviour="evolve", primary_key=["id"])
    assert got.target == NEW and got.dropped == () and got.position == _log(30)
    assert {(c.kind, c.column, c.outcome) for c in got.changes} == {("widen_type", "weight_g", "apply"),
                                                                   ("add_column", "lot", "apply")}


def test_a_real_narrowing_or_drop_comes_from_a_newer_position():
    narrowed = pa.schema([("id", pa.int32()), ("weight_g", pa.int16())])
    got = follow(NEW, [SourceSchema(narrowed, _log(40)), SourceSchema(NEW, _log(25))], recorded=_log(20),
                 behaviour="evolve", primary_key=["id"])
    assert [(c.kind, c.outcome) for c in got.refused] == [("narrow_type", "refuse")]
    assert ("drop_column", "lot", "apply") in {(c.kind, c.column, c.outcome) for c in got.changes}
    kept = follow(NEW, [SourceSchema(narrowed, _log(40))], recorded=_log(20), behaviour="lenient")
    assert kept.target == NEW and kept.dropped == ()      # lenient keeps the column and the wider type


def test_a_column_added_and_dropped_within_one_batch_follows_the_behaviour_as_batch_by_batch():
    base = pa.schema([("id", pa.int32())])
    added = base.append(pa.field("tmp", pa.string()))
    schemas = [SourceSchema(added, _log(11)), SourceSchema(base, _log(12))]
    assert follow(base, schemas, recorded=_log(10), behaviour="evolve").target == base
    assert follow(base, schemas, recorded=_log(10), behaviour="lenient").target.names == ["id", "tmp"]


def test_kafka_positions_order_only_within_their_partition():
    assert position_order(seq_from_kafka(1, 7), seq_from_kafka(1, 3)) == "newer"
    assert position_order(seq_from_kafka(1, 2), seq_from_kafka(1, 3)) == "older"
    assert position_order(seq_from_kafka(2, 0), seq_from_kafka(1, 3)) == "unordered"
    assert position_order(seq_from_kafka(9, 9), _log(3)) == "unordered"
    # another partition's schema only adds: no drop, no narrowing, no quarantine even under exception
    other = follow(NEW, [SourceSchema(OLD, seq_from_kafka(3, 900))], recorded=seq_from_kafka(0, 5),
                   behaviour="exception")
    assert other.target == NEW and other.refused == () and other.position is None
    wider = follow(OLD, [SourceSchema(NEW, seq_from_kafka(3, 1))], recorded=seq_from_kafka(0, 5), behaviour="evolve")
    assert wider.target == NEW and wider.position is None      # taken, but the recorded position stays in partition 0
    same = follow(NEW, [SourceSchema(OLD, seq_from_kafka(0, 9))], recorded=seq_from_kafka(0, 5), behaviour="evolve")
    assert same.refused[0].kind == "narrow_type"              # newer in the recorded position's own partition


def _changes(rows: list[dict], schema: pa.Schema, pos: int) -> pa.Table:
    t = pa.Table.from_pylist(rows, schema=schema)
    n = t.num_rows
    return t.append_column(KIND, pa.array([0] * n, pa.int8())).append_column(
        SEQ, pa.array([_log(pos + i) for i in range(n)], pa.string()))


def test_the_sink_records_the_position_at_creation_and_before_a_change_a_replay_finds_it(tmp_path):
    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("id",), schema_change="evolve")
    sink = open_sink(spec, pipeline_id="p")
    sink.apply(_changes([{"id": 1, "weight_g": 5}], OLD, 10), batch_id=0, schema_position=_log(10))
    assert DeltaTable(spec.path).metadata().configuration[PROP_SCHEMA_POSITION] == _log(10)
    # a crash after the position's commit and before the schema change: the replay makes the change
    sink._set_properties({PROP_SCHEMA_POSITION: _log(30)})
    fresh = open_sink(spec, pipeline_id="p")
    fresh.apply(_changes([{"id": 2, "weight_g": 70000, "lot": "L1"}], NEW, 30), batch_id=1, schema_position=_log(30))
    table = read_delta(spec.path)
    assert table.schema.field("weight_g").type == pa.int32() and "lot" in table.schema.names
    assert DeltaTable(spec.path).metadata().configuration[PROP_SCHEMA_POSITION] == _log(30)
    assert sorted(table["id"].to_pylist()) == [1, 2]


def test_the_batch_that_recorded_the_position_is_replayed_as_newer():
    assert follow(OLD, [SourceSchema(NEW, _log(30))], recorded=_log(30), behaviour="evolve").target == NEW
