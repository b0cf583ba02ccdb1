"""UpdatableTopN: Top-N over an upsert stream whose sort key only improves (Flink's ``UpdatableTopNFunction``).

Rows are identified by ``row_key`` (the input's unique key). A ``+I``/``+U`` for a
row key already in the Top-N replaces that row; the planner guarantees its sort key
does not get worse (a worse one is a stale input: counted, then ranked anyway).

Emission rules::

    new row key, cannot enter a full Top-N      nothing
    new row key, without rank number            -D the evicted worst row (if full), +I row
    known row key, without rank number          -U old (if generate_update_before), +U row
    with rank number: a new row lands at r      shifted ranks k >= r: -U old@k, +U new@k; +I at the first empty rank
    known row key, same sort key, rank r        -U old@r, +U row@r
    known row key, better sort key, r_old->r    the rows between move down one rank: -U/+U per rank,
                                                the row's old rank is retracted before its new value
"""

from __future__ import annotations

from changelake.errors import StateError
from changelake.changelog import RowKind
from changelake.log_values import shown, shown_row
from changelake.operators._rows import is_accumulate, project
from changelake.operators._topn_buffer import TopNBuffer
from changelake.operators.rank_base import TopNBase


class UpdatableTopN(TopNBase):

    def _one(self, kind: int, row: tuple, now: int) -> None:
        if not is_accumulate(kind):
            raise StateError(f"UpdatableTopN got {RowKind(kind).short} ({shown_row(row)}); it accepts only +I/+U "
                             "upserts. Use strategy 'retract' for a changelog with retractions")
        st = self._partition(row, now, lambda: {"rows": {}, "buffer": []})
        self._rows: dict = st["rows"]
        buf = self._buffer(st)
        if self.config.output_rank_number or self.config.has_offset:
            self._with_row_number(row, buf)
        else:
            self._without_row_number(row, buf)
        self._save(row, st, now)

    def _row_number(self, sk: tuple, rk: tuple, buf: TopNBuffer) -> int:
        rank = 1
        for sort_key, keys in buf:
            if buf.same_key(sort_key, sk):
                for k in keys:
                    if k == rk:
                        return rank
                    rank += 1
            else:
                rank += len(keys)
        raise StateError(f"UpdatableTopN: row key {rk!r} is missing from its partition's sorted buffer")

    def _without_row_number(self, row: tuple, buf: TopNBuffer) -> None:
        sk, rk = self.order.of(row), project(row, self.config.row_key)
        old = self._rows.get(rk)
        if old is not None:
            old_sk = self.order.of(old)
            if not buf.same_key(old_sk, sk):
                buf.remove_item(old_sk, rk)
                buf.put(sk, rk)
            self._rows[rk] = row
            self.update_before(old)
            self.update_after(row)
            return
        if not self.in_buffer_range(sk, buf):
            return
        buf.put(sk, rk)
        self._rows[rk] = row
        if buf.size() > self.rank_end:
            last_key = buf.remove_last()
            last_row = self._rows.pop(last_key)
            self.delete(last_row)
        self.insert(row)

    def _with_row_number(self, row: tuple, buf: TopNBuffer) -> None:
        sk, rk = self.order.of(row), project(row, self.config.row_key)
        old = self._rows.get(rk)
        if old is None:
            if self.in_buffer_range(sk, buf):
                buf.put(sk, rk)
                self._rows[rk] = row
                self._emit_ranked(sk, row, buf)
            return
        old_sk = self.order.of(old)
        cmp = self.order.compare(sk, old_sk)
        if cmp == 0:
            rank = self._row_number(sk, rk, buf)
            self._rows[rk] = row
            self.update_before(old, rank)
            self.update_after(row, rank)
            return
        old_rank = self._row_number(old_sk, rk, buf)
        buf.remove_item(old_sk, rk)
        buf.put(sk, rk)
        self._rows[rk] = row
        if cmp < 0:
            self._emit_ranked(sk, row, buf, old_sk, old, old_rank)
            return
        self.stale(lambda: f"row key {rk!r}: sort key got worse ({shown(old_sk)} -> {shown(sk)}); the input breaks the "
                           "monotonic sort key this Top-N strategy relies on (upstream state expired?)")
        self._emit_worse(row, self._row_number(sk, rk, buf), old, old_rank, buf)

    def _emit_worse(self, row: tuple, new_rank: int, old: tuple, old_rank: int, buf: TopNBuffer) -> None:
        self.update_before(old, old_rank)
        rank = 0
        for _, keys in buf:
            for k in keys:
                rank += 1
                if rank == new_rank:
                    self.update_after(row, new_rank)
                    return
                if old_rank <= rank:
                    current = self._rows[k]
                    self.update_before(current, rank + 1)
                    self.update_after(current, rank)
        self.update_after(row, new_rank)

    def _emit_ranked(self, sk: tuple, row: tuple, buf: TopNBuffer, old_sk: tuple | None = None,
                     old: tuple | None = None, old_rank: int = -1) -> None:
        rank, current, found, old_retracted = 0, None, False, False
        consumed = 0
        for sort_key, keys in buf:
            if not self.in_rank_end(rank):
                break
            consumed += 1
            if not found and buf.same_key(sort_key, sk):
                rank += len(keys)
                current, found = row, True
            elif found:
                if old_sk is not None and self.order.compare(sort_key, old_sk) > 0:
                    break
                limit = (lambda r: r < old_rank) if old_sk is not None else self.in_rank_end
                for k in keys:
                    if not limit(rank):
                        break
                    prev = self._rows[k]
                    self.update_before(prev, rank)
                    if current is row and old is not None and not old_retracted:
                        self.update_before(old, old_rank)
                        old_retracted = True
                    self.update_after(current, rank)
                    current = prev
                    rank += 1
            else:
                rank += len(keys)
        if self.in_rank_end(rank):
            if old is None:
                self.insert(current, rank)
            else:
                if not old_retracted:
                    self.update_before(old, old_rank)
                self.update_after(current, rank)
            return
        for _, keys in buf.entries[consumed:]:
            for k in keys:
                self._rows.pop(k, None)
        buf.truncate(consumed)
