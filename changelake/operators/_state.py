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
and ``value`` (restricted pickle bytes, see :func:`encode_value`) and ``written_at``
(int64 ms). The schema metadata carries the operator name and format version. A
snapshot of :data:`SNAPSHOT_COMPRESS_FROM` bytes or more has its buffers zstd-compressed; an
uncompressed stream, as every snapshot was written before, reads the same.
One row per entry, so a binding can split a snapshot into hash buckets by key. (The inner join of two
keyed inputs writes its own format, ``2-columnar``, when its state is held in Arrow columns:
``_join_columnar``; it reads this one too.) A
:class:`TrackedKeyedState` (a join side's rows) keeps the key and value columns of its last snapshot
(or of the one it was restored from) and pickles again only the entries changed since, taking the
others from those columns: the bytes are the same.
"""

from __future__ import annotations

import array
import copyreg
import io
import logging
import pickle
import zoneinfo
from typing import Any, Callable, Iterator, Literal

import numpy as np
import pyarrow as pa

from changelake.errors import ConfigError, StateError
from changelake.ipc import stream_bytes
from changelake.metrics import Figures

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
        if self.ttl_ms > 0 and entry[1] + self.ttl_ms <= now:
            self.delete(key)
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
            self.delete(k)
        return len(dead)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def entries(self) -> Iterator[tuple[Any, Any, int]]:
        for k, (v, w) in self._data.items():
            yield k, v, w

    def written(self) -> list[int]:
        """Every entry's time of the last write, in entry order."""
        return [e[1] for e in self._data.values()]

    def values(self) -> Iterator[Any]:
        """Every entry's value, in entry order (expired ones included, as :meth:`entries`)."""
        return (e[0] for e in self._data.values())

    def load(self, key: Any, value: Any, written_at: int, position: int | None = None) -> None:
        """Restore one entry; ``position``: its row in the snapshot (kept by :class:`TrackedKeyedState`)."""
        self._data[key] = [value, written_at]

    def encoded(self) -> tuple[pa.Array, pa.Array]:
        """Every entry's pickled key and value, in entry order."""
        return _pickle_column(list(self._data)), _pickle_column([e[0] for e in self._data.values()])


class TrackedKeyedState(KeyedState):
    """A :class:`KeyedState` whose snapshot pickles again only the entries changed since the last one.

    It keeps the key and value columns of the last snapshot, or of the snapshot it was restored from,
    and each unchanged entry's position in them; ``put``, ``delete``, ``clear`` and expiry forget an
    entry's position, and an owner that changes a value in place (a join side's rows of a join key) calls
    :meth:`touch`. A snapshot takes the unchanged entries' pickles from those columns (one Arrow
    ``take``, no Python object per entry) and pickles the others; its bytes are exactly those of a full one.
    """

    __slots__ = ("_pos", "_columns")

    def __init__(self, name: str, ttl_ms: int = 0) -> None:
        super().__init__(name, ttl_ms)
        #: key -> position of its unchanged pickles in ``_columns`` (keys, values)
        self._pos: dict[Any, int] = {}
        self._columns: tuple[pa.Array, pa.Array] | None = None

    def touch(self, key: Any) -> None:
        """``key``'s value was changed in place, or its entry was put or deleted through :meth:`rows`."""
        self._pos.pop(key, None)

    def rows(self) -> dict[Any, list]:
        """The store's own dict, key -> ``[value, written_at]``, for an owner's loop that reads and changes
        it directly; every key it puts, changes or deletes must then be :meth:`touch` ed."""
        return self._data

    def put(self, key: Any, value: Any, now: int) -> None:
        self._data[key] = [value, now]
        self._pos.pop(key, None)

    def delete(self, key: Any) -> None:         # also what an expired entry's get and expire call
        self._data.pop(key, None)
        self._pos.pop(key, None)

    def clear(self) -> None:
        self._data.clear()
        self._pos.clear()
        self._columns = None

    def adopt(self, keys: pa.Array, values: pa.Array) -> None:
        """The pickled key and value columns of the snapshot being restored: :meth:`load` gives each
        entry's position in them."""
        self._columns = (keys, values)

    def load(self, key: Any, value: Any, written_at: int, position: int | None = None) -> None:
        """Restore one entry; ``position``: its row in the columns given to :meth:`adopt`, so that the
        next snapshot pickles only the entries changed after the restore."""
        self._data[key] = [value, written_at]
        if position is None:
            self._pos.pop(key, None)
        else:
            self._pos[key] = position

    def encoded(self) -> tuple[pa.Array, pa.Array]:
        """Every entry's pickled key and value, in entry order (the changed ones pickled now)."""
        pos, data = self._pos, self._data
        order = [pos.get(k, -1) for k in data]
        base = self._columns
        if base is not None and len(pos) == len(data) and order == list(range(len(base[0]))):
            return base                                     # nothing changed since
        missing = [k for k, p in zip(data, order) if p < 0]
        parts_k, parts_v = ([base[0]], [base[1]]) if base is not None else ([], [])
        if missing:
            parts_k.append(_pickle_column(missing))
            parts_v.append(_pickle_column([data[k][0] for k in missing]))
        if not parts_k:
            keys = values = _pickle_column([])
        else:
            idx = np.fromiter(order, np.int64, len(order))
            if missing:                                     # the new pickles come after the kept ones
                idx[idx < 0] = (len(base[0]) if base is not None else 0) + np.arange(len(missing), dtype=np.int64)
            take = pa.array(idx, pa.int64())
            keys = pa.concat_arrays(parts_k).take(take) if len(parts_k) > 1 else parts_k[0].take(take)
            values = pa.concat_arrays(parts_v).take(take) if len(parts_v) > 1 else parts_v[0].take(take)
        self._columns = (keys, values)
        self._pos = dict(zip(data, range(len(data))))
        return keys, values


# ---- value codec -------------------------------------------------------------------------------
# Keys and values are pickled (protocol 5): fast, and exact for the SQL scalar types rows carry
# (None, bool, int, float incl. NaN, str, bytes, Decimal, date/time types) and for the tuples,
# lists and dicts operators build from them. Unpickling is restricted to exactly those types (and
# the kernels' NaN, which pickles by name with its bits: ``_values.sql_nan``), so a snapshot cannot
# name any other class (no code runs on restore).

_ALLOWED_GLOBALS = {
    ("decimal", "Decimal"), ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"),
    ("datetime", "timedelta"), ("datetime", "timezone"), ("builtins", "bytearray"), ("builtins", "set"),
    ("builtins", "frozenset"), ("_codecs", "encode"), ("zoneinfo", "ZoneInfo"),
    ("changelake.operators._values", "sql_nan"),
}


def _reduce_zone(zone: zoneinfo.ZoneInfo):
    # Arrow gives tz-aware timestamps a ZoneInfo, whose own pickle goes through builtins.getattr;
    # by its key it is ZoneInfo(key), the same cached instance
    if zone.key is None:
        raise TypeError("a ZoneInfo read from a file has no key to restore it by")
    return zoneinfo.ZoneInfo, (zone.key,)


_DISPATCH = {**copyreg.dispatch_table, zoneinfo.ZoneInfo: _reduce_zone}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise StateError(f"state snapshot refers to {module}.{name}, which operator state never holds; "
                         "the snapshot is corrupt or was not written by changelake")


def _pickle_column(values: list) -> pa.Array:
    """Pickle each value (memo-free, so each one stands alone) into one large_binary column."""
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5)
    pickler.dispatch_table = _DISPATCH
    pickler.fast = True  # no memo: values are acyclic, and none may refer to another's memo
    offsets = [0]
    for v in values:
        try:
            pickler.dump(v)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise StateError(f"cannot snapshot a value of type {type(v).__name__}: {v!r} ({e}); "
                             "operator state holds only SQL scalar values and containers of them") from None
        offsets.append(out.tell())
    return pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), len(values),
        [None, pa.py_buffer(array.array("q", offsets)), pa.py_buffer(out.getbuffer())])


def encode_value(v: Any) -> bytes:
    return _pickle_column([v])[0].as_py()


def decode_value(data: bytes) -> Any:
    return _RestrictedUnpickler(io.BytesIO(data)).load()


_SNAPSHOT_SCHEMA = pa.schema([
    pa.field("state", pa.string(), nullable=False),
    pa.field("key", pa.large_binary(), nullable=False),
    pa.field("value", pa.large_binary(), nullable=False),
    pa.field("written_at", pa.int64(), nullable=False),
])


#: a snapshot of this many bytes or more has its buffers zstd-compressed (Arrow IPC's own buffer
#: compression: any Arrow reader reads them, and snapshots written before, uncompressed, read as they
#: were). A join bucket's pickled rows shrink ~4.7x (168 -> 36 KB for 1,250 rows), and every byte of a
#: snapshot crosses from the Python worker to the JVM, into RocksDB and the checkpoint's changelog at each
#: step of its bucket, and back at the next; below ~25 KB the ~0.45 ms compressing and reading back cost
#: more than the smaller state calls save: docs/state-design.md, "Snapshots compressed".
SNAPSHOT_COMPRESS_FROM = 32 * 1024


def snapshot_stores(operator: str, stores: list[KeyedState]) -> bytes:
    """Serialize ``stores`` to Arrow IPC stream bytes (format described in the module docstring)."""
    names, written = [], []
    key_parts, value_parts = [], []
    for store in stores:
        if not len(store):
            continue
        names.extend([store.name] * len(store))
        written.extend(store.written())
        k, v = store.encoded()
        key_parts.append(k)
        value_parts.append(v)
    keys = pa.concat_arrays(key_parts) if key_parts else _pickle_column([])
    values = pa.concat_arrays(value_parts) if value_parts else _pickle_column([])
    schema = _SNAPSHOT_SCHEMA.with_metadata({"operator": operator, "format": SNAPSHOT_FORMAT_VERSION})
    table = pa.Table.from_arrays(
        [pa.array(names, pa.string()), keys, values, pa.array(written, pa.int64())], schema=schema)
    return stream_bytes(table, SNAPSHOT_COMPRESS_FROM)


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
    names = table.column("state").to_pylist()
    written = table.column("written_at").to_pylist()
    key_column, value_column = table.column("key").combine_chunks(), table.column("value").combine_chunks()
    keys, values = _pickles(key_column), _pickles(value_column)
    # a tracked store keeps the snapshot's columns and each entry's position in them: its next snapshot
    # pickles only what changed
    tracked = False
    for store in stores:
        if isinstance(store, TrackedKeyedState):
            store.adopt(key_column, value_column)
            tracked = True
    for i, (name, w) in enumerate(zip(names, written)):
        store = by_name.get(name)
        if store is None:
            raise StateError(f"snapshot holds unknown state {name!r} for {operator}; "
                             f"known states: {sorted(by_name)} (a renamed state needs a migration)")
        store.load(keys.load(), values.load(), w, i if tracked else None)


def _pickles(arr: pa.Array) -> pickle.Unpickler:
    """One restricted unpickler over a whole binary column (pickles are self-delimiting)."""
    if len(arr) == 0:
        return _RestrictedUnpickler(io.BytesIO(b""))
    offsets = memoryview(arr.buffers()[1]).cast("q")  # large_binary: int64 offsets
    start, stop = offsets[arr.offset], offsets[arr.offset + len(arr)]
    data = memoryview(arr.buffers()[2])[start:stop]
    return _RestrictedUnpickler(io.BytesIO(data))


class StaleRetractions:
    """Applies the ``on_stale_retraction`` policy and counts every occurrence.

    A stale retraction is a -U/-D that finds no matching state: the state expired
    by TTL, or the row was never seen (input not in order, or started from an
    incomplete snapshot). ``warn`` logs and goes on as Flink does; ``fail`` raises
    :class:`StateError`. Either way it is counted into ``figures`` (the kernel's, published by its
    runner as ``changelake_stale_retractions_total``).
    """

    def __init__(self, operator: str, policy: StaleRetractionPolicy, figures: Figures | None = None) -> None:
        if policy not in ("warn", "fail"):
            raise ConfigError(f"on_stale_retraction must be 'warn' or 'fail', got {policy!r}")
        self.operator = operator
        self.policy = policy
        self.count = 0
        self.figures = Figures() if figures is None else figures

    def __call__(self, describe: Callable[[], str]) -> None:
        self.count += 1
        self.figures["stale_retractions", self.operator] += 1
        if self.policy == "fail":
            raise StateError(f"{self.operator}: {describe()}. The state expired (raise the state TTL) or the "
                             "input is missing earlier changes; set on_stale_retraction: warn to skip such rows")
        if self.count <= 10 or self.count % 1000 == 0:
            log.warning("%s: %s (stale retraction #%d, skipped)", self.operator, describe(), self.count)


def check_ttl(name: str, ttl_ms: int) -> int:
    if not isinstance(ttl_ms, int) or ttl_ms < 0:
        raise ConfigError(f"{name}: state_ttl_ms must be an integer >= 0 (0 disables TTL), got {ttl_ms!r}")
    return ttl_ms
