"""IntervalJoin: an equi-join bounded in event time, with state the watermark cleans up.

Joins a left row ``l`` and a right row ``r`` with equal join keys when::

    l.time BETWEEN r.time - before AND r.time + after

(Flink's time-windowed join). Both inputs are insert-only, and so is the output. Per input row,
with ``W`` the watermark the micro-batch started with (see ``_event_time``)::

    time is null or time < W   -> late: emitted as a late row (LATE_LEFT_KIND / LATE_RIGHT_KIND), not joined
    otherwise                  -> +I [l + r] for every stored row of the other input it meets;
                                  the row is stored (join key -> rows with their time and whether they met one)

At the end of the batch the watermark advances to ``W'`` and every row no future row can meet
is dropped: a left row once ``l.time + before < W'``, a right row once ``r.time + after < W'``
(a future row of the other input has time >= ``W'``; an earlier one is late). In a left (right,
full) outer join a dropped left (right) row that met nothing is emitted then as ``+I`` padded
with nulls, once, and never retracted: no row that could have met it can still arrive.

So the state holds the rows of the last ``before + after`` of event time plus the watermark
delay, whatever the input's volume over all time. A join key with a NULL part never matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from changelake.errors import ConfigError
from changelake.log_values import shown_row
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel
from changelake.operators._event_time import (
    LATE_LEFT_KIND, LATE_RIGHT_KIND, NO_WATERMARK, STATE_WATERMARK, WATERMARK_KIND, Watermarks, event_time_ms)
from changelake.operators._rows import INSERT, Changes, coerce, project
from changelake.operators._state import KeyedState

#: join key -> that input's rows, each ``[time_ms, row, met_a_row]``. Part of the checkpoint contract.
STATE_LEFT_ROWS = "interval-left-rows"
STATE_RIGHT_ROWS = "interval-right-rows"
#: the next event time at which a stored row of each input can be dropped (skips useless scans)
STATE_NEXT_EXPIRY = "interval-next-expiry"

INTERVAL_JOIN_TYPES = ("INNER", "LEFT", "RIGHT", "FULL")


@dataclass(frozen=True, kw_only=True)
class TimeBoundedJoinConfig:
    """What the interval and the temporal join are configured with alike."""

    join_type: str
    left_key: tuple[int, ...]
    right_key: tuple[int, ...]
    left_arity: int
    right_arity: int
    #: positions of the event-time columns in each input
    left_time: int
    right_time: int
    left_delay_ms: int = 0
    right_delay_ms: int = 0
    #: the operator's name in error messages
    name: str = "time-bounded join"

    #: join types the operator implements
    JOIN_TYPES: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        if self.join_type not in self.JOIN_TYPES:
            raise ConfigError(f"{self.name}: join type must be one of {self.JOIN_TYPES}, got {self.join_type!r}")
        if len(self.left_key) != len(self.right_key):
            raise ConfigError(f"{self.name}: left_key and right_key must name the same number of columns")
        if self.left_delay_ms < 0 or self.right_delay_ms < 0:
            raise ConfigError(f"{self.name}: watermark delays must be >= 0")


@dataclass(frozen=True, kw_only=True)
class IntervalJoinConfig(TimeBoundedJoinConfig):
    #: ``l.time BETWEEN r.time - before_ms AND r.time + after_ms``
    before_ms: int
    after_ms: int
    name: str = "interval join"

    JOIN_TYPES: ClassVar[tuple[str, ...]] = INTERVAL_JOIN_TYPES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.before_ms + self.after_ms < 0:
            raise ConfigError(f"{self.name}: the interval is empty: l.time BETWEEN r.time - {self.before_ms} ms AND "
                              f"r.time + {self.after_ms} ms can never hold")


class TimeBoundedJoin(Kernel):
    """What the interval and the temporal join share: two insert-checked inputs, the watermark, late rows."""

    #: input kinds the operator accepts per side (0 left, 1 right)
    ACCEPTS: tuple[frozenset, frozenset] = (frozenset({INSERT}), frozenset({INSERT}))

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.watermarks = Watermarks(self._register(KeyedState(STATE_WATERMARK)),
                                     (config.left_delay_ms, config.right_delay_ms))
        self._time = (config.left_time, config.right_time)
        self._keys = (config.left_key, config.right_key)
        self._arity = (config.left_arity, config.right_arity)

    def process(self, batch, *, side: Literal["left", "right"], now: int = 0) -> Changes:
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        s = 0 if side == "left" else 1
        out = Changes()
        watermark = self.watermarks.current
        accepts, time_at = self.ACCEPTS[s], self._time[s]
        for kind, row in coerce(batch):
            t = event_time_ms(row[time_at])
            if kind == WATERMARK_KIND:
                self.watermarks.observe(s, t)
                continue
            if kind not in accepts:
                raise ValueError(f"{self.config.name}: the {side} input sent a {_kind_name(kind)} row, but this "
                                 "operator joins only inserts there; declare the source append_only (its updates and "
                                 f"deletes are errors) or join the rows with a regular join instead. "
                                 f"Row: {shown_row(row)}")
            if t is None or t < watermark:
                out.emit(LATE_LEFT_KIND if s == 0 else LATE_RIGHT_KIND, self.padded(row, s))
                continue
            self.watermarks.observe(s, t)
            self._element(kind, row, t, s, project(row, self._keys[s]), out)
        return out

    #: the stores whose values are lists of held rows (set by the subclass)
    _row_stores: tuple[KeyedState, ...] = ()

    @property
    def state_rows(self) -> int:
        """Rows held (stored rows, buffered facts, versions), plus the watermark's two entries."""
        return sum(len(rows) for store in self._row_stores for _, rows, _ in store.entries()) + \
            len(self.watermarks.store)

    def padded(self, row: tuple, side: int) -> tuple:
        """``row`` of input ``side`` in the output's columns, the other input's columns null."""
        nulls = (None,) * self._arity[1 - side]
        return row + nulls if side == 0 else nulls + row

    def finish(self, *, now: int = 0) -> Changes:
        out = Changes()
        before = self.watermarks.current
        watermark = self.watermarks.advance()
        if watermark > before or before == NO_WATERMARK:
            self._fire(watermark, out)
        return out

    def _element(self, kind: int, row: tuple, t: int, side: int, key: tuple, out: Changes) -> None:
        raise NotImplementedError

    def _fire(self, watermark: int, out: Changes) -> None:
        raise NotImplementedError


class IntervalJoin(TimeBoundedJoin):
    OPERATOR = "IntervalJoin"

    def __init__(self, config: IntervalJoinConfig) -> None:
        super().__init__(config)
        self.rows = (self._register(KeyedState(STATE_LEFT_ROWS)), self._register(KeyedState(STATE_RIGHT_ROWS)))
        self._row_stores = self.rows
        self.next_expiry = self._register(KeyedState(STATE_NEXT_EXPIRY))
        #: a stored row of input s is dropped once its time + bound[s] < W
        self._bound = (config.before_ms, config.after_ms)
        self._outer = (config.join_type in ("LEFT", "FULL"), config.join_type in ("RIGHT", "FULL"))

    def contract(self) -> cm.ChangelogContract:
        return cm.ChangelogContract(produces=cm.INSERT_ONLY, accepts=cm.INSERT_ONLY, needs_update_before=False)

    def _element(self, kind: int, row: tuple, t: int, side: int, key: tuple, out: Changes) -> None:
        met = False
        if not any(v is None for v in key):
            before, after = self.config.before_ms, self.config.after_ms
            for other in self.rows[1 - side].get(key, 0) or ():
                lt, rt = (t, other[0]) if side == 0 else (other[0], t)
                if rt - before <= lt <= rt + after:
                    out.emit(INSERT, row + other[1] if side == 0 else other[1] + row)
                    other[2] = met = True
        mine = self.rows[side].get(key, 0)
        if mine is None:
            mine = []
            self.rows[side].put(key, mine, 0)
        mine.append([t, row, met])
        expiry = t + self._bound[side]
        nxt = self.next_expiry.get(side, 0)
        if nxt is None or expiry < nxt:
            self.next_expiry.put(side, expiry, 0)

    def _fire(self, watermark: int, out: Changes) -> None:
        for side in (0, 1):
            nxt = self.next_expiry.get(side, 0)
            if nxt is None or nxt >= watermark:
                continue
            bound, outer, store = self._bound[side], self._outer[side], self.rows[side]
            soonest = None
            for key, rows, _ in list(store.entries()):
                keep = []
                for entry in rows:
                    if entry[0] + bound < watermark:
                        if outer and not entry[2]:
                            out.emit(INSERT, self.padded(entry[1], side))
                    else:
                        keep.append(entry)
                        soonest = entry[0] + bound if soonest is None else min(soonest, entry[0] + bound)
                if not keep:
                    store.delete(key)
                elif len(keep) != len(rows):
                    store.put(key, keep, 0)
            if soonest is None:
                self.next_expiry.delete(side)
            else:
                self.next_expiry.put(side, soonest, 0)


def _kind_name(kind: int) -> str:
    from changelake.changelog import RowKind

    try:
        return RowKind(kind).short
    except ValueError:
        return f"kind {kind}"
