"""What every kernel shares: the batch entry points, snapshot/restore, mini-batch buffering.

Lifecycle of a kernel (one instance holds the state of many keys)::

    op = SomeKernel(config)                 # or SomeKernel.restore(config, snapshot_bytes)
    out = op.process(batch, now=t)          # Changes or an Arrow changelog table in, Changes out
    out = op.on_watermark(wm, now=t)        # flushes a pending mini-batch bundle (the caller forwards wm)
    out = op.finish(now=t)                  # end of input: flushes a pending bundle
    data = op.snapshot()                    # bytes; restore() with the same config continues exactly
    op.expire(now=t)                        # explicit state cleanup of TTL-expired entries

``now`` is the processing-time clock (ms) used for state TTL only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Self, TypeVar

import pyarrow as pa

from changelake.errors import ConfigError
from changelake.metrics import Figures
from changelake.operators._rows import Changes, coerce
from changelake.operators._state import KeyedState, restore_stores, snapshot_stores

K = TypeVar("K", bound="Kernel")

#: State name of a pending (not yet fired) mini-batch bundle.
MINI_BATCH_BUFFER = "mini-batch-buffer"


class MiniBatchBuffer:
    """Count-triggered bundle: rows are held until ``size`` are pending (checked after each row).

    Entries are ``(tag, kind, row)``; the tag is the input side for two-input operators.
    The pending rows are part of the snapshot (store :data:`MINI_BATCH_BUFFER`).
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or size < 1:
            raise ConfigError(f"mini_batch size must be an integer >= 1, got {size!r}")
        self.size = size
        self.store = KeyedState(MINI_BATCH_BUFFER)
        self._pending: list[tuple] = []

    def feed(self, tag: str, batch: Changes) -> Iterator[list[tuple]]:
        """Add ``batch``; yields each bundle that fills up, in order."""
        for kind, row in batch:
            self._pending.append((tag, kind, row))
            if len(self._pending) >= self.size:
                yield self.drain()

    def drain(self) -> list[tuple]:
        out, self._pending = self._pending, []
        return out

    def __len__(self) -> int:
        return len(self._pending)

    def sync_store(self) -> None:
        self.store.clear()
        for i, entry in enumerate(self._pending):
            self.store.load(i, entry, 0)

    def load_store(self) -> None:
        self._pending = [v for _, v, _ in sorted(self.store.entries(), key=lambda e: e[0])]


class Kernel:
    """Base of the single-input kernels (the join adds a ``side`` argument)."""

    OPERATOR: ClassVar[str] = "kernel"

    def __init__(self) -> None:
        self._stores: list[KeyedState] = []
        self.mini_batch: MiniBatchBuffer | None = None
        #: counts made since :meth:`take_figures` (stale retractions, corrections): published by the runner
        self.figures = Figures()

    def take_figures(self) -> Figures:
        """The figures counted since the last call, and reset them."""
        out = Figures(self.figures)
        self.figures.clear()
        return out

    def _register(self, store: KeyedState) -> KeyedState:
        self._stores.append(store)
        return store

    # -- entry points ---------------------------------------------------------------------------
    def process(self, batch, *, now: int = 0) -> Changes:
        batch = coerce(batch)
        out = Changes()
        if self.mini_batch is None:
            self._process_rows(batch, now, out)
        else:
            for bundle in self.mini_batch.feed("in", batch):
                self._process_bundle(bundle, now, out)
        return out

    def _process_arrow_bundles(self, batch, now: int, fold) -> Changes:
        """Vectorised mini-batch entry: ``fold(bundle_table, now, out)`` handles each full bundle of an
        Arrow batch (nothing may be pending); a trailing partial bundle goes to the pending buffer."""
        table = pa.table(batch) if isinstance(batch, pa.RecordBatch) else batch
        out = Changes()
        size = self.mini_batch.size
        full = (table.num_rows // size) * size
        for start in range(0, full, size):
            fold(table.slice(start, size), now, out)
        if full < table.num_rows:
            out.extend(Kernel.process(self, table.slice(full), now=now))
        return out

    def rebundle(self, size: int) -> None:
        """Go on with mini-batch bundles of ``size`` rows, exactly as a kernel restored from this one's
        snapshot with ``mini_batch_size=size`` would (the Spark binding folds each bucket's share of a
        micro-batch as one bundle; a pending bundle fires once ``size`` rows are pending)."""
        if self.mini_batch is not None:
            self.mini_batch.size = size

    def on_watermark(self, watermark: int, *, now: int = 0) -> Changes:
        return self.flush(now=now)

    def finish(self, *, now: int = 0) -> Changes:
        return self.flush(now=now)

    def flush(self, *, now: int = 0) -> Changes:
        out = Changes()
        if self.mini_batch is not None and len(self.mini_batch):
            self._process_bundle(self.mini_batch.drain(), now, out)
        return out

    # -- subclass hooks ---------------------------------------------------------------------------
    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        """Row-at-a-time semantics over a whole batch (non-mini-batch operators)."""
        raise NotImplementedError(f"{type(self).__name__} has no row-at-a-time mode")

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        """Mini-batch semantics over one fired bundle of ``(tag, kind, row)``."""
        raise NotImplementedError(f"{type(self).__name__} has no mini-batch mode")

    # -- state --------------------------------------------------------------------------------------
    def _all_stores(self) -> list[KeyedState]:
        stores = list(self._stores)
        if self.mini_batch is not None:
            self.mini_batch.sync_store()
            stores.append(self.mini_batch.store)
        return stores

    def snapshot(self) -> bytes:
        """All keyed state (and a pending mini-batch bundle) as bytes; see ``_state``.

        """
        return snapshot_stores(self.OPERATOR, self._all_stores())

    @classmethod
    def restore(cls, config, data: bytes) -> Self:
        """A new kernel for ``config`` continuing from a :meth:`snapshot`."""
        op = cls(config)
        restore_stores(cls.OPERATOR, data, op._all_stores())
        if op.mini_batch is not None:
            op.mini_batch.load_store()
        return op

    def expire(self, *, now: int) -> int:
        """Explicit cleanup: drop every TTL-expired entry; returns how many were dropped."""
        return sum(s.expire(now) for s in self._stores)

    @property
    def state_rows(self) -> int:
        """Entries held in keyed state (keys, or rows for the join)."""
        return sum(len(s) for s in self._stores)
