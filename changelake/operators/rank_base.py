"""The Top-N kernels' shared parts: their configuration and :class:`TopNBase` (partition state, rank end,
the emit helpers). The strategies and their emission rules: :mod:`changelake.operators.rank`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from changelake.changelog import RowKind
from changelake.errors import ConfigError, StateError
from changelake.log_values import shown_row
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Changes, project
from changelake.operators._state import KeyedState, StaleRetractionPolicy, StaleRetractions, check_ttl
from changelake.operators._topn_buffer import SortColumn, SortOrder, TopNBuffer

Strategy = Literal["append_only", "append_only_first_n", "fast_top1", "retract", "update"]
STRATEGIES = ("append_only", "append_only_first_n", "fast_top1", "retract", "update")

#: partition key -> the partition's Top-N state (layout per strategy; always has "rank_end")
STATE_PARTITION = "rank-partition"


@dataclass(frozen=True)
class RankConfig:
    strategy: Strategy
    partition_keys: tuple[int, ...]
    sort_keys: tuple[SortColumn, ...]
    rank_end: int | None = None
    rank_start: int = 1
    #: read N from this column instead of a constant (then rank_start must be 1)
    rank_end_column: int | None = None
    rank_type: Literal["ROW_NUMBER", "RANK", "DENSE_RANK"] = "ROW_NUMBER"
    generate_update_before: bool = True
    output_rank_number: bool = False
    #: unique key of the input rows (strategy ``update``)
    row_key: tuple[int, ...] | None = None
    state_ttl_ms: int = 0
    on_stale_retraction: StaleRetractionPolicy = "warn"
    #: optional input schema; lets the rank-end column's type be checked up front
    input_schema: pa.Schema | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"Rank: strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.rank_type != "ROW_NUMBER":
            raise ConfigError(f"Rank: {self.rank_type} is not supported by streaming Top-N; use ROW_NUMBER")
        if (self.rank_end is None) == (self.rank_end_column is None):
            raise ConfigError("Rank: give exactly one of rank_end (constant N) and rank_end_column (variable N); "
                              "a Top-N without an upper bound is not supported")
        if self.rank_end is not None and not (1 <= self.rank_start <= self.rank_end):
            raise ConfigError(f"Rank: need 1 <= rank_start <= rank_end, got {self.rank_start}..{self.rank_end}")
        if self.rank_end_column is not None:
            if self.rank_start != 1:
                raise ConfigError("Rank: a variable rank end needs rank_start = 1")
            if self.input_schema is not None:
                t = self.input_schema.field(self.rank_end_column).type
                if not pa.types.is_integer(t):
                    raise ConfigError(f"Rank: rank_end_column {self.rank_end_column} is {t}; the rank end must be "
                                      "an integer column (BIGINT, INT, SMALLINT, TINYINT)")
        if self.strategy == "fast_top1" and (self.rank_end != 1 or self.rank_start != 1):
            raise ConfigError("Rank: fast_top1 needs a constant rank range 1..1")
        if self.strategy == "update" and not self.row_key:
            raise ConfigError("Rank: strategy 'update' needs row_key (the input's unique key)")
        check_ttl("Rank", self.state_ttl_ms)

    @property
    def has_offset(self) -> bool:
        return self.rank_start > 1


class TopNBase(Kernel):
    """Partition state, rank end, and the emit helpers shared by all strategies."""

    OPERATOR = "Rank"

    def __init__(self, config: RankConfig) -> None:
        super().__init__()
        self.config = config
        self.order = SortOrder(config.sort_keys)
        self.state = self._register(KeyedState(STATE_PARTITION, config.state_ttl_ms))
        self.stale = StaleRetractions(self.OPERATOR, config.on_stale_retraction, self.figures)
        self._out: Changes | None = None
        self.rank_end = config.rank_end or 0
        #: id of a partition's sorted list -> (that list, its sort keys' native forms): see :meth:`_buffer`
        self._native: dict[int, tuple[list, list]] = {}

    def contract(self) -> cm.ChangelogContract:
        c = self.config
        produces = cm.ALL if c.generate_update_before else cm.UPSERT
        accepts = cm.INSERT_ONLY if c.strategy in ("append_only", "append_only_first_n") else cm.ALL
        return cm.ChangelogContract(produces=produces, accepts=accepts, needs_update_before=c.strategy == "retract")

    # -- state --------------------------------------------------------------------------------
    def _partition(self, row: tuple, now: int, new) -> dict:
        """The partition's state (created with ``new()``); sets ``self.rank_end`` for it."""
        pk = project(row, self.config.partition_keys)
        st = self.state.get(pk, now)
        if st is None:
            st = new()
            st["rank_end"] = None
        col = self.config.rank_end_column
        if col is not None:
            if st["rank_end"] is None:
                value = row[col]
                if value is None or int(value) < 1:
                    raise StateError(f"Rank: rank end column {col} holds {value!r}; it must be a positive integer")
                st["rank_end"] = int(value)
            self.rank_end = st["rank_end"]
        return st

    def _buffer(self, st: dict) -> TopNBuffer:
        """The partition's sorted buffer, with the native sort keys this kernel kept for its list since it
        last saw it (made anew for a list it has not seen: restored, new, or changed outside a buffer). The
        kept pair holds the list itself, so no other list can take its id while it is kept."""
        entries = st["buffer"]
        kept = self._native.get(id(entries))
        if kept is not None and kept[0] is entries and len(kept[1]) == len(entries):
            return TopNBuffer(self.order, entries, kept[1])
        if len(self._native) > 2 * len(self.state) + 64:        # lists of dropped or expired partitions
            self._native.clear()
        buf = TopNBuffer(self.order, entries)
        self._native[id(entries)] = (entries, buf.native)
        return buf

    def expire(self, *, now: int) -> int:
        self._native.clear()
        return super().expire(now=now)

    def _save(self, row: tuple, st: dict, now: int) -> None:
        self.state.put(project(row, self.config.partition_keys), st, now)

    def _drop(self, row: tuple) -> None:
        self.state.delete(project(row, self.config.partition_keys))

    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        self._out = out
        try:
            for kind, row in batch:
                self._one(kind, row, now)
        finally:
            self._out = None

    def _one(self, kind: int, row: tuple, now: int) -> None:
        raise NotImplementedError

    def _require_insert(self, kind: int, row: tuple) -> None:
        if kind != INSERT:
            raise StateError(f"{type(self).__name__} got {RowKind(kind).short} ({shown_row(row)}) but accepts "
                             "insert-only input; use strategy 'retract' (or 'update' for upserts)")

    # -- emit helpers ---------------------------------------------------------------------------
    def in_rank_end(self, rank: int) -> bool:
        return rank <= self.rank_end

    def in_range(self, rank: int) -> bool:
        return self.config.rank_start <= rank <= self.rank_end

    def _emit(self, kind: int, row: tuple, rank: int | None) -> None:
        self._out.emit(kind, row + (rank,) if (rank is not None and self.config.output_rank_number) else row)

    def insert(self, row: tuple, rank: int | None = None) -> None:
        if rank is None or self.in_range(rank):
            self._emit(INSERT, row, rank)

    def delete(self, row: tuple, rank: int | None = None) -> None:
        if rank is None or self.in_range(rank):
            self._emit(DELETE, row, rank)

    def update_after(self, row: tuple, rank: int | None = None) -> None:
        if rank is None or self.in_range(rank):
            self._emit(UPDATE_AFTER, row, rank)

    def update_before(self, row: tuple, rank: int | None = None) -> None:
        if self.config.generate_update_before and (rank is None or self.in_range(rank)):
            self._emit(UPDATE_BEFORE, row, rank)

    def in_buffer_range(self, sort_key: tuple, buf: TopNBuffer) -> bool:
        """A new row can enter the Top-N: the buffer has room or the row beats the current worst."""
        last = buf.last()
        if last is None or self.order.compare(sort_key, last[0]) < 0:
            return True
        return buf.size() < self.rank_end

    def shift(self, rows: list, rank: int, carried: tuple, *, down: bool) -> tuple[int, tuple]:
        """Re-emit ranks ``rank, rank+1, ...`` (within N) for ``rows``, each taking its neighbour's place.

        ``down``: a row was inserted above, every row moves one rank down (rank k: -U row, +U carried).
        Otherwise a row was removed above and every row moves up (rank k: -U carried, +U row).
        Returns the next rank and the row carried on.
        """
        for r in rows:
            if not self.in_rank_end(rank):
                break
            self.update_before(r if down else carried, rank)
            self.update_after(carried if down else r, rank)
            carried = r
            rank += 1
        return rank, carried

    def emit_ranked_insert(self, sk: tuple, row: tuple, buf: TopNBuffer) -> int:
        """Emit the rank changes of ``row`` (already in ``buf``, last of its sort key) entering the
        Top-N; returns how many sort-key entries were visited (later ones lie beyond N)."""
        rank, current, found, consumed = 0, None, False, 0
        for sort_key, rows in buf:
            if not self.in_rank_end(rank):
                break
            consumed += 1
            if not found and buf.same_key(sort_key, sk):
                rank += len(rows)
                current, found = row, True
            elif found:
                rank, current = self.shift(rows, rank, current, down=True)
            else:
                rank += len(rows)
        if self.in_rank_end(rank):
            self.insert(current, rank)
        return consumed
