"""Pipeline assembly: Kafka source -> decode -> (operators) -> Delta sinks, one Spark query.

The query (:class:`changelake.spark.query.PipelineQuery`, started by
:func:`changelake.service.query_start.start_query`)::

    Kafka records -> DecodeStage (mapInArrow, executors): IPC payloads of rows, dead letters, stats
        -> payloads for the driver: stats, dead letters, rows of sources mirrored into a table
        -> per source read by the operator graph: typed rows (unpacked from the payloads)
           -> the compiled graph (changelake.spark.compile) -> each graph table's changes as payloads
    foreachBatch(the union of both): ONE Spark action per micro-batch (``toArrow``), so the
    stateful operators run once per batch; the operators' reports drained from the report channel

Every micro-batch runs :meth:`BatchProcessor.process_decoded` (pure Arrow, no Spark) on the driver:

1. collect the payloads and report offsets that expired upstream;
2. the rows of mirrored sources go to their table, key changes split by the table's key
   (``changelake.key_changes``; the decode stage split the graph sources' rows by their key and
   counted, both counts reach ``changelake_key_changes_total`` here); graph tables' changes,
   ordered per key as the last kernel emitted them, get a fresh ``_seq`` (batch id, then
   position) that orders them after every earlier batch, and a lone ``-U`` becomes a ``-D``
   (``sink_changes``);
3. apply each source's ``on_error`` policy to the dead letters (fail: stop before
   anything is written; skip: count and drop; dlq: quarantine with raw bytes); rows of
   graph sources with a null primary key are dead letters from the executors on;
4. count the truncates the decoders read (``on_truncate`` apply or skip); a mirrored table
   gets the position of its latest truncate of the batch (apply);
5. apply each table's changes (and truncate) through its idempotent Delta sink, the tables at once
   (``BatchProcessor._commit_tables``).

Every write is keyed by (pipeline id, checkpoint generation, batch id) through Delta transaction ids
(``connectors.commits``; the generation is decided at start by ``service.lifecycle``) and
Spark only advances its offsets after the batch function returns, so a crash
anywhere in between replays the batch, and the replay writes nothing twice. The
operators' state store versions are per batch too: a replayed batch recomputes from
the state of the batch before it, so it emits the same changes again.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from changelake import metrics
from changelake.changelog import DEAD_LETTER_SCHEMA, KIND, SEQ, RowKind, commit_position
from changelake.connectors.consistency import Cut, table_version
from changelake.connectors.delta_log import LogRead
from changelake.connectors.delta_sink import ApplyResult, DeltaUpsertSink, Maintenance, TableSpec, open_sink
from changelake.connectors.delta_sink_kernel import check_truncate_order, latest_per_key
from changelake.errors import ConfigError, DecodeError
from changelake.formats import make_decoder
from changelake.formats.assemble import dead_letters
from changelake.formats.encodings import source_schema
from changelake.formats.message_key import key_shapes
from changelake.formats.origin import Origin
from changelake.formats.sequence import by_kafka
from changelake.plan.graph import Pipeline
from changelake.plan.physical import PhysicalPlan, sink_changes
from changelake.service.config import (ORIGIN_COLUMNS, ChangelakeConfig, MaintenanceSpec, SourceSpec, TableSpecModel,
                                       parse_duration)
from changelake.service.dead_letter_paths import DeadLetterPaths
from changelake.service.epochs import EpochBook
from changelake.service.key_inference import TableKeys
from changelake.service.quarantine import Quarantine
from changelake.service.routing import Router, Target
from changelake.service.driver_graph import DriverGraph
from changelake.service.transactions import TransactionCommits
from changelake.service.views import pipeline_from_config
from changelake.spark.compile import CHANGES_PART
from changelake.spark.decode_stage import DecodeStage, check_keys

log = logging.getLogger(__name__)

#: Test hook: ``CHANGELAKE_FAULT=<point>@<batch id>`` kills the process with SIGKILL at that point (in the query of
#: the pipeline's checkpoint); ``<point>@<batch id>@mirrors``: in the mirrors' own query (``service.split``).
FAULT_ENV = "CHANGELAKE_FAULT"
#: Test hook: ``CHANGELAKE_SLOW_GRAPH=<seconds>@<batch id>``: the operator graph's batch sleeps that long before its
#: Delta commits (an artificially slow view; tests/integration/test_mirror_query.py)
SLOW_GRAPH_ENV = "CHANGELAKE_SLOW_GRAPH"
_KIND_LABEL = {k.value: k.short for k in RowKind}
#: Delta tables a batch commits at once (delta-rs engine; see ``BatchProcessor._commit_tables``)
COMMIT_THREADS = 4


def _armed(point: str, batch_id: int, query: str = "") -> bool:
    return os.environ.get(FAULT_ENV) == f"{point}@{batch_id}{query.replace('.', '@')}"


def _fault(point: str, batch_id: int, query: str = "") -> None:
    if _armed(point, batch_id, query):
        log.error("fault injection: killing the process at %s of batch %d", point, batch_id)
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class BatchReport:
    batch_id: int
    records: int = 0
    changes: dict[str, dict[str, int]] = field(default_factory=dict)    # table -> kind -> n
    dead_letters: dict[str, int] = field(default_factory=dict)          # reason -> n
    key_changes: dict[str, int] = field(default_factory=dict)           # source -> updates that moved a row
    truncates: dict[str, int] = field(default_factory=dict)             # source -> TRUNCATE messages read
    expired: int = 0
    epochs: dict[str, int] = field(default_factory=dict)                # source -> epoch changes found
    committed_tables: list[str] = field(default_factory=list)
    transactions: dict[str, Any] = field(default_factory=dict)         # consistency: transaction (the gate's figures)
    framed_tables: list[str] = field(default_factory=list)              # reduced on the executors (frames)
    seconds: float = 0.0


class _Route:
    def __init__(self, spec: SourceSpec) -> None:
        self.spec = spec
        self.decoder = make_decoder(spec.format, columns=source_schema(spec.columns) if spec.columns else None,
                                    options=spec.decoder_options())
        self._rx = re.compile(spec.topic_pattern) if spec.topic_pattern else None
        self._topics = frozenset(spec.topics or ())
        self._replay_rx = re.compile(spec.replay_topic_regex())

    def matches(self, topic: str) -> bool:
        """The source reads ``topic``: one of its own, or its replay topic (a replayed message has its original
        topic from its headers; only one produced there by hand keeps the replay topic's)."""
        return (topic in self._topics if self._rx is None else bool(self._rx.fullmatch(topic))) or \
            bool(self._replay_rx.fullmatch(topic))


_NO_GRAPH: Any = object()


class BatchProcessor:
    """The ``foreachBatch`` function of a pipeline.

    ``graph`` is the operator graph (default: the config's ``views`` and ``tables[].from``,
    :func:`~changelake.service.views.pipeline_from_config`); None runs only the mirrors.
    ``query``: which query of a pipeline of two (``service.split``: ``.mirrors``, or "" for the graph's);
    ``accounted_elsewhere``: sources whose records, dead letters and truncates the other query accounts
    for (this one only feeds their rows to the graph).
    """

    #: the operators' state buckets when none are given (part of the state fingerprint: service.lifecycle)
    DEFAULT_BUCKETS = 32

    def __init__(self, config: ChangelakeConfig, *, spark: Any = None, graph: Pipeline | None = _NO_GRAPH,
                 buckets: int | None = None, query: str = "", accounted_elsewhere: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.query_name = query
        self.accounted_elsewhere = accounted_elsewhere
        self.routes = [_Route(s) for s in config.sources]
        graph = pipeline_from_config(config) if graph is _NO_GRAPH else graph
        self.plan: PhysicalPlan | None = None if graph is None else graph.plan()
        self.buckets = self.DEFAULT_BUCKETS if buckets is None else buckets
        #: route index -> the graph source node it feeds
        self.graph_routes = {}
        if self.plan is not None:
            by_name = {n.source: n for n in self.plan.sources}
            for i, r in enumerate(self.routes):
                if r.spec.name in by_name:
                    if getattr(r.decoder, "output_schema", None) is None:
                        raise ConfigError(f"source {r.spec.name!r} feeds the operator graph, so it must declare "
                                          "its columns (sources[].columns)")
                    self.graph_routes[i] = by_name[r.spec.name]
        #: graph table of each ``_route`` index of the packed changes (set by :meth:`stream`)
        self.graph_tables: list[str] = []
        #: the Spark query that feeds this processor (set by :func:`start_query`)
        self.query: Any = None
        self.keys = TableKeys(config)
        self._spark = spark
        self.sinks: dict[str, DeltaUpsertSink] = {}     # opened once the table's key is known
        #: what the start read of the tables' logs, by path (``delta_log.LogRead``, or the future of a tombstone
        #: table's read still running): each sink takes up its own when it opens (``DeltaUpsertSink.adopt_logs``)
        #: instead of loading the logs again (set by the runner)
        self.logs_read: dict[str, LogRead | Future] = {}
        self._pool: ThreadPoolExecutor | None = None     # the concurrent Delta commits, started on first use
        self.dead_letters = DeadLetterPaths(config, query=query)
        #: the pipeline's lease (``changelake.service.lease``), checked before a batch writes; None: not run
        #: by the CLI's runner (tests, the in-process API)
        self.lease: Any = None
        self.quarantine = Quarantine(config, self.keys)
        self.epochs = EpochBook(config.pipeline.checkpoint)
        #: table -> columns its source's newest schema dropped, for the sink (set per batch)
        self._dropped: dict[str, tuple[str, ...]] = {}
        #: table -> the source position of the newest schema it takes from the batch, for the sink (per batch)
        self._positions: dict[str, str] = {}
        self.stage = DecodeStage(self.routes, graph_keys={i: n.upsert_key or () for i, n in self.graph_routes.items()},
                                 boundary_topics=sorted({s.transaction_topic_name() for s in config.sources} - {None}))
        #: ``consistency: transaction`` (the gate, its states in the checkpoint) and ``_changelake_consistency``
        self.consistency = TransactionCommits(config, self.routes)
        #: with the gate, the views run on the driver behind it (``changelake.service.driver_graph``); the
        #: plan the Spark query runs on the executors is then None
        self.driver_graph = DriverGraph(self.plan) if self.plan is not None and self.consistency.gate else None
        self.executor_plan = None if self.driver_graph is not None else self.plan
        # The stage goes to the executors once, with the query: routes whose table's key is unknown at
        # start report their message keys' fields every batch; the first batch that has some teaches it.
        unknown = self.keys.unknown()
        self.stage.learn_keys = {i for i, r in enumerate(self.routes) if r.spec.table in unknown}
        #: routed sources (``sources[].route``): their routers, and the tables they created, each with a route
        #: (the source's settings, the table's own decoder) and the ``tables[]`` entry it behaves as
        owners: dict[str, tuple[str, int]] = {}
        self.routers = {r.spec.name: Router(r.spec, storage_root=config.storage.root, decoder=r.decoder,
                                            taken=[t.name for t in config.tables], owners=owners)
                        for r in self.routes if r.spec.route is not None}
        self.table_routes: dict[str, _Route] = {}
        self.routed_tables: dict[str, TableSpecModel] = {}
        self.last_report: BatchReport | None = None
        self.totals = BatchReport(batch_id=-1)
        #: the checkpoint's generation (``changelake.service.lifecycle``; set by :meth:`start_generation`)
        self.generation = 0
        #: graph tables an older checkpoint generation wrote: this one's first commit replaces them, even
        #: when the view has no change in it
        self.replacing: set[str] = set()
        #: route -> its mirrored table's snapshot, fed to the graph by a rebuilt checkpoint's first batch
        #: (``changelake.service.rebuild``; set by :func:`start_query`)
        self.snapshots: dict[int, Any] = {}
        #: times the first batch of this process (``changelake.service.restart_clock``; set by the runner)
        self.clock: Any = None

    def start_generation(self, generation: int, replaced: Sequence[str] = ()) -> None:
        """Run as checkpoint generation ``generation`` (every write's commit position); ``replaced``: the
        graph tables an older generation wrote, each replaced by its first commit."""
        self.generation = generation
        self.replacing = set(replaced)
        self.dead_letters.store.generation = generation
        self.dead_letters.topic.generation = generation
        for sink in self.sinks.values():
            sink.generation = generation

    def close(self) -> None:
        """Release what the processor holds on the driver once its query has ended: the lookup joins'
        connections of the views behind the transaction gate."""
        if self.driver_graph is not None:
            self.driver_graph.close()

    def _table_model(self, name: str) -> TableSpecModel:
        return self.routed_tables[name] if name in self.routed_tables else self.config.table(name)

    def _table_path(self, name: str) -> str:
        return self.routed_tables[name].path if name in self.routed_tables else self.config.table_path(name)

    def _schema_change_of(self, name: str) -> str:
        if name in self.routed_tables:
            return self.routed_tables[name].schema_change or self.table_routes[name].spec.schema_change
        return self.config.schema_change_of(name)

    def _all_routes(self) -> list["_Route"]:
        return [*self.routes, *self.table_routes.values()]

    def _sink(self, name: str) -> DeltaUpsertSink:
        if name not in self.sinks:
            t = self._table_model(name)
            # a graph table keyed by a group or partition key that may be NULL holds NULL keys (as SQL's
            # GROUP BY); a mirrored table's NULL key was made a dead letter before it got here
            nullable = next((n.nullable_key for n in self.plan.sinks if n.table == name), ()) if self.plan else ()
            # a mirror's changes may hold its sources' placeholder for values not sent (graph tables' never do)
            unavailable = next((r.spec.unavailable_value for r in self._all_routes() if r.spec.table == name), None)
            graph_table = self.plan is not None and any(n.table == name for n in self.plan.sinks)
            spec = TableSpec(name=name, path=self._table_path(name), primary_key=self.keys.key_of(name),
                             partition_by=tuple(t.partition_by), nullable_key=nullable, unavailable_value=unavailable,
                             tombstone_retention=timedelta(seconds=parse_duration(t.tombstone_retention)),
                             maintenance=_maintenance(t.maintenance), properties=t.properties,
                             history=t.history,
                             track_history=None if t.track_history is None else tuple(t.track_history),
                             schema_change=self._schema_change_of(name),
                             replace_on_new_generation=graph_table and t.history is None,
                             storage_options=self.config.storage.plain_options())
            opened = dict(pipeline_id=self.config.pipeline.id, engine=self.config.storage.engine,
                          generation=self.generation)
            if self._spark is None:
                self.sinks[name] = open_sink(spec, **opened)
            else:   # the Spark wing chooses between delta-spark and delta-rs
                from changelake.spark.delta_sink import open_sink as open_engine_sink

                self.sinks[name] = open_engine_sink(spec, spark=self._spark, **opened)
            self.sinks[name].adopt_logs(self._logs_read_of(spec.path, spec.resolved_tombstone_path))
        return self.sinks[name]

    def _logs_read_of(self, *paths: str) -> dict[str, LogRead]:
        """What the start read of these tables' logs (:attr:`logs_read`), taken out: a read still running in the
        background (a tombstone table's, ``lifecycle.read_tombstone_tables``) is waited for."""
        out = {}
        for path in paths:
            read = self.logs_read.pop(path, None)
            if isinstance(read, Future):
                read = read.result()
            if read is not None:
                out[path] = read
        return out

    def framed_tables(self) -> dict[str, tuple[str, ...]]:
        """The tables whose batches reach their sink as Spark DataFrames, reduced on the executors
        (table -> primary key): with ``storage.reduce_on`` executors, or auto and the delta-spark engine.
        Only upsert tables whose every change comes from the executors: graph tables, and mirrors
        whose sources are decoded there (``columns`` declared, not routed) and whose key is known."""
        reduce_on = self.config.storage.reduce_on
        if self._spark is None or reduce_on == "driver":
            return {}
        feeds: dict[str, list[int]] = {}
        for i, r in enumerate(self.routes):
            if r.spec.table is not None:
                feeds.setdefault(r.spec.table, []).append(i)
        # a gated table's rows wait on the driver (consistency: transaction), so they are collected
        candidates = {name: self.keys.key_of(name) for name, routes in feeds.items()
                      if all(i in self.stage.executor_routes and i not in self.stage.txn_routes for i in routes)}
        candidates.update({name: tuple(self.config.table(name).primary_key) for name in self.graph_tables})
        framed = {}
        for name, key in candidates.items():
            if not key or self._table_model(name).history is not None:
                continue
            sink = self._sink(name)
            if hasattr(sink, "apply_frame") and (reduce_on == "executors" or sink.engine == "delta-spark"):
                framed[name] = tuple(key)
        return framed

    def process_decoded(self, out: pa.Table, batch_id: int, *, late_rows: dict | None = None,
                        rejected: Sequence[Any] = (), frames: dict[str, Any] | None = None) -> BatchReport:
        """Apply the collected output of the executors' :class:`DecodeStage` and graph, the late
        rows of the event-time joins (``{(view, side): (count, JSON rows)}``) and the input rows an
        operator could not process (``rejected``: node, side, row as JSON, seq, error; see
        ``changelake.spark.reports.Rejected``), which go by their source's ``on_error``.
        ``frames``: the changes of :meth:`framed_tables` that stayed on the executors, per table
        (``changelake.spark.batch_frames.TableFrame``: a DataFrame and its counts per kind); ``out``
        then holds their dead letters, key-change counts and truncates, not their rows."""
        if self.lease is not None:
            self.lease.check(batch_id)      # another instance took over: stop before this batch writes
        if self.clock is not None:
            self.clock.mark("read")
        report = self._process_decoded(out, batch_id, late_rows=late_rows, rejected=rejected, frames=frames)
        if self.clock is not None:
            self.clock.mark("commit")
        return report

    def _process_decoded(self, out: pa.Table, batch_id: int, *, late_rows: dict | None,
                         rejected: Sequence[Any], frames: dict[str, Any] | None) -> BatchReport:
        stats, parts = self.stage.split(out)
        side = parts.pop(-1, {})                    # route -1: the END events of the transaction metadata topics
        boundaries = side.get("bounds")
        events = [got.pop("txn") for got in parts.values() if "txn" in got]
        if self.accounted_elsewhere:
            stats = self._not_elsewhere(stats, parts)
        for i, got in parts.items():
            if "epochs" in got or "epochchg" in got:     # a source route's (graph changes are keyed by graph table)
                self.epochs.take(self.routes[i].spec.name, got)
        self._dropped, self._positions = {}, {}
        self.keys.learn(_key_shapes(self.routes, parts))
        graph_changes = {self.graph_tables[i]: got.pop(CHANGES_PART) for i, got in parts.items()
                         if CHANGES_PART in got}
        moves = {self.routes[i].spec.name: pc.sum(got.pop("moves")["moves"]).as_py() for i, got in parts.items()
                 if "moves" in got}
        decoded = []
        truncates = [(self.routes[i], got.pop("trunc")) for i, got in parts.items() if "trunc" in got]
        for i, got in parts.items():
            if not got:
                continue
            route = self.routes[i]
            if "raw" in got and route.spec.route is not None:
                routed, found = self._route_raw(route, got.pop("raw"))
                decoded.extend(routed)
                truncates.extend(found)
            if "raw" in got:                      # columns learnt at run time: decode here, screen the schema
                if route.spec.table is not None:
                    self.quarantine.prepare(route.spec.table, route.decoder)
                result = route.decoder.decode(got["raw"])
                rows, found = self.epochs.resequence(route.spec.name, route.spec.sequence_by, result, got["raw"])
                dead = result.dead_letters
                if route.spec.table is not None:
                    screened = self.quarantine.screen(route.spec.table, source=route.spec.name, decoder=route.decoder,
                                                      raw=got["raw"], rows=rows, dead_letters=dead)
                    rows, dead = screened.rows, screened.dead_letters
                    self._note_schema(route.spec.table, screened)
                decoded.append((route, rows, dead))
                if found.num_rows:
                    truncates.append((route, found))
            rows = got.get("rows")
            dead = got.get("dl")
            if rows is not None or dead is not None:
                decoded.append((route, rows if rows is not None else _empty(route),
                                dead if dead is not None else DEAD_LETTER_SCHEMA.empty_table()))
        decoded.extend(self._rejected(rejected))
        epochs = self.epochs.settle(batch_id)       # recorded before the Delta commits: a replay reads them
        report = self._apply(stats, decoded, batch_id, graph_changes, late_rows, moves, truncates, frames or {},
                             transactions=(events, boundaries))
        report.epochs = epochs
        return report

    def _not_elsewhere(self, stats: dict[tuple[str, int], Any], parts: dict[int, dict[str, pa.Table]]
                       ) -> dict[tuple[str, int], Any]:
        """The batch without what the other query accounts for (``accounted_elsewhere``): those sources' dead
        letters, truncates and read statistics (their rows went to the graph on the executors)."""
        for i, got in parts.items():        # (a graph table's changes are keyed by its index: not a route's)
            if i < len(self.routes) and self.routes[i].spec.name in self.accounted_elsewhere:
                for part in ("dl", "trunc", "keys", "moves"):
                    got.pop(part, None)

        def elsewhere(topic: str) -> bool:
            route = next((r for r in self.routes if r.matches(topic)), None)
            return route is not None and route.spec.name in self.accounted_elsewhere

        return {tp: v for tp, v in stats.items() if not elsewhere(tp[0])}

    def _route_raw(self, route: "_Route", raw: pa.Table
                   ) -> tuple[list[tuple["_Route", pa.Table, pa.Table]], list[tuple["_Route", pa.Table]]]:
        """A routed source's raw records, decoded per target table by the table's own decoder (rows, dead
        letters) plus the truncates read; the tables seen first are set up here, keys learnt where unknown."""
        split = self.routers[route.spec.name].split(raw)
        decoded = [(route, _empty(route), split.dead_letters)] if split.dead_letters.num_rows else []
        shapes: dict[str, list[pa.Table]] = {}
        for target, _, records in split.groups:
            table = self._table_route(route, target)
            if self.keys.key_of(target.table) is None:
                shapes.setdefault(target.table, []).append(key_shapes(records, table.decoder))
        keyless: dict[str, str] = {}
        for name, found in shapes.items():
            try:
                self.keys.learn({name: found})
            except DecodeError as exc:      # e.g. a source table without a primary key: only its changes wait
                keyless[name] = str(exc)
        truncates = []
        positions = []
        for target, origin, records in split.groups:
            table = self.table_routes[target.table]
            if target.table in keyless or self.keys.key_of(target.table) is None:
                why = keyless.get(target.table) or (f"table {target.table!r}: its primary key is not known yet "
                                                    "(no message of it had a key); set its route rule's primary_key")
                decoded.append((table, _empty(table),
                                dead_letters(records, [(i, "missing-key", why) for i in range(records.num_rows)])))
                continue
            origin_columns = self.routers[route.spec.name].rules[target.rule].origin_columns
            self.quarantine.prepare(target.table, table.decoder, added=ORIGIN_COLUMNS if origin_columns else ())
            result = table.decoder.decode(records)
            positions.append(result.positions)
            screened = self.quarantine.screen(target.table, source=route.spec.name, decoder=table.decoder,
                                              raw=records, rows=result.rows, dead_letters=result.dead_letters,
                                              added=ORIGIN_COLUMNS if origin_columns else ())
            rows = screened.rows
            self._note_schema(target.table, screened)
            if origin_columns:
                rows = with_origin_columns(rows, origin, table=target.table)
            decoded.append((table, rows, screened.dead_letters))
            if result.truncates.num_rows:
                truncates.append((table, result.truncates))
        if route.spec.sequence_by == "source":         # one walk over every table's messages, in Kafka order
            self.epochs.walk(route.spec.name, raw, positions)
            decoded = [(t, self.epochs.ordered(rows), dead) for t, rows, dead in decoded]
            truncates = [(t, self.epochs.ordered(found, truncates=True)) for t, found in truncates]
        elif route.spec.sequence_by == "kafka":
            decoded = [(t, by_kafka(rows), dead) for t, rows, dead in decoded]
            truncates = [(t, by_kafka(found, partition="partition", offset="offset")) for t, found in truncates]
        return decoded, truncates

    def _note_schema(self, table: str, screened: Any) -> None:
        """What the sink needs of a screened batch's schemas: the columns to drop, the position to record."""
        if screened.dropped:
            self._dropped[table] = screened.dropped
        if screened.position is not None:
            self._positions[table] = screened.position

    def _table_route(self, route: "_Route", target: Target) -> "_Route":
        """The route of a routed table (created on first sight): the source's settings, its own decoder."""
        found = self.table_routes.get(target.table)
        if found is not None:
            return found
        router = self.routers[route.spec.name]
        rule = router.rules[target.rule]
        model = router.table_model(target)
        table = _Route(route.spec.model_copy(update={"table": target.table, "route": None, "columns": rule.columns}))
        self.table_routes[target.table] = table
        self.routed_tables[target.table] = model
        self.keys.add(target.table, model.path, model.primary_key,
                      extra=ORIGIN_COLUMNS if rule.origin_columns else ())
        self.quarantine.add_table(model, source_schema_change=route.spec.schema_change)
        log.info("source %s: table %s (route[%d], source_table %r) at %s, primary key %s", route.spec.name,
                 target.table, target.rule, rule.source_table, model.path,
                 list(self.keys.key_of(target.table) or ["(from the message keys)"]))
        return table

    def _rejected(self, rejected: Sequence[Any]) -> list[tuple["_Route", pa.Table, pa.Table]]:
        """Rows an operator raised on, as dead letters (reason ``operator-error``) of the source they
        descend from, so that source's ``on_error`` applies: they never stop the pipeline in a loop."""
        by_source: dict[str, list[dict]] = {}
        for r in rejected:
            source = self.plan.source_of(r.node, r.side)
            spec = self._route_of(source).spec
            if r.message is not None:
                topic, partition, offset = r.message
            else:
                partition, offset = _kafka_position(r.seq)
                topic = spec.topics[0] if spec.topics and len(spec.topics) == 1 else f"view:{r.node}"
            where = (f"the message at {topic} partition {partition} offset {offset}" if r.message is not None else
                     f"position {r.seq}" if r.seq else "another operator's output: no source position")
            by_source.setdefault(source, []).append({
                "topic": topic, "partition": partition, "offset": offset, "timestamp": None, "key": None,
                "value": r.row.encode(), "reason": "operator-error",
                "error": (f"view {r.node!r} could not process this {r.side} input row "
                          f"({where}): "
                          f"{r.error}. The row was set aside and the pipeline went on; fix the value or the "
                          "view; `changelake dlq show` shows the row (a decoded row, not a message: it is not "
                          "replayed)")})
        out = []
        for source, letters in by_source.items():
            route = self._route_of(source)
            out.append((route, _empty(route), pa.Table.from_pylist(letters, schema=DEAD_LETTER_SCHEMA)))
        return out

    def _route_of(self, source: str) -> "_Route":
        return next(r for r in self.routes if r.spec.name == source)

    def _apply(self, stats: dict[tuple[str, int], tuple[int, int, int]],
               decoded: list[tuple["_Route", pa.Table, pa.Table]], batch_id: int,
               graph_changes: dict[str, pa.Table] | None = None, late_rows: dict | None = None,
               moves: dict[str, int] | None = None,
               truncates: Sequence[tuple["_Route", pa.Table]] = (), frames: dict[str, Any] | None = None,
               transactions: tuple[list[pa.Table], pa.Table] | None = None) -> BatchReport:
        """``moves``: per source, the key changes the decode stage split for the graph; ``truncates``: per
        route, the TRUNCATE messages its decoder read (``changelog.TRUNCATE_SCHEMA``); ``frames``: the
        tables whose changes stayed on the executors (see :meth:`process_decoded`); ``transactions``: the
        transaction of each change record read and the END events read (``consistency: transaction``)."""
        frames = frames or {}
        started = time.monotonic()
        report = BatchReport(batch_id=batch_id, key_changes=dict(moves or {}))
        for (topic, partition), (n, expired, last_ts) in stats.items():
            report.records += n
            metrics.READ_TIMES.note(topic, str(partition), last_ts)
            if expired:
                metrics.EXPIRED_OFFSETS.labels(topic, str(partition)).inc(expired)
                report.expired += expired
            route = next((r for r in self.routes if r.matches(topic)), None)
            metrics.RECORDS_IN.labels(topic, route.spec.format if route else "unrouted").inc(n)
        if report.records:
            metrics.BATCH_ROWS.set(report.records)

        per_table: dict[str, list[pa.Table]] = {}
        feeds: dict[str, list[pa.Table]] = {}       # the graph's sources' rows, when it runs here
        fed = self.driver_graph.sources if self.driver_graph is not None else frozenset()
        letters: list[tuple[str, pa.Table, str | None]] = []     # (source, dead letters, table)
        for route, rows, dead in decoded:
            if route.spec.name in fed and rows.num_rows:
                feeds.setdefault(route.spec.name, []).append(rows)
            rows, bad, moved = self._check_keys(route, rows, dead)
            if moved:
                report.key_changes[route.spec.name] = report.key_changes.get(route.spec.name, 0) + moved
            if bad.num_rows:
                self._handle_bad(route, bad, batch_id, report)
                if route.spec.on_error == "dlq":
                    letters.append((route.spec.name, bad, route.spec.table))
            if rows.num_rows and route.spec.table is not None:
                per_table.setdefault(route.spec.table, []).append(rows)
        for source, n in report.key_changes.items():
            metrics.KEY_CHANGES.labels(source=source).inc(n)
        cut, driven = self._gate(per_table, feeds, transactions, batch_id, report)
        if self.driver_graph is not None:
            late_rows = {**(late_rows or {}), **self.driver_graph.late}
            for route, _, bad in self._rejected(self.driver_graph.rejected):     # the views' operator errors
                self._handle_bad(route, bad, batch_id, report)
                if route.spec.on_error == "dlq":
                    letters.append((route.spec.name, bad, route.spec.table))
        letters.extend(self._late_letters(late_rows or {}, batch_id, report))
        truncate_at = self._truncates(truncates, report)
        for name in frames:
            per_table.setdefault(name, [])
        empty = {r.spec.table: r for r in self._all_routes() if r.spec.table in truncate_at}
        for name in truncate_at.keys() - per_table.keys():
            per_table[name] = [_empty(empty[name])]
        graph_changes = {**(graph_changes or {}), **driven}
        for name in self.replacing - graph_changes.keys() - frames.keys():
            graph_changes[name] = _empty_changes(self.plan, name)        # replaced even with no row
        for name, changes in graph_changes.items():
            pk = self.config.table(name).primary_key
            out = graph_sink_changes(changes, primary_key=pk, batch_id=batch_id, generation=self.generation)
            if self.config.table(name).history is not None:
                # a view's history has one version per batch and key: the batch's intermediate rows
                # are the order the operators ran in, not states the source went through
                out = latest_per_key(out, primary_key=pk)
            per_table.setdefault(name, []).append(out)

        _fault("before-sinks", batch_id, self.query_name)
        if self.plan is not None and os.environ.get(SLOW_GRAPH_ENV, "").endswith(f"@{batch_id}"):
            time.sleep(float(os.environ[SLOW_GRAPH_ENV].split("@")[0]))
        self.dead_letters.write(letters, batch_id=batch_id)
        commits = []
        positions = dict(self._positions)
        consistent = {"batch_id": str(batch_id), "last_transaction": cut.last_transaction or "",
                      "source_position": cut.source_position or ""}       # the newest schema positions, known to the screen once committed
        for name, parts in sorted(per_table.items()):
            frame = frames.get(name)
            if frame is None:
                changes = pa.concat_tables(parts, promote_options="permissive")
                kinds = _count_kinds(changes)
                apply = self._sink(name).apply
            else:
                if parts:
                    raise AssertionError(f"table {name}: changes both collected and left on the executors")
                changes, kinds = frame.changes, frame.kinds
                apply = functools.partial(self._sink(name).apply_frame, checks=frame.checks)
                report.framed_tables.append(name)
            report.changes[name] = kinds
            if self.consistency.active:
                self._sink(name).commit_metadata = {"changelake.consistency": json.dumps(consistent)}
            for kind, n in kinds.items():
                metrics.CHANGES_IN.labels(name, kind).inc(n)
            commits.append((name, functools.partial(apply, changes, batch_id=batch_id, truncate_at=truncate_at.get(name),
                                                    dropped_columns=self._dropped.pop(name, ()),
                                                    schema_position=self._positions.pop(name, None))))
        # Arrow batches on delta-rs commit at once; DataFrames (Spark jobs of this batch) one after another
        at_once = not frames and all(getattr(self.sinks[n], "engine", None) == "delta-rs" for n, _ in commits)
        results = self._commit_tables(commits, batch_id, at_once=at_once)
        self.quarantine.advance(positions)
        report.committed_tables.extend(name for name, _ in commits if results[name].committed)
        self.replacing -= {name for name, _ in commits}
        _fault("after-sinks", batch_id, self.query_name)
        self._record_cut(cut, batch_id)
        report.seconds = time.monotonic() - started
        self.last_report = report
        self._accumulate(report)
        log.info("batch %d: %d records, changes %s, key changes %s, dead letters %s, %.2fs", batch_id,
                 report.records, json.dumps(report.changes), json.dumps(report.key_changes),
                 json.dumps(report.dead_letters), report.seconds)
        return report

    def _gate(self, per_table: dict[str, list[pa.Table]], feeds: dict[str, list[pa.Table]],
              transactions: tuple[list[pa.Table], pa.Table] | None, batch_id: int, report: BatchReport
              ) -> tuple[Cut, dict[str, pa.Table]]:
        """``consistency: transaction``: the gated tables' rows in ``per_table`` become those of complete source
        transactions (:class:`~changelake.service.transactions.TransactionCommits`), and the graph's sources'
        rows (``feeds``) likewise, run through the views on the driver; the batch's cut and the graph tables'
        changes."""
        gated = {r.spec.table for r in self._all_routes() if r.spec.consistency == "transaction" and r.spec.table}
        events, boundaries = transactions or ([], None)
        cut, driven = self.consistency.hold(per_table, gated, events, boundaries, batch_id=batch_id,
                                            generation=self.generation, feeds=feeds, graph=self.driver_graph)
        if self.consistency.gate is not None:
            report.transactions = {"committed": cut.released, "held": cut.held_transactions,
                                   "held_rows": cut.held_rows, "split": cut.split}
        return cut, driven

    def _record_cut(self, cut: Cut, batch_id: int) -> None:
        """The batch's row of ``_changelake_consistency``, once all its table commits are in."""
        if self.consistency.cuts is None:
            return
        options = self.config.storage.plain_options()
        names = [t.name for t in self.config.tables] + sorted(self.routed_tables)
        self.consistency.record(cut, {n: table_version(self._table_path(n), options) for n in names},
                                position=commit_position(batch_id, self.generation))
        _fault("after-cut", batch_id)

    def _commit_tables(self, commits: list[tuple[str, Callable[[], ApplyResult]]], batch_id: int, *,
                       at_once: bool) -> dict[str, ApplyResult]:
        """Run each table's commit of the batch; their results by table.

        The tables are independent Delta tables, each commit keyed by the batch id (its ``txn``), so
        they run at once on the delta-rs engine (which releases the GIL while it merges and writes):
        a batch's commits take about as long as its slowest one instead of their sum. A crash between
        them leaves some tables at the batch and some before it, as it did one after another, and the
        replay commits only the tables that lack it. The first error (in table order) is raised once
        every commit has ended. Without ``at_once`` (the delta-spark engine, or tables handed over as
        Spark DataFrames, whose commits run Spark jobs) the tables commit one after another.
        """
        # the test hook's kill after the first table must come before the others: one after another then
        if len(commits) < 2 or not at_once or _armed("after-first-table", batch_id, self.query_name):
            results = {}
            for i, (name, commit) in enumerate(commits):
                results[name] = commit()
                if i == 0:
                    _fault("after-first-table", batch_id, self.query_name)
            return results
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=COMMIT_THREADS, thread_name_prefix="delta-commit")
        futures = {self._pool.submit(commit): name for name, commit in commits}
        wait(futures)
        failed = [f for f in futures if f.exception() is not None]
        if failed:
            raise min(failed, key=futures.__getitem__).exception()
        return {name: f.result() for f, name in futures.items()}

    def _truncates(self, truncates: Sequence[tuple["_Route", pa.Table]], report: BatchReport) -> dict[str, str]:
        """Count the truncates by source and action; the position of each mirrored table's latest one
        (sources with ``on_truncate: apply``; the config refuses apply on a source that views read)."""
        latest: dict[str, str] = {}
        for route, found in truncates:
            source, action, n = route.spec.name, route.spec.truncate_policy, found.num_rows
            metrics.TRUNCATES.labels(source=source, action=action).inc(n)
            report.truncates[source] = report.truncates.get(source, 0) + n
            table = route.spec.table
            if action != "apply" or table is None:
                log.info("source %s: %d truncate(s) skipped (on_truncate: %s)", source, n, action)
                continue
            newest = pc.max(found[SEQ]).as_py()
            check_truncate_order(found[SEQ], newest, table=table)
            if table not in latest or newest > latest[table]:
                latest[table] = newest
        return latest

    def _check_keys(self, route: _Route, rows: pa.Table, bad: pa.Table) -> tuple[pa.Table, pa.Table, int]:
        """The rows for the route's table with key changes split by the table's key (and how many), and
        the dead letters plus the rows whose primary key is absent or null: they could not be applied."""
        bad = bad.cast(DEAD_LETTER_SCHEMA)
        if rows.num_rows == 0 or route.spec.table is None:
            return rows, bad, 0
        key = self.keys.key_of(route.spec.table)
        if key is None:
            raise DecodeError(f"table {route.spec.table!r} has no primary_key and none was learnt from the "
                              "message keys; set tables[].primary_key", reason="missing-key")
        missing = [k for k in key if k not in rows.column_names]
        if missing:
            raise DecodeError(
                f"source {route.spec.name!r}: the decoded rows have no column(s) {missing} that table "
                f"{route.spec.table!r} uses as primary key; fix tables[].primary_key or the source's columns",
                reason="missing-key")
        return check_keys(rows, bad, key, f"table {route.spec.table!r}")

    def _late_letters(self, late_rows: dict, batch_id: int, report: BatchReport
                      ) -> list[tuple[str, pa.Table, str | None]]:
        """Count the joins' late rows; those of views with ``late_rows: dead_letter`` become dead letters
        (the decoded row as JSON: the message was decoded fine, its Kafka position is not known here)."""
        letters = []
        for (view, side), (n, rows) in sorted(late_rows.items()):
            metrics.LATE_ROWS.labels(view=view, side=side).inc(n)
            report.dead_letters["late"] = report.dead_letters.get("late", 0) + n
            if not rows:
                log.warning("batch %d: view %s dropped %d late %s row(s) (behind its watermark; late_rows: drop)",
                            batch_id, view, n, side)
                continue
            source = self.plan.source_of(view, side)
            spec = self._route_of(source).spec
            error = (f"view {view!r}: this {side} input row's event time is behind the join's watermark (the "
                     "largest event time seen minus watermark_delay), so it was not joined; raise the source's "
                     "watermark_delay if such rows are expected")
            letters.append((source, pa.Table.from_pydict({
                "topic": [spec.topics[0] if spec.topics and len(spec.topics) == 1 else f"view:{view}"] * len(rows),
                "partition": [-1] * len(rows), "offset": [-1] * len(rows), "timestamp": [None] * len(rows),
                "key": [None] * len(rows), "value": [r.encode() for r in rows],
                "reason": ["late"] * len(rows), "error": [error] * len(rows)}, schema=DEAD_LETTER_SCHEMA), None))
        return letters

    def _handle_bad(self, route: _Route, bad: pa.Table, batch_id: int, report: BatchReport) -> None:
        reasons = bad["reason"].to_pylist()
        topics = bad["topic"].to_pylist()
        for topic, reason in zip(topics, reasons):
            metrics.DECODE_ERRORS.labels(topic, reason).inc()
        for reason, n in Counter(reasons).items():
            report.dead_letters[reason] = report.dead_letters.get(reason, 0) + n
            metrics.TABLE_BAD_RECORDS.labels(table=route.spec.table or "", reason=reason,
                                             action=route.spec.on_error).inc(n)
        policy = route.spec.on_error
        if policy == "fail":
            first = bad.slice(0, 1).to_pylist()[0]
            raise DecodeError(
                f"source {route.spec.name!r} (on_error: fail): {first['error']}; {bad.num_rows} bad message(s) "
                f"in batch {batch_id}. Fix the producer, or set on_error: dlq to quarantine bad messages",
                reason=first["reason"], topic=first["topic"], partition=first["partition"], offset=first["offset"])
        counter = metrics.DEAD_LETTERS if policy == "dlq" else metrics.SKIPPED_BAD
        for topic, reason in zip(topics, reasons):
            counter.labels(topic, reason).inc()
        if policy == "skip":
            log.warning("source %s: skipped %d bad message(s) in batch %d (on_error: skip)",
                        route.spec.name, bad.num_rows, batch_id)

    def _accumulate(self, report: BatchReport) -> None:
        t = self.totals
        t.batch_id = report.batch_id
        t.records += report.records
        t.expired += report.expired
        for name, kinds in report.changes.items():
            acc = t.changes.setdefault(name, {})
            for k, n in kinds.items():
                acc[k] = acc.get(k, 0) + n
        for reason, n in report.dead_letters.items():
            t.dead_letters[reason] = t.dead_letters.get(reason, 0) + n
        for source, n in report.key_changes.items():
            t.key_changes[source] = t.key_changes.get(source, 0) + n
        for source, n in report.truncates.items():
            t.truncates[source] = t.truncates.get(source, 0) + n


def with_origin_columns(rows: pa.Table, origin: Origin, *, table: str) -> pa.Table:
    """``rows`` of one origin with its database (``db.schema`` when the message names a schema) and table as the
    columns :data:`ORIGIN_COLUMNS`, placed before the reserved columns (``route[].origin_columns``)."""
    clash = [c for c in ORIGIN_COLUMNS if c in rows.column_names]
    if clash:
        raise ConfigError(f"table {table!r}: its rows already have column(s) {clash}, which origin_columns adds; "
                          "turn origin_columns off for its route rule")
    at = next((i for i, n in enumerate(rows.column_names) if n.startswith("_")), rows.num_columns)
    db = ".".join(p for p in (origin.db, origin.schema) if p) or None
    for name, value in reversed(list(zip(ORIGIN_COLUMNS, (db, origin.table)))):
        rows = rows.add_column(at, pa.field(name, pa.string()), pa.array([value] * rows.num_rows, pa.string()))
    return rows


def graph_sink_changes(changes: pa.Table, *, primary_key: Sequence[str], batch_id: int,
                       generation: int = 0) -> pa.Table:
    """A graph table's collected changes of one batch, ready for the Delta sink.

    The payloads of the executors' tasks arrive in no particular order; sorted stably by the
    ``_seq`` the graph gave them (the last kernel's output positions), each key's changes are in
    the order that kernel emitted them. Then :func:`~changelake.plan.physical.sink_changes`:
    ``_seq`` from the batch's commit position and the row's (after every earlier batch, also an older
    checkpoint generation's), a lone ``-U`` as ``-D``.
    """
    changes = changes.sort_by([(SEQ, "ascending")]) if changes.num_rows > 1 else changes
    return sink_changes(changes, primary_key=primary_key, batch_id=batch_id, generation=generation)


def _empty_changes(plan: PhysicalPlan, table: str) -> pa.Table:
    """No change for graph table ``table``, with its columns."""
    schema = next(n.schema for n in plan.sinks if n.table == table)
    return schema.append(pa.field(KIND, pa.int8())).append(pa.field(SEQ, pa.string())).empty_table()


def _key_shapes(routes: list["_Route"], parts: dict[int, dict[str, pa.Table]]) -> dict[str, list[pa.Table]]:
    """The ``keys`` payloads of the decode stage, by table."""
    shapes: dict[str, list[pa.Table]] = {}
    for i, got in parts.items():
        if "keys" in got and routes[i].spec.table is not None:
            shapes.setdefault(routes[i].spec.table, []).append(got["keys"])
    return shapes


def _kafka_position(seq: str | None) -> tuple[int, int]:
    """(partition, offset) of an ordering token made from a Kafka position (``changelog.seq_from_kafka``);
    (-1, -1) when the token is a database log position or not a source row's."""
    if seq and len(seq) == 26 and seq[0] == "k" and seq[1:].isdigit():
        return int(seq[1:6]), int(seq[6:])
    return -1, -1


def _maintenance(m: MaintenanceSpec) -> Maintenance:
    def every(value: str | None) -> timedelta | None:
        return None if value is None else timedelta(seconds=parse_duration(value))

    return Maintenance(compact_every=every(m.compact_every), compact_min_files=m.compact_min_files,
                       vacuum_every=every(m.vacuum_every),
                       vacuum_retention=timedelta(seconds=parse_duration(m.vacuum_retention)))


def _empty(route: "_Route") -> pa.Table:
    schema = getattr(route.decoder, "output_schema", None)
    return schema.empty_table() if schema is not None else pa.table({})


def _count_kinds(changes: pa.Table) -> dict[str, int]:
    counts = pc.value_counts(changes[KIND]).to_pylist()
    return {_KIND_LABEL[c["values"]]: c["counts"] for c in counts}
