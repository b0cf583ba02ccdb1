"""Run a physical plan on Spark Structured Streaming: the sink tables' changes of each micro-batch.

:func:`compile_packed` takes one typed, decoded streaming DataFrame per source (the source's
columns, ``_kind``, ``_seq``) and returns one streaming DataFrame of every sink table's changes as
Arrow IPC payloads (``PACKED_SCHEMA``: ``_route`` = the table's index, ``part`` = ``"changes"``),
which one Spark action per micro-batch collects. The plan runs as one linear chain of
``transformWithStateInPandas`` operators, one per stateful node (``changelake.spark.chain``): a
node read by several consumers still runs once, with one copy of its state. Per node kind::

    source       its rows cast to the node's schema, routed to its consumers (mapInArrow, SourceRouter)
    filter       rows where the SQL predicate is true, in DuckDB (``plan.sql``, as LocalRunner)
    project      the SQL expressions in DuckDB, cast to the planned types
    lookup_join  the worker's cached LookupJoiner (one per node per Python worker); _kind and _seq pass
    stateful     one operator of the chain: per bucket of its state key (``spark.buckets.bucket_of``),
                 the kernel restored from the bucket's state, run over the bucket's rows ordered by
                 _seq, its output routed on; -U dropped first when drop_update_before
    aggregate    two-phase when its calls merge (:func:`is_two_phase`): the router in front of it folds
                 the rows it sends per group key into partial accumulators, the global kernel merges them
    join         each input addressed on its own (part = its side), bucketed by its join-key values
    interval / temporal join
                 as join, plus one heartbeat per bucket with the largest event time of the rows sent
                 (every bucket then agrees on the watermark); late rows leave as reports
    sink         the rows addressed to the table, delivered as its packed changes

Ordering: a stateful node's rows carry ``_seq`` (the source's ordering token, or the row's
position in its upstream bucket's output of the micro-batch), and each bucket sorts its rows
by it stably, so the rows of one key reach the kernel in the order their upstream emitted
them, whatever the shuffle did. Rows of different upstream buckets have no order between
them (as rows of different keys in :class:`~changelake.plan.local.LocalRunner` may
interleave differently); the final state of every table is the same.

The state of each stateful node lives in the RocksDB state store of its operator, checkpointed
with the query. Spark identifies that state by the operator's position in the query: changing the
plan's shape (adding, removing or reordering stateful nodes) or a node's bucket count needs a new
checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from changelake.errors import ConfigError
from changelake.plan.physical import PhysicalPlan
from changelake.spark.chain import CHANGES_PART, compile_chain, is_two_phase  # noqa: F401  (re-exported)
from changelake.spark.decode_stage import SPARK_SCHEMA
from changelake.spark.groups import GroupLayout
from changelake.spark.reports import ReportChannel

#: Buckets per stateful node unless the caller says otherwise (docs/state-design.md: B=32 for keys
#: of many values; a low-cardinality key touches at most as many buckets as it has values).
DEFAULT_BUCKETS = 32


def compile_packed(plan: PhysicalPlan, sources: Mapping[str, Any], *,
                   buckets: int | Mapping[str, int] = DEFAULT_BUCKETS, channel: ReportChannel | None = None,
                   two_phase: bool = True, groups: GroupLayout | None = None) -> tuple[Any, list[str]]:
    """Every sink table's changes as one DataFrame of IPC payloads (``PACKED_SCHEMA``), and the table
    name of each ``_route`` index.

    ``sources`` maps each source name to its decoded streaming DataFrame (at least the
    source's columns, ``_kind`` and ``_seq``). ``buckets`` is one bucket count for every stateful
    node, or per node id (missing ids get :data:`DEFAULT_BUCKETS`). ``channel``
    (:class:`~changelake.spark.reports.ReportChannel`) receives every node's reports under its node
    id: state sizes, stale retractions, materializer corrections, the event-time joins' late rows,
    the lookup joins' figures (without it they are dropped). ``two_phase=False`` runs every
    aggregate one-phase (the global kernel's snapshots are the one-phase GroupAggregate's, so either
    continues the other's state; the local step adds no state of its own). ``groups``: the group layout
    (:mod:`changelake.spark.groups`); None spreads the buckets over the session's shuffle partitions,
    which suits a new checkpoint.
    """
    missing = sorted({n.source for n in plan.sources} - set(sources))
    if missing:
        raise ConfigError(f"no streaming DataFrame for source(s) {missing}")
    if groups is None and sources:
        spark = next(iter(sources.values())).sparkSession
        groups = GroupLayout(int(spark.conf.get("spark.sql.shuffle.partitions")))
    return compile_chain(plan, sources, buckets=buckets, default_buckets=DEFAULT_BUCKETS, channel=channel,
                         two_phase=two_phase, groups=groups)


#: Spark schema of packed changes (the same columns as the decode stage's payloads).
PACKED_SCHEMA = SPARK_SCHEMA
