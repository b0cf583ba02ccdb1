"""One running instance per pipeline: a lease in the lake, taken at start, renewed, checked before every batch.

The lease is a small Delta table, ``<storage.root>/_changelake_leases/<pipeline id>``, with no rows: every
take, renewal and release is one commit whose commit info names the holder (``changelake.lease``: owner,
host, pid, time, event). A Delta commit is a put-if-absent of the next log version (a link on a local or
mounted filesystem, ``If-None-Match: *`` on S3: ``connectors.object_store``), and changelake commits the
lease with no retry, so of two instances committing the same version one wins and the other is told so:
the log is the lease's fencing token. At start (:meth:`Lease.acquire`), from the newest lease commit::

    newest lease commit                                      this instance
    none, or a release                                       takes the lease
    older than lease_ttl (its holder stopped renewing)       takes it over (logged, naming the holder)
    by a process of this host that is gone, or with this     takes it over (a restart after a crash or
      process's pid (an earlier life of this container)        SIGKILL, without waiting for the ttl)
    by another live holder, within lease_ttl                 refuses to start: LeaseHeld, naming the holder
    two instances commit the same version at once            one takes it, the other refuses

While it runs, a thread renews the lease every third of ``lease_ttl``, and :meth:`Lease.check` runs before
each batch writes anything (tables, dead letters, ledger): a lease commit by anyone else since this
instance's last one means another instance took over, and the batch stops with :class:`LeaseLost` before
its first write, so no table or checkpoint is written by both; an idle instance whose renewal finds the
lease taken stops its query between batches (``service.runner``). A graceful stop releases the lease.
``changelake_lease_state{state}`` is 1 for the state the lease is in (:data:`STATES`: held, renewal_failing,
lost) and ``changelake_lease_renewed_timestamp_seconds`` says when it was last committed.

The object store failing for a while (a renewal's PUT refused, 5xx, timeouts) does not stop a batch: no other
instance may take the lease before ``lease_ttl`` has passed since this one's last renewal, so :meth:`Lease.check`
lets the batch write until then (state ``renewal_failing``, a warning) and stops it with the store's error
after. A renewal the store applied but whose reply was lost is this instance's own newest commit: it is taken
as held, not as a takeover.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from changelake import metrics
from changelake.durations import parse_duration
from changelake.errors import ChangelakeError

__all__ = ["Holder", "Lease", "LeaseHeld", "LeaseLost", "STATES", "lease_path", "newest_holder"]

log = logging.getLogger(__name__)

#: The commit-info key of a lease commit.
KEY = "changelake.lease"
LEASES_DIR = "_changelake_leases"
_SCHEMA = pa.schema([pa.field("owner", pa.string())])
_DOC = 'docs/operations.md, "One instance per pipeline"'
#: the values of ``changelake_lease_state{state}`` (one of them 1 while the run holds or held the lease)
STATES = ("held", "renewal_failing", "lost")


def _set_state(pipeline_id: str, state: str) -> None:
    for s in STATES:
        metrics.LEASE_STATE.labels(pipeline_id, s).set(1 if s == state else 0)


class LeaseHeld(ChangelakeError):
    """Another instance of the pipeline holds the lease: this one does not start."""


class LeaseLost(ChangelakeError):
    """Another instance took the lease over: this one stops before writing."""


@dataclass(frozen=True)
class Holder:
    owner: str
    host: str
    pid: int
    at: float
    event: str       # take | renew | release

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at))
        return f"{self.owner} (host {self.host}, pid {self.pid}; {self.event} at {when})"


def lease_path(root: str, pipeline_id: str) -> str:
    if "://" in root:
        return f"{root.rstrip('/')}/{LEASES_DIR}/{pipeline_id}"
    return str(Path(root) / LEASES_DIR / pipeline_id)


class Lease:
    """The lease of one pipeline (module docstring)."""

    def __init__(self, path: str, *, pipeline_id: str, ttl_s: float, storage_options: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.pipeline_id = pipeline_id
        self.ttl_s = ttl_s
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.owner = f"{self.host}:{self.pid}:{uuid.uuid4().hex[:8]}"
        self._options = dict(storage_options) if storage_options else None
        self._clock = clock
        self._lock = threading.Lock()
        self._version: int | None = None        # the log version of this instance's newest lease commit
        self._renewed = 0.0
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: DeltaTable | None = None

    @classmethod
    def for_config(cls, config) -> "Lease":
        return cls(lease_path(config.storage.root, config.pipeline.id), pipeline_id=config.pipeline.id,
                   ttl_s=parse_duration(config.pipeline.lease_ttl), storage_options=config.storage.plain_options())

    # --- start, run, stop ----------------------------------------------------------

    def acquire(self) -> None:
        """Take the lease, or raise :class:`LeaseHeld` (the rule of the module docstring)."""
        table = self._table()
        holder = _holder(table)
        if holder is not None and holder.event != "release" and holder.owner != self.owner:
            age = self._clock() - holder.at
            if self._gone(holder):
                log.warning("pipeline %s: taking over the lease of %s, a process of this host that is gone",
                            self.pipeline_id, holder.describe())
            elif age < self.ttl_s:
                raise LeaseHeld(
                    f"pipeline {self.pipeline_id} is already running: its lease {self.path} is held by "
                    f"{holder.describe()}, for {self.ttl_s - age:.0f} s more unless renewed. Two instances "
                    "would write the same checkpoint and tables; stop the other instance (or wait until its "
                    f"lease expires, pipeline.lease_ttl = {self.ttl_s:.0f} s, if it is gone) ({_DOC})")
            else:
                log.warning("pipeline %s: taking over the lease of %s, not renewed for %.0f s (lease_ttl %.0f s)",
                            self.pipeline_id, holder.describe(), age, self.ttl_s)
        try:
            self._commit(table, "take")
        except CommitFailedError:
            winner = _holder(self._table())
            raise LeaseHeld(f"pipeline {self.pipeline_id}: another instance took the lease {self.path} at the "
                            f"same moment: {winner.describe() if winner else 'unknown'}; this one does not start "
                            f"({_DOC})") from None
        log.info("pipeline %s: lease %s taken by %s (ttl %.0f s)", self.pipeline_id, self.path, self.owner,
                 self.ttl_s)

    @property
    def lost(self) -> str | None:
        """Why this instance lost the lease (another took it over), or None while it holds it."""
        return self._lost

    def start_renewing(self) -> None:
        """Renew the lease every third of its ttl from a daemon thread, until :meth:`release`."""
        def renew_loop() -> None:
            while not self._stop.wait(self.ttl_s / 3):
                try:
                    self.renew()
                except LeaseLost as exc:
                    log.error("%s", exc)
                    return
                except Exception:  # a store error: retried at the next tick, and by check() before a batch
                    _set_state(self.pipeline_id, "renewal_failing")
                    log.warning("pipeline %s: lease renewal failed; retrying", self.pipeline_id, exc_info=True)

        self._thread = threading.Thread(target=renew_loop, name="changelake-lease", daemon=True)
        self._thread.start()

    def check(self, batch_id: int) -> None:
        """Before batch ``batch_id`` writes: raise :class:`LeaseLost` when another instance took the lease over;
        renew it first when its last renewal is more than half a ttl old (the renewal thread was held up)."""
        with self._lock:
            if self._lost is None:
                table = self._table()
                if table.version() != self._version:
                    self._adopt_or_lose(table)
                elif self._clock() - self._renewed > self.ttl_s / 2:
                    try:
                        self._renew_locked(table)
                    except OSError:      # the store failing: no one may take the lease over before its ttl
                        if self._clock() - self._renewed >= self.ttl_s:
                            raise
                        _set_state(self.pipeline_id, "renewal_failing")
                        log.warning("pipeline %s: lease renewal failed before batch %d; the lease holds until "
                                    "%.0f s after its last renewal, so the batch goes on", self.pipeline_id,
                                    batch_id, self.ttl_s, exc_info=True)
            if self._lost is not None:
                raise LeaseLost(f"{self._lost}; batch {batch_id} was not written by this instance ({_DOC})")

    def renew(self) -> None:
        with self._lock:
            if self._lost is None:
                self._renew_locked(self._table())
            if self._lost is not None:
                raise LeaseLost(self._lost)

    def release(self) -> None:
        """Give the lease up (a graceful stop): the next instance starts at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            if self._lost is not None or self._version is None:
                return
            try:
                table = self._table()
                if table.version() == self._version:
                    self._commit(table, "release")
                    log.info("pipeline %s: lease %s released", self.pipeline_id, self.path)
            except Exception:  # the lease then expires after its ttl
                log.warning("pipeline %s: could not release the lease; it expires after %.0f s", self.pipeline_id,
                            self.ttl_s, exc_info=True)

    # --- helpers -------------------------------------------------------------------

    def _renew_locked(self, table: DeltaTable) -> None:
        if table.version() != self._version:
            return self._adopt_or_lose(table)
        try:
            self._commit(table, "renew")
        except CommitFailedError:
            self._lose(self._table())

    def _adopt_or_lose(self, table: DeltaTable) -> None:
        """The lease has a commit this instance did not see succeed: its own (a renewal whose reply was lost)
        keeps the lease; anyone else's took it over."""
        holder = _holder(table)
        if holder is not None and holder.owner == self.owner and holder.event != "release":
            self._version = table.version()
            self._renewed = holder.at
            _set_state(self.pipeline_id, "held")
            return
        self._lose(table)

    def _lose(self, table: DeltaTable) -> None:
        holder = _holder(table)
        self._lost = (f"pipeline {self.pipeline_id}: another instance took the lease {self.path} over: "
                      f"{holder.describe() if holder else 'unknown'} (this instance, {self.owner}, stops)")
        _set_state(self.pipeline_id, "lost")

    def _table(self) -> DeltaTable:
        """The lease table at its newest version (created on first use); the handle is kept and brought up to
        date incrementally, so a check reads only the commits since the last one."""
        if self._handle is not None:
            self._handle.update_incremental()
            return self._handle
        try:
            self._handle = DeltaTable(self.path, storage_options=self._options)
        except TableNotFoundError:
            DeltaTable.create(self.path, _SCHEMA, mode="ignore", storage_options=self._options,
                              configuration={"delta.logRetentionDuration": "interval 1 day"},
                              raise_if_key_not_exists=False)
            self._handle = DeltaTable(self.path, storage_options=self._options)
        return self._handle

    def _commit(self, table: DeltaTable, event: str) -> None:
        now = self._clock()
        info = {"owner": self.owner, "host": self.host, "pid": self.pid, "at": now, "event": event}
        write_deltalake(table, _SCHEMA.empty_table(), mode="append",
                        commit_properties=CommitProperties(custom_metadata={KEY: json.dumps(info)},
                                                           max_commit_retries=0))
        self._version = table.version()
        self._renewed = now
        _set_state(self.pipeline_id, "held" if event != "release" else "released")     # released: every state 0
        if event != "release":
            metrics.LEASE_RENEWED.set(now)

    def _gone(self, holder: Holder) -> bool:
        """A holder on this host whose process is gone, or that had this process's pid."""
        if holder.host != self.host:
            return False
        if holder.pid == self.pid:
            return True
        try:
            os.kill(holder.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def newest_holder(config) -> Holder | None:
    """The newest lease commit of ``config``'s pipeline, read without creating or writing anything (None: the
    lease was never taken); ``changelake status`` shows it."""
    try:
        table = DeltaTable(lease_path(config.storage.root, config.pipeline.id),
                           storage_options=config.storage.plain_options())
    except TableNotFoundError:
        return None
    return _holder(table)


def _holder(table: DeltaTable) -> Holder | None:
    """The newest lease commit's holder (None: the lease was never taken)."""
    for commit in table.history(1):
        raw = commit.get(KEY)
        if raw:
            data = json.loads(raw)
            return Holder(owner=str(data["owner"]), host=str(data["host"]), pid=int(data["pid"]),
                          at=float(data["at"]), event=str(data["event"]))
    return None
