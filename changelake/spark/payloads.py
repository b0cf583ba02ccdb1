"""Arrow IPC payloads: how tables travel inside a binary column between Spark's JVM and Python workers."""

from __future__ import annotations

import pyarrow as pa

from changelake.ipc import stream_bytes

#: a payload of this many bytes or more is compressed: ``bench/operators.py --queries b`` (payloads of
#: ~8,000 changes) peaked 10 % lower in memory with compressed payloads, in the same time
#: (docs/benchmarks.md, "Operator snapshots compressed"); a payload of a few rows would pay ~0.25 ms
COMPRESS_FROM = 256 * 1024


def to_ipc(table: pa.Table) -> bytes:
    return stream_bytes(table, COMPRESS_FROM)


def from_ipc(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()
