"""Rank: streaming Top-N (``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...) <= N``).

Mirrors Flink's rank functions; the planner picks one by what it knows of the input:

==========================  ===========================  ============================================
strategy                    input                        class
==========================  ===========================  ============================================
``append_only``             insert-only                  :class:`AppendOnlyTopN`
``append_only_first_n``     insert-only, ORDER BY time   :class:`AppendOnlyFirstN` (keeps the first N)
``fast_top1``               upserts, N = 1, monotonic    :class:`FastTop1`
``retract``                 any changelog                :class:`~.rank_retractable.RetractableTopN`
``update``                  upserts by ``row_key``,      :class:`~.rank_updatable.UpdatableTopN`
                            monotonic sort key
==========================  ===========================  ============================================

Only ROW_NUMBER with an upper bound is supported (as in Flink's streaming Top-N);
RANK / DENSE_RANK and an open end are rejected at construction. Rows with equal sort
keys rank in arrival order. The rank end may be a constant or read from a column
(fixed per partition by the partition's first row).

Common emission vocabulary (``in range`` = ``rank_start <= rank <= rank_end``; with
``output_rank_number`` the rank is appended as the last column; ``-U`` only with
``generate_update_before``; ranked emits outside the range are dropped)::

    a row enters the Top-N               +I row[@rank]
    a row leaves it                      -D row[@rank]
    rank r now holds another row         -U old@r, +U new@r        (with rank number)
    a row is replaced (no rank number)   -D old, +I new            (append-only / retract)

Only changed ranks are emitted: without rank numbers, rows that merely shift position
inside the Top-N emit nothing. Per-strategy rules are in each class's docstring.
"""

from __future__ import annotations

from changelake.operators._topn_buffer import TopNBuffer
from changelake.operators.rank_base import STATE_PARTITION, STRATEGIES, RankConfig, Strategy, TopNBase
from changelake.operators.rank_retractable import RetractableTopN
from changelake.operators.rank_updatable import UpdatableTopN

__all__ = ["STATE_PARTITION", "STRATEGIES", "AppendOnlyFirstN", "AppendOnlyTopN", "FastTop1", "RankConfig",
           "RetractableTopN", "Strategy", "TopNBase", "UpdatableTopN", "make_rank"]


class AppendOnlyTopN(TopNBase):
    """Insert-only input; keeps the best N rows per partition.

    ::

        row does not beat the worst of a full Top-N   nothing
        without rank number: Top-N was full           -D the evicted worst row, +I row
                             otherwise                +I row
        with rank number: row lands at rank r         for each rank k >= r it shifts: -U old@k, +U new@k;
                                                      +I at the first rank that was empty
    """

    def _one(self, kind: int, row: tuple, now: int) -> None:
        self._require_insert(kind, row)
        st = self._partition(row, now, lambda: {"buffer": []})
        buf = self._buffer(st)
        sk = self.order.of(row)
        if not self.in_buffer_range(sk, buf):
            return
        buf.put(sk, row)
        if self.config.output_rank_number or self.config.has_offset:
            self._with_row_number(sk, row, buf)
        else:
            self._without_row_number(row, buf)
        self._save(row, st, now)

    def _with_row_number(self, sk: tuple, row: tuple, buf: TopNBuffer) -> None:
        consumed = self.emit_ranked_insert(sk, row, buf)
        buf.truncate(consumed)

    def _without_row_number(self, row: tuple, buf: TopNBuffer) -> None:
        if buf.size() > self.rank_end:
            evicted = buf.remove_last()
            if evicted == row:
                return
            self.delete(evicted)
        self.insert(row)


class AppendOnlyFirstN(TopNBase):
    """Insert-only input ordered by arrival (e.g. ``ORDER BY proctime``): the first N rows win.

    ::

        fewer than N rows seen in the partition   +I row[@count]   (count += 1)
        otherwise                                  nothing
    """

    def _one(self, kind: int, row: tuple, now: int) -> None:
        self._require_insert(kind, row)
        st = self._partition(row, now, lambda: {"count": 0})
        if st["count"] >= self.rank_end:
            return
        st["count"] += 1
        self._save(row, st, now)
        if self.config.output_rank_number or self.config.has_offset:
            self.insert(row, st["count"])
        else:
            self.insert(row)


class FastTop1(TopNBase):
    """Top-1 over upserts keyed by the partition key, the sort key only ever improving.

    ::

        first row of the partition        +I row[@1]
        row beats the current top row     -U top[@1], +U row[@1]
        otherwise                         nothing (a worse or equal sort key cannot win)
    """

    def _one(self, kind: int, row: tuple, now: int) -> None:
        st = self._partition(row, now, lambda: {"top": None})
        top = st["top"]
        ranked = 1 if self.config.output_rank_number else None
        if top is None:
            st["top"] = row
            self._save(row, st, now)
            self.insert(row, ranked)
            return
        if self.order.compare(self.order.of(row), self.order.of(top)) < 0:
            st["top"] = row
            self._save(row, st, now)
            self.update_before(top, ranked)
            self.update_after(row, ranked)


def make_rank(config: RankConfig) -> TopNBase:
    """The Top-N kernel for ``config.strategy``."""
    classes = {"append_only": AppendOnlyTopN, "append_only_first_n": AppendOnlyFirstN, "fast_top1": FastTop1,
               "retract": RetractableTopN, "update": UpdatableTopN}
    return classes[config.strategy](config)
