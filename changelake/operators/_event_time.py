"""Event time and watermarks of the time-bounded joins (interval join, temporal join).

Each input of such an operator has an event-time column (a timestamp, or an integer of epoch
milliseconds) and a watermark delay. Per input the operator keeps the largest event time it has
seen; the input's watermark is that maximum minus the delay, and the operator's watermark is the
smaller of its two inputs' (none until both inputs have had a row)::

    W = min(max_event_time(left) - left_delay, max_event_time(right) - right_delay)

``W`` is fixed for the duration of a micro-batch: a row whose event time is below the ``W`` the
batch started with is *late* (it goes out as a late row, see :data:`LATE_KINDS`, and is not
joined). At the end of the batch (``finish``) the maxima of the batch's rows become part of ``W``
and the operator fires: it emits what the new ``W`` completes and drops the state ``W`` has passed.
So a micro-batch's rows are judged against the watermark of the batches before it, as Spark's
own watermark does, and the result does not depend on how a batch's rows are ordered.

On Spark one operator instance runs per state bucket, and a bucket sees only its own keys' rows.
So that every bucket agrees on ``W``, each task also sends every bucket a *heartbeat* row per
input (kind :data:`WATERMARK_KIND`, only the event-time column set) carrying the largest event time
of the task's rows: every bucket then sees the same maxima as one operator over all rows would.
"""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND
from changelake.operators._state import KeyedState

#: Row kind of a heartbeat: not a change, only an event time for the watermark (never emitted).
WATERMARK_KIND = 6
#: Row kinds of a late input row in an operator's output (left / right input), in the output's
#: columns of that side; the executor takes them out of the changelog (counted, dropped or sent
#: to the dead-letter path) before any consumer sees them.
LATE_LEFT_KIND = 5
LATE_RIGHT_KIND = 7
LATE_KINDS = {LATE_LEFT_KIND: "left", LATE_RIGHT_KIND: "right"}
#: The watermark before both inputs have had a row.
NO_WATERMARK = -(2 ** 63)

#: State name of the per-input maxima. Part of the checkpoint contract.
STATE_WATERMARK = "watermark"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def event_time_ms(value) -> int | None:
    """Epoch milliseconds of an event-time value (int ms, datetime, date); None for a null."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError(f"an event time must be a timestamp or epoch milliseconds, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        delta = value - _EPOCH
        return (delta.days * 86_400_000) + (delta.seconds * 1000) + delta.microseconds // 1000
    if isinstance(value, date):
        return (value - _EPOCH.date()).days * 86_400_000
    raise TypeError(f"an event time must be a timestamp or epoch milliseconds, got {value!r}")


class Watermarks:
    """The two inputs' event-time maxima (in keyed state) and the operator watermark of the batch."""

    def __init__(self, store: KeyedState, delays: tuple[int, int]) -> None:
        self.store = store
        self.delays = delays
        self._pending: list[int | None] = [None, None]

    def _max(self, side: int) -> int | None:
        return self.store.get(side, 0)

    @property
    def current(self) -> int:
        """The watermark the running batch started with (:data:`NO_WATERMARK` if an input had no row)."""
        maxima = [self._max(0), self._max(1)]
        if None in maxima:
            return NO_WATERMARK
        return min(maxima[0] - self.delays[0], maxima[1] - self.delays[1])

    def observe(self, side: int, t: int | None) -> None:
        """A row (or heartbeat) of input ``side`` (0 left, 1 right) with event time ``t``."""
        if t is not None and (self._pending[side] is None or t > self._pending[side]):
            self._pending[side] = t

    def advance(self) -> int:
        """End of the batch: fold the batch's maxima in; returns the new watermark."""
        for side, t in enumerate(self._pending):
            old = self._max(side)
            if t is not None and (old is None or t > old):
                self.store.put(side, t, 0)
        self._pending = [None, None]
        return self.current


def split_late(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """An event-time join's output split into (changes, late input rows as the kernel emitted them)."""
    late = pc.is_in(table[KIND], pa.array(list(LATE_KINDS), pa.int8()))
    return table.filter(pc.invert(late)), table.filter(late)
