"""TemporalJoin: facts joined with the version of a changelog table valid at each fact's event time.

``facts JOIN versions FOR SYSTEM_TIME AS OF facts.time ON facts.k = versions.pk`` (Flink's
event-time temporal table join). The left input is insert-only facts; the right input is the
changelog of a table keyed by the join key, whose event-time column says from when each change
holds: ``+I``/``+U`` at ``t`` make that row the key's version from ``t`` on, ``-D`` at ``t`` ends
the key's row at ``t`` (``-U`` is ignored: the ``+U`` that follows it carries the new version).

With ``W`` the watermark (see ``_event_time``)::

    fact or version with time null or < W   -> late: emitted as a late row, not used
    fact                                    -> buffered under its key until W passes its time
    version                                 -> stored in the key's version list, ordered by time
                                               (equal times: the later arrival wins)
    end of batch, W advanced to W'          -> every buffered fact with time < W' is emitted once:
                                               +I [fact + version valid at fact.time] if one exists,
                                               else +I [fact + nulls] (left join) or nothing (inner);
                                               per key, versions older than the newest one at or
                                               before W' are dropped (no future fact can see them),
                                               and so is that one if it is a deletion

A fact is emitted only once ``W`` has passed its time because until then a version older than
the fact may still arrive. The output is insert-only and never retracted. The state holds the
facts of the last watermark delay and, per key, one version plus those newer than ``W``.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import ClassVar

from changelake.errors import ConfigError
from changelake.operators import changelog_mode as cm
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Changes
from changelake.operators._state import KeyedState
from changelake.operators.interval_join import TimeBoundedJoin, TimeBoundedJoinConfig

#: join key -> buffered facts ``[time_ms, row]`` / versions ``[time_ms, row or None]`` in time order.
#: Part of the checkpoint contract.
STATE_FACTS = "temporal-facts"
STATE_VERSIONS = "temporal-versions"


@dataclass(frozen=True, kw_only=True)
class TemporalJoinConfig(TimeBoundedJoinConfig):
    name: str = "temporal join"

    JOIN_TYPES: ClassVar[tuple[str, ...]] = ("INNER", "LEFT")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.left_key:
            raise ConfigError(f"{self.name}: a temporal join needs a join key (the versioned table's primary key)")


class TemporalJoin(TimeBoundedJoin):
    OPERATOR = "TemporalJoin"
    ACCEPTS = (frozenset({INSERT}), frozenset({INSERT, UPDATE_BEFORE, UPDATE_AFTER, DELETE}))

    def __init__(self, config: TemporalJoinConfig) -> None:
        super().__init__(config)
        self.facts = self._register(KeyedState(STATE_FACTS))
        self.versions = self._register(KeyedState(STATE_VERSIONS))
        self._row_stores = (self.facts, self.versions)

    def contract(self) -> cm.ChangelogContract:
        return cm.ChangelogContract(produces=cm.INSERT_ONLY, accepts=cm.ALL, needs_update_before=False)

    def _element(self, kind: int, row: tuple, t: int, side: int, key: tuple, out: Changes) -> None:
        if side == 0:
            facts = self.facts.get(key, 0)
            if facts is None:
                self.facts.put(key, [[t, row]], 0)
            else:
                facts.append([t, row])
            return
        if kind == UPDATE_BEFORE:
            return
        versions = self.versions.get(key, 0)
        if versions is None:
            versions = []
            self.versions.put(key, versions, 0)
        # after every version of the same time: the later arrival wins
        at = bisect_right([v[0] for v in versions], t)
        versions.insert(at, [t, None if kind == DELETE else row])

    def _fire(self, watermark: int, out: Changes) -> None:
        left_join = self.config.join_type == "LEFT"
        for key, facts, _ in list(self.facts.entries()):
            ready = sorted((f for f in facts if f[0] < watermark), key=lambda f: f[0])
            if not ready:
                continue
            versions = [] if any(v is None for v in key) else (self.versions.get(key, 0) or [])
            times = [v[0] for v in versions]
            for t, row in ready:
                at = bisect_right(times, t)
                version = versions[at - 1][1] if at else None
                if version is not None:
                    out.emit(INSERT, row + version)
                elif left_join:
                    out.emit(INSERT, self.padded(row, 0))
            rest = [f for f in facts if f[0] >= watermark]
            if rest:
                self.facts.put(key, rest, 0)
            else:
                self.facts.delete(key)
        for key, versions, _ in list(self.versions.entries()):
            at = bisect_right([v[0] for v in versions], watermark)
            if at == 0:
                continue
            keep = versions[at - 1:] if versions[at - 1][1] is not None else versions[at:]
            if not keep:
                self.versions.delete(key)
            elif len(keep) != len(versions):
                self.versions.put(key, keep, 0)
