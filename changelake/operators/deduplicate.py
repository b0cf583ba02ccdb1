"""Deduplicate: keep the first or the last row per key, on processing time or on a rowtime column.

Mirrors Flink's ``ProcTimeDeduplicateKeep{First,Last}RowFunction``,
``RowTimeDeduplicateFunction`` and their mini-batch variants. State per key
(:data:`STATE_LAST_ROW`): the row currently emitted for the key (keep-first on
processing time stores only a marker).

Emission rules, ``pre`` = the key's stored row (None if absent or expired), ``r`` = input::

    mode                   condition                             emit                           state
    ---------------------  ------------------------------------  -----------------------------  --------
    first, proctime        pre is None                           +I r                           marker
    first, proctime        otherwise                             nothing                        -
    last,  proctime, +I    pre is None                           +I r  (+U r if not gen_insert) r
    last,  proctime, +I    r == pre and TTL disabled             nothing (no-op suppressed)     r
    last,  proctime, +I    otherwise                             [-U pre if gub] +U r           r
    last,  proctime, +I    not gub and not gen_insert            +U r                           r
    last,  changelog, -U/-D  pre is None                         nothing (stale retraction, but  -
                                                                 not when a mini-batch folded
                                                                 away the key's earlier rows)
    last,  changelog, -U/-D  otherwise                           -D pre                         cleared
    last,  +I/+U, unavailable_value set: each value of r equal to it is first replaced by pre's value
                                         (NULL when pre is None): an unchanged TOASTed column
    rowtime (first|last)   r wins over pre (see below)           like "last, proctime" without  r
                                                                 the no-op suppression
    rowtime                r does not win                        nothing                        -

``r`` wins over ``pre`` on rowtime when ``pre`` is None, or for keep-last when
``pre.rt <= r.rt``, for keep-first when ``r.rt < pre.rt``.

With TTL enabled an unchanged keep-last row is re-emitted (Flink does this so that
downstream state is refreshed and does not expire too early).

Mini-batch (count trigger, flushed by a watermark and at finish):

* proctime: one row per key survives the bundle (the first for keep-first, the last
  for keep-last) and is then processed as above. A surviving -U/-D of a key the state does not
  hold whose earlier rows the bundle folded away (a row inserted and deleted within one micro-batch)
  emits nothing and is not a stale retraction: it retracts a row that never left the bundle.
* rowtime, ``compact_changes=False``: every buffered row is processed as above, key by
  key (Flink's ``RowTimeMiniBatchDeduplicateFunction``).
* rowtime, ``compact_changes=True``: the rows of a key are folded with the "wins"
  rule first, so only the net change against the state is emitted (Flink's
  ``RowTimeMiniBatchLatestChangeDeduplicateFunction``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import RowKind, user_columns
from changelake.errors import ConfigError, StateError
from changelake.log_values import shown_row
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel, MiniBatchBuffer
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Changes, is_accumulate, project
from changelake.operators._state import KeyedState, StaleRetractionPolicy, StaleRetractions, check_ttl

#: key -> the row last emitted for it (keep-first on processing time: ``True``).
STATE_LAST_ROW = "deduplicate-row"


@dataclass(frozen=True)
class DeduplicateConfig:
    keys: tuple[int, ...]
    keep: Literal["first", "last"]
    order: Literal["proctime", "rowtime"] = "proctime"
    rowtime_index: int | None = None
    generate_update_before: bool = True
    generate_insert: bool = True
    input_insert_only: bool = True
    state_ttl_ms: int = 0
    mini_batch_size: int | None = None
    compact_changes: bool = False
    on_stale_retraction: StaleRetractionPolicy = "warn"
    #: a connector's placeholder for a value it did not send (keep-last changelog input only)
    unavailable_value: str | None = None

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("Deduplicate: keys must name at least one column")
        if self.keep not in ("first", "last"):
            raise ConfigError(f"Deduplicate: keep must be 'first' or 'last', got {self.keep!r}")
        if self.order not in ("proctime", "rowtime"):
            raise ConfigError(f"Deduplicate: order must be 'proctime' or 'rowtime', got {self.order!r}")
        if (self.order == "rowtime") != (self.rowtime_index is not None):
            raise ConfigError("Deduplicate: set rowtime_index exactly when order is 'rowtime'")
        if not self.input_insert_only and not (self.order == "proctime" and self.keep == "last"):
            raise ConfigError("Deduplicate: only keep='last' on processing time accepts updates and deletes; "
                              "put a keep-last deduplicate (changelog normalize) in front, or declare the input "
                              "insert-only")
        if self.compact_changes and (self.order != "rowtime" or self.mini_batch_size is None):
            raise ConfigError("Deduplicate: compact_changes applies only to rowtime deduplication with a mini-batch")
        check_ttl("Deduplicate", self.state_ttl_ms)
        if self.unavailable_value is not None and self.input_insert_only:
            raise ConfigError("Deduplicate: unavailable_value applies to a changelog input (input_insert_only false)")


class Deduplicate(Kernel):
    OPERATOR = "Deduplicate"

    def __init__(self, config: DeduplicateConfig) -> None:
        super().__init__()
        self.config = config
        self.state = self._register(KeyedState(STATE_LAST_ROW, config.state_ttl_ms))
        self.stale = StaleRetractions(self.OPERATOR, config.on_stale_retraction, self.figures)
        if config.mini_batch_size is not None:
            self.mini_batch = MiniBatchBuffer(config.mini_batch_size)
        u = config.unavailable_value
        #: the placeholder as text and as bytes (a BYTES column holds its UTF-8 bytes)
        self._unavailable = () if u is None else (u, u.encode())
        #: keys whose earlier rows the mini-batch being processed folded away
        self._folded: frozenset | set = _NONE

    def contract(self) -> cm.ChangelogContract:
        c = self.config
        if c.keep == "first" and c.order == "proctime":
            produces = cm.INSERT_ONLY
        else:
            produces = cm.updates(generate_update_before=c.generate_update_before,
                                  generate_insert=c.generate_insert or c.generate_update_before,
                                  deletes=not c.input_insert_only)
        accepts = cm.INSERT_ONLY if c.input_insert_only else cm.ALL
        return cm.ChangelogContract(produces=produces, accepts=accepts, needs_update_before=False)

    # -- per row ---------------------------------------------------------------------------------
    def _check_insert(self, kind: int, row: tuple) -> None:
        if kind != INSERT and self.config.input_insert_only:
            raise StateError(f"Deduplicate got {RowKind(kind).short} ({shown_row(row)}) but is configured for an "
                             "insert-only input; set input_insert_only: false (keep='last' on processing time only)")

    def _wins(self, pre: tuple | None, row: tuple) -> bool:
        if pre is None:
            return True
        i = self.config.rowtime_index
        if self.config.keep == "last":
            return pre[i] <= row[i]
        return row[i] < pre[i]

    def _emit_update(self, pre: tuple | None, row: tuple, out: Changes) -> None:
        c = self.config
        if not (c.generate_update_before or c.generate_insert):
            out.emit(UPDATE_AFTER, row)
        elif pre is None:
            out.emit(INSERT, row)
        else:
            if c.generate_update_before:
                out.emit(UPDATE_BEFORE, pre)
            out.emit(UPDATE_AFTER, row)

    def _one(self, key: tuple, kind: int, row: tuple, now: int, out: Changes) -> None:
        c, state = self.config, self.state
        if c.order == "rowtime":
            self._check_insert(kind, row)
            pre = state.get(key, now)
            if self._wins(pre, row):
                self._emit_update(pre, row, out)
                state.put(key, row, now)
            return
        if c.keep == "first":
            self._check_insert(kind, row)
            if state.get(key, now) is None:
                state.put(key, True, now)
                out.emit(INSERT, row)
            return
        if c.input_insert_only:
            self._check_insert(kind, row)
        pre = state.get(key, now)
        if c.unavailable_value is not None and is_accumulate(kind):
            row = fill_unavailable(row, pre, self._unavailable)
        if not is_accumulate(kind):
            if pre is None:
                if key not in self._folded:
                    self.stale(lambda: f"{RowKind(kind).short} ({shown_row(row)}) found no row for key {key!r}")
                return
            state.delete(key)
            out.emit(DELETE, pre)
            return
        state.put(key, row, now)
        if pre is not None and c.state_ttl_ms == 0 and pre == row:
            return
        if pre is None and not c.input_insert_only:
            out.emit(INSERT, row)
            return
        self._emit_update(pre, row, out)

    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        keys = self.config.keys
        for kind, row in batch:
            self._one(project(row, keys), kind, row, now, out)

    # -- mini-batch ------------------------------------------------------------------------------
    def process(self, batch, *, now: int = 0) -> Changes:
        """As :meth:`Kernel.process`; an Arrow batch in proctime mini-batch mode takes the
        vectorised path: each full bundle is folded to one row per key with Arrow, and only the
        surviving rows are converted to Python and compared with the state."""
        if (isinstance(batch, (pa.Table, pa.RecordBatch)) and self.mini_batch is not None
                and self.config.order == "proctime" and not len(self.mini_batch)
                and not holds_value(batch, self._unavailable)):
            return self._process_arrow_bundles(batch, now, self._fold_arrow)
        return super().process(batch, now=now)

    def _fold_arrow(self, bundle: pa.Table, now: int, out: Changes) -> None:
        names = user_columns(bundle)
        keys = [names[i] for i in self.config.keys]
        positions = bundle.select(keys).append_column("pos", pa.array(np.arange(bundle.num_rows)))
        per_key = positions.group_by(keys, use_threads=False).aggregate([("pos", "min"), ("pos", "max")])
        arrival = pc.sort_indices(per_key["pos_min"])
        survivor = per_key["pos_max" if self.config.keep == "last" else "pos_min"]
        folded = pc.take(pc.not_equal(per_key["pos_min"], per_key["pos_max"]), arrival).to_pylist()
        for (kind, row), more in zip(Changes.from_arrow(bundle.take(pc.take(survivor, arrival))), folded):
            key = project(row, self.config.keys)
            self._folded = {key} if more else _NONE
            self._one(key, kind, row, now, out)
        self._folded = _NONE

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        c = self.config
        keys = c.keys
        if c.order == "rowtime" and not c.compact_changes:
            per_key: dict[tuple, list[tuple]] = {}
            for _, kind, row in bundle:
                per_key.setdefault(project(row, keys), []).append((kind, row))
            for key, rows in per_key.items():
                for kind, row in rows:
                    self._one(key, kind, row, now, out)
            return
        survivors: dict[tuple, tuple] = {}
        seen: set[tuple] = set()
        for _, kind, row in bundle:
            key = project(row, keys)
            if key in survivors:
                seen.add(key)
            if c.order == "rowtime":
                self._check_insert(kind, row)
                held = survivors.get(key)
                if held is None or self._wins(held[1], row):
                    survivors[key] = (kind, row)
            elif c.keep == "first":
                survivors.setdefault(key, (kind, row))
            else:
                held = survivors.get(key)
                if self._unavailable and held is not None and is_accumulate(kind) and is_accumulate(held[0]):
                    row = fill_unavailable(row, held[1], self._unavailable)
                survivors[key] = (kind, row)
        self._folded = seen
        try:
            for key, (kind, row) in survivors.items():
                self._one(key, kind, row, now, out)
        finally:
            self._folded = _NONE


#: no key folded (the row-at-a-time path)
_NONE: frozenset = frozenset()


def fill_unavailable(row: tuple, pre: tuple | None, placeholder: tuple) -> tuple:
    """``row`` with each value equal to the placeholder (text or bytes) replaced by ``pre``'s value
    (None without ``pre``)."""
    if not any(v in placeholder for v in row if isinstance(v, (str, bytes))):
        return row
    return tuple((None if pre is None else pre[i]) if isinstance(v, (str, bytes)) and v in placeholder else v
                 for i, v in enumerate(row))


def holds_value(batch: pa.Table | pa.RecordBatch, placeholder: tuple) -> bool:
    """Whether a text or bytes column of ``batch`` holds the placeholder."""
    if not placeholder:
        return False
    for name in user_columns(batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])):
        col = batch.column(name)
        t = col.type
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            needle = pa.scalar(placeholder[0], t)
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            needle = pa.scalar(placeholder[1], t)
        else:
            continue
        if pc.any(pc.equal(col, needle)).as_py():
            return True
    return False
