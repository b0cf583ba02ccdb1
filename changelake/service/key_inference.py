"""Primary keys of tables that configure none: taken from the Kafka message keys.

A table without ``primary_key`` gets its key from the first micro-batch that has
messages for it: the field names of their message keys (see
:mod:`changelake.formats.message_key`). Every message of that batch must have a
key and all keys must name the same fields, else the batch fails with an error
that says which message and how to fix it. The learnt key is stored with the
table (the Delta table property ``changelake.primaryKey`` that the sink writes
when it creates the table), so a restart uses the same key without learning it
again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import pyarrow as pa
from deltalake import DeltaTable

from changelake.connectors.delta_sink_schema import PROP_PRIMARY_KEY
from changelake.errors import DecodeError
from changelake.service.config import ChangelakeConfig

log = logging.getLogger(__name__)


class TableKeys:
    """The primary key of every table: configured, recorded in the Delta table, or learnt."""

    def __init__(self, config: ChangelakeConfig) -> None:
        self._storage = config.storage.plain_options() or None
        self._keys: dict[str, tuple[str, ...] | None] = {}
        #: columns appended to a learnt key (a routed table's origin columns)
        self._extra: dict[str, tuple[str, ...]] = {}
        for t in config.tables:
            self.add(t.name, config.table_path(t.name), t.primary_key)

    def add(self, table: str, path: str, primary_key: list[str] | None, *, extra: tuple[str, ...] = ()) -> None:
        """Know ``table`` (a routed table is added when first seen): its key is ``primary_key`` plus ``extra``,
        else the key recorded in the Delta table at ``path``, else learnt from the message keys plus ``extra``."""
        self._extra[table] = tuple(extra)
        self._keys[table] = (tuple(primary_key) + tuple(extra)) if primary_key else _recorded_key(path, self._storage)

    def key_of(self, table: str) -> tuple[str, ...] | None:
        return self._keys[table]

    def unknown(self) -> set[str]:
        """Tables whose key is still to be learnt from message keys."""
        return {name for name, key in self._keys.items() if key is None}

    def learn(self, shapes: Mapping[str, list[pa.Table]]) -> None:
        """Learn the keys of tables still without one from this batch's key shapes (SHAPES_SCHEMA tables)."""
        for table, parts in shapes.items():
            if self._keys.get(table) is not None:
                continue
            rows = pa.concat_tables(parts).to_pylist()
            if not rows:
                continue
            keyless = next((r for r in rows if r["fields"] is None), None)
            if keyless is not None:
                raise DecodeError(
                    f"table {table!r} has no primary_key, so its key is taken from the Kafka message keys, but "
                    f"a message has no key (or a key that is not a struct of fields); set tables[].primary_key "
                    f"for {table!r} (a routed table: its route rule's primary_key)", reason="missing-key",
                    topic=keyless["topic"],
                    partition=keyless["partition"], offset=keyless["offset"])
            distinct = sorted({r["fields"] for r in rows})
            if len(distinct) > 1:
                where = "; ".join(f"{f} (first at {r['topic']}/{r['partition']}/{r['offset']})"
                                  for f in distinct for r in rows if r["fields"] == f)
                raise DecodeError(
                    f"table {table!r} has no primary_key and its messages' keys disagree: {where}; set "
                    f"tables[].primary_key for {table!r} (a routed table: its route rule's primary_key)",
                    reason="missing-key")
            key = tuple(json.loads(distinct[0]))
            if any(k.startswith("_") for k in key):
                raise DecodeError(f"table {table!r}: the message keys name reserved columns {list(key)} "
                                  f"(starting with '_'); set tables[].primary_key (a routed table: its route rule's "
                                  "primary_key)", reason="missing-key")
            key += tuple(c for c in self._extra.get(table, ()) if c not in key)
            log.info("table %s: primary key %s taken from the message keys", table, list(key))
            self._keys[table] = key


def _recorded_key(path: str, storage: dict[str, str] | None) -> tuple[str, ...] | None:
    if not DeltaTable.is_deltatable(path, storage_options=storage):
        return None
    recorded = DeltaTable(path, storage_options=storage).metadata().configuration.get(PROP_PRIMARY_KEY)
    return tuple(json.loads(recorded)) if recorded else None
