"""The changelog contract shared by decoders, operators and sinks.

A changelog batch is a ``pyarrow.Table`` holding the user columns followed by
reserved columns whose names start with ``_``:

==============  ==========  ==========================================================
column          Arrow type  meaning
==============  ==========  ==========================================================
``_kind``       int8        row kind code, see :class:`RowKind`
``_seq``        string      ordering token of the change for its key; larger is newer
``_topic``      string      Kafka topic the change came from
``_partition``  int32       Kafka partition
``_offset``     int64       Kafka offset
``_source_ts``  timestamp   when the change happened in the source database (ms, UTC)
``_db``         string      source database (or ``None``)
``_table``      string      source table (or ``None``)
==============  ==========  ==========================================================

``_seq`` is built by :func:`seq_from_log_position` or :func:`seq_from_kafka` so
that plain string comparison orders changes of one key correctly. The rows of one
message share its ``_seq`` (the ``-U`` and ``+U`` of an update; the rows of a multi-row
Canal message; the ``-D`` and ``+I`` of a key change, see :mod:`changelake.key_changes`):
among them, a row's position in the batch is its order, so whatever reduces a key's
changes takes the last row of the greatest ``_seq``.
"""

from __future__ import annotations

import enum

import pyarrow as pa


class RowKind(enum.IntEnum):
    """Flink's four row kinds with their byte codes."""

    INSERT = 0          # +I
    UPDATE_BEFORE = 1   # -U
    UPDATE_AFTER = 2    # +U
    DELETE = 3          # -D

    @property
    def short(self) -> str:
        return _SHORT[self]

    @classmethod
    def from_short(cls, text: str) -> "RowKind":
        try:
            return _FROM_SHORT[text]
        except KeyError:
            raise ValueError(f"unknown row kind {text!r}; expected one of +I, -U, +U, -D") from None

    @property
    def is_accumulate(self) -> bool:
        """+I and +U add a row; -U and -D retract one."""
        return self in (RowKind.INSERT, RowKind.UPDATE_AFTER)


_SHORT = {RowKind.INSERT: "+I", RowKind.UPDATE_BEFORE: "-U",
          RowKind.UPDATE_AFTER: "+U", RowKind.DELETE: "-D"}
_FROM_SHORT = {v: k for k, v in _SHORT.items()}

KIND = "_kind"
SEQ = "_seq"
TOPIC = "_topic"
PARTITION = "_partition"
OFFSET = "_offset"
SOURCE_TS = "_source_ts"
DATABASE = "_db"
TABLE = "_table"

#: Reserved columns every decoder appends after the user columns, in this order.
METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(KIND, pa.int8(), nullable=False),
    pa.field(SEQ, pa.string(), nullable=False),
    pa.field(TOPIC, pa.string()),
    pa.field(PARTITION, pa.int32()),
    pa.field(OFFSET, pa.int64()),
    pa.field(SOURCE_TS, pa.timestamp("ms", tz="UTC")),
    pa.field(DATABASE, pa.string()),
    pa.field(TABLE, pa.string()),
)
METADATA_NAMES: tuple[str, ...] = tuple(f.name for f in METADATA_FIELDS)

#: Raw Kafka records as the source hands them to decoders (one Arrow row per message).
RAW_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("timestamp", pa.timestamp("ms", tz="UTC")),
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
])

#: Dead letters: the raw bytes and position of a message that could not be decoded.
DEAD_LETTER_SCHEMA = RAW_SCHEMA.append(pa.field("reason", pa.string(), nullable=False)).append(
    pa.field("error", pa.string(), nullable=False))

#: Truncates a decoder read (``on_truncate`` apply or skip): one row per TRUNCATE message, with the
#: message's position (``_seq`` orders it against the table's changes) and the table it names.
TRUNCATE_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field(SEQ, pa.string(), nullable=False),
    pa.field(DATABASE, pa.string()),
    pa.field(TABLE, pa.string()),
])

_SEQ_WIDTH = 20


def seq_from_kafka(partition: int, offset: int) -> str:
    """Ordering token from the Kafka position (used when the format carries no log position).

    Only changes of one key are compared, and one key lives in one partition.
    """
    return f"k{partition:05d}{offset:0{_SEQ_WIDTH}d}"


def seq_from_log_position(*parts: int, offset: int) -> str:
    """Ordering token from a database log position, e.g. (binlog file index, pos, row).

    The Kafka offset breaks ties between changes that share a log position
    (snapshot rows, re-deliveries).
    """
    body = "".join(f"{p:0{_SEQ_WIDTH}d}" for p in parts)
    return f"l{body}{offset:0{_SEQ_WIDTH}d}"


#: Batch ids of one checkpoint generation below this: :func:`commit_position` packs both into one int64.
GENERATION_SPAN = 1 << 40


def commit_position(batch_id: int, generation: int = 0) -> int:
    """Where a micro-batch stands in a pipeline's life: its checkpoint's generation, then its batch id.

    A new checkpoint restarts its batch ids at 0; its generation is higher than every earlier one's
    (``changelake.service.lifecycle``), so its batches come after theirs. Generation 0 is the
    checkpoints recorded before generations existed: their positions are their batch ids, as before.
    The position is the Delta transaction version of every sink commit and the ``b`` part of a view's
    ``_seq`` (:func:`with_batch_seq`).
    """
    if not 0 <= batch_id < GENERATION_SPAN:
        raise ValueError(f"batch id {batch_id} is outside [0, 2^40)")
    if generation < 0:
        raise ValueError(f"checkpoint generation must be >= 0, got {generation}")
    return generation * GENERATION_SPAN + batch_id


def split_commit_position(position: int) -> tuple[int, int]:
    """(generation, batch id) of a :func:`commit_position`."""
    return divmod(position, GENERATION_SPAN)


def with_batch_seq(changes: pa.Table, batch_id: int, generation: int = 0) -> pa.Table:
    """``changes`` (an operator's output, in order) with ``_seq`` = commit position and row position.

    Operators emit new rows with no log position; what orders them for the sink is the
    micro-batch they come from (its :func:`commit_position`: a newer checkpoint's batches after
    an older one's) and, within it, their position (a key's changes are in order).
    """
    at = commit_position(batch_id, generation)
    seqs = pa.array([f"b{at:0{_SEQ_WIDTH}d}{i:0{_SEQ_WIDTH}d}" for i in range(changes.num_rows)], pa.string())
    if SEQ in changes.column_names:
        return changes.set_column(changes.schema.get_field_index(SEQ), SEQ, seqs)
    return changes.append_column(SEQ, seqs)


def user_columns(table: pa.Table) -> list[str]:
    """The user's columns of a changelog batch (everything not reserved)."""
    return [n for n in table.column_names if not n.startswith("_")]
