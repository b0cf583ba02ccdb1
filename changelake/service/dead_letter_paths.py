"""Where each source's dead letters go: the Delta quarantine table or a Kafka topic.

``sources[].dead_letter_topic``, else ``dead_letter.topic``, names the topic; a
source with neither writes to the Delta table at ``dead_letter.path``. Both
destinations write a batch's letters once per (pipeline id, batch id).
"""

from __future__ import annotations

import pyarrow as pa

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.dead_letter_topic import LETTER_SCHEMA, DeadLetterTopic
from changelake.connectors.dead_letters import DeadLetterStore
from changelake.service.config import ChangelakeConfig


def ledger_path(config: ChangelakeConfig) -> str:
    """The Delta table recording which batches' dead letters were produced to Kafka."""
    return config.dead_letter_path().rstrip("/") + "_topic_ledger"


class DeadLetterPaths:
    def __init__(self, config: ChangelakeConfig, *, query: str = "") -> None:
        storage = config.storage.plain_options() or None
        self._topic_of = {s.name: config.dead_letter_topic(s.name) for s in config.sources}
        self.store = DeadLetterStore(config.dead_letter_path(), pipeline_id=config.pipeline.id,
                                     storage_options=storage, query=query)
        self.topic = DeadLetterTopic(bootstrap_servers=config.kafka.bootstrap_servers,
                                     properties=config.kafka.plain_properties(), pipeline_id=config.pipeline.id,
                                     ledger_path=ledger_path(config), storage_options=storage, query=query)

    def write(self, letters: list[tuple[str, pa.Table, str | None] | tuple[str, pa.Table]], *, batch_id: int) -> None:
        """Write one batch's dead letters, given as (source name, DEAD_LETTER_SCHEMA table, the table they were
        meant for or None) triples; a pair means no table."""
        letters = [(s[0], s[1], s[2] if len(s) > 2 else None) for s in letters]
        to_table = [(s, t, n) for s, t, n in letters if self._topic_of[s] is None and t.num_rows]
        to_topic = [(s, t, n) for s, t, n in letters if self._topic_of[s] is not None and t.num_rows]
        if to_table:
            self.store.append(_concat(to_table), source=_repeat(to_table, lambda s, n: s),
                              table=_repeat(to_table, lambda s, n: n), batch_id=batch_id)
        if to_topic:
            table = _concat(to_topic).append_column("source", _repeat(to_topic, lambda s, n: s)) \
                .append_column("dead_letter_topic", _repeat(to_topic, lambda s, n: self._topic_of[s])) \
                .cast(LETTER_SCHEMA).append_column("table", _repeat(to_topic, lambda s, n: n))
            self.topic.write(table, batch_id=batch_id)


def _concat(letters: list[tuple[str, pa.Table, str | None]]) -> pa.Table:
    return pa.concat_tables([t.cast(DEAD_LETTER_SCHEMA) for _, t, _ in letters])


def _repeat(letters: list[tuple[str, pa.Table, str | None]], value) -> pa.Array:
    return pa.array([value(s, n) for s, t, n in letters for _ in range(t.num_rows)], pa.string())
