"""Keyed operator state with processing-time TTL, snapshots to bytes, stale-retraction policy.

State model
-----------
Each operator keeps one or more named :class:`KeyedState` stores (the names are
module constants of the operator and part of the on-disk contract). A store maps
a key (a tuple) to a value and remembers when the entry was last written. With a
TTL ``t > 0`` an entry written at ``w`` is expired once ``w + t <= now``; reads do
not refresh it (Flink's ``OnCreateAndWrite`` / ``NeverReturnExpired``). Expired
entries are dropped lazily on access and eagerly by :meth:`KeyedState.expire`.

Snapshot format (version 1)
---------------------------
Arrow IPC stream bytes of one table with columns ``state`` (store name), ``key``
and ``value`` (tagged JSON text, see :func:`encode_value`) and ``written_at``
(int64 ms). The schema metadata carries the operator name and format version.
One row per entry, so a binding can split a snapshot into hash buckets by key.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import logging
from typing import Any, Callable, Iterator, Literal

import pyarrow as pa

from changelake.errors import ConfigError, StateError
from changelake.service.metrics import STALE_RETRACTIONS

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT_VERSION = "1"
StaleRetractionPolicy = Literal["warn", "fail"]


class KeyedState:
    """One named keyed store: key -> value, with the time of the last write for TTL."""

    __slots__ = ("name", "ttl_ms", "_data")

    def __init__(self, name: str, ttl_ms: int = 0) -> None:
        if ttl_ms < 0:
            raise ConfigError(f"state {name!r}: TTL must be >= 0 ms (0 disables it), got {ttl_ms}")
        self.name = name
        self.ttl_ms = ttl_ms
        self._data: dict[Any, list] = {}

    def _alive(self, written_at: int, now: int) -> bool:
        return self.ttl_ms <= 0 or written_at + self.ttl_ms > now

    def get(self, key: Any, now: int, default: Any = None) -> Any:
        """The value for ``key`` or ``default``; an expired entry is removed and treated as absent."""
        entry = self._data.get(key)
        if entry is None:
            return default
        if not self._alive(entry[1], now):
            del self._data[key]
            return default
        return entry[0]

    def put(self, key: Any, value: Any, now: int) -> None:
        self._data[key] = [value, now]

    def delete(self, key: Any) -> None:
        self._data.pop(key, None)

    def expire(self, now: int) -> int:
        """Drop every expired entry; returns how many were dropped."""
        if self.ttl_ms <= 0:
            return 0
        dead = [k for k, (_, w) in self._data.items() if not self._alive(w, now)]
        for k in dead:
            del self._data[k]
        return len(dead)

    def __len__(self) -> int:
        return len(self._data)

    def entries(self) -> Iterator[tuple[Any, Any, int]]:
        for k, (v, w) in self._data.items():
            yield k, v, w

    def load(self, key: Any, value: Any, written_at: int) -> None:
        self._data[key] = [value, written_at]


# ---- value codec -------------------------------------------------------------------------------
# Tagged JSON: scalars (None, bool, int, float, str) are written as themselves; containers and
# other scalar types as one-key objects, so tuples come back as tuples (hashable keys).

def _enc(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return {"t": [_enc(x) for x in v]}
    if isinstance(v, list):
        return {"l": [_enc(x) for x in v]}
    if isinstance(v, dict):
        return {"m": [[_enc(k), _enc(x)] for k, x in v.items()]}
    if isinstance(v, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, decimal.Decimal):
        return {"d": str(v)}
    if isinstance(v, _dt.datetime):
        return {"ts": v.isoformat()}
    if isinstance(v, _dt.date):
        return {"date": v.isoformat()}
    raise StateError(f"cannot snapshot a value of type {type(v).__name__}: {v!r}; "
                     "operator state holds only SQL scalar values and containers of them")


def _dec(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "t":
        return tuple(_dec(y) for y in x)
    if tag == "l":
        return [_dec(y) for y in x]
    if tag == "m":
        return {_dec(k): _dec(y) for k, y in x}
    if tag == "b":
        return base64.b64decode(x)
    if tag == "d":
        return decimal.Decimal(x)
    if tag == "ts":
        return _dt.datetime.fromisoformat(x)
    if tag == "date":
        return _dt.date.fromisoformat(x)
    raise StateError(f"unknown tag {tag!r} in a state snapshot; was it written by a newer changelake?")


def encode_value(v: Any) -> str:
    return json.dumps(_enc(v), separators=(",", ":"), allow_nan=True)


def decode_value(text: str) -> Any:
    return _dec(json.loads(text))


_SNAPSHOT_SCHEMA = pa.schema([
    pa.field("state", pa.string(), nullable=False),
    pa.field("key", pa.large_string(), nullable=False),
    pa.field("value", pa.large_string(), nullable=False),
    pa.field("written_at", pa.int64(), nullable=False),
])


def snapshot_stores(operator: str, stores: list[KeyedState]) -> bytes:
    """Serialize ``stores`` to Arrow IPC stream bytes (format described in the module docstring)."""
    names, keys, values, written = [], [], [], []
    for store in stores:
        for k, v, w in store.entries():
            names.append(store.name)
            keys.append(encode_value(k))
            values.append(encode_value(v))
            written.append(w)
    schema = _SNAPSHOT_SCHEMA.with_metadata({"operator": operator, "format": SNAPSHOT_FORMAT_VERSION})
    table = pa.Table.from_arrays(
        [pa.array(names, pa.string()), pa.array(keys, pa.large_string()),
         pa.array(values, pa.large_string()), pa.array(written, pa.int64())], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def restore_stores(operator: str, data: bytes, stores: list[KeyedState]) -> None:
    """Load a snapshot written by :func:`snapshot_stores` into empty ``stores``."""
    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if meta.get("operator") != operator:
        raise StateError(f"snapshot belongs to operator {meta.get('operator')!r}, not {operator!r}; "
                         "restore it into the operator that wrote it")
    if meta.get("format") != SNAPSHOT_FORMAT_VERSION:
        raise StateError(f"snapshot format {meta.get('format')!r} is not supported "
                         f"(this build reads format {SNAPSHOT_FORMAT_VERSION})")
    by_name = {s.name: s for s in stores}
    cols = table.to_pydict()
    for name, k, v, w in zip(cols["state"], cols["key"], cols["value"], cols["written_at"]):
        store = by_name.get(name)
        if store is None:
            raise StateError(f"snapshot holds unknown state {name!r} for {operator}; "
                             f"known states: {sorted(by_name)} (a renamed state needs a migration)")
        store.load(decode_value(k), decode_value(v), w)


class StaleRetractions:
    """Applies the ``on_stale_retraction`` policy and counts every occurrence.

    A stale retraction is a -U/-D that finds no matching state: the state expired
    by TTL, or the row was never seen (input not in order, or started from an
    incomplete snapshot). ``warn`` logs and goes on as Flink does; ``fail`` raises
    :class:`StateError`. Either way ``changelake_stale_retractions_total`` counts it.
    """

    def __init__(self, operator: str, policy: StaleRetractionPolicy) -> None:
        if policy not in ("warn", "fail"):
            raise ConfigError(f"on_stale_retraction must be 'warn' or 'fail', got {policy!r}")
        self.operator = operator
        self.policy = policy
        self.count = 0

    def __call__(self, describe: Callable[[], str]) -> None:
        self.count += 1
        STALE_RETRACTIONS.labels(operator=self.operator).inc()
        if self.policy == "fail":
            raise StateError(f"{self.operator}: {describe()}. The state expired (raise the state TTL) or the "
                             "input is missing earlier changes; set on_stale_retraction: warn to skip such rows")
        if self.count <= 10 or self.count % 1000 == 0:
            log.warning("%s: %s (stale retraction #%d, skipped)", self.operator, describe(), self.count)


def check_ttl(name: str, ttl_ms: int) -> int:
    if not isinstance(ttl_ms, int) or ttl_ms < 0:
        raise ConfigError(f"{name}: state_ttl_ms must be an integer >= 0 (0 disables TTL), got {ttl_ms!r}")
    return ttl_ms
