"""The catch-up progress: per source, records done and remaining, rate and ETA.

From each of Spark's progress reports (``sources[0]``: ``startOffset`` / ``endOffset`` /
``latestOffset`` per topic and partition)::

    done      = end offset - the start offset of the run's first batch   (summed over the source's partitions)
    remaining = latest offset - end offset
    rate      = first report: its batch's records / its batch's duration (durationMs.triggerExecution)
                later:        records done since the first report / seconds since the first report
    ETA       = remaining / rate

so neither Spark's start-up nor the query's start counts in the rate. On a terminal the runner
shows it as one ``\\r``-overwritten line on stderr (a log line clears it first and it is drawn again
after); without a terminal (Kubernetes) it logs it as a line every ``LOG_EVERY_S`` seconds while
records remain, and once when the pipeline has caught up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from changelake.spark.progress import parse_offsets


@dataclass(frozen=True)
class SourceProgress:
    name: str
    done: int
    remaining: int
    #: records per second (see the module's table)
    rate: float

    @property
    def eta_seconds(self) -> float | None:
        if self.remaining == 0:
            return 0.0
        return self.remaining / self.rate if self.rate > 0 else None


def format_progress_line(sources: Sequence[SourceProgress]) -> str:
    """``orders: 12,000 done, 3,000 left, 1,500/s, ETA 2 s | products: ...``"""
    parts = []
    for s in sources:
        eta = s.eta_seconds
        parts.append(f"{s.name}: {s.done:,} done, {s.remaining:,} left, {s.rate:,.0f}/s, "
                     f"ETA {'?' if eta is None else _duration(eta)}")
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class CatchUpTracker:
    """Turns progress reports into :class:`SourceProgress` per configured source.

    ``source_of(topic)`` names the source that reads a topic (None: not ours)."""

    def __init__(self, source_of: Callable[[str], str | None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self._source_of = source_of
        self._clock = clock
        self._baseline: dict[tuple[str, str], int] = {}
        self._started = clock()
        self._first: tuple[float, dict[str, int]] | None = None      # (time, done per source) of the first report

    def observe(self, progress: dict[str, Any]) -> list[SourceProgress]:
        now = self._clock()
        done: dict[str, int] = {}
        left: dict[str, int] = {}
        for src in progress.get("sources", []):
            start = parse_offsets(src.get("startOffset"))
            end = parse_offsets(src.get("endOffset"))
            latest = parse_offsets(src.get("latestOffset"))
            for topic, parts in {**latest, **end}.items():
                name = self._source_of(topic)
                if name is None:
                    continue
                for p in set(end.get(topic, {})) | set(latest.get(topic, {})):
                    e = int(end.get(topic, {}).get(p, start.get(topic, {}).get(p, 0)))
                    base = self._baseline.setdefault((topic, p), int(start.get(topic, {}).get(p, e)))
                    done[name] = done.get(name, 0) + max(0, e - base)
                    high = int(latest.get(topic, {}).get(p, e))
                    left[name] = left.get(name, 0) + max(0, high - e)
        if self._first is None:
            self._first = (now, dict(done))
            batch_s = (progress.get("durationMs") or {}).get("triggerExecution")
            seconds = batch_s / 1000.0 if batch_s else now - self._started
            rates = {n: d / seconds if seconds > 0 else 0.0 for n, d in done.items()}
        else:
            at, before = self._first
            seconds = now - at
            rates = {n: (d - before.get(n, 0)) / seconds if seconds > 0 else 0.0 for n, d in done.items()}
        return [SourceProgress(n, done.get(n, 0), left.get(n, 0), rates.get(n, 0.0))
                for n in sorted(set(done) | set(left))]
