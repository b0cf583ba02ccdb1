"""The state bucket of a row: one function, computed in Python, stable across processes and versions.

Every stateful node's state is split into B buckets by its state key (the group keys, the
deduplication keys, a join side's key columns). :func:`bucket_of` is the only place a bucket is
computed: the source routers, the routers behind each kernel and the single-node binding all call
it. It is part of the checkpoint contract: a bucket's state holds the keys that hashed to it, so a
changed function would send a key's later rows to a bucket that does not hold its history. It
therefore depends on nothing that may change between runs or library versions: not Python's
``hash`` (salted per process for text), not Spark's or DuckDB's ``hash``, only fixed constants,
BLAKE2b and the values' Arrow representation:

====================================  =================================================================
column type                           the 64-bit value hashed
====================================  =================================================================
integer, boolean                      the value as a signed 64-bit integer, mixed (SplitMix64 finalizer)
date, time, timestamp, duration       its stored integer (days, or units since the epoch / midnight),
                                      mixed; a timestamp's zone does not change its stored instant
float, double                         its IEEE 754 double bits, mixed, with ``-0.0`` taken as ``0.0``
                                      and every NaN as one NaN (equal in SQL, one key in the kernels)
string, binary, decimal               BLAKE2b (8 bytes, little-endian) of its UTF-8 bytes / its bytes /
                                      its 128- or 256-bit unscaled integer
anything else (list, struct, ...)     BLAKE2b of its JSON text (keys sorted)
NULL (any type)                       a fixed constant: NULL is a key like any other
====================================  =================================================================

The key columns' hashes are folded left to right (``h = mix(h ^ column hash)``), and the bucket is
``h mod B``. Equal keys (as the kernels compare them: NULL equal to NULL, ``-0.0`` to ``0.0``, NaN to
NaN) get equal buckets; a join's two sides have key columns of equal types (the planner checks), so
equal keys of both sides meet.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NULL = np.uint64(0x6A09E667F3BCC908)
_SEED = np.uint64(0xCBF29CE484222325)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer over uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def _digest(value: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(value, digest_size=8).digest(), "little")


def _bytes_hash(column: pa.Array, encode) -> np.ndarray:
    """BLAKE2b of each value's bytes (``encode`` maps a Python value to them), once per distinct value."""
    encoded = column.dictionary_encode()
    digests = np.array([_digest(encode(v)) for v in encoded.dictionary.to_pylist()], dtype=np.uint64)
    indices = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False)
    return digests[indices] if len(digests) else np.zeros(len(column), dtype=np.uint64)


def _integers(column: pa.Array) -> np.ndarray:
    return pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)


def column_hash(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The 64-bit hash of every value of ``column`` (see the module docstring)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.dictionary_decode()
        t = column.type
    if pa.types.is_null(t):
        return np.full(len(column), _NULL, dtype=np.uint64)
    if pa.types.is_boolean(t):
        h = _mix(_integers(column.cast(pa.int8())))
    elif pa.types.is_integer(t):
        h = _mix(_integers(column.cast(pa.int64(), safe=False)))
    elif pa.types.is_date32(t) or pa.types.is_time32(t):
        h = _mix(_integers(column.view(pa.int32())))
    elif pa.types.is_temporal(t) and t.bit_width == 64:     # timestamp, duration, date64, time64
        h = _mix(_integers(column.view(pa.int64())))
    elif pa.types.is_floating(t):
        x = pc.fill_null(column.cast(pa.float64()), 0.0).to_numpy(zero_copy_only=False) + 0.0   # -0.0 + 0.0 = 0.0
        x = np.where(np.isnan(x), np.float64("nan"), x)
        h = _mix(np.ascontiguousarray(x).view(np.uint64))
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        h = _bytes_hash(column, lambda v: v.encode("utf-8"))
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        h = _bytes_hash(column, bytes)
    elif pa.types.is_decimal(t):
        h = _bytes_hash(column.view(pa.binary(t.bit_width // 8)), bytes)
    else:
        h = _bytes_hash(pa.array([json.dumps(v, sort_keys=True, default=str) for v in column.to_pylist()]),
                        lambda v: v.encode("utf-8"))
    if column.null_count:
        h = np.where(column.is_null().to_numpy(zero_copy_only=False), _NULL, h)
    return h


def bucket_of(table: pa.Table, columns: Sequence[str], buckets: int) -> np.ndarray:
    """The bucket in ``[0, buckets)`` of every row of ``table`` by its key ``columns`` (int32); every
    row in bucket 0 when there is no key column."""
    if not columns or buckets == 1:
        return np.zeros(table.num_rows, dtype=np.int32)
    h = np.full(table.num_rows, _SEED, dtype=np.uint64)
    for name in columns:
        h = _mix(h ^ column_hash(table.column(name)))
    return (h % np.uint64(buckets)).astype(np.int32)


def split_by_bucket(table: pa.Table, columns: Sequence[str], buckets: int) -> list[tuple[int, pa.Table]]:
    """``table``'s rows per bucket present, as ``(bucket, rows)`` in bucket order (row order kept)."""
    if table.num_rows == 0:
        return []
    ids = bucket_of(table, columns, buckets)
    if buckets == 1 or not columns:
        return [(0, table)]
    order = np.argsort(ids, kind="stable")
    keys = ids[order]
    ordered = table.take(pa.array(order))
    starts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(keys)]
    return [(int(keys[a]), ordered.slice(a, b - a)) for a, b in itertools.pairwise(starts)]
