"""``_seq`` across source epochs and ``sequence_by`` (changelake.formats.sequence), without Spark."""

from __future__ import annotations

import random

import orjson
import pyarrow as pa
import pytest

from changelake.changelog import RAW_SCHEMA, TRUNCATE_SCHEMA, seq_from_log_position
from changelake.errors import DecodeError
from changelake.formats.debezium_json import DebeziumJsonDecoder
from changelake.formats.maxwell_json import MaxwellJsonDecoder
from changelake.formats.sequence import (
    POSITIONS_SCHEMA, PartitionEpoch, Sequencer, apply_sequence_by, resequenced, states_of, states_table)

pytestmark = pytest.mark.unit

COLUMNS = pa.schema([("id", pa.int64()), ("v", pa.string())])


def _records(values: list[bytes], partition: int = 0, first: int = 0) -> pa.Table:
    n = len(values)
    return pa.table({"topic": ["t"] * n, "partition": pa.array([partition] * n, pa.int32()),
                     "offset": pa.array(range(first, first + n), pa.int64()),
                     "timestamp": pa.nulls(n, pa.timestamp("ms", tz="UTC")), "key": pa.array([b"k"] * n),
                     "value": pa.array(values)}, schema=RAW_SCHEMA)


def _mysql(v: str, file: int, pos: int, ts: int, server_id: int = 1, gtid: str | None = None,
           schema: bool = False) -> bytes:
    payload = {"op": "c", "before": None, "after": {"id": 1, "v": v},
               "source": {"file": f"mysql-bin.{file:06d}", "pos": pos, "row": 0, "server_id": server_id,
                          "gtid": gtid, "ts_ms": ts}}
    return orjson.dumps(payload)


def _latest(rows: pa.Table) -> str:
    """What a sink keeps: the value of the greatest _seq (the last of equal ones)."""
    best = max(range(rows.num_rows), key=lambda i: (rows["_seq"][i].as_py(), i))
    return rows["v"][best].as_py()


def _decode(values: list[bytes], sequencer: Sequencer, **records) -> pa.Table:
    result = DebeziumJsonDecoder(columns=COLUMNS).decode(_records(values, **records))
    rows, _ = resequenced(sequencer, result.rows, result.truncates, result.positions, "source")
    return rows


def test_first_epoch_keeps_the_tokens_tables_already_hold():
    rows = _decode([_mysql("a", 3, 500, 1000)], Sequencer())
    assert rows["_seq"].to_pylist() == [seq_from_log_position(3, 500, 0, offset=0)]


def test_a_new_server_orders_after_every_change_of_the_old_one():
    seq = Sequencer()
    rows = _decode([_mysql("old", 3, 900, 1000), _mysql("new", 1, 100, 2000, server_id=2),
                    _mysql("newer", 1, 200, 3000, server_id=2)], seq)
    assert _latest(rows) == "newer"
    assert rows["_seq"][1].as_py().startswith("m00000000000000000001")
    assert [(c.reason, c.before, c.after) for c in seq.changes] == [("new-server", "server_id 1", "server_id 2")]
    # within the new epoch the log position still decides: a re-delivered older change stays older
    again = _decode([_mysql("new", 1, 100, 2000, server_id=2)], seq, first=3)
    assert again["_seq"][0].as_py() < rows["_seq"][-1].as_py()


def test_gtid_server_uuid_is_the_marker_without_a_server_id():
    seq = Sequencer()
    _decode([_mysql("a", 2, 900, 1000, server_id=0, gtid="aaaa:5"),
             _mysql("b", 2, 950, 1500, server_id=0, gtid="bbbb:1")], seq)
    assert [c.after for c in seq.changes] == ["server_uuid bbbb"]


def test_reset_master_position_back_while_time_goes_on():
    seq = Sequencer()
    rows = _decode([_mysql("before", 5, 900, 1000), _mysql("after reset", 1, 4, 5000)], seq)
    assert _latest(rows) == "after reset" and seq.changes[0].reason == "position-reset"


def test_a_redelivered_block_is_not_a_new_epoch():
    seq = Sequencer()
    history = [_mysql(f"v{i}", 2, 100 * i, 1000 + i) for i in range(1, 6)]
    rows = _decode(history + history[2:], seq)          # a connector restart re-sends, in the original order
    assert seq.changes == [] and _latest(rows) == "v5"


def test_snapshot_rows_without_a_server_do_not_start_an_epoch():
    seq = Sequencer()
    _decode([_mysql("snap", 3, 157, 1000, server_id=0), _mysql("stream", 3, 300, 2000, server_id=7)], seq)
    assert seq.changes == []


def test_epoch_state_carries_over_batches_and_a_replay_gets_the_same_tokens():
    first = Sequencer()
    _decode([_mysql("old", 3, 900, 1000), _mysql("new", 1, 100, 2000, server_id=2)], first)
    carried = states_of(states_table(first.end_states()))
    assert carried[("t", 0)] == PartitionEpoch(at=2, ordinal=1, marker="server_id 2", order=(1 << 32) | 100, ts=2000)
    batch = [_mysql("newer", 1, 300, 3000, server_id=2)]
    once = _decode(batch, Sequencer(dict(carried)), first=2)
    twice = _decode(batch, Sequencer(states_of(states_table(first.end_states()))), first=2)
    assert once["_seq"].to_pylist() == twice["_seq"].to_pylist()
    assert once["_seq"][0].as_py().startswith("m00000000000000000001")


class _RowByRow(Sequencer):
    """The epoch rule applied message by message only: what the column-wise steady path must agree with."""

    def _walk_partition(self, key, state, chunk, fresh):
        return self._walk_rows(key, state, chunk, fresh)


def _positions(rng: random.Random, first: int, n: int, *, failover: bool) -> pa.Table:
    """``n`` messages of partitions 0 and 1 from offset ``first``: growing positions with gaps of nulls,
    re-delivered blocks (position and time back), and with ``failover`` a position reset or a new server."""
    rows, order, ts = [], 1000, 50_000
    for i in range(n):
        order += rng.randint(0, 300)
        ts += rng.randint(0, 2)
        kind = rng.random()
        if kind < 0.03:
            order, ts = order - rng.randint(1, 900), ts - rng.randint(0, 5)        # re-delivered: both go back
        elif failover and kind < 0.05:
            order = rng.randint(0, 500)                                            # RESET MASTER: time goes on
        marker = None if rng.random() < 0.2 else f"server_id {7 + (failover and i > n // 2 and rng.random() < 0.5)}"
        rows.append({"topic": "t", "partition": i % 2, "offset": first + i // 2, "marker": marker,
                     "order": None if rng.random() < 0.1 else order, "ts": None if rng.random() < 0.1 else ts})
    return pa.Table.from_pylist(rows, schema=POSITIONS_SCHEMA)


@pytest.mark.parametrize("failover", [False, True])
def test_the_column_wise_walk_gives_the_ordinals_and_states_of_the_walk_message_by_message(failover):
    # the steady path takes the ordinary chunks whole; wherever an epoch may start, the rule goes message by
    # message: over many chunks, with the state carried between them, both give the same everything
    epochs_started = 0
    for seed in range(40):
        rng = random.Random(seed)
        fast, slow = Sequencer(), _RowByRow()
        start = PartitionEpoch(marker="server_id 7") if seed % 3 == 0 else None
        if start is not None:
            fast.states[("t", 0)], slow.states[("t", 0)] = PartitionEpoch(**start.to_json()), start
        first = 0
        for _ in range(4):
            n = rng.choice([1, 2, 40, 400])
            chunk = _positions(rng, first, n, failover=failover and rng.random() < 0.5)
            first += (n + 1) // 2
            got, want = fast.walk(chunk), slow.walk(chunk)
            assert got.keys() == want.keys()
            for k in want:
                assert got[k][0].tolist() == want[k][0].tolist() and got[k][1].tolist() == want[k][1].tolist(), seed
            assert fast.states == slow.states and fast.changes == slow.changes, seed
        if failover:
            epochs_started += bool(slow.changes)
    assert not failover or epochs_started > 10      # the failover histories do start epochs


def test_postgres_commit_lsn_orders_interleaved_transactions_without_an_epoch():
    def pg(v: str, lsn: int, commit: int, ts: int) -> bytes:
        return orjson.dumps({"op": "c", "before": None, "after": {"id": 1, "v": v},
                             "source": {"lsn": lsn, "sequence": f'["{commit}","{lsn}"]', "ts_ms": ts}})
    seq = Sequencer()
    # T2 (lsn 200) commits before T1 (lsn 100): the change LSN goes back, the commit LSN does not
    _decode([pg("t2", 200, 150, 1000), pg("t1", 100, 250, 2000)], seq)
    assert seq.changes == []
    rows = _decode([pg("restored", 120, 110, 3000)], seq, first=2)
    assert seq.changes[0].reason == "position-reset" and rows["_seq"][0].as_py().startswith("m")


def test_maxwell_server_id_is_its_epoch():
    def mx(v: str, position: str, server_id: int, ts: int) -> bytes:
        return orjson.dumps({"type": "insert", "database": "d", "table": "t", "data": {"id": 1, "v": v},
                             "position": position, "server_id": server_id, "ts": ts})
    result = MaxwellJsonDecoder(columns=COLUMNS).decode(
        _records([mx("old", "mysql-bin.000009:900", 1, 10), mx("new", "mysql-bin.000001:4", 2, 11)]))
    seq = Sequencer()
    rows, _ = resequenced(seq, result.rows, result.truncates, result.positions, "source")
    assert _latest(rows) == "new" and seq.changes[0].reason == "new-server"


def test_bulk_and_per_message_paths_report_the_same_positions():
    values = [_mysql(f"v{i}", 2, 100 * i, 1000 + i, server_id=3) for i in range(1, 4)]
    bulk = DebeziumJsonDecoder(columns=COLUMNS).decode(_records(values)).positions
    per_message = DebeziumJsonDecoder(columns=COLUMNS).decode(_records(values + [b"{not json"])).positions
    assert bulk.to_pylist() == per_message.to_pylist()
    assert bulk["marker"].to_pylist() == ["server_id 3"] * 3


def test_truncates_get_their_epoch_too():
    seq = Sequencer()
    t = {"op": "t", "source": {"file": "mysql-bin.000001", "pos": 10, "server_id": 2, "ts_ms": 9000}}
    result = DebeziumJsonDecoder(columns=COLUMNS, options={"on-truncate": "apply"}).decode(
        _records([_mysql("old", 4, 900, 1000), orjson.dumps(t)]))
    _, truncates = resequenced(seq, result.rows, result.truncates, result.positions, "source")
    assert truncates.schema == TRUNCATE_SCHEMA and truncates["_seq"][0].as_py().startswith("m")


def test_sequence_by_kafka_orders_by_offset():
    result = DebeziumJsonDecoder(columns=COLUMNS).decode(
        _records([_mysql("first", 9, 900, 1000), _mysql("second", 1, 4, 1000)], partition=2))
    rows = apply_sequence_by(result.rows, "kafka")
    assert rows["_seq"].to_pylist() == ["k00002" + f"{o:020d}" for o in (0, 1)] and _latest(rows) == "second"


@pytest.mark.parametrize("type_, values", [
    (pa.int64(), [5, -3, None, 2 ** 40]),
    (pa.timestamp("us", tz="UTC"), [5_000_000, 1, None, 7_000_000]),
    (pa.date32(), [300, -20, None, 301]),
])
def test_sequence_by_column_orders_by_the_value_then_offset(type_, values):
    rows = pa.table({"id": [1, 1, 1, 1], "u": pa.array(values, type_), "_seq": ["x"] * 4,
                     "_partition": pa.array([0] * 4, pa.int32()), "_offset": pa.array([0, 1, 2, 3], pa.int64())})
    seqs = apply_sequence_by(rows, {"column": "u"})["_seq"].to_pylist()
    ranked = sorted(range(4), key=lambda i: seqs[i])
    assert ranked == sorted(range(4), key=lambda i: (values[i] is not None, values[i] or 0, i))
    assert all(s.startswith("c") for s in seqs)


def test_sequence_by_a_missing_column_says_what_to_fix():
    rows = pa.table({"id": [1], "_seq": ["x"], "_partition": pa.array([0], pa.int32()), "_offset": [0]})
    with pytest.raises(DecodeError, match="sequence_by names column 'updated_at'"):
        apply_sequence_by(rows, {"column": "updated_at"})
