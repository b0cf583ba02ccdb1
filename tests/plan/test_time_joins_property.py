"""Property: the interval join and the temporal join emit exactly what SQL computes over the rows that
were in time, whatever the micro-batches and the arrival order, and the other rows come out as late rows.

Random histories on a small key domain (insert-only rows for the interval join; facts and a versioned
changelog with ``-U``/``+U`` pairs, deletes and equal version times for the temporal join), out of
order, with random watermark delays, split into random micro-batches and closed by a batch of sentinel
rows far in the future on keys that match nothing, so that every window closes and every fact goes out.

Which rows are late is computed here from the rule in ``operators/_event_time`` (the watermark of a
batch is ``min`` over the inputs of the largest event time before the batch minus the delay; a row
below it, or without an event time, is late), not by the kernels. Then:

* the rows the plan emits, as a multiset (the output is insert-only), equal DuckDB's join over the
  rows that were in time, and the Delta table the sink wrote holds exactly them;
* ``runner.late`` holds exactly the late rows, each in the batch that brought it;
* a restart changes nothing: the runner is snapshotted after a random batch, the run goes on, and a
  fresh LocalRunner restored from the snapshot replays the batches after it with the same output
  (the Delta table gets the restored runner's output from there on).
"""

from __future__ import annotations

import random
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from changelake.changelog import KIND, RowKind
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner
from changelake.plan.physical import PhysicalPlan, sink_changes

pytestmark = pytest.mark.unit

I, UB, UA, D = (int(k) for k in (RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE))
#: late rows' kinds as ``operators/_event_time`` documents them
LATE_LEFT, LATE_RIGHT = 5, 7
#: the final batch's rows: far after every history's event times, on keys no row has (nor each other)
SENTINEL_TIME = 10 ** 9
SENTINEL_ID = 10 ** 6
SENTINEL_KEYS = (-1, -2)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

SETTINGS = settings(max_examples=15, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# --- rows ---------------------------------------------------------------------------------------------
def event_time(ms: int | None, time_type: str):
    """Epoch milliseconds as a value of the event-time column's type."""
    if ms is None or time_type == "bigint":
        return ms
    value = EPOCH + timedelta(milliseconds=ms)
    return value if time_type == "timestamp" else value.replace(tzinfo=None)


def arrow_rows(schema: pa.Schema, rows: list[tuple], time_at: int, time_type: str) -> pa.Table:
    rows = [tuple(event_time(v, time_type) if i == time_at else v for i, v in enumerate(r)) for r in rows]
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    return pa.Table.from_arrays([pa.array(list(c), f.type) for c, f in zip(cols, schema)], schema=schema)


def changelog(schema: pa.Schema, rows: list[tuple[int, tuple]], time_at: int, time_type: str) -> pa.Table:
    table = arrow_rows(schema, [r for _, r in rows], time_at, time_type)
    return table.append_column(KIND, pa.array([k for k, _ in rows], pa.int8()))


def tuples(table: pa.Table, columns: list[str]) -> list[tuple]:
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


# --- the documented watermark rule, on its own ----------------------------------------------------------
def judge(batches: list[dict[str, list]], sources: tuple[str, str], time_at: tuple[int, int],
          delays: tuple[int, int], skip: frozenset = frozenset(), at_watermark: Counter | None = None):
    """Late rows (batch, side, kind, row) and the in-time rows of each side (kind, row, arrival number).

    The watermark a batch is judged against is min over the sides of (largest event time in the
    batches before it - delay), none before both sides had a row; rows of a kind in ``skip`` never
    reach the operator. ``at_watermark`` counts the rows exactly at their batch's watermark per side."""
    maxima: list[int | None] = [None, None]
    late, in_time, arrival = [], ([], []), 0
    for b, batch in enumerate(batches):
        w = None if None in maxima else min(maxima[0] - delays[0], maxima[1] - delays[1])
        seen: list[int | None] = [None, None]
        for s, name in enumerate(sources):
            for kind, row in batch.get(name, ()):
                if kind in skip:
                    continue
                t = row[time_at[s]]
                if t is None or (w is not None and t < w):
                    late.append((b, s, kind, row))
                    continue
                if at_watermark is not None and t == w:
                    at_watermark[s] += 1
                in_time[s].append((kind, row, arrival))
                arrival += 1
                seen[s] = t if seen[s] is None else max(seen[s], t)
        for s in (0, 1):
            if seen[s] is not None:
                maxima[s] = seen[s] if maxima[s] is None else max(maxima[s], seen[s])
    return late, in_time


def expected_late(late, n_batches: int, schema: pa.Schema, arity: tuple[int, int], time_at: tuple[int, int],
                  time_type: str) -> list[Counter]:
    """Per batch, the late rows as the operator emits them: in its output columns, the other side null."""
    per_batch = [[] for _ in range(n_batches)]
    for b, side, _, row in late:
        per_batch[b].append((side, row))
    out = []
    for rows in per_batch:
        padded = [tuple(event_time(v, time_type) if i == time_at[s] else v for i, v in enumerate(r))
                  for s, r in rows]
        padded = [r + (None,) * arity[1] if s == 0 else (None,) * arity[0] + r for (s, _), r in zip(rows, padded)]
        table = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in padded], schema=schema)
        kinds = [LATE_LEFT if s == 0 else LATE_RIGHT for s, _ in rows]
        out.append(Counter((k,) + r for k, r in zip(kinds, tuples(table, schema.names))))
    return out


# --- running ------------------------------------------------------------------------------------------------
def run(plan: PhysicalPlan, node: str, batches: list[dict[str, pa.Table]], restart_after: int, root: Path,
        key: dict[str, str] | None = None):
    """The batches through the plan into Delta, and a restart: the runner's snapshot after batch
    ``restart_after`` is restored into a fresh runner (and fresh sinks), which replays the batches
    after it and writes them; the first runner goes on alone. Returns both runs' output and late rows
    per batch (the replay's from ``restart_after + 1`` on).

    ``key`` maps the Delta table's key columns to output columns whose nulls become -1 there (a
    padded row has a null id), in place of the sink node's primary key."""
    (sink_node,) = plan.sinks
    spec = TableSpec(name=sink_node.table, path=str(root / sink_node.table),
                     primary_key=tuple(key) if key else sink_node.primary_key)

    def write(sink, changes: pa.Table, b: int) -> None:
        for name, column in (key or {}).items():
            changes = changes.append_column(name, pc.fill_null(changes[column], -1))
        sink.apply(sink_changes(changes, primary_key=spec.primary_key, batch_id=b), batch_id=b)

    sink = open_sink(spec, pipeline_id="timeprop", engine="delta-rs")
    first = LocalRunner(plan)
    out, late, replay_out, replay_late = [], [], {}, {}
    snapshot = None
    for b, inputs in enumerate(batches):
        changes, late_rows = _step(first, node, inputs)
        out.append(changes)
        late.append(late_rows)
        if b <= restart_after:
            write(sink, changes, b)
        if b == restart_after:
            snapshot = first.snapshot()
    second = LocalRunner(plan)
    second.restore(snapshot)
    sink = open_sink(spec, pipeline_id="timeprop", engine="delta-rs")
    for b in range(restart_after + 1, len(batches)):
        changes, late_rows = _step(second, node, batches[b])
        replay_out[b], replay_late[b] = changes, late_rows
        write(sink, changes, b)
    return out, late, replay_out, replay_late


def _step(runner: LocalRunner, node: str, inputs: dict[str, pa.Table]) -> tuple[pa.Table, pa.Table | None]:
    before = len(runner.late.get(node, ()))
    (changes,) = runner.step(inputs).values()
    new = runner.late.get(node, [])[before:]
    return changes, pa.concat_tables(new) if new else None


def check_run(plan: PhysicalPlan, node: str, result, oracle: Counter, want_late: list[Counter], root: Path,
              columns: list[str]) -> None:
    """Emitted rows (but the sentinels, padded in an outer join) = ``oracle``, late rows per batch =
    ``want_late``, the replay = the first run, the Delta table = ``oracle``."""
    out, late, replay_out, replay_late = result
    node_names = plan[node].schema.names

    def emitted(tables) -> Counter:
        rows = Counter()
        for t in tables:
            assert set(t[KIND].to_pylist()) <= {I}, "the time-bounded joins only insert"
            for r in tuples(t, columns):
                if _sentinel(r):
                    assert sum(v is None for v in r) == len(r) // 2, f"a sentinel met a row: {r}"
                else:
                    rows[r] += 1
        return rows

    def late_rows(t) -> Counter:
        return Counter() if t is None else Counter(tuples(t, [KIND] + node_names))

    assert emitted(out) == oracle
    assert [late_rows(t) for t in late] == want_late
    for b in replay_out:
        assert emitted([replay_out[b]]) == emitted([out[b]]), f"after the restart, batch {b}"
        assert late_rows(replay_late[b]) == late_rows(late[b]), f"late rows after the restart, batch {b}"
    (sink_node,) = plan.sinks
    table = read_delta(str(root / sink_node.table), columns=columns)
    assert Counter(r for r in tuples(table, columns) if not _sentinel(r)) == oracle, \
        "the Delta table holds each emitted row once"


def _sentinel(row: tuple) -> bool:
    return SENTINEL_ID in row or SENTINEL_ID + 1 in row


def _oracle(sql: str, tables: dict[str, pa.Table], schema: pa.Schema, columns: list[str]) -> Counter:
    con = duckdb.connect()
    try:
        con.execute("SET TimeZone = 'UTC'")
        for name, table in tables.items():
            con.register(name, table)
        result = con.sql(sql).to_arrow_table()
    finally:
        con.close()
    return Counter(tuples(result.cast(schema), columns))


def _ms_sql(ms: int, time_type: str) -> str:
    return f"({ms})" if time_type == "bigint" else f"to_milliseconds({ms})"


# --- histories ------------------------------------------------------------------------------------------------
#: a join key (one in five null) and an event time (one in 22 null) on a small domain
KEYS = st.integers(-1, 3).map(lambda k: None if k < 0 else k)
TIMES = st.integers(-1, 20).map(lambda t: None if t < 0 else t)


def rows_of(elements, most: int):
    """Lists of ``elements`` of a length drawn evenly up to ``most`` (plain lists stay short)."""
    return st.integers(0, most).flatmap(lambda n: st.lists(elements, min_size=n, max_size=n))


def arrival_order(items: list, time_of, rnd: random.Random, jitter: int) -> list:
    """``items`` out of order: by event time plus a random lag of up to ``jitter`` (a few stragglers
    much more); items without an event time anywhere."""
    def at(item):
        t = time_of(item)
        lag = rnd.uniform(0, jitter) + (rnd.uniform(0, 25) if rnd.random() < 0.1 else 0)
        return rnd.uniform(0, 20) if t is None else t + lag
    return sorted(items, key=at)


def micro_batches(events: list[tuple[str, list]], rnd: random.Random) -> list[dict[str, list]]:
    """``(source, [(kind, row), ...])`` messages in arrival order cut into micro-batches (some empty)."""
    batches, i = [], 0
    while i < len(events):
        n = 0 if rnd.random() < 0.05 else rnd.randint(1, 10)
        batch: dict[str, list] = {}
        for source, rows in events[i:i + n]:
            batch.setdefault(source, []).extend(rows)
        batches.append(batch)
        i += n
    return batches


def closed(batches: list[dict], sources: tuple[str, str], sentinels: tuple[tuple, tuple]) -> list[dict]:
    """``batches`` and a last one with a sentinel row per source: every window closes, every fact goes out."""
    return batches + [{sources[0]: [(I, sentinels[0])], sources[1]: [(I, sentinels[1])]}]


# --- interval join ---------------------------------------------------------------------------------------------
L_COLS = {"lid": "bigint", "k": "bigint", "lt": "bigint"}
R_COLS = {"rid": "bigint", "k": "bigint", "rt": "bigint"}
INTERVAL_OUT = ["lid", "k", "lt", "rid", "r_k", "rt"]
INTERVAL_SENTINELS = ((SENTINEL_ID, SENTINEL_KEYS[0], SENTINEL_TIME), (SENTINEL_ID + 1, SENTINEL_KEYS[1], SENTINEL_TIME))


def interval_plan(how: str, before: int, after: int, delays: tuple[int, int], time_type: str) -> PhysicalPlan:
    p = Pipeline()
    left = p.source("l", columns={**L_COLS, "lt": time_type}, append_only=True, event_time="lt",
                    watermark_delay=f"{delays[0]} ms")
    right = p.source("r", columns={**R_COLS, "rt": time_type}, append_only=True, event_time="rt",
                     watermark_delay=f"{delays[1]} ms")
    # the Delta table's key is (lid, rid), a padded row's null id -1 there (see run)
    left.interval_join(right, on=["k"], before=f"{before} ms", after=f"{after} ms", how=how, name="ij") \
        .to_table("joined", primary_key=["lid", "rid"])
    return p.plan()


@st.composite
def interval_cases(draw):
    lefts = draw(rows_of(st.tuples(KEYS, TIMES), 24), label="left rows (key, time)")
    rights = draw(rows_of(st.tuples(KEYS, TIMES), 24), label="right rows (key, time)")
    before = draw(st.one_of(st.just(0), st.integers(-3, 8)), label="before ms")
    after = draw(st.one_of(st.just(max(0, -before)), st.integers(max(-before, -3), 8)), label="after ms")
    delays = (draw(st.integers(0, 8), label="left delay ms"), draw(st.integers(0, 8), label="right delay ms"))
    jitter = draw(st.integers(0, 12), label="out-of-order lag ms")
    rnd = draw(st.randoms(use_true_random=False))
    rows = [("l", (i, k, t)) for i, (k, t) in enumerate(lefts)] + \
           [("r", (i, k, t)) for i, (k, t) in enumerate(rights)]
    events = [(source, [(I, row)]) for source, row in arrival_order(rows, lambda e: e[1][2], rnd, jitter)]
    batches = micro_batches(events, rnd)
    batches = closed(batches, ("l", "r"), INTERVAL_SENTINELS)
    restart_after = draw(st.integers(0, len(batches) - 1), label="restart after batch")
    return before, after, delays, batches, restart_after


def interval_oracle(how: str, before: int, after: int, in_time, plan: PhysicalPlan, time_type: str) -> Counter:
    sources = {n.source: n.schema for n in plan.sources}
    tables = {name: arrow_rows(sources[name], [r for _, r, _ in rows if r[0] < SENTINEL_ID], 2, time_type)
              for name, rows in zip(("l", "r"), in_time)}
    sql = f"""
        SELECT l.lid, l.k, l.lt, r.rid, r.k AS r_k, r.rt
        FROM l {how.upper()} JOIN r
          ON l.k = r.k AND l.lt BETWEEN r.rt - {_ms_sql(before, time_type)} AND r.rt + {_ms_sql(after, time_type)}"""
    return _oracle(sql, tables, plan["ij"].schema, INTERVAL_OUT)


def check_interval_join(how: str, case, root: Path, time_type: str = "bigint") -> None:
    before, after, delays, batches, restart_after = case
    plan = interval_plan(how, before, after, delays, time_type)
    sources = {n.source: n.schema for n in plan.sources}
    late, in_time = judge(batches, ("l", "r"), (2, 2), delays)
    tables = [{name: changelog(sources[name], rows, 2, time_type) for name, rows in batch.items()}
              for batch in batches]
    result = run(plan, "ij", tables, restart_after, root, key={"lkey": "lid", "rkey": "rid"})
    want_late = expected_late(late, len(batches), plan["ij"].schema, (3, 3), (2, 2), time_type)
    check_run(plan, "ij", result, interval_oracle(how, before, after, in_time, plan, time_type), want_late, root,
              INTERVAL_OUT)


#: on the bounds: after batch 1 the watermark is 5 (min(10, 5)); left row 0 (3 + before 2 = 5) is still
#: kept, and right row 1 at exactly 5 is in time and meets it (3 BETWEEN 5 - 2 AND 5 + 0)
INTERVAL_AT_THE_BOUNDS = (2, 0, (0, 0), closed(
    [{"l": [(I, (0, 0, 3))], "r": [(I, (0, 1, 5))]}, {"l": [(I, (1, 1, 10))]}, {"r": [(I, (1, 0, 5))]}],
    ("l", "r"), INTERVAL_SENTINELS), 1)


@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
@SETTINGS
@given(case=interval_cases())
@example(case=INTERVAL_AT_THE_BOUNDS)
def test_interval_join_emits_the_sql_interval_join_of_the_rows_in_time(tmp_path_factory, how, case):
    check_interval_join(how, case, tmp_path_factory.mktemp("lake"))


@settings(SETTINGS, max_examples=8)
@given(case=interval_cases())
def test_interval_join_on_timestamp_columns(tmp_path_factory, case):
    check_interval_join("full", case, tmp_path_factory.mktemp("lake"), time_type="timestamp")


# --- temporal join ---------------------------------------------------------------------------------------------
F_COLS = {"fid": "bigint", "k": "bigint", "ft": "bigint"}
V_COLS = {"k": "bigint", "val": "bigint", "vt": "bigint"}
TEMPORAL_OUT = ["fid", "k", "ft", "v_k", "val", "vt"]
TEMPORAL_SENTINELS = ((SENTINEL_ID, SENTINEL_KEYS[0], SENTINEL_TIME), (SENTINEL_KEYS[1], SENTINEL_ID + 1, SENTINEL_TIME))


def temporal_plan(how: str, delays: tuple[int, int], time_type: str) -> PhysicalPlan:
    p = Pipeline()
    facts = p.source("f", columns={**F_COLS, "ft": time_type}, append_only=True, event_time="ft",
                     watermark_delay=f"{delays[0]} ms")
    versions = p.source("v", columns={**V_COLS, "vt": time_type}, primary_key=["k"], event_time="vt",
                        watermark_delay=f"{delays[1]} ms")
    facts.temporal_join(versions, on=["k"], how=how, name="tj").to_table("priced", primary_key=["fid"])
    return p.plan()


@st.composite
def temporal_cases(draw):
    facts = draw(rows_of(st.tuples(KEYS, TIMES), 20), label="facts (key, time)")
    # even times on few keys: one key often has two versions at the same time (one in 12 has none)
    times = st.integers(-1, 10).map(lambda t: None if t < 0 else 2 * t)
    changes = draw(rows_of(st.tuples(st.integers(0, 3), times, st.booleans(), st.integers(0, 99)), 20),
                   label="versions (key, time, delete, value)")
    delays = (draw(st.integers(0, 8), label="fact delay ms"), draw(st.integers(0, 8), label="version delay ms"))
    jitter = draw(st.integers(0, 12), label="out-of-order lag ms")
    rnd = draw(st.randoms(use_true_random=False))
    items = [("f", (i, k, t)) for i, (k, t) in enumerate(facts)] + [("v", c) for c in changes]
    events, current = [], {}
    for source, item in arrival_order(items, lambda e: e[1][2] if e[0] == "f" else e[1][1], rnd, jitter):
        if source == "f":
            events.append(("f", [(I, item)]))
            continue
        # the changelog in arrival order: +I, -U/+U (the before-image has the old version's time), -D
        k, t, delete, val = item
        row, old = (k, val, t), current.get(k)
        if old is None:
            events.append(("v", [(I, row)]))
            current[k] = row
        elif delete:
            events.append(("v", [(D, (k, old[1], t))]))       # the deletion's time
            del current[k]
        else:
            events.append(("v", [(UB, old), (UA, row)]))
            current[k] = row
    batches = micro_batches(events, rnd)
    batches = closed(batches, ("f", "v"), TEMPORAL_SENTINELS)
    restart_after = draw(st.integers(0, len(batches) - 1), label="restart after batch")
    return delays, batches, restart_after


def temporal_oracle(how: str, in_time, plan: PhysicalPlan, time_type: str) -> Counter:
    sources = {n.source: n.schema for n in plan.sources}
    facts = arrow_rows(sources["f"], [r for _, r, _ in in_time[0] if r[0] < SENTINEL_ID], 2, time_type)
    versions = arrow_rows(sources["v"], [r for _, r, _ in in_time[1]], 2, time_type) \
        .append_column("arrival", pa.array([a for _, _, a in in_time[1]], pa.int64())) \
        .append_column("is_delete", pa.array([kind == D for kind, _, _ in in_time[1]], pa.bool_()))
    # per fact the latest version at or before its time, the later arrival first among equal times;
    # a deletion there means no version
    sql = f"""
        WITH latest AS (
          SELECT f.fid, v.k, v.val, v.vt, v.is_delete,
                 row_number() OVER (PARTITION BY f.fid ORDER BY v.vt DESC, v.arrival DESC) AS n
          FROM f JOIN v ON f.k = v.k AND v.vt <= f.ft)
        SELECT f.fid, f.k, f.ft, latest.k AS v_k, latest.val, latest.vt
        FROM f LEFT JOIN latest ON latest.fid = f.fid AND latest.n = 1 AND NOT latest.is_delete
        {"WHERE latest.fid IS NOT NULL" if how == "inner" else ""}"""
    return _oracle(sql, {"f": facts, "v": versions}, plan["tj"].schema, TEMPORAL_OUT)


def check_temporal_join(how: str, case, root: Path, time_type: str = "bigint") -> None:
    delays, batches, restart_after = case
    plan = temporal_plan(how, delays, time_type)
    sources = {n.source: n.schema for n in plan.sources}
    # the versions' -U rows are dropped before the join: never late, no event time
    late, in_time = judge(batches, ("f", "v"), (2, 2), delays, skip=frozenset({UB}))
    tables = [{name: changelog(sources[name], rows, 2, time_type) for name, rows in batch.items()}
              for batch in batches]
    result = run(plan, "tj", tables, restart_after, root)
    want_late = expected_late(late, len(batches), plan["tj"].schema, (3, 3), (2, 2), time_type)
    check_run(plan, "tj", result, temporal_oracle(how, in_time, plan, time_type), want_late, root, TEMPORAL_OUT)


#: on the bounds: after batch 1 the watermark is 4 (min(4, 5)); key 0's version at 4 is replaced by
#: one of the same time (the later arrival wins for facts 0 and 1, fact 1 at exactly 4 is in time),
#: and key 1's version at 2 still holds for fact 2 at 4 although a newer one (at 5) exists
TEMPORAL_AT_THE_BOUNDS = ((0, 0), closed(
    [{"f": [(I, (0, 0, 4))], "v": [(I, (0, 10, 2)), (I, (1, 20, 2))]},
     {"v": [(UB, (0, 10, 2)), (UA, (0, 11, 4)), (UB, (1, 20, 2)), (UA, (1, 21, 5))]},
     {"v": [(UB, (0, 11, 4)), (UA, (0, 12, 4))], "f": [(I, (1, 0, 4)), (I, (2, 1, 4))]}],
    ("f", "v"), TEMPORAL_SENTINELS), 0)


@pytest.mark.parametrize("how", ["inner", "left"])
@SETTINGS
@given(case=temporal_cases())
@example(case=TEMPORAL_AT_THE_BOUNDS)
def test_temporal_join_emits_each_fact_with_the_version_valid_at_its_time(tmp_path_factory, how, case):
    check_temporal_join(how, case, tmp_path_factory.mktemp("lake"))


@settings(SETTINGS, max_examples=8)
@given(case=temporal_cases())
def test_temporal_join_on_timestamp_columns(tmp_path_factory, case):
    check_temporal_join("left", case, tmp_path_factory.mktemp("lake"), time_type="timestamp_ntz")


def test_the_histories_reach_late_rows_the_watermark_ties_and_restarts():
    """The strategies reach what the properties are about (not only empty or in-order histories)."""
    seen = Counter()

    # the histories at the bounds are always among them (in a full test run the rarest case, a version
    # exactly at the watermark, was drawn 0 times in 60 examples once: more examples, and the explicit ones)
    @settings(SETTINGS, max_examples=150)
    @given(interval=interval_cases(), temporal=temporal_cases())
    @example(interval=INTERVAL_AT_THE_BOUNDS, temporal=TEMPORAL_AT_THE_BOUNDS)
    def survey(interval, temporal):
        before, after, delays, batches, restart_after = interval
        at = Counter()
        late, _ = judge(batches, ("l", "r"), (2, 2), delays, at_watermark=at)
        seen["interval late"] += bool(late)
        seen["interval row at the watermark"] += bool(at)
        seen["interval asymmetric"] += before != after
        seen["interval zero bound"] += 0 in (before, after)
        seen["interval restart mid-run"] += restart_after < len(batches) - 2
        delays, batches, restart_after = temporal
        at = Counter()
        late, in_time = judge(batches, ("f", "v"), (2, 2), delays, skip=frozenset({UB}), at_watermark=at)
        seen["temporal late"] += bool(late)
        seen["temporal row at the watermark"] += bool(at)
        times = Counter((r[0], r[2]) for _, r, _ in in_time[1])
        seen["temporal tie"] += any(n > 1 for n in times.values())
        seen["temporal delete"] += any(kind == D for kind, _, _ in in_time[1])
        seen["temporal restart mid-run"] += restart_after < len(batches) - 2

    survey()
    # every case is reached (the rarest, a version exactly at the watermark, also has an explicit @example)
    assert len(seen) == 10 and min(seen.values()) >= 1, seen
    assert sorted(seen.values())[1] >= 5, seen
