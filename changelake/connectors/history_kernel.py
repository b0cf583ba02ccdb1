"""Engine-neutral logic of an SCD type 2 history table (``tables[].history: scd2``): pure Arrow, no I/O.

A history table keeps every version of each key: the user columns, ``_seq`` / ``_source_ts`` of
the change that last wrote the version, and ``__start_at`` / ``__end_at``, the ``_seq`` (the
position the sink orders changes by) at which the version became current and stopped being
current (NULL while it is current). A version is identified by (key, ``__start_at``).

Per batch, for each key the batch touches, the key's history is rebuilt from its stored versions,
its logged states and the batch's changes, then compared with what is stored::

    the key's state at each position (_seq); where several sources know a position, the first wins:
        the batch:   the last change of the position (batch order; -U ignored):
                     +I/+U -> present with the change's values, -D -> absent
        the log:     the states no version shows (below)
        the table:   at a version's __start_at and at its _seq (the change last written in
                     place; a change is a whole row): present with its values
                     at a version's __end_at where no version starts: absent
    fold the states in position order (cur = the open version):
        absent                                  -> cur closes here (__end_at = position)
        present, no cur                         -> a version opens here (__start_at = position)
        present, a tracked column differs       -> cur closes here, a version opens here
        present, tracked columns equal          -> cur updated in place (_seq = position)
    stored version with the same (key, __start_at): unchanged -> nothing; else updated
    stored version no longer in the history    -> deleted
    new version                                -> inserted
    a state not logged yet that no version holds (a delete; a row a later in-place write
    replaced, the version's first row included) -> logged

Tracked columns are ``track_history`` when given, else every user column. So a late change
lands in the interval it belongs to (it splits it, or closes it when it is a delete), a replayed
change meets the state it already made (nothing changes), and the outcome does not depend on how
the changes were batched: the log keeps what the table's versions do not show (a delete that
closed nothing yet, the rows in-place writes replaced), so every state a late change can fall
between is known. A change holding the ``unavailable`` placeholder (an unchanged TOASTed Postgres
column) takes the value of the version open before it (NULL if none).

The log keeps a state for the sink's ``tombstone_retention``; a change later than that can fall
between states that only the expired log knew, and then meets the versions' states alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from changelake.changelog import KIND, SEQ, RowKind
from changelake.connectors.delta_sink_kernel import _null_safe_keys, placeholder_value

START_AT = "__start_at"
END_AT = "__end_at"
#: the type of ``__start_at`` / ``__end_at``: the type of ``_seq``, which orders the changes
INTERVAL_TYPE = pa.string()
INTERVAL_FIELDS = (pa.field(START_AT, INTERVAL_TYPE), pa.field(END_AT, INTERVAL_TYPE))
_ROW = "__changelake_row"

_ABSENT, _PRESENT = 0, 1


@dataclass(frozen=True)
class HistoryDiff:
    """What a batch changes in a history table."""

    writes: pa.Table        # table columns + _kind: +I a new version, +U a changed one, -D a version to remove
    log: pa.Table           # states to add to the log (log_schema): deletes and rows no version shows
    opened: int             # versions inserted
    updated: int            # stored versions changed (closed, split or updated in place)
    removed: int            # stored versions no longer in the history (a late change moved their start)


def keys_of(changes: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The distinct keys of ``changes``."""
    return changes.select(list(primary_key)).group_by(list(primary_key)).aggregate([])


def rows_of_keys(table: pa.Table, keys: pa.Table, primary_key: Sequence[str]) -> pa.Table:
    """The rows of ``table`` whose key is one of ``keys`` (NULL matching NULL)."""
    if table.num_rows == 0 or keys.num_rows == 0:
        return table.slice(0, 0)
    left, right, on = _null_safe_keys(
        pa.table({k: table[k].cast(keys.schema.field(k).type) for k in primary_key}),
        pa.table({k: keys[k] for k in primary_key}), primary_key)
    left = left.append_column(_ROW, pa.array(np.arange(table.num_rows, dtype=np.int64)))
    hits = left.join(right, keys=on, join_type="left semi")
    return table.take(hits[_ROW].combine_chunks().sort())


def rebuild_history(changes: pa.Table, stored: pa.Table, logged: pa.Table, *, primary_key: Sequence[str],
                    target_schema: pa.Schema, track_history: Sequence[str] | None = None,
                    placeholder: str | None = None) -> HistoryDiff:
    """The versions to write for the keys of ``changes``, and the states to add to the log (see the
    module docstring).

    ``changes``: the batch in the changelog contract, aligned to the table (``align_to_table``);
    ``stored``: the table's versions of those keys; ``logged``: the logged states of those keys
    (``log_schema``); ``target_schema``: the table's columns (with ``__start_at`` / ``__end_at``).
    """
    key = list(primary_key)
    columns = [f.name for f in target_schema]
    row_columns = [c for c in columns if c not in (START_AT, END_AT)]
    user = [c for c in columns if not c.startswith("_")]
    tracked = [c for c in (track_history if track_history is not None else user) if c not in key]
    needles = {} if placeholder is None else {c: placeholder_value(target_schema.field(c).type, placeholder)
                                              for c in user}
    needles = {c: v for c, v in needles.items() if v is not None}

    from_batch = _states_by_key(changes, row_columns, key)
    from_log = _states_by_key(logged, row_columns, key) if logged.num_rows else {}
    stored_by_key: dict[tuple, list[dict]] = {}
    for row in stored.select(columns).to_pylist():
        stored_by_key.setdefault(_key(row, key), []).append(row)

    writes: list[dict] = []
    to_log: list[dict] = []
    opened = updated = removed = 0
    for k, batch_states in from_batch.items():
        versions = stored_by_key.get(k, [])
        log_states = from_log.get(k, {})
        states = _stored_states(versions)
        states.update(log_states)
        states.update(batch_states)
        history = _fold(states, tracked=tracked, needles=needles)
        shown = {v[SEQ] for v in history}       # a version holds the row of its last write only
        for position, (what, values) in states.items():
            if position in log_states or (what == _PRESENT and position in shown):
                continue
            to_log.append({**(values or dict(zip(key, k))), SEQ: position,
                           KIND: int(RowKind.DELETE if what == _ABSENT else RowKind.INSERT)})
        before = {v[START_AT]: v for v in versions}
        for version in history:
            old = before.pop(version[START_AT], None)
            if old is None:
                writes.append({**version, KIND: int(RowKind.INSERT)})
                opened += 1
            elif not _same(old, version, columns):
                writes.append({**version, KIND: int(RowKind.UPDATE_AFTER)})
                updated += 1
        for old in before.values():
            writes.append({**old, KIND: int(RowKind.DELETE)})
            removed += 1
    schema = pa.schema(list(target_schema) + [pa.field(KIND, pa.int8())])
    full = [{c: w.get(c) for c in schema.names} for w in writes]
    logs = log_schema(target_schema)
    return HistoryDiff(writes=pa.Table.from_pylist(full, schema=schema),
                       log=pa.Table.from_pylist([{c: r.get(c) for c in logs.names} for r in to_log], schema=logs),
                       opened=opened, updated=updated, removed=removed)


def log_schema(target_schema: pa.Schema) -> pa.Schema:
    """The state log's columns: the table's, without the interval, plus ``_kind`` (+I a row, -D absent)."""
    return pa.schema([f for f in target_schema if f.name not in (START_AT, END_AT)] + [pa.field(KIND, pa.int8())])


def _states_by_key(changes: pa.Table, columns: list[str], key: list[str]) -> dict[tuple, dict[str, tuple[int, Any]]]:
    """Per key, the state at each position: the last change of the position (-U ignored)."""
    out: dict[tuple, dict[str, tuple[int, Any]]] = {}
    kinds = changes[KIND].to_pylist()
    rows = changes.select([c for c in columns if c in changes.column_names]).to_pylist()
    for kind, row in zip(kinds, rows):
        if kind == RowKind.UPDATE_BEFORE:
            continue
        state = (_ABSENT, None) if kind == RowKind.DELETE else (_PRESENT, row)
        out.setdefault(_key(row, key), {})[row[SEQ]] = state
    return out


def _key(row: dict, key: list[str]) -> tuple:
    return tuple(row[c] for c in key)


def _stored_states(versions: list[dict]) -> dict[str, tuple[int, Any]]:
    """The key's states the stored versions tell of: present at each start and last in-place write
    (a change is a whole row), absent at an end where no version starts."""
    states: dict[str, tuple[int, Any]] = {}
    starts = {v[START_AT] for v in versions}
    for v in versions:
        if v[END_AT] is not None and v[END_AT] not in starts:
            states[v[END_AT]] = (_ABSENT, None)
    for v in versions:
        row = {c: x for c, x in v.items() if c not in (START_AT, END_AT)}
        states[v[START_AT]] = (_PRESENT, {**row, SEQ: v[START_AT]})
        if v[SEQ] is not None and v[SEQ] > v[START_AT] and v[SEQ] not in starts:
            states[v[SEQ]] = (_PRESENT, row)
    return states


def _fold(states: dict[str, tuple[int, Any]], *, tracked: list[str], needles: dict[str, Any]) -> list[dict]:
    """The versions the key's states make, in position order (the table in the module docstring).
    A placeholder is replaced in ``states`` too, so that what is logged holds the value."""
    versions: list[dict] = []
    cur: dict | None = None
    for position in sorted(states):
        what, values = states[position]
        if what == _ABSENT:
            if cur is not None:
                cur[END_AT] = position
                cur = None
            continue
        values = dict(values)
        for c, needle in needles.items():
            if values.get(c) == needle:
                values[c] = None if cur is None else cur.get(c)
        states[position] = (_PRESENT, values)
        if cur is not None and all(_equal(cur.get(c), values.get(c)) for c in tracked):
            cur.update(values)
            continue
        if cur is not None:
            cur[END_AT] = position
        cur = {**values, START_AT: position, END_AT: None}
        versions.append(cur)
    return versions


def _equal(a: Any, b: Any) -> bool:
    """Equal as stored values; NaN equals NaN (else a replay would rewrite a version holding one)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _same(old: dict, new: dict, columns: Sequence[str]) -> bool:
    return all(_equal(old.get(c), new.get(c)) for c in columns)
