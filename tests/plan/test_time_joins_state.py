"""The time-bounded joins keep bounded state: the watermark drops what no future row can need.

A long run (200 micro-batches, each a second of event time with a few hundred rows, out of order
within the watermark delay) through an interval join and a temporal join in one LocalRunner. The
kernels' ``state_rows`` must stay below a bound that follows from the window and the delays alone,
however many batches have gone by, and fall to the minimum once a last batch moves the watermark
past everything: the watermark's two entries and that batch's sentinel rows, and for the temporal
join one version per key that still has a row.
"""

from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest

from changelake.changelog import KIND, RowKind
from changelake.plan import Pipeline
from changelake.plan.local import LocalRunner

pytestmark = pytest.mark.unit

I, UB, UA, D = (int(k) for k in (RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.UPDATE_AFTER, RowKind.DELETE))

BATCHES = 200
SECOND = 1000                       # event time per batch, ms
ROWS = 150                          # rows per batch of each insert-only input
CHANGES = 20                        # version changes per batch
KEYS = 1000                         # join keys of both joins
DELAY = 2000                        # every input's watermark delay, ms
BEFORE, AFTER = 3000, 1000          # l.t BETWEEN r.t - 3 s AND r.t + 1 s
FAR = 10 ** 12                      # the last batch's event time


def pipeline() -> Pipeline:
    p = Pipeline()
    delay = f"{DELAY} ms"
    left = p.source("l", columns={"lid": "bigint", "k": "bigint", "lt": "bigint"}, append_only=True,
                    event_time="lt", watermark_delay=delay)
    right = p.source("r", columns={"rid": "bigint", "k": "bigint", "rt": "bigint"}, append_only=True,
                     event_time="rt", watermark_delay=delay)
    versions = p.source("v", columns={"k": "bigint", "val": "bigint", "vt": "bigint"}, primary_key=["k"],
                        event_time="vt", watermark_delay=delay)
    left.interval_join(right, on=["k"], before=f"{BEFORE} ms", after=f"{AFTER} ms", how="full", name="ij") \
        .to_table("ij", primary_key=["lid", "rid"])
    left.temporal_join(versions, on=["k"], how="left", name="tj").to_table("tj", primary_key=["lid"])
    return p


def table(names: list[str], rows: list[tuple[int, tuple]]) -> pa.Table:
    cols = list(zip(*[r for _, r in rows])) if rows else [[] for _ in names]
    return pa.table({**{n: pa.array(c, pa.int64()) for n, c in zip(names, cols)},
                     KIND: pa.array([k for k, _ in rows], pa.int8())})


def history(rnd: random.Random):
    """Per batch its rows and the number of keys whose latest version in event time (the later arrival
    among equal times) is a row, not a deletion; event times run a second per batch, a third of the rows
    up to DELAY - 1 ms behind (never behind the watermark)."""
    current: dict[int, tuple] = {}
    latest: dict[int, tuple[int, bool]] = {}
    lid = rid = 0
    for b in range(BATCHES):
        def at() -> int:
            return max(0, b * SECOND + rnd.randrange(SECOND) - (rnd.randrange(DELAY) if rnd.random() < 0.3 else 0))
        lefts, rights, changes = [], [], []
        for _ in range(ROWS):
            lefts.append((I, (lid, rnd.randrange(KEYS), at())))
            rights.append((I, (rid, rnd.randrange(KEYS), at())))
            lid, rid = lid + 1, rid + 1
        for _ in range(CHANGES if b else KEYS):
            k = rnd.randrange(KEYS) if b else len(changes)
            row, old = (k, rnd.randrange(100), at()), current.get(k)
            if old is None:
                changes.append((I, row))
                current[k] = row
            elif rnd.random() < 0.1:
                changes.append((D, (k, old[1], row[2])))
                del current[k]
            else:
                changes += [(UB, old), (UA, row)]
                current[k] = row
        for kind, (k, _, t) in changes:
            if kind != UB and (k not in latest or t >= latest[k][0]):
                latest[k] = (t, kind == D)
        yield {"l": table(["lid", "k", "lt"], lefts), "r": table(["rid", "k", "rt"], rights),
               "v": table(["k", "val", "vt"], changes)}, sum(not deleted for _, deleted in latest.values())


def test_state_stays_bounded_and_empties_when_the_watermark_passes_everything():
    runner = LocalRunner(pipeline().plan())
    interval, temporal = runner.kernels["ij"], runner.kernels["tj"]
    # a row stays while the watermark (about the newest event time - DELAY) has not passed its time
    # plus its side's bound; rows come at ROWS per SECOND per input: the window in batches, plus
    # the batch in flight and one for rounding
    spans = [math.ceil((DELAY + bound) / SECOND) + 2 for bound in (BEFORE, AFTER)]
    interval_bound = 2 + ROWS * sum(spans)
    # facts wait for the watermark to pass them; per key one version plus those newer than the watermark
    temporal_bound = 2 + ROWS * (math.ceil(DELAY / SECOND) + 2) + KEYS + 2 * CHANGES * (math.ceil(DELAY / SECOND) + 2)
    peaks = {"ij": [], "tj": []}
    emitted = {"ij": 0, "tj": 0}
    live = 0
    for inputs, live in history(random.Random(6)):
        outs = runner.step(inputs)
        for name in emitted:
            emitted[name] += outs[name].num_rows
        peaks["ij"].append(interval.state_rows)
        peaks["tj"].append(temporal.state_rows)
    assert max(peaks["ij"]) <= interval_bound, (max(peaks["ij"]), interval_bound)
    assert max(peaks["tj"]) <= temporal_bound, (max(peaks["tj"]), temporal_bound)
    # not growing with the run: the last 50 batches need no more than the 50 after the warm-up
    for name, sizes in peaks.items():
        assert max(sizes[-50:]) <= 1.2 * max(sizes[10:60]), name
    # the bound is not vacuous, and the joins did join (most rows in time)
    assert max(peaks["ij"]) > interval_bound / 3 and max(peaks["tj"]) > KEYS
    assert emitted["ij"] > BATCHES * ROWS and emitted["tj"] > 0.9 * (BATCHES - 3) * ROWS
    assert runner.late == {}, "no row is further behind the newest one than the delay"

    # sentinels far ahead on keys nothing has: the watermark passes every row of the run
    runner.step({"l": table(["lid", "k", "lt"], [(I, (-1, -1, FAR))]),
                 "r": table(["rid", "k", "rt"], [(I, (-1, -2, FAR))]),
                 "v": table(["k", "val", "vt"], [(I, (-3, 0, FAR))])})
    # the watermark's two entries and the two sentinels, which nothing has passed
    assert interval.state_rows == 2 + 2
    # the watermark, the fact sentinel, the version sentinel, one version per key with a row
    assert temporal.state_rows == 2 + 1 + 1 + live
