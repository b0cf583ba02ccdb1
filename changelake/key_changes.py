"""Key changes: an update whose before-image key differs from its after-image key is a move.

Decoders emit every update as ``-U(before), +U(after)``: consecutive rows at one ``_seq``,
``-U`` first. Decoders often do not know the primary key (it may be configured per source, per
table, or learnt from the Kafka message keys), so the rows are compared once the key is known,
by :func:`split_key_changes`::

    decoded rows (consecutive, same _seq)   key(before) vs key(after)     result (same positions)
    -------------------------------------   ---------------------------   ------------------------
    -U before, +U after                     equal (null equals null)      -U before, +U after
    -U before, +U after                     differ                        -D before, +I after: a move
    any other row                           -                             unchanged

A move keeps both rows where they were: the ``-D`` of the old key, then the ``+I`` of the new one,
at the message's ``_seq``. Rows that share a ``_seq`` come from one message and are ordered by
their position in it (see :mod:`changelake.changelog`), so a chain inside one multi-row message
(``b -> c`` then ``a -> b``: ``-D b, +I c, -D a, +I b``) ends with ``b`` holding ``a``'s old row.

Why it matters: whatever is keyed and applies a ``+U`` as "the new row of its key" drops ``-U``
(an upsert sink, Flink's ChangelogNormalize). For an update that moved the row to another key,
the ``-U`` is the only removal of the old key; as a ``-D`` it removes it, and the sink keeps a
tombstone for it, so a later but older change of the old key cannot bring it back.

Applied where decoded rows first meet the key they are applied by (each counts the moves in
``changelake_key_changes_total{source}`` on the driver):

* a source's rows for the operator graph, by the graph source's primary key: the service's decode
  stage (executors; the count travels to the driver with the batch) and ``LocalRunner``;
* a source's rows for its mirrored table, by the table's key (configured or learnt from the
  message keys): the pipeline on the driver, before the Delta sink.

Splitting is idempotent for one key: a split pair is no longer a ``-U, +U`` pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import KIND, SEQ, RowKind

_UB, _UA = int(RowKind.UPDATE_BEFORE), int(RowKind.UPDATE_AFTER)
_D, _I = int(RowKind.DELETE), int(RowKind.INSERT)

#: How each format reports an update that changes the primary key (for ``explain`` and the docs).
REPORTED_AS: dict[str, str] = {
    "canal-json": "an UPDATE whose old[i] holds a key column",
    "maxwell-json": "an update whose old holds a key column",
    "ogg-json": "a U whose before and after keys differ",
    "debezium-json": "a u whose before and after keys differ (the MySQL and Postgres connectors send a "
                     "delete and a create instead, which need nothing)",
    "debezium-avro-confluent": "a u whose before and after keys differ (the MySQL and Postgres connectors send "
                               "a delete and a create instead, which need nothing)",
}


@dataclass(frozen=True)
class KeyChangeSplit:
    """The rows with every move split, and how many updates were moves."""

    changes: pa.Table
    moves: int


def split_key_changes(changes: pa.Table, key: Sequence[str]) -> KeyChangeSplit:
    """``changes`` with each ``-U, +U`` pair whose ``key`` columns differ turned into ``-D, +I``.

    ``changes`` is a changelog batch in decoder order (``_kind``; ``_seq`` when present, then a
    pair must share it). Pure and vectorised; rows keep their positions and every other column.
    An empty ``key`` (unknown) leaves the rows as they are.
    """
    if not key or changes.num_rows < 2:
        return KeyChangeSplit(changes, 0)
    kinds = changes[KIND].to_numpy(zero_copy_only=False)
    pairs = np.flatnonzero((kinds[:-1] == _UB) & (kinds[1:] == _UA))
    if pairs.size and SEQ in changes.column_names:
        seq = changes[SEQ]
        same = pc.equal(seq.take(pa.array(pairs)), seq.take(pa.array(pairs + 1)))
        pairs = pairs[pc.fill_null(same, False).to_numpy(zero_copy_only=False)]
    if not pairs.size:
        return KeyChangeSplit(changes, 0)
    moved = pairs[_keys_differ(changes, key, pairs)]
    if not moved.size:
        return KeyChangeSplit(changes, 0)
    fixed = kinds.astype(np.int8, copy=True)
    fixed[moved] = _D
    fixed[moved + 1] = _I
    out = changes.set_column(changes.schema.get_field_index(KIND), changes.schema.field(KIND),
                             pa.array(fixed, pa.int8()).cast(changes.schema.field(KIND).type))
    return KeyChangeSplit(out, int(moved.size))


def _keys_differ(changes: pa.Table, key: Sequence[str], pairs: np.ndarray) -> np.ndarray:
    """Per pair (``-U`` at ``pairs[j]``, ``+U`` right after): whether any key column differs."""
    before_at, after_at = pa.array(pairs), pa.array(pairs + 1)
    differs = np.zeros(pairs.size, dtype=bool)
    for name in key:
        column = changes[name]
        before, after = column.take(before_at), column.take(after_at)
        try:
            equal = pc.equal(before, after)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):     # nested types: compare as Python values
            differs |= np.array([b != a for b, a in zip(before.to_pylist(), after.to_pylist())], dtype=bool)
            continue
        both_null = pc.and_(pc.is_null(before), pc.is_null(after))
        same = pc.or_(pc.fill_null(equal, False), both_null)
        differs |= ~same.to_numpy(zero_copy_only=False)
    return differs
