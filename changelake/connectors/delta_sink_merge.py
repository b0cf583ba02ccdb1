"""The two MERGEs of the sink, as SQL clauses both engines execute.

Target alias ``t``, source alias ``s``; the source carries ``_kind``::

    table MERGE ON key
      matched,     s is +I/+U, t._seq < s._seq  -> UPDATE every stored column
      matched,     s is -D,    t._seq < s._seq  -> DELETE
      not matched, s is +I/+U                    -> INSERT
    tombstone MERGE ON key
      matched,     s is -D,    t._seq < s._seq  -> UPDATE _seq, _deleted_at   (a newer delete)
      matched,     s is +I/+U, t._seq < s._seq  -> DELETE                      (a newer re-insert)
      not matched, s is -D                       -> INSERT

Identifier quoting differs by engine (DataFusion ``"x"``, Spark SQL ```x```), so the
clauses are built with the engine's quoting function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from changelake.changelog import KIND, SEQ, RowKind
from changelake.connectors.delta_sink_schema import DELETED_AT

Quote = Callable[[str], str]

IS_DELETE = f"s.{KIND} = {int(RowKind.DELETE)}"
IS_UPSERT = f"s.{KIND} <> {int(RowKind.DELETE)}"
NEWER = f"t.{SEQ} < s.{SEQ}"


def double_quote(name: str) -> str:
    """A column name as a DataFusion (delta-rs) SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def backtick(name: str) -> str:
    """A column name as a Spark SQL identifier."""
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class MergeClauses:
    """``MERGE INTO t USING s ON on`` with one update, one delete and one insert clause."""

    on: str
    update_when: str
    update_set: Mapping[str, str]
    delete_when: str
    insert_when: str
    insert_values: Mapping[str, str]


def _assign(columns: Sequence[str], quote: Quote) -> dict[str, str]:
    return {quote(c): f"s.{quote(c)}" for c in columns}


def key_predicate(primary_key: Sequence[str], quote: Quote) -> str:
    return " AND ".join(f"t.{quote(k)} = s.{quote(k)}" for k in primary_key)


def table_merge(primary_key: Sequence[str], columns: Sequence[str], quote: Quote) -> MergeClauses:
    """The sink table's MERGE; ``columns`` are the stored columns (the source's, minus ``_kind``)."""
    values = _assign(columns, quote)
    return MergeClauses(on=key_predicate(primary_key, quote),
                        update_when=f"{IS_UPSERT} AND {NEWER}", update_set=values,
                        delete_when=f"{IS_DELETE} AND {NEWER}",
                        insert_when=IS_UPSERT, insert_values=values)


def tombstone_merge(primary_key: Sequence[str], quote: Quote) -> MergeClauses:
    """The tombstone table's MERGE."""
    return MergeClauses(on=key_predicate(primary_key, quote),
                        update_when=f"{IS_DELETE} AND {NEWER}", update_set=_assign((SEQ, DELETED_AT), quote),
                        delete_when=f"{IS_UPSERT} AND {NEWER}",
                        insert_when=IS_DELETE, insert_values=_assign((*primary_key, SEQ, DELETED_AT), quote))
