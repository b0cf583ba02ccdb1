"""The dead-letter store: a Delta quarantine table of messages that could not be decoded.

Each row keeps the raw key and value bytes, the Kafka position, a bounded
``reason`` and the ``error`` text, plus the pipeline id and batch id. Appends
are idempotent per (pipeline id, checkpoint generation, batch id) through Delta transaction ids
(the batch's commit position, with the rule of :mod:`changelake.connectors.commits`), so a
batch replayed after a crash does not quarantine its messages twice, and a new checkpoint's
batches are written after an older one's. A commit that fails as a conflict (another writer's commit, or
this append's own commit whose reply the object store lost: delta-rs then finds its own transaction id
there) is checked again and retried, at most ``COMMIT_ATTEMPTS`` times; never appended twice.
"""

from __future__ import annotations

import time

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

from changelake.changelog import DEAD_LETTER_SCHEMA, commit_position
from changelake.connectors.commits import check_position
from changelake.connectors.delta_read import read_delta
from changelake.connectors.object_store import StoreBrownout

#: tries at one batch's append (a conflict is re-checked, then retried)
COMMIT_ATTEMPTS = 4

STORE_SCHEMA = DEAD_LETTER_SCHEMA.append(pa.field("source", pa.string())).append(
    pa.field("pipeline_id", pa.string())).append(pa.field("batch_id", pa.int64())).append(
    pa.field("table", pa.string()))


class DeadLetterStore:
    def __init__(self, path: str, *, pipeline_id: str, storage_options: dict[str, str] | None = None,
                 generation: int = 0, query: str = "") -> None:
        self.path = path
        self.pipeline_id = pipeline_id
        self.generation = generation
        # ``query``: which of the pipeline's two queries writes (``service.split``): its batch ids are its own
        self._app_id = f"changelake:{pipeline_id}:dead-letters{query}"
        self._storage_options = storage_options or None

    def append(self, letters: pa.Table, *, source: str | pa.Array, batch_id: int,
               table: str | pa.Array | None = None) -> bool:
        """Append ``letters`` (DEAD_LETTER_SCHEMA), each with the table it was meant for (None: none); False
        when this batch was already written. A store written before the ``table`` column existed gets it."""
        if letters.num_rows == 0:
            return False
        attempt, brownout = 0, StoreBrownout()
        while True:
            try:
                return self._append_once(letters, source=source, batch_id=batch_id, table=table)
            except CommitFailedError:
                attempt += 1
                if attempt == COMMIT_ATTEMPTS:
                    raise
                time.sleep(0.1 * 2 ** attempt)
            except OSError as exc:      # the store failing for a while: again, as the table sinks do
                wait = brownout.delay(exc)
                if wait is None:
                    raise
                brownout.sleep(wait)

    def _append_once(self, letters: pa.Table, *, source: str | pa.Array, batch_id: int,
                     table: str | pa.Array | None) -> bool:
        recorded = self._committed_version()
        if check_position(None if recorded < 0 else recorded, generation=self.generation, batch_id=batch_id,
                          what=f"the dead-letter table {self.path}") == "replay":
            return False
        version = commit_position(batch_id, self.generation)
        n = letters.num_rows
        src = source if isinstance(source, (pa.Array, pa.ChunkedArray)) else pa.array([source] * n, pa.string())
        meant = table if isinstance(table, (pa.Array, pa.ChunkedArray)) else pa.array([table] * n, pa.string())
        rows = letters.cast(DEAD_LETTER_SCHEMA).append_column("source", src) \
            .append_column("pipeline_id", pa.array([self.pipeline_id] * n, pa.string())) \
            .append_column("batch_id", pa.array([batch_id] * n, pa.int64())).append_column("table", meant)
        write_deltalake(self.path, rows.cast(STORE_SCHEMA), mode="append", schema_mode="merge",
                        storage_options=self._storage_options,
                        commit_properties=CommitProperties(app_transactions=[Transaction(self._app_id, version)]))
        return True

    def _committed_version(self) -> int:
        if not DeltaTable.is_deltatable(self.path, storage_options=self._storage_options):
            return -1
        version = DeltaTable(self.path, storage_options=self._storage_options).transaction_version(self._app_id)
        return -1 if version is None else version

    def read(self) -> pa.Table:
        """Every letter of the store (STORE_SCHEMA; empty when there is no table). A store written before the
        ``table`` column existed reads it as null."""
        if not DeltaTable.is_deltatable(self.path, storage_options=self._storage_options):
            return STORE_SCHEMA.empty_table()
        kept = read_delta(self.path, storage_options=self._storage_options)
        return pa.table({f.name: kept[f.name].cast(f.type) if f.name in kept.column_names
                         else pa.nulls(kept.num_rows, f.type) for f in STORE_SCHEMA})
