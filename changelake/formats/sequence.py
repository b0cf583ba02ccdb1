"""``_seq``: the ordering token of a change, and how a source's log positions become one.

Sinks (``connectors.delta_sink_kernel``, ``delta_sink_merge``, ``spark.delta_sink``) and operators compare
``_seq`` as plain strings, only between changes of one key (one key lives in one Kafka partition).
Every token starts with a letter that says what it is made of; the digits are zero-padded to 20:

======  ====================================================  =============================================
prefix  made of                                               written by
======  ====================================================  =============================================
``b``   micro-batch id, position in the batch                 operator outputs (``changelog.with_batch_seq``)
``c``   the ``sequence_by`` column's value, Kafka offset      a source with ``sequence_by: {column: ...}``
``k``   Kafka partition, offset                               a format without a log position, or
                                                              ``sequence_by: kafka``
``l``   log position (binlog file index, pos, row; LSN; ...),  a source's first epoch (tokens of tables
        Kafka offset                                          written before epochs existed are these)
``m``   epoch ordinal, then the ``l`` token without its ``l``  a source's later epochs (ordinal 1, 2, ...)
======  ====================================================  =============================================

So ``l`` < ``m``: every change of a later epoch is newer than every change of an earlier one, and
within an epoch the log position decides, as it always did (the first epoch's tokens are unchanged).

Epochs. A log position only orders changes of one log: a MySQL failover, ``RESET MASTER``, a
PostgreSQL restore or a new replication slot start positions again, lower. Per Kafka partition, in
Kafka order, each message with a log position gets the epoch ordinal of the partition (0 at first)::

    message (marker e, order o, source time t) against the partition's state (E, O, T)
    ------------------------------------------------------------------------------------------------
    E known, e given, e != E                      new epoch (reason ``new-server``)
    o < O and t > T                               new epoch (reason ``position-reset``): the position
                                                  went back while the database's clock went on
    otherwise                                     same epoch (a re-delivered block goes back in both)
    then: E = e (when given), O = o, T = t (when given); the message's ordinal is the partition's

``marker`` is the server a log belongs to (MySQL: Debezium's ``server_id``, else the GTID's server
UUID; Maxwell: ``server_id``); ``order`` a number that grows along one log (MySQL: file index and
pos; PostgreSQL: the last commit LSN of Debezium's ``sequence``, else the LSN; OGG: ``pos``).
A message without a position (``k`` tokens) leaves the state alone. The state per partition is
kept in the pipeline's checkpoint with the offset it holds at (``changelake.spark.checkpoint``), so a
batch replayed after a crash gets the same ordinals.

``sequence_by`` (per source): ``source`` (the default: the above), ``kafka`` (``k`` tokens: Kafka order
within the partition) or ``{column: name}`` (an integer, date or timestamp column of the rows; null
sorts first; ties by Kafka offset; a truncate, which has no row, gets its Kafka token). Changing it on an
existing table changes the prefix of new tokens (``c`` < ``k`` < ``l``): start such a table afresh.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from changelake.changelog import OFFSET, PARTITION, SEQ, TOPIC
from changelake.errors import DecodeError

_WIDTH = 20

#: per message with a log position (``DecodeResult.positions``): where it is and what its epoch rule reads
POSITIONS_SCHEMA = pa.schema([
    pa.field("topic", pa.string(), nullable=False),
    pa.field("partition", pa.int32(), nullable=False),
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("marker", pa.string()),
    pa.field("order", pa.int64()),
    pa.field("ts", pa.int64()),
])

REASONS = ("new-server", "position-reset")


def binlog_order(file_index: int, pos: int) -> int:
    """A MySQL binlog position as one growing number (pos < 2^32: binlog files are at most 1 GiB)."""
    return (file_index << 32) | pos


def gtid_server(gtid: Any) -> str | None:
    """The server UUID of a GTID (``uuid:n`` or ``uuid:a-b``), else None."""
    if isinstance(gtid, str) and ":" in gtid:
        return gtid.split(":", 1)[0] or None
    return None


def mysql_marker(server_id: Any, gtid: Any) -> str | None:
    """The MySQL server a binlog event comes from (0, Debezium's snapshot rows: unknown)."""
    if type(server_id) is int and server_id > 0:
        return f"server_id {server_id}"
    uuid = gtid_server(gtid)
    return f"server_uuid {uuid}" if uuid else None


@dataclass
class PartitionEpoch:
    """The epoch state of one partition after the messages before offset ``at``."""

    at: int = 0
    ordinal: int = 0
    marker: str | None = None
    order: int | None = None
    ts: int | None = None

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PartitionEpoch":
        return cls(**{k: data.get(k) for k in ("at", "ordinal", "marker", "order", "ts")})


@dataclass(frozen=True)
class EpochChange:
    topic: str
    partition: int
    offset: int
    ordinal: int
    reason: str
    before: str | None
    after: str | None

    def describe(self) -> str:
        if self.reason == "new-server":
            why = f"the log's server changed from {self.before} to {self.after}"
        else:
            why = f"the log position went back on {self.after or 'the same server'} while the source time went on"
        return (f"{self.topic}[{self.partition}] offset {self.offset}: {why}; from here on this partition's "
                f"changes are ordered after every earlier one (epoch {self.ordinal})")


@dataclass
class Sequencer:
    """Epoch ordinals of one Kafka partition range after another (one per read task or driver decode)."""

    states: dict[tuple[str, int], PartitionEpoch] = field(default_factory=dict)
    changes: list[EpochChange] = field(default_factory=list)

    def walk(self, positions: pa.Table) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
        """Advance the states over ``positions`` (:data:`POSITIONS_SCHEMA`, any order); per partition, the
        sorted offsets and their ordinals."""
        out: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
        if positions.num_rows == 0:
            return out
        positions = positions.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
        topics = positions["topic"].to_numpy(zero_copy_only=False)
        parts = positions["partition"].to_numpy(zero_copy_only=False)
        bounds = np.flatnonzero((topics[1:] != topics[:-1]) | (parts[1:] != parts[:-1])) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(topics)]):
            key = (str(topics[lo]), int(parts[lo]))
            chunk = positions.slice(lo, hi - lo)
            offsets = chunk["offset"].to_numpy(zero_copy_only=False)
            state = self.states.setdefault(key, PartitionEpoch())
            fresh = offsets >= state.at      # a range read twice in one task (never, but harmless) keeps its ordinals
            ordinals = self._walk_partition(key, state, chunk, fresh)
            out[key] = (offsets, ordinals)
        return out

    def _walk_partition(self, key: tuple[str, int], state: PartitionEpoch, chunk: pa.Table,
                        fresh: np.ndarray) -> np.ndarray:
        ordinals = _steady(state, chunk, fresh)
        return ordinals if ordinals is not None else self._walk_rows(key, state, chunk, fresh)

    def _walk_rows(self, key: tuple[str, int], state: PartitionEpoch, chunk: pa.Table,
                   fresh: np.ndarray) -> np.ndarray:
        """The epoch rule message by message (a chunk where an epoch may start, or one read again)."""
        markers = chunk["marker"].to_pylist()
        orders = chunk["order"].to_pylist()
        stamps = chunk["ts"].to_pylist()
        offsets = chunk["offset"].to_pylist()
        ordinals = np.empty(len(offsets), dtype=np.int64)
        for i, (e, o, t, off) in enumerate(zip(markers, orders, stamps, offsets)):
            if fresh[i]:
                reason = None
                if e is not None and state.marker is not None and e != state.marker:
                    reason = "new-server"
                elif (o is not None and state.order is not None and o < state.order and t is not None
                      and state.ts is not None and t > state.ts):
                    reason = "position-reset"
                if reason is not None:
                    state.ordinal += 1
                    self.changes.append(EpochChange(key[0], key[1], off, state.ordinal, reason, state.marker,
                                                    e if e is not None else state.marker))
                if e is not None:
                    state.marker = e
                if o is not None:
                    state.order = o
                if t is not None:
                    state.ts = t
                state.at = off + 1
            ordinals[i] = state.ordinal
        return ordinals

    def resequence(self, table: pa.Table, walked: Mapping[tuple[str, int], tuple[np.ndarray, np.ndarray]], *,
                   topic: str = TOPIC, partition: str = PARTITION, offset: str = OFFSET) -> pa.Table:
        """``table`` (rows or truncates) with the ``l`` tokens of later epochs turned into ``m`` tokens."""
        return with_ordinals(table, walked, topic=topic, partition=partition, offset=offset)

    def end_states(self) -> dict[tuple[str, int], PartitionEpoch]:
        return dict(self.states)


def _steady(state: PartitionEpoch, chunk: pa.Table, fresh: np.ndarray) -> np.ndarray | None:
    """The ordinals of a chunk in which no epoch starts, found column-wise, with ``state`` advanced past it as
    :meth:`Sequencer._walk_rows` would; None when an epoch may start in it (or part of it was read before),
    which the message-by-message walk then decides. One server and positions that only go back when the
    source time does too: the ordinary chunk, whose messages all keep the partition's ordinal."""
    n = chunk.num_rows
    if n == 0 or not fresh.all():
        return None
    markers = chunk["marker"].combine_chunks().drop_null()
    servers = pc.unique(markers).to_pylist() if len(markers) else []
    if len(servers) > 1 or (servers and state.marker is not None and servers[0] != state.marker):
        return None
    orders, stamps = chunk["order"].combine_chunks(), chunk["ts"].combine_chunks()
    # the state's value, then each message's, nulls carried forward: [i] is what the state holds when message i
    # is reached, [n] what it holds after the chunk
    held_o = pc.fill_null_forward(pa.concat_arrays([pa.array([state.order], pa.int64()), orders]))
    held_t = pc.fill_null_forward(pa.concat_arrays([pa.array([state.ts], pa.int64()), stamps]))
    if pc.any(pc.and_(pc.less(orders, held_o.slice(0, n)), pc.greater(stamps, held_t.slice(0, n)))).as_py():
        return None         # a position went back while the source time went on (a null compares as no)
    if servers:
        state.marker = servers[0]
    state.order, state.ts = held_o[n].as_py(), held_t[n].as_py()
    state.at = int(chunk["offset"][n - 1].as_py()) + 1
    return np.full(n, state.ordinal, dtype=np.int64)


def with_ordinals(table: pa.Table, walked: Mapping[tuple[str, int], tuple[np.ndarray, np.ndarray]], *,
                  topic: str = TOPIC, partition: str = PARTITION, offset: str = OFFSET) -> pa.Table:
    """Rewrite ``_seq`` of the rows whose message has an ordinal > 0 (see the module's table)."""
    if table.num_rows == 0 or not any(int(o.max(initial=0)) > 0 for _, o in walked.values()):
        return table
    ordinal = np.zeros(table.num_rows, dtype=np.int64)
    topics = table[topic].to_numpy(zero_copy_only=False)
    parts = table[partition].to_numpy(zero_copy_only=False)
    offs = table[offset].to_numpy(zero_copy_only=False)
    for (t, p), (offsets, ordinals) in walked.items():
        mask = (topics == t) & (parts == p)
        if not mask.any():
            continue
        idx = np.searchsorted(offsets, offs[mask])
        idx = np.clip(idx, 0, len(offsets) - 1)
        found = offsets[idx] == offs[mask]
        ordinal[np.flatnonzero(mask)] = np.where(found, ordinals[idx], 0)
    seq = table[SEQ]
    later = pc.and_(pa.array(ordinal > 0), pc.starts_with(seq, "l"))
    if not pc.any(later).as_py():
        return table
    padded = pc.utf8_lpad(pa.array(ordinal).cast(pa.string()), _WIDTH, "0")
    tokens = pc.binary_join_element_wise("m", padded, pc.utf8_slice_codeunits(seq, 1), "")
    return table.set_column(table.schema.get_field_index(SEQ), pa.field(SEQ, pa.string(), nullable=False),
                            pc.if_else(later, tokens, seq))


# --- sequence_by ------------------------------------------------------------------------------------

def by_kafka(table: pa.Table, *, partition: str = PARTITION, offset: str = OFFSET) -> pa.Table:
    """``_seq`` from the Kafka position only (``sequence_by: kafka``)."""
    if table.num_rows == 0:
        return table
    tokens = pc.binary_join_element_wise(
        "k", pc.utf8_lpad(table[partition].cast(pa.string()), 5, "0"),
        pc.utf8_lpad(table[offset].cast(pa.string()), _WIDTH, "0"), "")
    return table.set_column(table.schema.get_field_index(SEQ), pa.field(SEQ, pa.string(), nullable=False), tokens)


def column_fits(type_: pa.DataType) -> bool:
    """Whether a column can order changes (``sequence_by: {column: ...}``): integer, date or timestamp."""
    return pat.is_integer(type_) or pat.is_date(type_) or pat.is_timestamp(type_)


def by_column(table: pa.Table, column: str, *, offset: str = OFFSET) -> pa.Table:
    """``_seq`` from a column's value, then the Kafka offset (``c`` tokens; null sorts first)."""
    if table.num_rows == 0:
        return table
    values = table[column]
    if not column_fits(values.type):
        raise TypeError(f"column {column!r} is {values.type}; sequence_by needs an integer, date or timestamp column")
    if pat.is_date(values.type):
        values = values.cast(pa.int32())
    elif pat.is_timestamp(values.type):
        values = values.cast(pa.int64())
    ints = pc.fill_null(values.cast(pa.int64()), -(2 ** 63)).to_numpy(zero_copy_only=False).astype(np.int64)
    shifted = ints.astype(np.uint64) ^ np.uint64(1 << 63)          # order-preserving: int64 -> uint64
    text = pa.array(shifted).cast(pa.string())
    tokens = pc.binary_join_element_wise(
        "c", pc.utf8_lpad(text, _WIDTH, "0"), pc.utf8_lpad(table[offset].cast(pa.string()), _WIDTH, "0"), "")
    return table.set_column(table.schema.get_field_index(SEQ), pa.field(SEQ, pa.string(), nullable=False), tokens)


def sequence_column(sequence_by: Any) -> str | None:
    """The column of ``sequence_by: {column: name}`` (a mapping or the config's model), else None."""
    if isinstance(sequence_by, Mapping):
        return sequence_by.get("column")
    return getattr(sequence_by, "column", None)


def apply_sequence_by(rows: pa.Table, sequence_by: Any) -> pa.Table:
    """Changelog rows with ``_seq`` as ``sequence_by`` says: ``source`` (or None) unchanged, ``kafka``, or a
    column (which the rows must have)."""
    if sequence_by in (None, "source"):
        return rows
    column = sequence_column(sequence_by)
    if column is None:
        return by_kafka(rows)
    if column not in rows.column_names:
        raise DecodeError(f"sequence_by names column {column!r}, but the source's rows have no such column "
                          f"(they have {[c for c in rows.column_names if not c.startswith('_')]}); fix the "
                          "source's sequence_by")
    return by_column(rows, column)


def merge_states(found: Iterable[Mapping[tuple[str, int], PartitionEpoch]]) -> dict[tuple[str, int], PartitionEpoch]:
    """One state per partition from several reports (the one furthest on)."""
    out: dict[tuple[str, int], PartitionEpoch] = {}
    for states in found:
        for key, state in states.items():
            if key not in out or state.at > out[key].at:
                out[key] = state
    return out



def resequenced(sequencer: Sequencer, rows: pa.Table, truncates: pa.Table, positions: pa.Table,
                sequence_by: Any) -> tuple[pa.Table, pa.Table]:
    """A decoded batch's rows and truncates (``changelog.TRUNCATE_SCHEMA``) with ``_seq`` as the source's
    ``sequence_by`` says; by the source position, the epoch ordinals of ``sequencer`` (advanced here)."""
    if sequence_by not in (None, "source"):      # a truncate has no row: its Kafka position
        return apply_sequence_by(rows, sequence_by), by_kafka(truncates, partition="partition", offset="offset")
    walked = sequencer.walk(positions)
    return (with_ordinals(rows, walked),
            with_ordinals(truncates, walked, topic="topic", partition="partition", offset="offset"))


#: the epoch states a decode reports to the driver, one row per partition
STATES_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                           pa.field("at", pa.int64()), pa.field("ordinal", pa.int64()),
                           pa.field("marker", pa.string()), pa.field("order", pa.int64()), pa.field("ts", pa.int64())])
#: the epoch changes a decode found, one row each
CHANGES_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                            pa.field("offset", pa.int64()), pa.field("ordinal", pa.int64()),
                            pa.field("reason", pa.string()), pa.field("before", pa.string()),
                            pa.field("after", pa.string())])


def states_table(states: Mapping[tuple[str, int], PartitionEpoch]) -> pa.Table:
    return pa.Table.from_pylist([{"topic": t, "partition": p, **s.to_json()} for (t, p), s in sorted(states.items())],
                                schema=STATES_SCHEMA)


def states_of(table: pa.Table) -> dict[tuple[str, int], PartitionEpoch]:
    return {(r.pop("topic"), r.pop("partition")): PartitionEpoch.from_json(r) for r in table.to_pylist()}


def changes_table(changes: Iterable[EpochChange]) -> pa.Table:
    return pa.Table.from_pylist([asdict(c) for c in changes], schema=CHANGES_SCHEMA)


def changes_of(table: pa.Table) -> list[EpochChange]:
    return [EpochChange(**r) for r in table.to_pylist()]
