"""bench/freshness.py checks that the Kafka log holds each change once (module docstring, "Each change once in
the log"): its graph sources run ``normalize: false``, so a change appended twice by a producer's retried
request is counted twice by the graph (``--join`` run 1 with ``own_query`` lost 2 orders that way)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.freshness import log_ends, written_twice  # noqa: E402

pytestmark = pytest.mark.unit

TOPICS = np.array(["bench.fresh.orders.0", "bench.fresh.orders.1"])


def _deliveries(steady: dict[tuple[int, int], list[int]], snapshot: dict[tuple[int, int], int] | None) -> dict:
    """A producer's delivery reports: the steady phase's (topic, partition, offset) and, unless None, the
    snapshot's acknowledged records per partition."""
    rows = [(t, p, o) for (t, p), offsets in steady.items() for o in offsets]
    out = {"topics": TOPICS, "topic": np.array([r[0] for r in rows], np.int8),
           "partition": np.array([r[1] for r in rows], np.int8), "offset": np.array([r[2] for r in rows], np.int64)}
    if snapshot is not None:
        out |= {"snapshot_topic": np.array([t for t, _ in snapshot], np.int8),
                "snapshot_partition": np.array([p for _, p in snapshot], np.int8),
                "snapshot_acked": np.array(list(snapshot.values()), np.int64)}
    return out


def test_records_no_delivery_report_names_are_counted_per_partition() -> None:
    """Run 1's orders.1[2]: a snapshot of 1,250 records, then the steady phase's acknowledgements skip the 11
    offsets 2133-2143 (a request appended twice: the first append was never acknowledged)."""
    steady = {(1, 2): [*range(1250, 2133), *range(2144, 2200)], (1, 3): list(range(1250, 2200)),
              (0, 0): list(range(1250, 1300))}
    d = _deliveries(steady, {(1, 2): 1250, (1, 3): 1250, (0, 0): 1250})
    ends = {"bench.fresh.orders.1": {"2": 2200, "3": 2200}, "bench.fresh.orders.0": {"0": 1300}}
    assert written_twice(d, ends) == {"bench.fresh.orders.1[2]": 11}


def test_a_doubled_snapshot_record_is_counted() -> None:
    """A record the snapshot appended twice shifts every later offset: none of the steady phase's is missing,
    but the log is one record longer than what was acknowledged."""
    d = _deliveries({(0, 1): list(range(101, 150))}, {(0, 1): 100})
    assert written_twice(d, {"bench.fresh.orders.0": {"1": 150}}) == {"bench.fresh.orders.0[1]": 1}
    assert written_twice(d, {"bench.fresh.orders.0": {"1": 149}}) == {}


def test_without_snapshot_counts_the_steady_phase_is_checked() -> None:
    """The delivery reports of a run that did not keep the snapshot's: the steady phase's span is checked."""
    d = _deliveries({(1, 3): [*range(1250, 2124), *range(2140, 2300)]}, None)
    assert written_twice(d, {"bench.fresh.orders.1": {"3": 2300}}) == {"bench.fresh.orders.1[3]": 16}


def test_the_log_end_is_the_furthest_any_query_read(tmp_path: Path) -> None:
    """With the mirrors in a query of their own, each query's last batch ends where it read to; the log's
    end per partition is the furthest of them (a query's earlier batches do not count)."""
    def offsets(checkpoint: Path, batch: int, ends: str) -> None:
        (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
        (checkpoint / "offsets" / str(batch)).write_text('v1\n{"batchTimestampMs":0}\n' + ends + "\n")

    graph, mirrors = tmp_path / "checkpoint", tmp_path / "checkpoint" / "mirrors"
    offsets(graph, 0, '{"t": {"0": 10, "1": 10}}')
    offsets(graph, 1, '{"t": {"0": 40, "1": 35}}')
    offsets(mirrors, 0, '{"t": {"0": 10, "1": 10}}')
    offsets(mirrors, 4, '{"t": {"0": 38, "1": 50}}')
    assert log_ends([graph, mirrors]) == {"t": {"0": 40, "1": 50}}
