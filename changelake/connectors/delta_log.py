"""A Delta table's commit files read directly, and a pipeline's transaction version kept up with them.

delta-rs's ``DeltaTable.transaction_version`` replays the log from its last checkpoint on every call: on an
object store that is one GET per commit since the checkpoint (up to ``delta.checkpointInterval``, 100 by
default), however recently the same handle answered, and after the handle's own load had read them. A sink
asks for it several times per batch, for its table and its tombstone table, so each batch read up to a few
hundred log files that had not changed, and a start's check each log twice (docs/benchmarks.md, "A batch's
log reads"). :class:`TxnVersions` asks delta-rs at most once per table, then reads
only the commits that came after the version it knows, one GET each: usually the sink's own last commit.
For a table it knows nothing of, it reads the newest few commits first, newest first: the first transaction
of the app id found there is the recorded one, without the replay.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from changelake.connectors.object_store import arrow_filesystem

__all__ = ["LogRead", "TxnVersions", "read_commit"]

log = logging.getLogger(__name__)

#: the most commits :class:`TxnVersions` reads itself to follow a table; further behind (another writer's burst
#: of commits), delta-rs's replay from the checkpoint reads no more than that
FOLLOW_AT_MOST = 20
#: the newest commits :class:`TxnVersions` reads for a table it knows nothing of: the sink's own last batch is
#: usually the newest, or behind a maintenance commit or two; none of them holding the app id's transaction
#: (a table written rarely, another writer's commits since), delta-rs replays the log
LOOK_BACK = 4


@dataclass(frozen=True)
class LogRead:
    """A table's log as another reader loaded it (the start's check, ``service.lifecycle``), for a sink to take
    up (``DeltaUpsertSink.adopt_logs``): the delta-rs handle, the transaction version of ``app_id`` at the
    handle's version, and for a tombstone table the key columns and ``_seq`` of its tombstones at that version
    as the delta-rs engine reads them (None: not read)."""

    table: DeltaTable
    app_id: str
    txn: int | None
    tombstones: pa.Table | None = None


def read_commit(fs: Any, root: str, version: int) -> list[dict] | None:
    """The actions of the table's commit ``version`` (``fs``, ``root``: ``object_store.arrow_filesystem`` of
    the table), one GET; None when the log no longer holds it (cleaned up after a checkpoint)."""
    try:
        with fs.open_input_stream(f"{root}/_delta_log/{version:020d}.json") as f:
            text = f.read().decode()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


class TxnVersions:
    """The transaction version of ``app_id`` in each table (by path), kept with the table version it holds at:
    a later version reads only the commits after the one it knows; a table not known yet, its newest few
    (module docstring)."""

    def __init__(self, app_id: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.app_id = app_id
        self._options = dict(storage_options) if storage_options else None
        self._known: dict[str, tuple[int, int | None]] = {}
        self._filesystems: dict[str, tuple[Any, str]] = {}

    def of(self, path: str, table: DeltaTable) -> int | None:
        """The transaction version recorded in ``table`` (the handle of ``path``) at the handle's version."""
        version = table.version()
        known = self._known.get(path)
        txn = self._followed(path, known, version) if known is not None else self._newest(path, version)
        if txn is _UNKNOWN:
            txn = table.transaction_version(self.app_id)
        self._known[path] = (version, txn)
        return txn

    def seed(self, path: str, version: int, txn: int | None) -> None:
        """What another reader found: ``txn`` at the table's ``version``."""
        self._known[path] = (version, txn)

    def forget(self) -> None:
        """Read every table's again from delta-rs (after a failed commit: the store may have changed)."""
        self._known.clear()

    def _followed(self, path: str, known: tuple[int, int | None], version: int) -> "int | None | object":
        at, txn = known
        if at == version:
            return txn
        if at > version or version - at > FOLLOW_AT_MOST:       # the table replaced, or far ahead
            return _UNKNOWN
        try:
            fs, root = self._filesystem(path)
            for v in range(at + 1, version + 1):
                actions = read_commit(fs, root, v)
                if actions is None:
                    return _UNKNOWN
                txn = self._txn_in(actions, txn)
        except Exception:  # any doubt: delta-rs reads it
            log.debug("%s: commits %d..%d not read; asking delta-rs", path, at + 1, version, exc_info=True)
            return _UNKNOWN
        return txn

    def _newest(self, path: str, version: int) -> "int | None | object":
        """The app id's transaction in the newest of the last :data:`LOOK_BACK` commits that holds one (the
        newest such action is the recorded version): a writer that commits every batch finds it in one GET."""
        try:
            fs, root = self._filesystem(path)
            for v in range(version, max(-1, version - LOOK_BACK), -1):
                actions = read_commit(fs, root, v)
                if actions is None:
                    return _UNKNOWN
                found = self._txn_in(actions, _UNKNOWN)
                if found is not _UNKNOWN:
                    return found
        except Exception:  # any doubt: delta-rs reads it
            log.debug("%s: newest commits not read; asking delta-rs", path, exc_info=True)
        return _UNKNOWN

    def _txn_in(self, actions: list[dict], otherwise: "int | None | object") -> "int | None | object":
        """The version of the app id's ``txn`` action among one commit's ``actions`` (a commit holds at most
        one per app id), else ``otherwise``."""
        for action in actions:
            found = action.get("txn")
            if isinstance(found, dict) and found.get("appId") == self.app_id:
                return int(found["version"])
        return otherwise

    def _filesystem(self, path: str) -> tuple[Any, str]:
        if path not in self._filesystems:
            self._filesystems[path] = arrow_filesystem(path, self._options)
        return self._filesystems[path]


_UNKNOWN = object()
