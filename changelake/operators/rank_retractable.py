"""RetractableTopN: Top-N over any changelog (Flink's ``RetractableTopNFunction``).

Keeps every row of the partition (not only the Top-N), sorted, so that retracting a
row of the Top-N can pull the next one up. Retractions match rows by full-row equality.

Emission rules::

    +I/+U row, with rank number:    row lands at rank r; each row at rank k >= r (within N) shifts:
                                    -U old@k, +U new@k; +I at the first rank that was empty
    +I/+U row, without rank number: row within N: -D the row pushed to rank N+1 (if any), +I row
    -U/-D row, with rank number:    each row at rank k > r moves up: -U old@k-1, +U new@k-1;
                                    -D at the last rank that is now empty
    -U/-D row, without rank number: row within N: -D row, +I the row pulled up to rank N (if any)
    -U/-D row not in state:         stale retraction (policy + metric), nothing emitted
"""

from __future__ import annotations

from changelake.log_values import shown_row
from changelake.operators._rows import is_accumulate
from changelake.operators._topn_buffer import TopNBuffer
from changelake.operators.rank_base import TopNBase


class RetractableTopN(TopNBase):

    def _one(self, kind: int, row: tuple, now: int) -> None:
        st = self._partition(row, now, lambda: {"buffer": []})
        buf = self._buffer(st)
        sk = self.order.of(row)
        ranked = self.config.output_rank_number or self.config.has_offset
        if is_accumulate(kind):
            buf.put(sk, row)
            if ranked:
                self.emit_ranked_insert(sk, row, buf)
            else:
                self._accumulate_unranked(sk, row, buf)
        else:
            if ranked:
                removed = self._retract_ranked(sk, row, buf)
            else:
                removed = self._retract_unranked(sk, row, buf)
            if not removed and not buf.remove_item(sk, row):
                self.stale(lambda: f"retraction ({shown_row(row)}) found no such row in its Top-N partition")
        if buf.entries:
            self._save(row, st, now)
        else:
            self._drop(row)

    # -- accumulate --------------------------------------------------------------------------
    def _accumulate_unranked(self, sk: tuple, row: tuple, buf: TopNBuffer) -> None:
        rank, found = 0, False
        to_collect = to_delete = None
        for sort_key, rows in buf:
            if not self.in_rank_end(rank):
                break
            if not found and buf.same_key(sort_key, sk):
                rank += len(rows)
                if self.in_range(rank):
                    to_collect = row
                found = True
            elif found:
                last_rank = rank + len(rows)
                if self.in_rank_end(last_rank):
                    rank = last_rank
                else:
                    to_delete = rows[self.rank_end - rank]
                    break
            else:
                rank += len(rows)
        if to_delete is not None:
            self.delete(to_delete)
        if to_collect is not None:
            self.insert(row)

    # -- retract -----------------------------------------------------------------------------
    def _retract_ranked(self, sk: tuple, row: tuple, buf: TopNBuffer) -> bool:
        rank, prev, found, at = 0, None, False, -1
        for index, (sort_key, rows) in enumerate(buf):
            if not self.in_rank_end(rank):
                break
            if not found and buf.same_key(sort_key, sk):
                at, i = index, 0
                while i < len(rows) and self.in_rank_end(rank):
                    current = rows[i]
                    if not found and current == row:
                        prev, found = current, True
                        del rows[i]
                        rank += 1
                        continue
                    if found:
                        self.update_before(prev, rank)
                        self.update_after(current, rank)
                        prev = current
                    rank += 1
                    i += 1
            elif found:
                rank, prev = self.shift(rows, rank, prev, down=False)
            else:
                rank += len(rows)
        if self.in_rank_end(rank) and found:
            self.delete(prev, rank)
        buf.drop_if_empty(at)
        return found

    def _retract_unranked(self, sk: tuple, row: tuple, buf: TopNBuffer) -> bool:
        next_rank, found, at = 1, False, -1
        for index, (sort_key, rows) in enumerate(buf):
            if not self.in_rank_end(next_rank):
                break
            if not found and buf.same_key(sort_key, sk):
                at, i = index, 0
                while i < len(rows) and self.in_rank_end(next_rank):
                    current = rows[i]
                    if not found and current == row:
                        self.delete(current, next_rank)
                        next_rank -= 1
                        found = True
                        del rows[i]
                        next_rank += 1
                        continue
                    if found and next_rank == self.rank_end:
                        self.insert(current, next_rank)
                    next_rank += 1
                    i += 1
            elif found:
                last_rank = next_rank + len(rows) - 1
                if last_rank < self.rank_end:
                    next_rank = last_rank + 1
                else:
                    self.insert(rows[self.rank_end - next_rank])
                    break
            else:
                next_rank += len(rows)
        buf.drop_if_empty(at)
        return found
