"""StreamingJoin: regular (unbounded) two-input joins with retraction.

Mirrors Flink's ``StreamingJoinOperator`` (inner, left, right, full) and
``StreamingSemiAntiJoinOperator`` (semi, anti). Each side keeps its rows in a
:class:`~changelake.operators.join_state.JoinRecordView` (three layouts); an outer
side also keeps per row the number of rows of the other side it joins with.

Emission rules for one input row ``r`` (``M`` = matching rows of the other side,
``a(o)`` = association count of other-side row ``o``; "outer join" = either side outer)::

    r is +I/+U
      r's side outer, M empty       -> +I [r + nulls]; store r with assoc 0
      r's side outer, M non-empty   -> for o in M: (other side outer and a(o) == 0: -D [nulls + o]);
                                       a(o) += 1; +I [r + o].  Store r with assoc |M|
      r's side inner                -> store r; for o in M: as above if the other side is outer,
                                       else emit [r + o] with r's own kind (+I or +U)
    r is -U/-D
      remove r from its side (nothing to remove: stale retraction, counted; output as below anyway)
      M empty                       -> r's side outer: -D [r + nulls]
      M non-empty                   -> for o in M: -D [r + o] (outer join) or r's kind (inner join);
                                       other side outer: a(o) == 1 -> +I [nulls + o]; a(o) -= 1

Semi / anti join (output = left rows only; ``n`` = number of matching right rows)::

    left  +I/+U: semi emits r if n > 0, anti if n == 0 (r's kind); store r with assoc n
    left  -U/-D: same condition, emits r with its kind; remove r
    right +I/+U: store; for each matching left row l: a(l) 0 -> 1: semi +I l, anti -D l; a(l) += 1
    right -U/-D: remove; for each matching left row l: a(l) 1 -> 0: semi -D l, anti +I l; a(l) -= 1

A ``+U`` without a preceding ``-U`` is treated as one more row (Flink does the same):
the joined row it replaces is not retracted. Outer joins always emit +I/-D, never
-U/+U (as Flink: both are equivalent for a join, FLINK-17337).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa

from changelake.changelog import KIND, RowKind
from changelake.errors import ConfigError, StateError
from changelake.log_values import shown_row
from changelake.operators import _join_bundle as columnar
from changelake.operators import _join_columnar
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel, MiniBatchBuffer
from changelake.operators._rows import (
    DELETE,
    INSERT,
    UPDATE_AFTER,
    Changes,
    coerce,
    is_accumulate,
    project,
)
from changelake.operators._state import (
    StaleRetractionPolicy,
    StaleRetractions,
    check_ttl,
)
from changelake.operators.join_state import InputSpec, JoinRecordView

JoinType = Literal["INNER", "LEFT", "RIGHT", "FULL", "SEMI", "ANTI"]
JOIN_TYPES = ("INNER", "LEFT", "RIGHT", "FULL", "SEMI", "ANTI")

#: join key -> that side's rows (see join_state)
STATE_LEFT_RECORDS = "join-left-records"
STATE_RIGHT_RECORDS = "join-right-records"


@dataclass(frozen=True)
class StreamingJoinConfig:
    join_type: JoinType
    left_key: tuple[int, ...]
    right_key: tuple[int, ...]
    left_arity: int
    right_arity: int
    left_input: InputSpec = field(default_factory=InputSpec)
    right_input: InputSpec = field(default_factory=InputSpec)
    #: extra (non-equi) condition on (left row, right row); None = TRUE
    condition: Callable[[tuple, tuple], bool] | None = None
    #: per key column: True = a NULL key never matches (SQL '='), False = NULL matches NULL (IS NOT DISTINCT FROM)
    filter_null_keys: tuple[bool, ...] | None = None
    left_state_ttl_ms: int = 0
    right_state_ttl_ms: int = 0
    mini_batch_size: int | None = None
    on_stale_retraction: StaleRetractionPolicy = "warn"
    #: the inputs' user columns (the planner gives them): with them an inner equi-join of two keyed inputs
    #: keeps its state in Arrow columns (``_join_columnar``). Not in the repr: the plan's fingerprints
    #: (``plan.fingerprint``) stay those of the plans before
    left_schema: pa.Schema | None = field(default=None, repr=False)
    right_schema: pa.Schema | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.join_type not in JOIN_TYPES:
            raise ConfigError(f"join_type must be one of {JOIN_TYPES}, got {self.join_type!r}")
        if len(self.left_key) != len(self.right_key) or not self.left_key:
            raise ConfigError("left_key and right_key must name the same, non-zero number of columns")
        if self.filter_null_keys is not None and len(self.filter_null_keys) not in (1, len(self.left_key)):
            raise ConfigError("filter_null_keys needs one flag per key column (or one for all)")
        check_ttl("StreamingJoin left", self.left_state_ttl_ms)
        check_ttl("StreamingJoin right", self.right_state_ttl_ms)

    @property
    def left_outer(self) -> bool:
        return self.join_type in ("LEFT", "FULL")

    @property
    def right_outer(self) -> bool:
        return self.join_type in ("RIGHT", "FULL")


class _JoinBase(Kernel):
    def __init__(self, config: StreamingJoinConfig) -> None:
        super().__init__()
        self.config = config
        self.left = JoinRecordView(STATE_LEFT_RECORDS, config.left_input, config.left_state_ttl_ms)
        self.right = JoinRecordView(STATE_RIGHT_RECORDS, config.right_input, config.right_state_ttl_ms)
        self._register(self.left.store)
        self._register(self.right.store)
        self.stale = StaleRetractions(self.OPERATOR, config.on_stale_retraction, self.figures)
        flags = config.filter_null_keys or (True,)
        self._null_filter = flags * len(config.left_key) if len(flags) == 1 else flags
        if config.mini_batch_size is not None:
            self.mini_batch = MiniBatchBuffer(config.mini_batch_size)

    def process(self, batch, *, side: Literal["left", "right"], now: int = 0) -> Changes:
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        batch = coerce(batch)
        out = Changes()
        if self.mini_batch is None:
            for kind, row in batch:
                self._element(kind, row, side == "left", now, out)
        else:
            for bundle in self.mini_batch.feed(side, batch):
                self._process_bundle(bundle, now, out)
        return out

    def expire(self, *, now: int) -> int:
        return self.left.expire(now) + self.right.expire(now)

    @property
    def state_rows(self) -> int:
        return len(self.left) + len(self.right)

    def _key(self, row: tuple, is_left: bool) -> tuple:
        return project(row, self.config.left_key if is_left else self.config.right_key)

    def _matches(self, row: tuple, jk: tuple, is_left: bool, now: int) -> list[tuple[tuple, int]]:
        if any(v is None and f for v, f in zip(jk, self._null_filter)):
            return []
        other = self.right if is_left else self.left
        found = other.records(jk, now)
        cond = self.config.condition
        if cond is None:
            return found
        return [(o, a) for o, a in found if (cond(row, o) if is_left else cond(o, row))]

    def _stale(self, kind: int, row: tuple, is_left: bool, jk: tuple) -> None:
        self.stale(lambda: f"{RowKind(kind).short} ({shown_row(row)}) on the {'left' if is_left else 'right'} input "
                           f"found no stored row to retract for join key {jk!r}")

    def _element(self, kind: int, row: tuple, is_left: bool, now: int, out: Changes) -> None:
        raise NotImplementedError


class StreamingJoin(_JoinBase):
    """Inner, left, right and full outer join.

    With a mini-batch, each bundle is folded columnar (``_join_bundle``: the same surviving records in
    the same order as :func:`fold_bundle`), and an inner join without an extra condition runs the
    surviving records with its matches looked up once per join key; its output is exactly that of
    :class:`RowByRowStreamingJoin`, the reference (same records, same order, same state).
    """

    OPERATOR = "StreamingJoin"
    #: False: every bundle row by row (the reference)
    COLUMNAR = True

    def __init__(self, config: StreamingJoinConfig) -> None:
        if config.join_type in ("SEMI", "ANTI"):
            raise ConfigError("semi and anti joins are StreamingSemiAntiJoin, not StreamingJoin")
        super().__init__(config)
        self._left_nulls = (None,) * config.left_arity
        self._right_nulls = (None,) * config.right_arity
        #: columnar bundles (_join_bundle): pending Arrow/tuple segments not yet in ``mini_batch``'s row buffer
        self._columnar = self.COLUMNAR and config.mini_batch_size is not None
        self._segments: list[columnar.Segment] = []
        self._segment_rows = 0
        self._fold_columns = {side: columnar.key_columns(key + (spec.unique_key or ()))
                              for side, key, spec in (("left", config.left_key, config.left_input),
                                                      ("right", config.right_key, config.right_input))}
        #: both sides' rows in Arrow columns (``_join_columnar``) while this join is one it computes and
        #: nothing has needed the dict state (``left``/``right``, empty meanwhile); None: the dict state
        self._fits = self._columnar and _join_columnar.fits(config)
        self._cols = _join_columnar.ColumnarSides(config) if self._fits else None

    def contract(self) -> cm.ChangelogContract:
        jt = self.config.join_type
        if jt == "INNER":
            produces = cm.ALL
        elif jt == "FULL":
            produces = cm.ChangelogMode.of(RowKind.INSERT, RowKind.DELETE)
        else:  # a retraction on the inner side keeps its kind (-U), as in Flink
            produces = cm.ChangelogMode.of(RowKind.INSERT, RowKind.UPDATE_BEFORE, RowKind.DELETE)
        return cm.ChangelogContract(produces=produces, accepts=cm.ALL, needs_update_before=True)

    def _joined(self, row: tuple, other: tuple, is_left: bool) -> tuple:
        return row + other if is_left else other + row

    def _padded(self, row: tuple, row_is_left: bool) -> tuple:
        return row + self._right_nulls if row_is_left else self._left_nulls + row

    def _element(self, kind: int, row: tuple, is_left: bool, now: int, out: Changes,
                 suppress: bool = False) -> None:
        """One input row. ``suppress``: half of a folded -U/+U pair of one unique key in a mini-batch
        bundle; the pair leaves the row's state and the null-padded rows of the other side as they
        were, so neither the state retraction nor the padding changes are applied/emitted."""
        c = self.config
        mine, other = (self.left, self.right) if is_left else (self.right, self.left)
        my_outer, other_outer = (c.left_outer, c.right_outer) if is_left else (c.right_outer, c.left_outer)
        jk = self._key(row, is_left)
        matches = self._matches(row, jk, is_left, now)
        if is_accumulate(kind):
            if my_outer and not matches:
                out.emit(INSERT, self._padded(row, is_left))
            if other_outer:
                for o, a in matches:
                    if a == 0 and not suppress:
                        out.emit(DELETE, self._padded(o, not is_left))
                    other.update_assoc(jk, o, a + 1, now)
            out_kind = INSERT if (my_outer or other_outer) else kind
            for o, _ in matches:
                out.emit(out_kind, self._joined(row, o, is_left))
            mine.add(jk, row, now, len(matches) if my_outer else 0)
            return
        if not suppress and not mine.retract(jk, row, now):
            self._stale(kind, row, is_left, jk)
        if not matches:
            if my_outer:
                out.emit(DELETE, self._padded(row, is_left))
            return
        out_kind = DELETE if my_outer else kind
        for o, _ in matches:
            out.emit(out_kind, self._joined(row, o, is_left))
        if other_outer:
            for o, a in matches:
                if a == 1 and not suppress:
                    out.emit(INSERT, self._padded(o, not is_left))
                other.update_assoc(jk, o, a - 1, now)

    # -- mini-batch, columnar ----------------------------------------------------------------------
    def process(self, batch, *, side: Literal["left", "right"], now: int = 0) -> Changes:
        if side not in ("left", "right"):
            raise ValueError(f"side must be 'left' or 'right', got {side!r}")
        if not self._columnar or len(self.mini_batch):      # rows restored into the row buffer: row by row
            self._leave_columns()
            return super().process(batch, side=side, now=now)
        segment = columnar.segment_of(side, batch, self._fold_columns[side])
        if segment is None:                                  # a key the fold cannot compare exactly
            self._leave_columns()
            self._rows_to_buffer()
            return super().process(batch, side=side, now=now)
        self._back_to_columns()
        out = Changes()
        size, start = self.mini_batch.size, 0
        while start < len(segment):
            take = min(size - self._segment_rows, len(segment) - start)
            self._segments.append(segment.slice(start, start + take))
            self._segment_rows += take
            start += take
            if self._segment_rows >= size:
                self._fire(now, out)
        return out

    def flush(self, *, now: int = 0) -> Changes:
        if not self._segments:
            if len(self.mini_batch or ()):
                self._leave_columns()
            out = super().flush(now=now)
            self._back_to_columns()
            return out
        out = Changes()
        self._fire(now, out)
        return out

    def _all_stores(self):
        self._leave_columns()
        self._rows_to_buffer()
        return super()._all_stores()

    # -- the state in Arrow columns (_join_columnar) ----------------------------------------------------
    @property
    def state_rows(self) -> int:
        return super().state_rows + (len(self._cols) if self._cols is not None else 0)

    def snapshot(self) -> bytes:
        if self._cols is not None and not self._segments and not len(self.mini_batch):
            return self._cols.snapshot(self.OPERATOR)
        return super().snapshot()

    @classmethod
    def restore(cls, config: StreamingJoinConfig, data: bytes) -> StreamingJoin:
        """Either snapshot format: the dict state's (``"1"``) or the columns' (``_join_columnar.FORMAT``);
        the kernel goes on in the state form its config calls for."""
        table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if meta.get("format") != _join_columnar.FORMAT:
            op = super().restore(config, data)
            if op._fits and not len(op.mini_batch):
                op._enter_columns()
            return op
        if meta.get("operator") != cls.OPERATOR:
            raise StateError(f"snapshot belongs to operator {meta.get('operator')!r}, not {cls.OPERATOR!r}; "
                             "restore it into the operator that wrote it")
        op = cls(config)
        cols = _join_columnar.ColumnarSides.restore(config, table)
        if op._cols is not None:
            op._cols = cols
        else:
            op._cols = cols
            op._leave_columns()
        return op

    def _enter_columns(self) -> None:
        """Move the dict state (both sides, in their order) into columns."""
        cols = _join_columnar.ColumnarSides(self.config)
        for side, view in (("left", self.left), ("right", self.right)):
            cols.load_rows(side, [e[0] for entries in view.store.values() for e in entries.values()])
            view.store.clear()
        self._cols = cols

    def _back_to_columns(self) -> None:
        """Into columns again once the rows held row by row are through (none pending)."""
        if self._cols is None and self._fits and not self._segments and not len(self.mini_batch):
            self._enter_columns()

    def _leave_columns(self) -> None:
        """Move the columns' rows into the dict state (in their order): the kernel goes on there."""
        cols, self._cols = self._cols, None
        if cols is None:
            return
        for side, view, key in (("left", self.left, self.config.left_key), ("right", self.right, self.config.right_key)):
            for row in cols.rows_in_order(side):
                view.add(project(row, key), row, 0)

    def _columns_side(self, segments: list, is_left: bool, out: Changes) -> bool:
        """One side of a bundle in columns; False (nothing done) when its rows do not fit them."""
        side = "left" if is_left else "right"
        c, cols = self.config, self._cols
        spec, key = (c.left_input, c.left_key) if is_left else (c.right_input, c.right_key)
        try:
            segment = columnar.concat(segments)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return False
        if segment is None:
            return True
        if segment.table is not None:
            table = cols.conform(side, segment.table.drop_columns([KIND]))
        else:
            try:
                table = cols.conform(side, Changes(segment.kinds.tolist(), segment.rows).to_arrow(
                    cols.schemas[side]).drop_columns([KIND]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError, ValueError):
                table = None
        if table is None:
            return False
        columns = self._fold_columns[side]
        join = [columns.index(k) for k in key]
        join_ids = columnar.key_ids(segment.keys, join)
        unique_ids = (join_ids if spec.layout == "join_key_contains_unique_key"
                      else columnar.key_ids(segment.keys, join + [columns.index(k) for k in spec.unique_key]))
        positions, paired = columnar.fold_unique(segment.kinds, unique_ids, join_ids)
        joined = cols.run(side, segment.kinds[positions], table.take(pa.array(positions)), paired,
                          lambda kind, row, jk: self._stale(kind, row, is_left, jk))
        if joined is not None:
            out.add_arrow(joined)
        return True

    def _rows_to_buffer(self) -> None:
        """Move the pending segments into the row buffer (in order): the rows continue row by row."""
        for segment in self._segments:
            rows = segment.rows if segment.rows is not None else Changes.from_arrow(segment.table).rows
            self.mini_batch._pending.extend(zip([segment.side] * len(rows), segment.kinds.tolist(), rows))
        self._segments, self._segment_rows = [], 0

    def _fire(self, now: int, out: Changes) -> None:
        segments, self._segments, self._segment_rows = self._segments, [], 0
        # Process the inner side first, so that fewer null-padded rows are emitted and retracted.
        for side in (("left", "right") if self.config.join_type == "RIGHT" else ("right", "left")):
            mine = [s for s in segments if s.side == side]
            if mine:
                self._run_side(mine, side == "left", now, out)

    def _run_side(self, segments: list, is_left: bool, now: int, out: Changes) -> None:
        """One side of a bundle: fold, then the surviving records in order."""
        if self._cols is not None:
            if self._columns_side(segments, is_left, out):
                return
            self._leave_columns()
        c = self.config
        spec, key = (c.left_input, c.left_key) if is_left else (c.right_input, c.right_key)
        records = None
        try:
            segment = columnar.concat(segments)
        except (pa.ArrowInvalid, pa.ArrowTypeError):        # tuple rows whose key values changed type
            segment = None
        if segment is None or spec.layout == "no_unique_key":
            rows = [(k, r) for s in segments
                    for k, r in zip(s.kinds.tolist(), s.rows if s.rows is not None else Changes.from_arrow(s.table).rows)]
            records = [(kind, row, _paired(group)) for group in fold_bundle(spec, rows, key) for kind, row in group]
        else:
            columns = self._fold_columns["left" if is_left else "right"]
            join = [columns.index(k) for k in key]
            join_ids = columnar.key_ids(segment.keys, join)
            unique_ids = (join_ids if spec.layout == "join_key_contains_unique_key"
                          else columnar.key_ids(segment.keys, join + [columns.index(k) for k in spec.unique_key]))
            positions, paired = columnar.fold_unique(segment.kinds, unique_ids, join_ids)
            records = zip(segment.kinds[positions].tolist(), segment.take_rows(positions), paired.tolist())
        if c.join_type == "INNER" and c.condition is None:
            self._inner_records(records, is_left, now, out)
        else:
            for kind, row, suppress in records:
                self._element(kind, row, is_left, now, out, suppress)

    def _inner_records(self, records, is_left: bool, now: int, out: Changes) -> None:
        """``_element`` for an inner equi-join over one side's folded records: the other side's state
        does not change while this side runs (no association counts), so each join key's matches are
        looked up once."""
        mine, other = (self.left, self.right) if is_left else (self.right, self.left)
        key = self.config.left_key if is_left else self.config.right_key
        if mine.unique_rows and other.unique_rows:
            self._inner_unique(records, mine, other, key, is_left, now, out)
            return
        null_filter = self._null_filter
        matches_of: dict[tuple, list[tuple]] = {}
        kinds, rows = out.kinds, out.rows
        for kind, row, suppress in records:
            jk = tuple([row[i] for i in key])
            matches = matches_of.get(jk)
            if matches is None:
                matches = ([] if None in jk and any(v is None and f for v, f in zip(jk, null_filter))
                           else [o for o, _ in other.records(jk, now)])
                matches_of[jk] = matches
            if kind == INSERT or kind == UPDATE_AFTER:
                mine.add(jk, row, now, 0)
            elif not suppress and not mine.retract(jk, row, now):
                self._stale(kind, row, is_left, jk)
            if matches:
                kinds.extend([kind] * len(matches))
                rows.extend([row + o for o in matches] if is_left else [o + row for o in matches])

    def _inner_unique(self, records, mine: JoinRecordView, other: JoinRecordView, key: tuple[int, ...],
                      is_left: bool, now: int, out: Changes) -> None:
        """:meth:`_inner_records` where both sides keep one row per unique key without a TTL (every table
        with a primary key): the same records, output and state, with the state's dicts read directly."""
        null_filter = self._null_filter
        mine_rows, other_rows = mine.store.rows(), other.store.rows()
        touch = mine.store.touch
        entry_key = mine.entry_key
        stale = self._stale
        matches_of: dict[tuple, list[tuple]] = {}
        kinds, rows = out.kinds, out.rows
        single = key[0] if len(key) == 1 else None
        for kind, row, suppress in records:
            jk = (row[single],) if single is not None else tuple([row[i] for i in key])
            matches = matches_of.get(jk)
            if matches is None:
                if None in jk and any(v is None and f for v, f in zip(jk, null_filter)):
                    matches = []
                else:
                    found = other_rows.get(jk)
                    matches = [e[0] for e in found[0].values()] if found is not None else []
                matches_of[jk] = matches
            ek = entry_key(row)
            if kind == INSERT or kind == UPDATE_AFTER:
                held = mine_rows.get(jk)
                if held is None:
                    mine_rows[jk] = [{ek: [row, 1, 0, now]}, now]
                else:
                    held[0][ek] = [row, 1, 0, now]
                touch(jk)
            elif not suppress:
                held = mine_rows.get(jk)
                entries = held[0] if held is not None else None
                if not entries or entries.pop(ek, None) is None:
                    stale(kind, row, is_left, jk)
                else:
                    if not entries:
                        del mine_rows[jk]
                    touch(jk)
            if matches:
                kinds.extend([kind] * len(matches))
                rows.extend([row + o for o in matches] if is_left else [o + row for o in matches])

    # -- mini-batch ------------------------------------------------------------------------------
    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        folded = {side: fold_bundle(spec, [(k, r) for tag, k, r in bundle if tag == side],
                                    self.config.left_key if side == "left" else self.config.right_key)
                  for side, spec in (("left", self.config.left_input), ("right", self.config.right_input))}
        # Process the inner side first, so that fewer null-padded rows are emitted and retracted.
        order = ("left", "right") if self.config.join_type == "RIGHT" else ("right", "left")
        for side in order:
            for group in folded[side]:
                suppress = _paired(group)
                for kind, row in group:
                    self._element(kind, row, side == "left", now, out, suppress)


class RowByRowStreamingJoin(StreamingJoin):
    """The reference: every mini-batch bundle folded and run row by row (:func:`fold_bundle`, ``_element``).
    Same operator name and state as :class:`StreamingJoin`: either restores the other's snapshot."""

    COLUMNAR = False


def _paired(group: list) -> bool:
    """A folded ``[-X, +Y]`` pair of one unique key (see ``StreamingJoin._element``'s ``suppress``)."""
    return len(group) == 2 and not is_accumulate(group[0][0]) and is_accumulate(group[1][0])


def fold_bundle(spec: InputSpec, records: list[tuple[int, tuple]], key: tuple[int, ...]) -> list[list]:
    """Fold one side of a mini-batch bundle; returns groups of ``(kind, row)`` in processing order.

    With a unique key (``join_key_contains_unique_key`` / ``has_unique_key``) each unique key keeps
    at most its last retraction and its last accumulation (``[-X, +Y]``); an accumulation followed
    by a retraction cancels out. Without one, a retraction cancels the latest earlier accumulation
    of an identical row (and vice versa); every surviving row is its own group.
    Groups come in the order their join key (then unique key) first arrived.
    """
    if spec.layout == "no_unique_key":
        per_key: dict[tuple, list[tuple[int, tuple]]] = {}
        for kind, row in records:
            pending = per_key.setdefault(project(row, key), [])
            for i in range(len(pending) - 1, -1, -1):
                k, r = pending[i]
                if is_accumulate(k) != is_accumulate(kind) and r == row:
                    del pending[i]
                    break
            else:
                pending.append((kind, row))
        return [[rec] for pending in per_key.values() for rec in pending]
    by_unique: dict[tuple, list[tuple[int, tuple]]] = {}
    for kind, row in records:
        uk = project(row, key) + (() if spec.layout == "join_key_contains_unique_key"
                                  else ("|",) + project(row, spec.unique_key))
        group = by_unique.setdefault(uk, [])
        if group and is_accumulate(group[-1][0]):
            group.pop()
            if not is_accumulate(kind):
                continue
        elif group and not is_accumulate(kind):
            group.pop()
        group.append((kind, row))
    order: dict[tuple, list[list]] = {}
    for uk, group in by_unique.items():
        if group:
            order.setdefault(project(group[0][1], key), []).append(group)
    return [g for groups in order.values() for g in groups]


class StreamingSemiAntiJoin(_JoinBase):
    """Left semi join (``EXISTS``) and left anti join (``NOT EXISTS``); emits left rows only."""

    OPERATOR = "StreamingSemiAntiJoin"

    def __init__(self, config: StreamingJoinConfig) -> None:
        if config.join_type not in ("SEMI", "ANTI"):
            raise ConfigError(f"StreamingSemiAntiJoin handles SEMI and ANTI, not {config.join_type}")
        super().__init__(config)
        self._anti = config.join_type == "ANTI"

    def contract(self) -> cm.ChangelogContract:
        return cm.ChangelogContract(produces=cm.ALL, accepts=cm.ALL, needs_update_before=True)

    def _element(self, kind: int, row: tuple, is_left: bool, now: int, out: Changes) -> None:
        jk = self._key(row, is_left)
        matches = self._matches(row, jk, is_left, now)
        if is_left:
            if (not matches) == self._anti:
                out.emit(kind, row)
            if is_accumulate(kind):
                self.left.add(jk, row, now, len(matches))
            elif not self.left.retract(jk, row, now):
                self._stale(kind, row, is_left, jk)
            return
        if is_accumulate(kind):
            self.right.add(jk, row, now)
            for left_row, a in matches:
                if a == 0:
                    out.emit(DELETE if self._anti else INSERT, left_row)
                self.left.update_assoc(jk, left_row, a + 1, now)
            return
        if not self.right.retract(jk, row, now):
            self._stale(kind, row, is_left, jk)
        for left_row, a in matches:
            if a == 1:
                out.emit(INSERT if self._anti else DELETE, left_row)
            self.left.update_assoc(jk, left_row, a - 1, now)
