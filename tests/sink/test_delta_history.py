"""SCD type 2 history tables (``TableSpec(history="scd2")``) on delta-rs: versions, deletes, late
changes, replays, crashes, and the whole history against one computed independently in DuckDB SQL."""

from __future__ import annotations

import random

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND, SEQ
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.errors import ConfigError, SinkCommitError

pytestmark = pytest.mark.unit

KINDS = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def changes(rows: list[tuple]) -> pa.Table:
    """(kind, seq, id, name, score) rows as a changelog batch."""
    return pa.table({
        "id": pa.array([r[2] for r in rows], pa.int64()),
        "name": pa.array([r[3] for r in rows], pa.string()),
        "score": pa.array([r[4] for r in rows], pa.int32()),
        KIND: pa.array([KINDS[r[0]] for r in rows], pa.int8()),
        SEQ: pa.array([r[1] for r in rows], pa.string()),
    })


def versions(path: str) -> list[tuple]:
    """(id, name, score, __start_at, __end_at) of every version, ordered."""
    reader = QueryBuilder().register("t", DeltaTable(path)).execute(
        'SELECT id, name, score, __start_at, __end_at FROM t ORDER BY id, __start_at')
    return [tuple(r.values()) for r in pa.table(reader).to_pylist()]


def history_sink(path: str, **spec):
    return open_sink(TableSpec(name="people", path=path, primary_key=("id",), history="scd2", **spec),
                     pipeline_id="hist")


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / "people")


def test_every_version_is_kept_and_a_delete_closes_the_current_one(path):
    sink = history_sink(path)
    sink.apply(changes([("+I", "l01", 1, "ann", 1), ("+I", "l02", 2, "bob", 5)]), batch_id=0)
    sink.apply(changes([("-U", "l03", 1, "ann", 1), ("+U", "l03", 1, "ann", 2), ("-D", "l04", 2, "bob", 5)]),
               batch_id=1)
    sink.apply(changes([("+I", "l05", 2, "bob", 6)]), batch_id=2)
    assert versions(path) == [(1, "ann", 1, "l01", "l03"), (1, "ann", 2, "l03", None),
                              (2, "bob", 5, "l02", "l04"), (2, "bob", 6, "l05", None)]
    table = DeltaTable(path)
    assert table.metadata().configuration["changelake.history"] == "scd2"
    assert pa.schema(table.schema().to_arrow()).field("__end_at").type in (pa.string(), pa.large_string(),
                                                                           pa.string_view())


def test_track_history_updates_the_current_version_in_place_for_other_columns(path):
    sink = history_sink(path, track_history=("name",))
    sink.apply(changes([("+I", "l01", 1, "ann", 1), ("+U", "l02", 1, "ann", 2)]), batch_id=0)
    sink.apply(changes([("+U", "l03", 1, "anne", 2), ("+U", "l04", 1, "anne", 7)]), batch_id=1)
    assert versions(path) == [(1, "ann", 2, "l01", "l03"), (1, "anne", 7, "l03", None)]


def test_a_late_change_splits_the_interval_it_falls_into(path):
    sink = history_sink(path)
    sink.apply(changes([("+I", "l10", 1, "a", 1), ("+U", "l30", 1, "c", 1)]), batch_id=0)
    sink.apply(changes([("+U", "l20", 1, "b", 1)]), batch_id=1)
    assert versions(path) == [(1, "a", 1, "l10", "l20"), (1, "b", 1, "l20", "l30"), (1, "c", 1, "l30", None)]
    sink.apply(changes([("+U", "l05", 1, "z", 1)]), batch_id=2)       # before the first version: a new first
    assert versions(path)[0] == (1, "z", 1, "l05", "l10")


def test_a_late_delete_closes_at_its_position_and_a_later_change_reopens(path):
    sink = history_sink(path)
    sink.apply(changes([("+I", "l10", 1, "a", 1), ("+U", "l30", 1, "c", 1)]), batch_id=0)
    sink.apply(changes([("-D", "l20", 1, None, None)]), batch_id=1)
    assert versions(path) == [(1, "a", 1, "l10", "l20"), (1, "c", 1, "l30", None)]


def test_a_delete_seen_before_its_insert_closes_the_version_the_insert_opens(path):
    sink = history_sink(path)
    sink.apply(changes([("-D", "l20", 1, None, None)]), batch_id=0)
    assert versions(path) == []
    sink.apply(changes([("+I", "l10", 1, "a", 1)]), batch_id=1)
    assert versions(path) == [(1, "a", 1, "l10", "l20")]


def test_replaying_changes_under_a_new_batch_id_changes_nothing(path):
    sink = history_sink(path, track_history=("name",))
    batch = changes([("+I", "l01", 1, "a", 1), ("+U", "l02", 1, "b", 1), ("+U", "l03", 1, "b", 4),
                     ("-D", "l04", 1, None, None), ("+I", "l05", 1, "c", 1)])
    sink.apply(batch, batch_id=0)
    before = versions(path)
    result = sink.apply(batch, batch_id=1)
    assert result.committed and result.upserts == 0 and result.deletes == 0
    assert versions(path) == before == [(1, "a", 1, "l01", "l02"), (1, "b", 4, "l02", "l04"),
                                        (1, "c", 1, "l05", None)]
    assert sink.apply(batch, batch_id=1).committed is False       # the same batch id: recognised as a replay


def test_a_key_change_in_one_message_closes_and_reopens_at_one_position(path):
    sink = history_sink(path)
    sink.apply(changes([("+I", "l01", 6, "x", 1)]), batch_id=0)
    # the rows of one message share its position: key 6 is deleted then inserted again at l02
    sink.apply(changes([("-D", "l02", 6, None, None), ("+I", "l02", 7, "x", 1),
                        ("-D", "l02", 5, None, None), ("+I", "l02", 6, "y", 1)]), batch_id=1)
    assert versions(path) == [(6, "x", 1, "l01", "l02"), (6, "y", 1, "l02", None), (7, "x", 1, "l02", None)]


def test_the_unavailable_placeholder_keeps_the_previous_versions_value(tmp_path):
    sink = open_sink(TableSpec(name="people", path=str(tmp_path / "p"), primary_key=("id",), history="scd2",
                               unavailable_value="__debezium_unavailable_value"), pipeline_id="hist")
    sink.apply(changes([("+I", "l01", 1, "long text", 1)]), batch_id=0)
    sink.apply(changes([("+U", "l02", 1, "__debezium_unavailable_value", 2)]), batch_id=1)
    assert versions(str(tmp_path / "p")) == [(1, "long text", 1, "l01", "l02"), (1, "long text", 2, "l02", None)]


def test_a_history_table_and_an_upsert_table_are_not_mixed_up(path, tmp_path):
    history_sink(path).apply(changes([("+I", "l01", 1, "a", 1)]), batch_id=0)
    upsert = open_sink(TableSpec(name="people", path=path, primary_key=("id",)), pipeline_id="other")
    with pytest.raises(SinkCommitError, match="is a history table"):
        upsert.apply(changes([("+I", "l02", 1, "a", 1)]), batch_id=0)
    with pytest.raises(SinkCommitError, match="tracks every column"):
        history_sink(path, track_history=("name",)).apply(changes([("+I", "l02", 1, "a", 1)]), batch_id=1)
    with pytest.raises(ConfigError, match="add history: scd2"):
        TableSpec(name="x", path=str(tmp_path / "x"), primary_key=("id",), track_history=("name",))


@pytest.mark.parametrize("crash_batch", [0, 1, 2])
def test_crash_between_the_delete_log_and_the_table_commit_then_restart_ends_like_a_clean_run(
        tmp_path, crash_batch):
    batches = [changes([("+I", "l01", 1, "a", 1), ("+I", "l02", 2, "b", 1), ("-D", "l09", 3, None, None)]),
               changes([("+U", "l05", 1, "c", 1), ("-D", "l06", 2, None, None), ("+I", "l03", 3, "q", 1)]),
               changes([("+U", "l04", 1, "x", 1), ("+I", "l07", 2, "b", 2), ("-D", "l08", 1, None, None)])]
    clean = str(tmp_path / "clean" / "people")
    sink = history_sink(clean)
    for i, batch in enumerate(batches):
        sink.apply(batch, batch_id=i)

    crashed = str(tmp_path / "crashed" / "people")
    sink = history_sink(crashed)
    for i, batch in enumerate(batches):
        if i == crash_batch:
            def crash(*args, **kwargs):
                raise RuntimeError("process killed before the table commit")
            sink._merge_versions = crash
            with pytest.raises(SinkCommitError, match="process killed"):
                sink.apply(batch, batch_id=i)
            sink = history_sink(crashed)              # restart: Spark replays the uncommitted batch
        sink.apply(batch, batch_id=i)
    sink = history_sink(crashed)                       # and a restart after the end replays the last batch
    assert sink.apply(batches[-1], batch_id=len(batches) - 1).committed is False
    assert versions(crashed) == versions(clean)
    assert len(versions(crashed)) == len(set((v[0], v[3]) for v in versions(crashed)))   # each version once


# --- the whole history against DuckDB ------------------------------------------------------------

TRUTH_SQL = """
WITH ev AS (                       -- one state per key and position: the last change of the position
    SELECT * FROM log WHERE kind <> '-U'
    QUALIFY row_number() OVER (PARTITION BY id, seq ORDER BY pos DESC) = 1),
st AS (
    SELECT *, lag(kind) OVER w AS pkind, lag(name) OVER w AS pname, lag(score) OVER w AS pscore
    FROM ev WINDOW w AS (PARTITION BY id ORDER BY seq)),
edge AS (                          -- the positions where a version opens or closes
    SELECT id, seq, kind, name, score FROM st
    WHERE (kind = '-D' AND pkind IS NOT NULL AND pkind <> '-D')
       OR (kind <> '-D' AND (pkind IS NULL OR pkind = '-D' OR pname IS DISTINCT FROM name
                             OR (NOT $track_name_only AND pscore IS DISTINCT FROM score)))),
ver AS (
    SELECT id, seq AS start_at, lead(seq) OVER (PARTITION BY id ORDER BY seq) AS end_at, kind, name
    FROM edge)
SELECT v.id, v.name,
       (SELECT e.score FROM ev e WHERE e.id = v.id AND e.kind <> '-D' AND e.seq >= v.start_at
          AND (v.end_at IS NULL OR e.seq < v.end_at) ORDER BY e.seq DESC LIMIT 1) AS score,
       v.start_at, v.end_at
FROM ver v WHERE v.kind <> '-D' ORDER BY v.id, v.start_at
"""


def truth(log: list[tuple], *, track_name_only: bool) -> list[tuple]:
    """The history computed in DuckDB SQL from the change log alone."""
    con = duckdb.connect()
    con.execute("CREATE TABLE log (pos INTEGER, kind VARCHAR, seq VARCHAR, id BIGINT, name VARCHAR, score INTEGER)")
    con.executemany("INSERT INTO log VALUES (?, ?, ?, ?, ?, ?)", [(i, *r) for i, r in enumerate(log)])
    return [tuple(r) for r in con.execute(TRUTH_SQL.replace("$track_name_only", str(track_name_only))).fetchall()]


def generate_log(rng: random.Random, *, keys: int, length: int) -> list[tuple]:
    """A change log as a database writes it: per key inserts, updates (-U/+U) and deletes, positions unique
    per message, a few names and scores so that some updates repeat the tracked values."""
    log, alive, position = [], {}, 0
    for _ in range(length):
        position += rng.randint(1, 3)
        seq = f"l{position:08d}"
        k = rng.randrange(keys)
        if k in alive and rng.random() < 0.2:
            log.append(("-D", seq, k, None, None))
            del alive[k]
        elif k in alive:
            new = (rng.choice("abc"), rng.randrange(4))
            log += [("-U", seq, k, *alive[k]), ("+U", seq, k, *new)]
            alive[k] = new
        else:
            alive[k] = (rng.choice("abc"), rng.randrange(4))
            log.append(("+I", seq, k, *alive[k]))
    return log


def apply_shuffled(path: str, log: list[tuple], rng: random.Random, *, track: tuple[str, ...] | None) -> None:
    """Messages (rows sharing a position stay together and in order) in shuffled order, in random batches."""
    messages: dict[str, list[tuple]] = {}
    for row in log:
        messages.setdefault(row[1], []).append(row)
    order = list(messages.values())
    rng.shuffle(order)
    sink = history_sink(path, track_history=track)
    batch_id = 0
    while order:
        n = rng.randint(1, 6)
        batch, order = order[:n], order[n:]
        sink.apply(changes([r for m in batch for r in m]), batch_id=batch_id)
        batch_id += 1


@pytest.mark.parametrize("track", [None, ("name",)])
def test_shuffled_changes_give_the_history_duckdb_reconstructs_from_the_log(tmp_path, track):
    rng = random.Random(13)
    log = generate_log(rng, keys=6, length=80)
    apply_shuffled(str(tmp_path / "t"), log, rng, track=track)
    expected = truth(log, track_name_only=track is not None)
    assert versions(str(tmp_path / "t")) == expected
    assert len(expected) > 40 and any(v[4] is None for v in expected) and any(v[2] != 0 for v in expected)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), keys=st.integers(1, 4), length=st.integers(1, 30),
       track=st.sampled_from([None, ("name",)]))
def test_property_any_order_and_batching_gives_the_duckdb_history(tmp_path_factory, seed, keys, length, track):
    rng = random.Random(seed)
    log = generate_log(rng, keys=keys, length=length)
    path = str(tmp_path_factory.mktemp("prop") / "t")
    apply_shuffled(path, log, rng, track=track)
    expected = truth(log, track_name_only=track is not None)
    assert versions(path) == expected
    again = [r for r in log if rng.random() < 0.5]            # redelivered changes, a new batch id
    history_sink(path, track_history=track).apply(changes(again), batch_id=10_000)
    assert versions(path) == expected


def test_the_docs_example_prints_what_docs_sink_md_shows(capsys):
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "sink.md").read_text()
    section = doc[doc.index("## History tables"):doc.index("## Tombstones and retention")]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL)
    exec(compile(next(b for lang, b in blocks if lang == "python"), "docs/sink.md", "exec"), {})
    shown = next(b for lang, b in blocks if lang == "" and b.startswith("{"))
    assert capsys.readouterr().out.strip() == shown.strip()


def test_the_state_log_expires_after_the_retention_and_the_versions_stay(tmp_path):
    from datetime import datetime, timedelta, timezone

    now = [datetime(2026, 1, 1, tzinfo=timezone.utc)]
    path = str(tmp_path / "people")
    sink = open_sink(TableSpec(name="people", path=path, primary_key=("id",), history="scd2",
                               tombstone_retention=timedelta(days=1)), pipeline_id="hist", clock=lambda: now[0])
    sink.apply(changes([("+I", "l01", 1, "a", 1), ("-D", "l02", 1, None, None), ("-D", "l09", 2, None, None)]),
               batch_id=0)
    assert sink.expire_tombstones() == 0                  # logged just now
    now[0] += timedelta(days=2)
    assert sink.expire_tombstones() == 2                  # both deletes
    assert versions(path) == [(1, "a", 1, "l01", "l02")]
    # after expiry a late insert of key 2 no longer meets its delete (the documented retention limit)
    sink.apply(changes([("+I", "l05", 2, "b", 1)]), batch_id=1)
    assert versions(path)[-1] == (2, "b", 1, "l05", None)
