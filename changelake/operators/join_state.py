"""The three state layouts of a join input (Flink's ``JoinRecordStateView``).

Per join key a side keeps its rows in one of three layouts, chosen from what the
planner knows about the input's unique key:

=============================  ==================================  =======================
layout                         entries per join key                 a new row ...
=============================  ==================================  =======================
``join_key_contains_unique_key``  at most one row                   replaces the row
``has_unique_key``                one row per unique-key value       replaces that entry
``no_unique_key``                 each distinct row with a count     increments the count
=============================  ==================================  =======================

On an outer side every entry also carries ``assoc``, the number of rows of the
other side it currently joins with (Flink's ``numOfAssociations``); it decides when
the null-padded row must be emitted or retracted.

TTL is per entry (a MapState entry in Flink): an entry written (added or its
``assoc`` updated) at ``w`` expires once ``w + ttl <= now``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from changelake.errors import ConfigError
from changelake.operators._state import TrackedKeyedState

Layout = Literal["join_key_contains_unique_key", "has_unique_key", "no_unique_key"]
LAYOUTS = ("join_key_contains_unique_key", "has_unique_key", "no_unique_key")

# entry fields: [row, count, assoc, written_at]
_ROW, _COUNT, _ASSOC, _WRITTEN = range(4)


@dataclass(frozen=True)
class InputSpec:
    """What is known about one join input's unique key."""

    layout: Layout = "no_unique_key"
    unique_key: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ConfigError(f"join input layout must be one of {LAYOUTS}, got {self.layout!r}")
        if (self.layout == "no_unique_key") != (self.unique_key is None):
            raise ConfigError("join input: give unique_key exactly when the layout is not 'no_unique_key'")


def _no_entry_key(row: tuple) -> tuple:
    return ()


def _whole_row(row: tuple) -> tuple:
    return row


def _entry_key_function(spec: InputSpec) -> Callable[[tuple], Any]:
    """A row's key among its join key's entries, in ``spec``'s layout: none (one row per join key), the
    unique key's values, or the whole row."""
    if spec.layout == "join_key_contains_unique_key":
        return _no_entry_key
    if spec.layout == "has_unique_key":
        unique = spec.unique_key
        if len(unique) == 1:
            i = unique[0]
            return lambda row: (row[i],)
        return lambda row: tuple([row[i] for i in unique])
    return _whole_row


class JoinRecordView:
    """One side's rows, by join key, in the layout of its :class:`InputSpec`."""

    def __init__(self, name: str, spec: InputSpec, ttl_ms: int) -> None:
        self.spec = spec
        self.ttl_ms = ttl_ms
        #: value: {entry key: [row, count, assoc, written_at]}, changed in place: every change touches the key
        self.store = TrackedKeyedState(name)
        #: a row's key among its join key's entries
        self.entry_key = _entry_key_function(spec)

    @property
    def unique_rows(self) -> bool:
        """One row per unique key (count 1 each, no association counts read), no TTL."""
        return self.spec.layout != "no_unique_key" and self.ttl_ms <= 0

    def _entries(self, jk: tuple, now: int) -> dict | None:
        entries = self.store.get(jk, now)
        if entries is None:
            return None
        if self.ttl_ms > 0:
            dead = [k for k, e in entries.items() if e[_WRITTEN] + self.ttl_ms <= now]
            for k in dead:
                del entries[k]
            if dead:
                self.store.touch(jk)
            if not entries:
                self.store.delete(jk)
                return None
        return entries

    def records(self, jk: tuple, now: int) -> list[tuple[tuple, int]]:
        """``(row, assoc)`` for every live row of ``jk``, a row with count n repeated n times."""
        entries = self._entries(jk, now)
        if not entries:
            return []
        return [(e[_ROW], e[_ASSOC]) for e in entries.values() for _ in range(e[_COUNT])]

    def add(self, jk: tuple, row: tuple, now: int, assoc: int = 0) -> None:
        entries = self._entries(jk, now)
        if entries is None:
            entries = {}
            self.store.put(jk, entries, now)
        else:
            self.store.touch(jk)
        ek = self.entry_key(row)
        entry = entries.get(ek)
        if entry is not None and self.spec.layout == "no_unique_key":
            entry[_COUNT] += 1
            entry[_ASSOC] = assoc
            entry[_WRITTEN] = now
        else:
            entries[ek] = [row, 1, assoc, now]

    def retract(self, jk: tuple, row: tuple, now: int) -> bool:
        """Remove one ``row``; False if nothing was there to remove."""
        entries = self._entries(jk, now)
        if not entries:
            return False
        ek = self.entry_key(row)
        entry = entries.get(ek)
        if entry is None:
            return False
        self.store.touch(jk)
        if entry[_COUNT] > 1:
            entry[_COUNT] -= 1
            entry[_WRITTEN] = now
        else:
            del entries[ek]
            if not entries:
                self.store.delete(jk)
        return True

    def update_assoc(self, jk: tuple, row: tuple, assoc: int, now: int) -> None:
        entries = self._entries(jk, now)
        entry = entries.get(self.entry_key(row)) if entries else None
        if entry is not None:
            self.store.touch(jk)
            entry[_ASSOC] = assoc
            entry[_WRITTEN] = now

    def expire(self, now: int) -> int:
        if self.ttl_ms <= 0:
            return 0
        dropped = 0
        for jk, entries, _ in list(self.store.entries()):
            before = len(entries)
            left = self._entries(jk, now)
            dropped += before - (len(left) if left else 0)
        return dropped

    def __len__(self) -> int:
        """The rows kept (a row with count n counted n times)."""
        if self.spec.layout != "no_unique_key":      # a unique key: every entry one row, count 1
            return sum(map(len, self.store.values()))
        return sum(e[_COUNT] for entries in self.store.values() for e in entries.values())
