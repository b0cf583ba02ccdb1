"""The one channel that carries operator figures from the Python workers to the driver.

Counters and gauges set in a Python worker land in that worker's own registry, which nobody
scrapes. Every figure an operator makes therefore travels as a typed report:

    report          made where                              applied on the driver (drain)
    ----------------------------------------------------------------------------------------------
    StateSize       each stateful bucket a batch touched   latest per (node, bucket); summed per node
                                                           into changelake_state_rows / _bytes
    Counts          each kernel run (stale retractions,    added to the named counters
                    materializer corrections, ...)
    Late            event-time joins' late rows            changelake_late_rows_total and, with
                                                           late_rows: dead_letter, dead letters
    Rejected        an input row a kernel raised on        the source's on_error: dead letter
                    (isolated by halving the bucket)       (reason operator-error), fail, or skip
    LookupFigures   each lookup-join task                  hits, misses, latencies; cache rows summed
                                                           over the workers' latest reports

Reports leave a ``transformWithStateInPandas`` operator in a column of their own (the ``REPORT``
part of its output envelope, beside the ``DATA`` part), never inside data columns; the
``mapInArrow`` right behind the operator adds them to the channel's accumulator (an accumulator
updated inside the transformWithStateInPandas worker itself corrupted its output on pyspark 4.2.0).
Stateless ``mapInArrow`` steps (the lookup join) add theirs directly.

Spark applies accumulator updates of successful tasks only; a state size is latest-per-bucket, so
a retried task does not count twice there.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from changelake import metrics
from changelake.operators.lookup_join import LookupStats, observe


@dataclass(frozen=True)
class StateSize:
    node: str
    bucket: int
    rows: int
    bytes: int


@dataclass(frozen=True)
class Counts:
    """Counts of named counters (``changelake.metrics.FIGURES``), by (figure, label value)."""
    figures: Mapping[tuple[str, str], int]


@dataclass(frozen=True)
class Late:
    node: str
    side: str
    count: int
    rows: tuple[str, ...] = ()        # the rows as JSON, when the node dead-letters late rows


@dataclass(frozen=True)
class Rejected:
    """An input row an operator could not process (set aside so the pipeline goes on)."""
    node: str
    side: str
    row: str                          # the row as JSON
    seq: str | None                   # its ordering token (a source row: its log or Kafka position)
    error: str
    message: tuple[str, int, int] | None = None     # the Kafka message it was decoded from, where known


@dataclass(frozen=True)
class LookupFigures:
    lookup: str
    worker: int
    stats: LookupStats


def encode(reports: Iterable[Any]) -> bytes:
    return pickle.dumps(list(reports), protocol=pickle.HIGHEST_PROTOCOL)


def decode(payload: bytes) -> list[Any]:
    return pickle.loads(payload)


@dataclass
class Drained:
    """What one drain found: late rows for the batch's dead letters, lookup figures per lookup."""
    late: dict[tuple[str, str], tuple[int, list[str]]] = field(default_factory=dict)
    rejected: list[Rejected] = field(default_factory=list)
    lookups: dict[str, LookupStats] = field(default_factory=dict)


class ReportChannel:
    """A Spark accumulator of reports (workers: :meth:`send`) and the driver's view of them (:meth:`drain`)."""

    def __init__(self, spark: Any) -> None:
        from pyspark.accumulators import AccumulatorParam

        class Concat(AccumulatorParam):
            def zero(self, value: list) -> list:
                return []

            def addInPlace(self, a: list, b: list) -> list:
                a.extend(b)
                return a

        self.accumulator = spark.sparkContext.accumulator([], Concat())
        self.state: dict[tuple[str, int], tuple[int, int]] = {}
        self.cache_rows: dict[tuple[str, int], int] = {}

    def __getstate__(self) -> dict:          # only the accumulator travels to the workers
        return {"accumulator": self.accumulator}

    def send(self, reports: Iterable[Any]) -> None:
        """In a task: add reports."""
        reports = list(reports)
        if reports:
            self.accumulator.add(reports)

    def drain(self) -> Drained:
        """On the driver, after a batch: apply every report to the registry and reset the accumulator."""
        reports, self.accumulator.value = self.accumulator.value, []
        out = Drained()
        touched = set()
        for r in reports:
            if isinstance(r, StateSize):
                self.state[(r.node, r.bucket)] = (r.rows, r.bytes)
                touched.add(r.node)
            elif isinstance(r, Counts):
                metrics.publish(r.figures)
            elif isinstance(r, Late):
                n, rows = out.late.get((r.node, r.side), (0, []))
                out.late[(r.node, r.side)] = (n + r.count, rows + list(r.rows))
            elif isinstance(r, Rejected):
                out.rejected.append(r)
            elif isinstance(r, LookupFigures):
                self.cache_rows[(r.lookup, r.worker)] = r.stats.cache_rows
                got = out.lookups.get(r.lookup)
                out.lookups[r.lookup] = got.merge(r.stats) if got else LookupStats().merge(r.stats)
        for node, (rows, size) in self.state_totals().items():
            if node in touched:
                metrics.STATE_ROWS.labels(operator=node).set(rows)
                metrics.STATE_BYTES.labels(operator=node).set(size)
        for lookup, stats in out.lookups.items():
            stats.cache_rows = sum(n for (name, _), n in self.cache_rows.items() if name == lookup)
            observe(lookup, stats)
        return out

    def state_totals(self) -> dict[str, tuple[int, int]]:
        """node -> (state rows, state bytes) over the buckets reported so far."""
        out: dict[str, tuple[int, int]] = {}
        for (node, _), (rows, size) in self.state.items():
            r, b = out.get(node, (0, 0))
            out[node] = (r + rows, b + size)
        return out


def lookup_report(lookup: str, stats: LookupStats) -> LookupFigures:
    return LookupFigures(lookup, os.getpid(), stats)
