"""The inner equi-join of two keyed inputs with both sides' rows held in Arrow columns.

:class:`~changelake.operators.streaming_join.StreamingJoin` keeps each side's rows in Python dicts
(``join_state``): every micro-batch of a Spark bucket unpickles them, runs the folded records one by
one, pickles the changed ones and turns the joined row tuples back into Arrow. For the join every
table with a primary key makes (inner, no extra condition, a unique key on both sides, no TTL, keys of
exactly comparable types) this module does the same work in columns, with the same result:

* a side's state is one Arrow table of its rows plus ``ords``, each row's insertion number; a join
  key's matches are its rows in ``ords`` order, the order the dict state lists them in (a row replaced
  by one with the same unique key keeps its number, as a dict entry keeps its place);
* one side's folded records (``_join_bundle.fold_unique``) are matched against the other side's state
  by integer key ids (``_join_bundle.key_ids`` over both, so equal keys get equal ids, NULL = NULL) and
  ``numpy.searchsorted``: the output is every record in order, each followed by its matches in order,
  taken from both tables in columns;
* the side's own state then drops the rows its retractions name (a retraction that finds none is
  stale, counted and logged by the caller), and takes each accumulation as a replacement (same unique
  key: its number kept) or a new row (the next number).

The right side runs first, then the left against the right's new state, as the dict path does. The
snapshot is the two tables in one Arrow IPC stream (:data:`FORMAT`): no pickling, no per-row objects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from changelake.errors import StateError
from changelake.ipc import stream_bytes
from changelake.operators._join_bundle import _exact_type, key_ids
from changelake.operators._rows import INSERT, UPDATE_AFTER, Changes
from changelake.operators._state import SNAPSHOT_COMPRESS_FROM

#: ``format`` of a snapshot written by :meth:`ColumnarSides.snapshot` (the dict state's is ``"1"``)
FORMAT = "2-columnar"
SIDE, ORD = "_side", "_ord"
_SIDES = ("left", "right")


def nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema])


def fits(config) -> bool:
    """Whether ``config`` (a ``StreamingJoinConfig``) is a join this module computes."""
    c = config
    if (c.join_type != "INNER" or c.condition is not None or c.mini_batch_size is None
            or c.left_schema is None or c.right_schema is None
            or c.left_state_ttl_ms > 0 or c.right_state_ttl_ms > 0):
        return False
    if [c.left_schema.field(i).type for i in c.left_key] != [c.right_schema.field(i).type for i in c.right_key]:
        return False
    for spec, key, schema in ((c.left_input, c.left_key, c.left_schema), (c.right_input, c.right_key, c.right_schema)):
        if spec.layout == "no_unique_key" or len(schema) == 0:
            return False
        if not all(_exact_type(schema.field(i).type) for i in (*key, *spec.unique_key)):
            return False
    return True


class ColumnarSides:
    """Both sides' rows as Arrow tables (see the module docstring)."""

    def __init__(self, config, schemas: Sequence[pa.Schema] | None = None) -> None:
        c = config
        left, right = schemas if schemas is not None else (c.left_schema, c.right_schema)
        self.schemas = {"left": nullable(left), "right": nullable(right)}
        self.keys = {"left": list(c.left_key), "right": list(c.right_key)}
        self.identity = {side: list(dict.fromkeys(key + (spec.unique_key if spec.layout == "has_unique_key" else ())))
                         for side, key, spec in (("left", c.left_key, c.left_input),
                                                 ("right", c.right_key, c.right_input))}
        flags = c.filter_null_keys or (True,)
        self.null_filter = flags * len(c.left_key) if len(flags) == 1 else flags
        self.tables = {side: self.schemas[side].empty_table() for side in _SIDES}
        self.ords = {side: np.zeros(0, dtype=np.int64) for side in _SIDES}
        self.next_ord = 0

    def __len__(self) -> int:
        return self.tables["left"].num_rows + self.tables["right"].num_rows

    # -- one side's folded records ------------------------------------------------------------------
    def conform(self, side: str, table: pa.Table) -> pa.Table | None:
        """``table``'s user columns in the side's state schema (None: they do not convert)."""
        schema = self.schemas[side]
        if table.num_columns != len(schema):
            return None
        if table.schema == schema:
            return table
        try:
            return table.rename_columns(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            return None

    def run(self, side: str, kinds: np.ndarray, rows: pa.Table, paired: np.ndarray,
            stale: Callable[[int, tuple, tuple], None]) -> pa.Table | None:
        """One side's folded records (``kinds``, ``rows`` in the state schema, ``paired``: half of an
        ``[R, A]`` pair) against the other side's state, then into this side's. Returns the joined output
        (left columns, right columns, ``_kind``), or None for none. ``stale(kind, row, join key)`` is
        called for each retraction that finds no row to retract."""
        other = "right" if side == "left" else "left"
        out = self._matches(side, other, kinds, rows)
        self._apply(side, kinds, rows, paired, stale)
        return out

    def _matches(self, side: str, other: str, kinds: np.ndarray, rows: pa.Table) -> pa.Table | None:
        state = self.tables[other]
        n = rows.num_rows
        if n == 0 or state.num_rows == 0:
            return None
        ids = _joint_ids(state, self.keys[other], rows, self.keys[side])
        state_ids, record_ids = ids[:state.num_rows], ids[state.num_rows:]
        order = np.lexsort((self.ords[other], state_ids))
        sorted_ids = state_ids[order]
        lo = np.searchsorted(sorted_ids, record_ids, side="left")
        counts = np.searchsorted(sorted_ids, record_ids, side="right") - lo
        for column, filtered in zip(self.keys[side], self.null_filter):
            if filtered and rows.column(column).null_count:
                counts[rows.column(column).is_null().to_numpy(zero_copy_only=False)] = 0
        total = int(counts.sum())
        if total == 0:
            return None
        record = np.repeat(np.arange(n, dtype=np.int64), counts)
        first = np.repeat(lo, counts)
        within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        match = order[first + within]
        mine = rows.take(pa.array(record))
        theirs = state.take(pa.array(match))
        left, right = (mine, theirs) if side == "left" else (theirs, mine)
        columns = [*left.columns, *right.columns, pa.array(kinds[record], type=pa.int8())]
        return pa.Table.from_arrays(columns, names=[f"c{i}" for i in range(len(columns) - 1)] + ["_kind"])

    def _apply(self, side: str, kinds: np.ndarray, rows: pa.Table, paired: np.ndarray,
               stale: Callable[[int, tuple, tuple], None]) -> None:
        state, ords = self.tables[side], self.ords[side]
        n = rows.num_rows
        if n == 0:
            return
        accumulate = (kinds == INSERT) | (kinds == UPDATE_AFTER)
        if state.num_rows:
            ids = _joint_ids(state, self.identity[side], rows, self.identity[side])
            state_ids, record_ids = ids[:state.num_rows], ids[state.num_rows:]
            order = np.argsort(state_ids, kind="stable")
            sorted_ids = state_ids[order]
            at = np.minimum(np.searchsorted(sorted_ids, record_ids), len(sorted_ids) - 1)
            found = sorted_ids[at] == record_ids
            held = order[at]                                   # the state row a found record names
        else:
            found = np.zeros(n, dtype=bool)
            held = np.zeros(n, dtype=np.int64)
        retract = ~accumulate & ~paired
        gone = held[(retract | accumulate) & found]
        for i in np.flatnonzero(retract & ~found).tolist():
            row = Changes.from_arrow(rows.slice(i, 1).append_column("_kind", pa.array([kinds[i]], pa.int8()))).rows[0]
            stale(int(kinds[i]), row, tuple(row[k] for k in self.keys[side]))
        added = np.flatnonzero(accumulate)
        if not len(gone) and not len(added):
            return
        new_ords = np.empty(len(added), dtype=np.int64)
        replaced = found[added]
        new_ords[replaced] = ords[held[added[replaced]]]
        fresh = int((~replaced).sum())
        new_ords[~replaced] = np.arange(self.next_ord, self.next_ord + fresh, dtype=np.int64)
        self.next_ord += fresh
        if len(gone):
            keep = np.ones(state.num_rows, dtype=bool)
            keep[gone] = False
            state, ords = state.filter(pa.array(keep)), ords[keep]
        if len(added):
            state = pa.concat_tables([state, rows.take(pa.array(added))])
            ords = np.concatenate([ords, new_ords])
        if state.num_columns and state.column(0).num_chunks > 8:
            state = state.combine_chunks()
        self.tables[side], self.ords[side] = state, ords

    # -- conversions ------------------------------------------------------------------------------------
    def rows_in_order(self, side: str) -> list[tuple]:
        """The side's rows as tuples (as ``Changes.from_arrow`` reads them), in insertion order."""
        table = self.tables[side]
        if not table.num_rows:
            return []
        ordered = table.take(pa.array(np.argsort(self.ords[side], kind="stable")))
        return Changes.from_arrow(ordered.append_column("_kind", pa.array(np.zeros(table.num_rows, np.int8)))).rows

    def load_rows(self, side: str, rows: list[tuple]) -> None:
        """Replace the side's state with ``rows`` (tuples, in insertion order)."""
        if not rows:
            self.tables[side] = self.schemas[side].empty_table()
            self.ords[side] = np.zeros(0, dtype=np.int64)
            return
        table = Changes([0] * len(rows), rows).to_arrow(self.schemas[side])
        self.tables[side] = table.drop_columns(["_kind"])
        self.ords[side] = np.arange(self.next_ord, self.next_ord + len(rows), dtype=np.int64)
        self.next_ord += len(rows)

    # -- snapshot ---------------------------------------------------------------------------------------
    def snapshot(self, operator: str) -> bytes:
        left, right = self.tables["left"], self.tables["right"]
        nl, nr = left.num_rows, right.num_rows
        columns = [pa.chunked_array([*c.chunks, pa.nulls(nr, c.type)], c.type) for c in left.columns]
        columns += [pa.chunked_array([pa.nulls(nl, c.type), *c.chunks], c.type) for c in right.columns]
        columns.append(pa.array(np.r_[np.zeros(nl, np.int8), np.ones(nr, np.int8)]))
        columns.append(pa.array(np.concatenate([self.ords["left"], self.ords["right"]])))
        names = ([f"l{i}" for i in range(left.num_columns)] + [f"r{i}" for i in range(right.num_columns)]
                 + [SIDE, ORD])
        schema = pa.schema([pa.field(nm, col.type) for nm, col in zip(names, columns)]).with_metadata(
            {"operator": operator, "format": FORMAT, "next_ord": str(self.next_ord)})
        return stream_bytes(pa.Table.from_arrays(columns, schema=schema), SNAPSHOT_COMPRESS_FROM)

    @classmethod
    def restore(cls, config, table: pa.Table) -> ColumnarSides:
        """The state of a :meth:`snapshot` (read as ``table``); the schemas are the snapshot's own."""
        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        names = table.column_names
        try:
            left_n = sum(1 for n in names if n.startswith("l"))
            sides = table.column(SIDE).to_numpy(zero_copy_only=False)
            ords = table.column(ORD).to_numpy(zero_copy_only=False).astype(np.int64)
        except KeyError as exc:
            raise StateError(f"a columnar join snapshot without column {exc}: it was not written by this build") from None
        left_cols = names[:left_n]
        right_cols = [n for n in names[left_n:] if n not in (SIDE, ORD)]
        schemas = [pa.schema([table.schema.field(n) for n in cols]) for cols in (left_cols, right_cols)]
        if config.left_schema is not None:
            schemas = [config.left_schema, config.right_schema]
        sides_state = cls(config, schemas)
        for flag, side, cols in ((0, "left", left_cols), (1, "right", right_cols)):
            mask = sides == flag
            part = table.filter(pa.array(mask)).select(cols)
            conformed = sides_state.conform(side, part)
            if conformed is None:
                raise StateError(f"the {side} side of a columnar join snapshot has columns {part.schema} that do not "
                                 f"convert to the join's {sides_state.schemas[side]}; the snapshot belongs to "
                                 "another plan")
            sides_state.tables[side] = conformed
            sides_state.ords[side] = ords[mask]
        sides_state.next_ord = int(meta.get("next_ord", int(ords.max(initial=-1)) + 1))
        return sides_state


def _joint_ids(a: pa.Table, a_columns: list[int], b: pa.Table, b_columns: list[int]) -> np.ndarray:
    """Key ids over ``a``'s rows then ``b``'s (their columns at ``a_columns`` / ``b_columns``, of equal
    types): equal for equal keys, NULL equal to NULL."""
    keys = pa.table({f"k{i}": pa.chunked_array([*_chunks(a.column(x)), *_chunks(b.column(y))], a.column(x).type)
                     for i, (x, y) in enumerate(zip(a_columns, b_columns))})
    return key_ids(keys, list(range(len(a_columns))))


def _chunks(column: pa.ChunkedArray | pa.Array) -> list[pa.Array]:
    return column.chunks if isinstance(column, pa.ChunkedArray) else [column]


__all__ = ["FORMAT", "ColumnarSides", "fits", "nullable"]
