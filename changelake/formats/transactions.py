"""Source transaction boundaries read from the messages: which transaction each change belongs to,
and where a transaction ends (``consistency: transaction``, :mod:`changelake.service.transactions`).

What each format carries, and what is read from it (one row per Kafka record):

=================  =====================================================  ==========================================
format             a change's transaction                                 the transaction's end
=================  =====================================================  ==========================================
debezium-json      ``transaction.id`` of the envelope (the connector's    an END event on the transaction metadata
                   ``provide.transaction.metadata=true``); snapshot       topic (``<topic.prefix>.transaction``) with
                   events carry none                                      its event count per data collection
maxwell-json       ``xid``                                                the change with ``"commit": true`` (the
                                                                          transaction's last row; its other rows are
                                                                          before it in the same partition when
                                                                          Maxwell partitions by database, its default)
=================  =====================================================  ==========================================

Debezium's PostgreSQL connector writes a transaction id as ``<txId>:<LSN>``, with the LSN of the event itself in
a change and the commit's LSN in the END (measured with Debezium 3.6.1: ``734:26378888`` in a change, ``734:26379616``
in its END): an id of that form (digits, a colon, digits) is taken as its ``txId``, on both sides. Other
connectors' ids (MySQL GTIDs, SQL Server LSNs, ...) are used as they are.

A change's data collection is its topic without the connector's topic prefix (Debezium names a table's
topic ``<prefix>.<collection>``, and an END event counts the events per ``<collection>``), so the count is
the number of Kafka records read from that topic with that transaction id: one event, one record, however
many changelog rows it decodes into. Tombstones (no value) and records that are not JSON objects carry no
transaction. Maxwell transaction ids are made ``<database>:<xid>`` (xids of different servers may meet).
"""

from __future__ import annotations

import re
from typing import Any

import pyarrow as pa

from changelake.formats.message_key import json_object

#: One row per change record that belongs to a source transaction.
EVENTS_SCHEMA = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("txn", pa.string()),
    pa.field("last", pa.bool_()),        # Maxwell: this change ends its transaction ("commit": true)
])

#: One row per END event of a transaction metadata topic (BEGIN events are not kept: they add nothing).
BOUNDARIES_SCHEMA = pa.schema([
    pa.field("topic", pa.string()), pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
    pa.field("txn", pa.string()), pa.field("event_count", pa.int64()),
    pa.field("collections", pa.list_(pa.struct([pa.field("collection", pa.string()),
                                                 pa.field("event_count", pa.int64())]))),
])

_PG_ID = re.compile(r"(\d+):\d+")


def transaction_id(raw: Any) -> str:
    """The id that names a transaction both in its changes and in its END (see the module's docstring)."""
    text = str(raw)
    pg = _PG_ID.fullmatch(text)
    return pg.group(1) if pg else text


#: the formats that carry transaction boundaries
FORMATS = ("debezium-json", "maxwell-json")


def event_transactions(records: pa.Table, fmt: str) -> pa.Table:
    """The transaction of each change record of ``records`` (Kafka records: topic, partition, offset,
    value) in format ``fmt``, as :data:`EVENTS_SCHEMA`; records without one are left out."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} carries no transaction boundaries; those that do: {', '.join(FORMATS)}")
    out: dict[str, list] = {n: [] for n in EVENTS_SCHEMA.names}
    for topic, partition, offset, value in zip(records["topic"].to_pylist(), records["partition"].to_pylist(),
                                               records["offset"].to_pylist(), records["value"].to_pylist()):
        obj = json_object(value)
        if obj is None:
            continue
        if fmt == "debezium-json":
            block = obj.get("transaction")
            txn = transaction_id(block["id"]) if isinstance(block, dict) and block.get("id") is not None else None
            last = False
        else:
            xid = obj.get("xid")
            txn = None if xid is None else f"{obj.get('database')}:{xid}"
            last = obj.get("commit") is True
        if txn is None:
            continue
        for name, v in zip(EVENTS_SCHEMA.names, (topic, partition, offset, str(txn), last)):
            out[name].append(v)
    return pa.table(out, schema=EVENTS_SCHEMA)


def transaction_boundaries(records: pa.Table) -> tuple[pa.Table, list[int]]:
    """The END events of Debezium transaction metadata records, as :data:`BOUNDARIES_SCHEMA`, and the indexes
    of the records that are neither BEGIN nor END (malformed: the caller makes them dead letters)."""
    out: dict[str, list] = {n: [] for n in BOUNDARIES_SCHEMA.names}
    bad = []
    for i, (topic, partition, offset, value) in enumerate(zip(
            records["topic"].to_pylist(), records["partition"].to_pylist(), records["offset"].to_pylist(),
            records["value"].to_pylist())):
        if value is None:
            continue
        obj = json_object(value)
        status = obj.get("status") if obj is not None else None
        if status == "BEGIN":
            continue
        if status != "END" or obj.get("id") is None or not isinstance(obj.get("data_collections"), list):
            bad.append(i)
            continue
        collections = [{"collection": str(c.get("data_collection")), "event_count": int(c.get("event_count") or 0)}
                       for c in obj["data_collections"] if isinstance(c, dict)]
        for name, v in zip(BOUNDARIES_SCHEMA.names, (topic, partition, offset, transaction_id(obj["id"]),
                                                     int(obj.get("event_count") or 0), collections)):
            out[name].append(v)
    return pa.table(out, schema=BOUNDARIES_SCHEMA), bad
