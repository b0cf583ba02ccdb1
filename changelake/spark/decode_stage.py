"""Decoding in the executors: the raw Kafka records of a micro-batch are decoded in the Spark
tasks that read them (:func:`decoding_source`), so the driver only merges.

The read task decodes what it read, in the same Python process: the raw records never cross into
the JVM. Reading in one Python runner and decoding in a ``mapInArrow`` behind it sent every record's
bytes from Python to the JVM (as Spark rows) and back to Python (as Arrow): measured on 200,000
Debezium events, decoding in the read task took 0.6-0.75x the wall time of reading plus a
``mapInArrow`` (docs/benchmarks.md, "Decoding where the records are read").

A task's results travel to the driver as Arrow IPC streams in a binary column, a few
rows per task: converting millions of decoded rows into Spark rows and back costs far
more than decoding them (measured: 250k Debezium events took 15 s as Spark rows and
a few seconds as IPC payloads on 2 cores). Each output row is one payload:

=========  ==========================================================================
``part``   what the payload holds
=========  ==========================================================================
``stats``  per topic-partition counts of the task: records read, offsets expired upstream
``rows``   changelog rows of route ``_route`` (its decoder's ``output_schema``); for a route that
           feeds the operator graph, key changes split by its graph key (``graph_keys``, see
           :mod:`changelake.key_changes`) and only rows whose graph key is not null
``moves``  how many updates of route ``_route`` were key changes split here (one row, ``moves``):
           counted on the driver
``dl``     dead letters of route ``_route`` (raw bytes, position, reason, error), including the
           rows whose graph key is null (reason ``missing-key``): they never reach a kernel
``trunc``  truncates of route ``_route`` (``changelog.TRUNCATE_SCHEMA``: position, database, table)
``raw``    raw records of route ``_route`` whose decoder learns its columns at run
           time (no ``columns`` configured): decoded on the driver
``keys``   the distinct message-key field lists of route ``_route``, while its table's
           primary key is still to be learnt (``learn_keys``)
``epochs``   the epoch state of each partition route ``_route`` decoded, at the end of the task
             (``changelake.formats.sequence.STATES_SCHEMA``): recorded in the checkpoint by the driver
``epochchg`` the epoch changes found there (``CHANGES_SCHEMA``): logged and counted by the driver
``txn``    the source transaction of each change record of route ``_route`` (``consistency: transaction``;
           ``changelake.formats.transactions.EVENTS_SCHEMA``)
``bounds`` the END events read from the transaction metadata topics (route -1; ``BOUNDARIES_SCHEMA``)
=========  ==========================================================================
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from changelake.changelog import DEAD_LETTER_SCHEMA, OFFSET, PARTITION, TOPIC
from changelake.formats.message_key import key_shapes
from changelake.formats.assemble import dead_letters
from changelake.formats.sequence import PartitionEpoch, Sequencer, changes_table, resequenced, states_table
from changelake.formats.transactions import event_transactions, transaction_boundaries
from changelake.key_changes import split_key_changes
from changelake.spark.kafka_source import (ARROW_SCHEMA, KafkaOptions, KafkaSource, KafkaStreamReader, SnapshotTask,
                                          split_markers)
from changelake.spark.payloads import from_ipc, to_ipc

SCHEMA = pa.schema([pa.field("_route", pa.int16()), pa.field("part", pa.string()), pa.field("payload", pa.binary())])
SPARK_SCHEMA = "_route smallint, part string, payload binary"
#: every ``part`` a payload can have (the stage's, and the graph tables' ``changes``): an envelope addressed
#: to the driver carries its part as an index into this tuple (``changelake.spark.chain.DRIVER``)
PARTS = ("stats", "rows", "moves", "dl", "trunc", "raw", "keys", "changes", "epochs", "epochchg", "txn", "bounds")
#: a read task decodes its records this many at a time (at least; a ``consume`` call's batch is not split): each
#: chunk is held in several forms at once while it is decoded (the raw batches, their cast and filtered copies,
#: one JSON text of the values, Arrow's parse of the whole envelopes), so the chunk, not the micro-batch, sets a
#: read worker's peak memory. Measured on 125,000 Debezium JSON events (bench/operators.py's products): peak
#: +259-274 MB at 100,000 a chunk against +143-145 MB at 25,000; docs/benchmarks.md, issue 29's section
CHUNK_RECORDS = 25_000
STATS_SCHEMA = pa.schema([pa.field("topic", pa.string()), pa.field("partition", pa.int32()),
                          pa.field("records", pa.int64()), pa.field("expired", pa.int64()),
                          pa.field("last_ts", pa.int64())])


class DecodeStage:
    """Built on the driver from the routes; pickled into every task."""

    def __init__(self, routes: Sequence[Any], *, graph_keys: dict[int, tuple[str, ...]] | None = None,
                 boundary_topics: Sequence[str] = ()) -> None:
        self.routes = list(routes)
        #: routes with ``consistency: transaction`` (their records' transactions are read), and the
        #: transaction metadata topics whose END events the driver's gate needs
        self.txn_routes = [i for i, r in enumerate(self.routes)
                           if getattr(r.spec, "consistency", "offset") == "transaction"]
        self.boundary_topics = frozenset(boundary_topics)
        #: route -> key columns of the graph source it feeds: rows with a null key become dead letters here
        self.graph_keys = dict(graph_keys or {})
        #: routes decoded in the executors (their columns are known up front)
        self.executor_routes = {i for i, r in enumerate(self.routes)
                                if getattr(r.decoder, "output_schema", None) is not None}
        #: routes whose message keys are inspected (their table's primary key is not known yet)
        self.learn_keys: set[int] = set()
        #: the read task's partitions' epoch states at their start (:meth:`begin`), and per route its sequencer
        self._start: dict[tuple[str, int], dict] = {}
        self._sequencers: dict[int, Sequencer] = {}

    def begin(self, epochs: dict[tuple[str, int], dict]) -> None:
        """In a read task, before its records: the epoch states its partitions start from."""
        self._start = dict(epochs)
        self._sequencers = {}

    def sequencer(self, route: int) -> Sequencer:
        if route not in self._sequencers:
            self._sequencers[route] = Sequencer({k: PartitionEpoch.from_json(v) for k, v in self._start.items()})
        return self._sequencers[route]

    # --- executor side -----------------------------------------------------
    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for payloads in self.chunks(batches):
            yield payload_batch(payloads)

    def chunks(self, batches: Iterator[pa.RecordBatch], *,
               tables: frozenset[int] = frozenset()) -> Iterator[list[tuple[int, str, bytes | pa.Table]]]:
        """The payloads of each chunk of records, as ``(_route, part, payload)`` triples; the ``rows`` of the
        routes in ``tables`` stay Arrow tables (the chain's routing takes them in the same process:
        ``changelake.spark.chain.RoutedStage``), every other payload is Arrow IPC."""
        pending: list[pa.RecordBatch] = []
        size = 0
        for batch in batches:
            pending.append(batch)
            size += batch.num_rows
            if size >= CHUNK_RECORDS:
                yield self._process(pending, tables)
                pending, size = [], 0
        if pending:
            yield self._process(pending, tables)
        epochs = [(i, "epochs", to_ipc(states_table(q.end_states()))) for i, q in self._sequencers.items()
                  if q.states]
        epochs += [(i, "epochchg", to_ipc(changes_table(q.changes))) for i, q in self._sequencers.items() if q.changes]
        if epochs:
            yield epochs

    def _process(self, batches: list[pa.RecordBatch],
                 tables: frozenset[int]) -> list[tuple[int, str, bytes | pa.Table]]:
        table = pa.Table.from_batches(batches).cast(ARROW_SCHEMA)
        records, expired = split_markers(table)
        out: list[tuple[int, str, bytes | pa.Table]] = [(-1, "stats", to_ipc(_stats(records, expired)))]
        topics = records["topic"]
        present = pc.unique(topics).to_pylist()
        bounds = [t for t in present if t in self.boundary_topics]
        if bounds:
            out.extend(self._boundaries(records.filter(pc.is_in(topics, pa.array(bounds, pa.string())))))
        for i, route in enumerate(self.routes):
            names = [t for t in present if route.matches(t)]
            if not names:
                continue
            mine = records.filter(pc.is_in(topics, pa.array(names, pa.string())))
            if i in self.learn_keys:
                out.append((i, "keys", to_ipc(key_shapes(mine, route.decoder))))
            if i in self.txn_routes:
                events = event_transactions(mine, route.spec.format)
                if events.num_rows:
                    out.append((i, "txn", to_ipc(events)))
            if i not in self.executor_routes:
                out.append((i, "raw", to_ipc(mine)))
                continue
            result = route.decoder.decode(mine)
            rows, truncates = resequenced(self.sequencer(i), result.rows, result.truncates, result.positions,
                                          getattr(route.spec, "sequence_by", "source"))
            dead = result.dead_letters.cast(DEAD_LETTER_SCHEMA)
            if self.graph_keys.get(i):
                rows, dead, moves = check_keys(rows, dead, self.graph_keys[i], f"source {route.spec.name!r}", raw=mine)
                if moves:
                    out.append((i, "moves", moves_payload(moves)))
            if rows.num_rows:
                out.append((i, "rows", rows if i in tables else to_ipc(rows)))
            if dead.num_rows:
                out.append((i, "dl", to_ipc(dead)))
            if truncates.num_rows:
                out.append((i, "trunc", to_ipc(truncates)))
        return out

    def _boundaries(self, records: pa.Table) -> list[tuple[int, str, bytes]]:
        """The END events of transaction metadata records (route -1); a malformed one is a dead letter of
        the first route with ``consistency: transaction``."""
        ends, bad = transaction_boundaries(records)
        out = [(-1, "bounds", to_ipc(ends))] if ends.num_rows else []
        if bad and self.txn_routes:
            why = ("a transaction metadata record that is neither a BEGIN nor an END event (status, id, "
                   "data_collections); check the connector's transaction.topic")
            letters = dead_letters(records, [(j, "malformed", why) for j in bad])
            out.append((self.txn_routes[0], "dl", to_ipc(letters.cast(DEAD_LETTER_SCHEMA))))
        return out

    # --- driver side -------------------------------------------------------
    def split(self, out: pa.Table) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[int, dict[str, pa.Table]]]:
        """The collected stage output -> (stats per partition: records read, offsets expired upstream, the
        latest Kafka timestamp read (epoch ms, 0: none); per route: rows / dl / raw tables)."""
        stats: dict[tuple[str, int], tuple[int, int, int]] = {}
        tables: dict[int, dict[str, list[pa.Table]]] = {}
        for route, part, payload in zip(out["_route"].to_pylist(), out["part"].to_pylist(),
                                         out["payload"].to_pylist()):
            table = from_ipc(payload)
            if part == "stats":
                for s in table.to_pylist():
                    k = (s["topic"], s["partition"])
                    r, e, ts = stats.get(k, (0, 0, 0))
                    stats[k] = (r + s["records"], e + s["expired"], max(ts, s["last_ts"] or 0))
            else:
                tables.setdefault(route, {}).setdefault(part, []).append(table)
        parts = {route: {part: pa.concat_tables(ts) for part, ts in by_part.items()}
                 for route, by_part in tables.items()}
        return stats, parts


def decoding_source(stage: Any) -> type:
    """The Kafka source (``changelake-kafka``) whose read tasks hand ``stage``'s output to Spark instead
    of raw records: a :class:`DecodeStage`'s payloads (:data:`SPARK_SCHEMA`), or what a stage wrapping
    it produces (its ``spark_schema``: ``changelake.spark.chain.RoutedStage``, the chain's envelopes).

    Spark ships a data source class defined here by value (cloudpickle), with ``stage``; each read
    task unpickles its own copy of the stream reader and so of the stage, as it did for ``mapInArrow``.
    """

    class DecodingKafkaSource(KafkaSource):
        def schema(self) -> str:
            return getattr(stage, "spark_schema", SPARK_SCHEMA)

        def streamReader(self, schema: Any) -> "DecodingStreamReader":
            return DecodingStreamReader(KafkaOptions.parse(self.options), stage)

    return DecodingKafkaSource


class DecodingStreamReader(KafkaStreamReader):
    """Plans the same offset ranges as :class:`KafkaStreamReader`; a read task decodes what it read."""

    def __init__(self, options: KafkaOptions, stage: Any) -> None:
        super().__init__(options)
        self.stage = stage

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SnapshotTask):     # a rebuilt checkpoint's first batch (RoutedStage.snapshot)
            return self.stage.snapshot(partition.route)
        begin = getattr(self.stage, "begin", None)
        if begin is not None:
            begin({(r.topic, r.partition): r.epoch for r in getattr(partition, "ranges", ()) if r.epoch})
        return self.stage(super().read(partition))


def payload_batch(payloads: Sequence[tuple[int, str, bytes]]) -> pa.RecordBatch:
    """``(_route, part, payload)`` triples as one batch of :data:`SCHEMA`."""
    return pa.RecordBatch.from_arrays(
        [pa.array([o[0] for o in payloads], pa.int16()), pa.array([o[1] for o in payloads], pa.string()),
         pa.array([o[2] for o in payloads], pa.binary())], schema=SCHEMA)


def moves_payload(moves: int) -> bytes:
    """The ``moves`` payload: how many updates a key check split (counted on the driver)."""
    return to_ipc(pa.table({"moves": pa.array([moves], pa.int64())}))


def check_keys(rows: pa.Table, dead: pa.Table, key: Sequence[str], what: str, *,
               raw: pa.Table | None = None) -> tuple[pa.Table, pa.Table, int]:
    """``rows`` made ready to be applied by ``key``: each update that changes the key split into a delete
    and an insert (:func:`changelake.key_changes.split_key_changes`), then the rows whose key is null
    moved to ``dead`` (:func:`split_null_keys`, ``what`` and ``raw`` as there). Returns the rows, the
    dead letters and how many updates were split. The one check for graph sources (read task), framed
    mirrors (``changelake.spark.batch_frames``) and collected mirrors (the service's batch processor)."""
    split = split_key_changes(rows, key)
    rows, dead = split_null_keys(split.changes, dead, key, what, raw=raw)
    return rows, dead, split.moves


def split_null_keys(rows: pa.Table, dead: pa.Table, key: Sequence[str], what: str, *,
                    raw: pa.Table | None = None) -> tuple[pa.Table, pa.Table]:
    """Rows whose ``key`` is null become ``missing-key`` dead letters (appended to ``dead``): they could
    not be applied (``what`` names the table or graph source, for the error text). With ``raw``, the
    Kafka records the rows were decoded from, each letter carries its message's key, value and
    timestamp; without (the records are not at hand), its position only."""
    if rows.num_rows == 0:
        return rows, dead
    null_key = functools.reduce(pc.or_, [pc.is_null(rows[k]) for k in key])     # pc.or_ takes two at a time
    if not pc.any(null_key).as_py():
        return rows, dead
    offending = rows.filter(null_key)
    n = offending.num_rows
    extra = pa.table({
        "topic": offending[TOPIC], "partition": offending[PARTITION], "offset": offending[OFFSET],
        "reason": pa.array(["missing-key"] * n),
        "error": pa.array([f"primary key {list(key)} is null; the change cannot be applied to {what}"] * n),
    })
    if raw is not None:        # a message decoded into several rows (Canal) is one letter per row
        position = ["topic", "partition", "offset"]
        extra = extra.join(raw.select([*position, "timestamp", "key", "value"]), position,
                           join_type="left outer").sort_by([(c, "ascending") for c in position])
    else:
        extra = extra.append_column("timestamp", pa.nulls(n, pa.timestamp("ms", tz="UTC"))) \
            .append_column("key", pa.nulls(n, pa.binary())).append_column("value", pa.nulls(n, pa.binary()))
    extra = extra.select(DEAD_LETTER_SCHEMA.names).cast(DEAD_LETTER_SCHEMA)
    return rows.filter(pc.invert(null_key)), pa.concat_tables([dead, extra])


def _stats(records: pa.Table, expired: dict[tuple[str, int], int]) -> pa.Table:
    counts: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    if records.num_rows:
        grouped = records.group_by(["topic", "partition"]).aggregate([("offset", "count"), ("timestamp", "max")])
        latest = grouped["timestamp_max"]
        if pa.types.is_timestamp(latest.type):          # epoch milliseconds
            latest = latest.cast(pa.timestamp("ms", tz=latest.type.tz)).cast(pa.int64())
        for t, p, n, ts in zip(grouped["topic"].to_pylist(), grouped["partition"].to_pylist(),
                               grouped["offset_count"].to_pylist(), latest.to_pylist()):
            counts[(t, p)] = n
            last[(t, p)] = ts or 0
    keys = sorted(set(counts) | set(expired))
    return pa.table([pa.array([k[0] for k in keys], pa.string()), pa.array([k[1] for k in keys], pa.int32()),
                     pa.array([counts.get(k, 0) for k in keys], pa.int64()),
                     pa.array([expired.get(k, 0) for k in keys], pa.int64()),
                     pa.array([last.get(k, 0) for k in keys], pa.int64())], schema=STATS_SCHEMA)
