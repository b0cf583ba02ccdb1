"""Bulk path of the Debezium Avro decoder, through polars' Avro reader (optional).

fastavro decodes one message per call at ~20 k Debezium events/s per core here:
most of the time goes into per-field union handling in Python objects. When
``polars`` is installed, a chunk of messages that share one writer schema is
wrapped into an in-memory Avro object container file (one block, no codec) and
read column-wise into Arrow, then assembled like the JSON bulk path.

Message boundaries are checked, not assumed: every body is followed by a 4-byte
sentinel (its index) that the container schema reads as a ``fixed`` field; a
truncated or over-long body shifts the stream, so its sentinel (or the read)
fails and the chunk goes message by message through fastavro, where the bad
message becomes a dead letter.
"""

from __future__ import annotations

import copy
import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from changelake.formats.assemble import ColumnSpec, MetaColumn
from changelake.formats.base import DecodeResult
from changelake.formats.debezium_bulk import assemble

try:  # optional accelerator: pip install polars
    import polars
except ImportError:  # pragma: no cover - exercised where polars is absent
    polars = None

AVAILABLE = polars is not None


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def inline_named_types(schema: Any) -> Any:
    """The schema with every reference to a named type replaced by a renamed copy of its definition
    (polars' reader does not resolve references such as Debezium's ``"after": ["null", "Value"]``)."""
    named: dict[str, dict] = {}
    copies = [0]

    def walk(s: Any, ns: str | None) -> Any:
        if isinstance(s, str):
            full = s if "." in s else (f"{ns}.{s}" if ns else s)
            target = named.get(full) or named.get(s)
            if target is None:
                return s
            copies[0] += 1
            clone = copy.deepcopy(target)
            clone["name"] = f"{clone['name']}_ref{copies[0]}"
            return clone
        if isinstance(s, list):
            return [walk(x, ns) for x in s]
        if not isinstance(s, dict):
            return s
        s = dict(s)
        kind = s.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            inner_ns = s.get("namespace", ns)
            if kind in ("record", "error"):
                s["fields"] = [dict(f, type=walk(f["type"], inner_ns)) for f in s.get("fields", [])]
            full = s["name"] if "." in s["name"] or not inner_ns else f"{inner_ns}.{s['name']}"
            named[full] = s
            named.setdefault(s["name"], s)
            return s
        if kind == "array":
            s["items"] = walk(s["items"], ns)
        elif kind == "map":
            s["values"] = walk(s["values"], ns)
        elif isinstance(kind, (dict, list)):
            s["type"] = walk(kind, ns)
        return s

    root_ns = schema.get("namespace") if isinstance(schema, dict) else None
    return walk(schema, root_ns)


def framed_schema_json(writer_schema: Any) -> bytes:
    """Container schema: the writer's record followed by a 4-byte sentinel per message."""
    return orjson.dumps({"type": "record", "name": "ChangelakeFramedMessage", "fields": [
        {"name": "m", "type": inline_named_types(writer_schema)},
        {"name": "end", "type": {"type": "fixed", "name": "ChangelakeSentinel", "size": 4}}]})


def container(schema_json: bytes, bodies: Sequence[bytes]) -> bytes:
    """An Avro object container file holding ``bodies`` (each framed with its sentinel) in one block."""
    sync = os.urandom(16)
    meta = {b"avro.schema": schema_json, b"avro.codec": b"null"}
    header = [b"Obj\x01", _zigzag(len(meta))]
    for k, v in meta.items():
        header += [_zigzag(len(k)), k, _zigzag(len(v)), v]
    header += [b"\x00", sync]
    block = b"".join(b + i.to_bytes(4, "big") for i, b in enumerate(bodies))
    return b"".join(header) + _zigzag(len(bodies)) + _zigzag(len(block)) + block + sync


def decode_avro_chunk(schema_json: bytes, bodies: list[bytes], records: pa.Table, idx: np.ndarray,
                      specs: Sequence[ColumnSpec], meta: Sequence[MetaColumn], *,
                      key: Sequence[str]) -> DecodeResult | None:
    """Decode ``bodies`` (Avro, one writer schema, from ``records[idx]``) in bulk, or None."""
    if polars is None or not bodies:
        return None
    n = len(bodies)
    try:
        table = polars.read_avro(io.BytesIO(container(schema_json, bodies))).to_arrow()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # noqa: BLE001 - polars raises a Rust panic (a BaseException) on corrupt input
        return None
    if table.num_rows != n:
        return None
    expected = pa.array([i.to_bytes(4, "big") for i in range(n)], type=pa.binary())
    ends = table.column("end").combine_chunks().cast(pa.binary())
    if ends.null_count or not pc.all(pc.equal(ends, expected)).as_py():
        return None
    return assemble(table.column("m").combine_chunks(), records, idx, specs, meta, key=key)
