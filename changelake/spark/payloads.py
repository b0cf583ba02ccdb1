"""Arrow IPC payloads: how tables travel inside a binary column between Spark's JVM and Python workers."""

from __future__ import annotations

import pyarrow as pa


#: payload buffers zstd-compressed (trial)
_WRITE = pa.ipc.IpcWriteOptions(compression="zstd")


def to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_WRITE) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def from_ipc(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()
