"""The progress table of consistent cuts: ``<storage.root>/_changelake_consistency``.

Delta has no transaction over several tables, so a batch's table commits land one by one. Once all of them
are in, the batch appends one row here: the source position every table is consistent to and each table's
Delta version at that point. A reader that time-travels each table to the versions of one row sees the
tables as the source database had them after one transaction (with ``consistency: transaction``), never
one table ahead of another (docs/pipelines.md, "Transaction-consistent tables").

==================  ===========================  ==============================================================
column              type                         meaning
==================  ===========================  ==============================================================
``batch_id``        bigint                       the micro-batch
``generation``      bigint                       the checkpoint generation that wrote it
``committed_at``    timestamp (UTC)              when the row was written (after the batch's table commits)
``transactions``    bigint                       source transactions applied in full so far
``last_transaction`` string                      id of the newest of them (null: none yet, or offset mode)
``source_position`` string                       where its END was read (``topic:partition:offset``)
``held_transactions`` bigint                     transactions read in part and held for a later batch
``held_rows``       bigint                       their changelog rows
``tables``          map<string, bigint>          table -> its Delta version consistent with this row
==================  ===========================  ==============================================================

The row is written once per (pipeline id, commit position) through a Delta app transaction, after every table
commit of the batch: a crash before it leaves the tables at most one batch ahead of the table's newest row, and
the replayed batch writes the row it missed (a batch's table commits are idempotent too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

SCHEMA = pa.schema([
    pa.field("batch_id", pa.int64(), nullable=False), pa.field("generation", pa.int64(), nullable=False),
    pa.field("committed_at", pa.timestamp("us", tz="UTC")), pa.field("transactions", pa.int64()),
    pa.field("last_transaction", pa.string()), pa.field("source_position", pa.string()),
    pa.field("held_transactions", pa.int64()), pa.field("held_rows", pa.int64()),
    pa.field("tables", pa.map_(pa.string(), pa.int64())),
])


@dataclass(frozen=True)
class Cut:
    """One batch's row of the progress table."""

    batch_id: int
    generation: int
    tables: Mapping[str, int]
    transactions: int = 0
    last_transaction: str | None = None
    source_position: str | None = None
    held_transactions: int = 0
    held_rows: int = 0
    released: int = 0          # transactions this batch applied (not in the table)
    split: int = 0             # transactions the limit split in this batch (not in the table)


class ConsistencyLog:
    """Appends the batches' cuts, once each (app id ``changelake:<pipeline id>:_changelake_consistency``)."""

    def __init__(self, path: str, *, pipeline_id: str, storage_options: Mapping[str, str] | None = None) -> None:
        self.path = path
        self.app_id = f"changelake:{pipeline_id}:_changelake_consistency"
        self._options = dict(storage_options or {}) or None

    def record(self, cut: Cut, *, version: int) -> bool:
        """Append ``cut`` unless commit position ``version`` is already recorded; True when written."""
        try:
            done = DeltaTable(self.path, storage_options=self._options).transaction_version(self.app_id)
        except Exception:            # no table yet (TableNotFoundError)
            done = None
        if done is not None and done >= version:
            return False
        row = pa.Table.from_pylist([{
            "batch_id": cut.batch_id, "generation": cut.generation, "committed_at": datetime.now(timezone.utc),
            "transactions": cut.transactions, "last_transaction": cut.last_transaction,
            "source_position": cut.source_position, "held_transactions": cut.held_transactions,
            "held_rows": cut.held_rows, "tables": sorted(cut.tables.items())}], schema=SCHEMA)
        write_deltalake(self.path, row, mode="append", storage_options=self._options,
                        commit_properties=CommitProperties(app_transactions=[Transaction(self.app_id, version)]))
        return True


def table_version(path: str, storage_options: Mapping[str, str] | None = None) -> int | None:
    """A Delta table's current version (None: no table there yet)."""
    try:
        return DeltaTable(path, storage_options=dict(storage_options or {}) or None).version()
    except Exception:
        return None
