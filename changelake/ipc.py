"""Arrow IPC stream bytes, compressed when they are large enough for it to pay.

Operator snapshots and the payloads between Spark's stages are Arrow IPC streams. Arrow can compress
each buffer of a stream (zstd), and its reader undoes that by itself. It pays for bytes that cross a
costly boundary: a snapshot goes to the JVM's state store and back at every step of its bucket, a payload
through Spark's shuffle and memory. It costs ~0.25 ms per stream however small (a compression context per
buffer), which a 1-row snapshot or a 10-row payload does not win back, so a stream is compressed only
from a size up (docs/state-design.md, "Snapshots compressed").
"""

from __future__ import annotations

import pyarrow as pa

_PLAIN = pa.ipc.IpcWriteOptions()
_ZSTD = pa.ipc.IpcWriteOptions(compression="zstd")


def stream_bytes(table: pa.Table, compress_from: int) -> bytes:
    """``table`` as Arrow IPC stream bytes; its buffers zstd-compressed when the table holds at least
    ``compress_from`` bytes (then in one record batch: each buffer of each batch is compressed alone)."""
    compress = table.nbytes >= compress_from
    if compress:
        table = table.combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_ZSTD if compress else _PLAIN) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
