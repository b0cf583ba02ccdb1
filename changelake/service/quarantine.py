"""Sources quarantined by an incompatible writer schema; the other sources keep going.

A decoder that reads its columns from writer schemas (Debezium Avro without
declared ``columns``) turns every message into a ``schema-incompatible`` dead
letter from the batch in which an incompatible writer schema first appears (see
:mod:`changelake.formats.debezium_avro`). Here the pipeline:

* gives each such decoder the columns and key of the table it writes to, when the
  table exists, so that after a restart the first writer schema is checked
  against the table rather than taken as it is;
* logs one error per quarantined source, saying what changed and how to fix it;
* sets ``changelake_table_quarantined{table}`` to 1 (the dead letters themselves
  are counted in ``changelake_dead_letters_total{reason="schema-incompatible"}``).

The quarantine lasts until the process restarts; a restart without a fix
quarantines the source again at its first incompatible message.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from changelake import metrics
from changelake.service.config import ChangelakeConfig
from changelake.service.key_inference import TableKeys

log = logging.getLogger(__name__)

REASON = "schema-incompatible"


class Quarantine:
    def __init__(self, config: ChangelakeConfig, routes: Sequence[Any], keys: TableKeys) -> None:
        storage = config.storage.plain_options() or None
        self.sources: set[str] = set()
        for t in config.tables:
            metrics.TABLE_QUARANTINED.labels(table=t.name).set(0)
        self._storage = storage
        for route in routes:
            if route.spec.table is None:          # feeds only the operator graph, or routed: declared columns
                continue
            self.adopt(route, config.table_path(route.spec.table), keys.key_of(route.spec.table))

    def adopt(self, route: Any, path: str, key: tuple[str, ...] | None) -> None:
        """Give the route's decoder the columns and key of its table at ``path``, when it exists."""
        adopt = getattr(route.decoder, "adopt_table", None)
        if adopt is not None and DeltaTable.is_deltatable(path, storage_options=self._storage):
            schema = pa.schema(DeltaTable(path, storage_options=self._storage).schema().to_arrow())
            adopt(pa.schema([f for f in schema if not f.name.startswith("_")]), key or ())
        metrics.TABLE_QUARANTINED.labels(table=route.spec.table).set(0)

    def observe(self, route: Any, dead_letters: pa.Table) -> None:
        """Note the source of ``route`` as quarantined when its dead letters say so."""
        incompatible = dead_letters.filter(pc.equal(dead_letters["reason"], REASON))
        if incompatible.num_rows == 0 or route.spec.name in self.sources:
            return
        self.sources.add(route.spec.name)
        if route.spec.table is not None:
            metrics.TABLE_QUARANTINED.labels(table=route.spec.table).set(1)
        log.error("source %s is quarantined, table %s receives none of its changes until a restart: %s",
                  route.spec.name, route.spec.table, incompatible["error"][0].as_py())
