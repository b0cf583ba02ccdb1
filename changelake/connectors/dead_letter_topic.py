"""Dead letters to a Kafka topic, once per (pipeline id, checkpoint generation, batch id).

Each dead letter is produced with its raw key and value bytes (and the original
timestamp) and these headers, all UTF-8 text:

==========================  ====================================================
header                      value
==========================  ====================================================
``changelake.reason``       the bounded reason (``malformed``, ``schema-mismatch``, ...)
``changelake.error``        the error text: what is wrong and what to fix
``changelake.topic``        topic the message was read from
``changelake.partition``    its partition (decimal)
``changelake.offset``       its offset (decimal)
``changelake.source``       the pipeline source (``sources[].name``) that read it
``changelake.table``        the table it was meant for (absent when none: a routed message no rule took)
``changelake.pipeline``     the pipeline id
``changelake.batch``        the micro-batch id (decimal)
``changelake.generation``   the checkpoint's generation (decimal; absent: 0, before generations)
==========================  ====================================================

Exactly once per batch::

    ledger records batch b's commit position (Delta txn, app id changelake:<pipeline>:dead-letter-topic;
        changelog.commit_position) -> skip (replay); a position ahead of b's -> refuse (connectors.commits)
    first batch of this process: the topic already holds letters of (pipeline, generation, b) -> record b, skip
    begin Kafka transaction (transactional.id changelake-<pipeline>-dead-letters)
      produce every letter of the batch
    commit the transaction; record b and the end offsets in the ledger

A crash before the Kafka commit leaves an open transaction, which the next
producer with the same transactional.id aborts: readers with
``isolation.level=read_committed`` never see it. A crash after the Kafka commit
and before the ledger write is found by reading the topic from the end offsets
the ledger last recorded (only what was written since), so the replayed batch
is not produced twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from changelake.changelog import DEAD_LETTER_SCHEMA, commit_position
from changelake.connectors.commits import check_position
from changelake.connectors.delta_read import read_delta
from changelake.errors import SinkCommitError

log = logging.getLogger(__name__)

HEADER_PREFIX = "changelake."
LEDGER_SCHEMA = pa.schema([pa.field("batch_id", pa.int64()), pa.field("topic", pa.string()),
                           pa.field("partition", pa.int32()), pa.field("end_offset", pa.int64())])
#: columns of the letters handed to :meth:`DeadLetterTopic.write`
#: (and optionally ``table``, string: the table a letter was meant for, null for none)
LETTER_SCHEMA = DEAD_LETTER_SCHEMA.append(pa.field("source", pa.string())).append(
    pa.field("dead_letter_topic", pa.string()))
#: what :func:`read_letters` returns (``timestamp`` as epoch ms here)
READ_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                         pa.field("offset", pa.int64()), pa.field("timestamp", pa.int64()),
                         pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("reason", pa.string()),
                         pa.field("error", pa.string()), pa.field("source", pa.string()),
                         pa.field("table", pa.string()), pa.field("batch_id", pa.int64()),
                         pa.field("store", pa.string())])
_TIMEOUT_S = 60


def letter_headers(letter: Mapping[str, Any], *, pipeline_id: str, batch_id: int,
                   generation: int = 0, query: str = "") -> list[tuple[str, bytes]]:
    """Kafka headers of one dead letter (a row of LETTER_SCHEMA as a dict); ``query``: which of the
    pipeline's queries wrote it when it runs two (``service.split``; its batch ids are its own)."""
    fields = {"reason": letter["reason"], "error": letter["error"], "topic": letter["topic"],
              "partition": letter["partition"], "offset": letter["offset"], "source": letter["source"],
              "pipeline": pipeline_id, "batch": batch_id, "generation": generation}
    if query:
        fields["query"] = query
    if letter.get("table"):
        fields["table"] = letter["table"]
    return [(HEADER_PREFIX + k, str(v).encode()) for k, v in fields.items()]


def header_dict(headers: list[tuple[str, bytes]] | None) -> dict[str, str]:
    """changelake's headers of a consumed dead letter, without the prefix: {'reason': ..., 'offset': ...}."""
    return {k[len(HEADER_PREFIX):]: (v or b"").decode() for k, v in headers or () if k.startswith(HEADER_PREFIX)}


class DeadLetterTopic:
    """Produces dead letters to Kafka topics in one transaction per batch."""

    def __init__(self, *, bootstrap_servers: str, properties: Mapping[str, str], pipeline_id: str,
                 ledger_path: str, storage_options: Mapping[str, str] | None = None, generation: int = 0,
                 query: str = "") -> None:
        self.pipeline_id = pipeline_id
        self.generation = generation
        self.ledger_path = ledger_path
        #: the pipeline's query that writes (``service.split``): its own app id, transactional id and header
        self.query = query
        self._app_id = f"changelake:{pipeline_id}:dead-letter-topic{query}"
        self._client_conf = {"bootstrap.servers": bootstrap_servers, "log_level": 3, **properties}
        self._storage_options = dict(storage_options) if storage_options else None
        self._producer: Any = None
        self._recovered = False

    def write(self, letters: pa.Table, *, batch_id: int) -> bool:
        """Produce ``letters`` (LETTER_SCHEMA); False when this batch's letters are already in Kafka."""
        if letters.num_rows == 0:
            return False
        recorded = self._recorded_batch()
        if check_position(None if recorded < 0 else recorded, generation=self.generation, batch_id=batch_id,
                          what=f"the dead-letter ledger {self.ledger_path}") == "replay":
            return False
        topics = pc.unique(letters["dead_letter_topic"]).to_pylist()
        if not self._recovered:
            self._recovered = True
            found = self._committed_before_crash(topics, batch_id)
            if found is not None:
                log.warning("dead letters of batch %d were already in Kafka (the process stopped before "
                            "recording them); not producing them again", batch_id)
                self._record(batch_id, found)
                return False
        self._record(batch_id, self._produce(letters, batch_id))
        return True

    # --- producing ----------------------------------------------------------------

    def _produce(self, letters: pa.Table, batch_id: int) -> dict[tuple[str, int], int]:
        from confluent_kafka import KafkaException

        producer = self._transactional_producer()
        ends: dict[tuple[str, int], int] = {}
        errors: list[str] = []

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                key = (msg.topic(), msg.partition())
                ends[key] = max(ends.get(key, -1), msg.offset() + 1)

        producer.begin_transaction()
        try:
            for letter in letters.to_pylist():
                ts = letter["timestamp"]
                producer.produce(letter["dead_letter_topic"], key=letter["key"], value=letter["value"],
                                 headers=letter_headers(letter, pipeline_id=self.pipeline_id, batch_id=batch_id,
                                                        generation=self.generation, query=self.query),
                                 timestamp=int(ts.timestamp() * 1000) if ts is not None else 0,
                                 on_delivery=delivered)
                producer.poll(0)
            producer.flush(_TIMEOUT_S)
            if errors:
                raise SinkCommitError(f"{len(errors)} dead letter(s) of batch {batch_id} could not be produced "
                                      f"(first: {errors[0]}); the batch will be retried")
            producer.commit_transaction(_TIMEOUT_S)
        except (KafkaException, SinkCommitError) as exc:
            try:
                producer.abort_transaction(_TIMEOUT_S)
            except KafkaException:
                self._producer = None     # a fatal producer error: start over with a new producer
            if isinstance(exc, SinkCommitError):
                raise
            raise SinkCommitError(f"the dead-letter transaction of batch {batch_id} failed: {exc}; "
                                  "the batch will be retried") from exc
        return ends

    def _transactional_producer(self) -> Any:
        if self._producer is None:
            from confluent_kafka import Producer

            producer = Producer({**self._client_conf,
                                 "transactional.id": f"changelake-{self.pipeline_id}-dead-letters{self.query}"})
            producer.init_transactions(_TIMEOUT_S)      # aborts a transaction a crashed process left open
            self._producer = producer
        return self._producer

    # --- the ledger ---------------------------------------------------------------

    def _recorded_batch(self) -> int:
        if not DeltaTable.is_deltatable(self.ledger_path, storage_options=self._storage_options):
            return -1
        version = DeltaTable(self.ledger_path, storage_options=self._storage_options).transaction_version(
            self._app_id)
        return -1 if version is None else version

    def _record(self, batch_id: int, ends: Mapping[tuple[str, int], int]) -> None:
        rows = sorted(ends.items())
        table = pa.table({"batch_id": pa.array([batch_id] * len(rows), pa.int64()),
                          "topic": [t for (t, _), _ in rows], "partition": pa.array([p for (_, p), _ in rows], pa.int32()),
                          "end_offset": pa.array([e for _, e in rows], pa.int64())}, schema=LEDGER_SCHEMA)
        write_deltalake(self.ledger_path, table, mode="append", storage_options=self._storage_options,
                        commit_properties=CommitProperties(app_transactions=[
                            Transaction(self._app_id, commit_position(batch_id, self.generation))]))

    def _recorded_ends(self) -> dict[tuple[str, int], int]:
        if not DeltaTable.is_deltatable(self.ledger_path, storage_options=self._storage_options):
            return {}
        ledger = read_delta(self.ledger_path, storage_options=self._storage_options)
        ends: dict[tuple[str, int], int] = {}
        for t, p, e in zip(ledger["topic"].to_pylist(), ledger["partition"].to_pylist(),
                           ledger["end_offset"].to_pylist()):
            ends[(t, p)] = max(ends.get((t, p), 0), e)
        return ends

    # --- recovery -----------------------------------------------------------------

    def _committed_before_crash(self, topics: list[str], batch_id: int) -> dict[tuple[str, int], int] | None:
        """End offsets of this pipeline's letters of ``batch_id`` found in ``topics`` after the ledger's
        last recorded offsets, or None when there are none."""
        ends: dict[tuple[str, int], int] = {}
        want = {"pipeline": self.pipeline_id, "batch": str(batch_id), "generation": str(self.generation)}
        for msg in read_topics(self._client_conf, topics, start=self._recorded_ends()):
            h = header_dict(msg.headers())
            if (h.get("pipeline") == want["pipeline"] and h.get("batch") == want["batch"]
                    and h.get("generation", "0") == want["generation"] and h.get("query", "") == self.query):
                key = (msg.topic(), msg.partition())
                ends[key] = max(ends.get(key, -1), msg.offset() + 1)
        return ends or None


def read_letters(client_conf: Mapping[str, Any], topics: list[str], *, pipeline_id: str) -> pa.Table:
    """The committed dead letters of ``pipeline_id`` in ``topics`` (LETTER_SCHEMA minus ``dead_letter_topic``,
    plus ``table``, ``batch_id`` and ``store``: the dead-letter topic it is in), positions from the headers."""
    rows = []
    for msg in read_topics(client_conf, topics):
        h = header_dict(msg.headers())
        if h.get("pipeline") != pipeline_id:
            continue
        kind, ms = msg.timestamp()
        rows.append({"topic": h.get("topic"), "partition": _int(h.get("partition")), "offset": _int(h.get("offset")),
                     "timestamp": ms if kind else None, "key": msg.key(), "value": msg.value(),
                     "reason": h.get("reason", ""), "error": h.get("error", ""), "source": h.get("source"),
                     "table": h.get("table"), "batch_id": _int(h.get("batch")), "store": msg.topic()})
    return pa.Table.from_pylist(rows, schema=READ_SCHEMA)


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.lstrip("-").isdigit() else None


def read_topics(client_conf: Mapping[str, Any], topics: list[str], *,
                start: Mapping[tuple[str, int], int] | None = None) -> Iterator[Any]:
    """Every committed message of ``topics`` (read_committed), from ``start`` offsets (else the low
    watermark) to the end of each partition."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    start = start or {}
    consumer = Consumer({**client_conf, "group.id": "changelake-dead-letter-reader", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        metadata = consumer.list_topics(timeout=_TIMEOUT_S)
        assignment = [TopicPartition(t, p, start.get((t, p), OFFSET_BEGINNING))
                      for t in topics if t in metadata.topics for p in metadata.topics[t].partitions]
        if not assignment:
            return
        consumer.assign(assignment)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        deadline = time.monotonic() + _TIMEOUT_S
        while pending:
            if time.monotonic() > deadline:
                raise SinkCommitError(f"reading dead-letter topics {topics} timed out after {_TIMEOUT_S}s")
            for msg in consumer.consume(1000, timeout=0.5):
                err = msg.error()
                if err is None:
                    yield msg
                elif err.code() == err._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                else:
                    raise SinkCommitError(f"reading dead-letter topic {msg.topic()} failed: {err}")
    finally:
        consumer.close()
