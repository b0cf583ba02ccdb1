"""The typed Python API that composes a pipeline, and the logical graph it builds.

::

    p = Pipeline()
    orders = p.source("orders", columns={"order_id": "bigint", "product_id": "bigint", "qty": "int"},
                      primary_key=["order_id"])
    products = p.source("products", columns={"id": "bigint", "category": "string", "price": "bigint"},
                        primary_key=["id"])
    sales = (orders.join(products, on={"product_id": "id"})
                   .group_by("category")
                   .agg(orders="count(*)", revenue="sum(price)"))
    sales.to_table("category_sales", primary_key=["category"])
    sales.top_n(3, order_by=["revenue desc"], rank_column="rnk").to_table("top3", primary_key=["rnk"])
    print(p.explain())

The same graph is declared in the service YAML under ``views`` and ``tables[].from``
(:func:`changelake.service.views.pipeline_from_config`). Every node gets a name (given, or
derived from its operation and input); names are the nodes' identity in the plan, in
``explain`` and in the operator state of a running query, so renaming a node of a running
pipeline discards its state.

Aggregates are written ``"count(*)"``, ``"count(col)"``, ``"count(distinct col)"``,
``"sum(col)"``, ``"avg(col)"``, ``"min(col)"``, ``"max(col)"``; sort keys ``"col"``,
``"col desc"``, ``"col asc nulls first"``; filters and projections are SQL expressions
over the input's columns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from changelake.durations import duration_ms
from changelake.errors import ConfigError

if TYPE_CHECKING:
    from changelake.connectors.lookup import Lookup
from changelake.types import arrow_schema

JOIN_HOW = ("inner", "left", "right", "full", "semi", "anti")
LOOKUP_JOIN_HOW = ("inner", "left")
_AGG = re.compile(r"^\s*(count|sum|avg|min|max)\s*\(\s*(distinct\s+)?(\*|[A-Za-z][A-Za-z0-9_]*)\s*\)\s*$", re.I)
_SORT = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_]*)(?:\s+(asc|desc))?(?:\s+nulls\s+(first|last))?\s*$", re.I)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class AggSpec:
    """``output = function(column)``; ``column`` None is COUNT(*)."""

    output: str
    function: str
    column: str | None
    distinct: bool = False

    @classmethod
    def parse(cls, output: str, text: str) -> "AggSpec":
        m = _AGG.match(str(text))
        if not m:
            raise ConfigError(f"aggregate {output!r}: cannot read {text!r}; write e.g. 'count(*)', 'sum(price)', "
                              "'count(distinct user_id)', 'min(ts)' (functions: count, sum, avg, min, max)")
        function, distinct, column = m.group(1).upper(), bool(m.group(2)), m.group(3)
        if column == "*":
            if function != "COUNT" or distinct:
                raise ConfigError(f"aggregate {output!r}: only count(*) takes '*'; got {text!r}")
            column = None
        return cls(output, function, column, distinct)

    def __str__(self) -> str:
        inner = "*" if self.column is None else ("DISTINCT " if self.distinct else "") + self.column
        return f"{self.function}({inner}) AS {self.output}"


@dataclass(frozen=True)
class SortSpec:
    column: str
    ascending: bool = True
    nulls_last: bool | None = None      # None: Flink's default (NULLs first ascending, last descending)

    @classmethod
    def parse(cls, text: str) -> "SortSpec":
        m = _SORT.match(str(text))
        if not m:
            raise ConfigError(f"cannot read the sort key {text!r}; write 'column', 'column desc' or "
                              "'column asc nulls first'")
        ascending, nulls = (m.group(2) or "asc").lower() == "asc", m.group(3)
        last = None if nulls is None else nulls.lower() == "last"
        return cls(m.group(1), ascending, None if last == (not ascending) else last)    # Flink's default: None

    def __str__(self) -> str:
        nulls = "" if self.nulls_last is None else (" NULLS LAST" if self.nulls_last else " NULLS FIRST")
        return f"{self.column} {'ASC' if self.ascending else 'DESC'}{nulls}"


@dataclass(frozen=True)
class LogicalNode:
    """One node of the logical graph; ``params`` depend on ``op`` (see :class:`Stream`)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StateOptions:
    """Idle-state retention of a stateful node and what a retraction that finds no state does.

    ``ttl``: a duration ('1 day', '30 minutes') after which a key's untouched state is dropped;
    None keeps state forever. ``on_stale_retraction``: 'warn' (log, count, skip, as Flink) or
    'fail' (stop the pipeline). Either way ``changelake_stale_retractions_total`` counts them.
    """

    ttl: str | None = None
    on_stale_retraction: str = "warn"

    def __post_init__(self) -> None:
        if self.on_stale_retraction not in ("warn", "fail"):
            raise ConfigError(f"on_stale_retraction must be 'warn' or 'fail', got {self.on_stale_retraction!r}")
        self.ttl_ms  # validates the duration

    @property
    def ttl_ms(self) -> int:
        return duration_ms("state ttl", self.ttl)


class Pipeline:
    """A graph of sources, operators and table sinks; see the module docstring.

    ``state`` is the default :class:`StateOptions` of every stateful node
    (:meth:`Stream.with_state` overrides it for one node).
    """

    def __init__(self, *, state: StateOptions | None = None) -> None:
        self.nodes: dict[str, LogicalNode] = {}
        self.state = state or StateOptions()

    # -- building ------------------------------------------------------------------------------
    def source(self, name: str, *, columns: Mapping[str, str] | pa.Schema, primary_key: Sequence[str] | None = None,
               normalize: bool | None = None, event_time: str | None = None, watermark_delay: str | None = None,
               append_only: bool = False, unavailable_value: str | None = None) -> "Stream":
        """A decoded CDC source with these columns.

        ``normalize`` (default: on when the source has a primary key and is not append-only) puts
        Flink's ChangelogNormalize behind the source: a keep-last state per primary key that turns
        re-delivered changes (Kafka is at-least-once) into no-ops before stateful operators
        see them. It costs one stored row per key; turn it off only when duplicates cannot occur.

        ``event_time`` names the column (a timestamp, or epoch milliseconds) that says when each
        change happened, for the time-bounded joins; ``watermark_delay`` ('5 seconds', default 0)
        is how far out of order its rows may arrive: the watermark is the largest event time seen
        minus the delay, and a row behind it is late. ``append_only`` declares that the source
        only ever inserts (facts, events): an interval join or a temporal join's fact side needs
        that, and an update or delete arriving from it stops the pipeline with an error.

        ``unavailable_value`` is the text a connector writes for a value it did not send (Debezium's
        ``__debezium_unavailable_value`` for an unchanged TOASTed Postgres column): the normalize
        puts the key's stored value in its place, so no operator ever sees the placeholder.
        """
        schema = columns if isinstance(columns, pa.Schema) else arrow_schema(dict(columns))
        key = tuple(primary_key) if primary_key else None
        if key:
            _check_columns(name, "primary_key", key, schema.names)
        if normalize and not key:
            raise ConfigError(f"source {name!r}: normalize needs a primary_key (the normalize state is keyed by it)")
        if unavailable_value is not None and not (key and normalize is not False and not append_only):
            raise ConfigError(f"source {name!r}: unavailable values are filled from the normalize state, which "
                              "needs a primary_key and normalize on")
        if normalize and append_only:
            raise ConfigError(f"source {name!r}: an append_only source has nothing to normalize; drop normalize")
        if watermark_delay is not None and event_time is None:
            raise ConfigError(f"source {name!r}: watermark_delay needs event_time (the column the watermark follows)")
        if event_time is not None:
            _check_columns(name, "event_time", [event_time], schema.names)
            t = schema.field(event_time).type
            if not (pa.types.is_timestamp(t) or pa.types.is_integer(t) or pa.types.is_date(t)):
                raise ConfigError(f"source {name!r}: event_time column {event_time!r} is {t}; it must be a timestamp, "
                                  "a date or an integer of epoch milliseconds")
        return self._add(name, "source", (), schema=schema, primary_key=key,
                         normalize=bool(key) and not append_only if normalize is None else normalize,
                         event_time=event_time, watermark_delay_ms=duration_ms(f"source {name!r} watermark_delay",
                                                                               watermark_delay),
                         append_only=bool(append_only), unavailable_value=unavailable_value)

    def _add(self, name: str, op: str, inputs: tuple[str, ...], **params: Any) -> "Stream":
        if not _NAME.match(name):
            raise ConfigError(f"node name {name!r} must start with a letter and hold only letters, digits and '_'")
        if name in self.nodes:
            raise ConfigError(f"two nodes are named {name!r}; node names must be unique")
        for i in inputs:
            if i not in self.nodes:
                raise ConfigError(f"{op} {name!r} reads {i!r}, which is not defined before it")
        self.nodes[name] = LogicalNode(name, op, inputs, params)
        return Stream(self, name)

    def _fresh(self, base: str) -> str:
        if base not in self.nodes:
            return base
        n = 2
        while f"{base}_{n}" in self.nodes:
            n += 1
        return f"{base}_{n}"

    def stream(self, name: str) -> "Stream":
        if name not in self.nodes:
            raise ConfigError(f"no node named {name!r}; defined: {sorted(self.nodes)}")
        return Stream(self, name)

    def sql(self, name: str, query: str, *, lookups: Mapping[str, "Lookup"] | None = None) -> "Stream":
        """A view written as one Flink SQL query over the sources and views defined so far (and the
        ``lookups`` a ``FOR SYSTEM_TIME AS OF`` join names); planned into the nodes the step methods
        add (:mod:`changelake.plan.sql_view`), the last one named ``name``."""
        from changelake.plan.sql_view import plan_view

        return plan_view(self, name, query, lookups)

    # -- planning --------------------------------------------------------------------------------
    def plan(self, *, mini_batch: bool = True):
        """The physical plan (changelog modes decided, materializers inserted)."""
        from changelake.plan.planner import plan

        return plan(self, mini_batch=mini_batch)

    def explain(self, **kwargs: Any) -> str:
        from changelake.plan.explain import explain_plan

        return explain_plan(self.plan(**kwargs))


@dataclass(frozen=True)
class Stream:
    """A node's output changelog; each method adds a node and returns its stream."""

    pipeline: Pipeline
    name: str

    def _then(self, op: str, name: str | None, inputs: tuple[str, ...] | None = None, **params: Any) -> "Stream":
        node_name = name or self.pipeline._fresh(f"{op}_{self.name}")
        return self.pipeline._add(node_name, op, inputs or (self.name,), **params)

    def with_state(self, *, ttl: str | None = None, on_stale_retraction: str = "warn") -> "Stream":
        """Set this node's state retention and stale-retraction policy (see :class:`StateOptions`)."""
        node = self.pipeline.nodes[self.name]
        if node.op in ("source", "sink", "filter", "project", "lookup_join"):
            raise ConfigError(f"{node.op} {self.name!r} keeps no state; set with_state on a stateful operator")
        options = StateOptions(ttl, on_stale_retraction)
        self.pipeline.nodes[self.name] = LogicalNode(node.name, node.op, node.inputs, {**node.params, "state": options})
        return self

    def deduplicate(self, keys: Sequence[str], *, keep: str = "last", order_by: str | None = None,
                    name: str | None = None) -> "Stream":
        """One row per key: the first or the last one, by arrival or by the ``order_by`` column."""
        if keep not in ("first", "last"):
            raise ConfigError(f"deduplicate: keep must be 'first' or 'last', got {keep!r}")
        return self._then("deduplicate", name, keys=tuple(keys), keep=keep, order_by=order_by)

    def filter(self, predicate: str, *, name: str | None = None) -> "Stream":
        """Rows for which the SQL ``predicate`` holds."""
        return self._then("filter", name, predicate=str(predicate))

    def select(self, columns: Mapping[str, str] | Sequence[str], *, name: str | None = None) -> "Stream":
        """A projection: ``{"output": "SQL expression"}``, or a list of column names to keep."""
        pairs = tuple((c, c) for c in columns) if not isinstance(columns, Mapping) else tuple(
            (str(k), str(v)) for k, v in columns.items())
        if not pairs:
            raise ConfigError("select: name at least one column")
        return self._then("project", name, projections=pairs)

    def join(self, other: "Stream", *, on: Mapping[str, str] | Sequence[str], how: str = "inner",
             where: Any = None, name: str | None = None) -> "Stream":
        """Regular join: ``on`` maps left columns to right columns (or lists names both sides share).

        ``where`` is an optional residual predicate, a Python callable ``(left: dict, right: dict) -> bool``.
        """
        how = how.lower()
        if how not in JOIN_HOW:
            raise ConfigError(f"join: how must be one of {JOIN_HOW}, got {how!r}")
        if other.pipeline is not self.pipeline:
            raise ConfigError("join: both streams must belong to the same Pipeline")
        pairs = tuple(on.items()) if isinstance(on, Mapping) else tuple((c, c) for c in on)
        if not pairs:
            raise ConfigError("join: 'on' must name at least one pair of key columns")
        node_name = name or self.pipeline._fresh(f"join_{self.name}_{other.name}")
        return self.pipeline._add(node_name, "join", (self.name, other.name), on=pairs, how=how, where=where)

    def interval_join(self, other: "Stream", *, on: Mapping[str, str] | Sequence[str], before: str, after: str,
                      left_time: str | None = None, right_time: str | None = None, how: str = "inner",
                      late_rows: str = "drop", name: str | None = None) -> "Stream":
        """Time-windowed join: rows with equal keys where ``left_time BETWEEN right_time - before AND
        right_time + after`` (durations such as '10 minutes'; '0 seconds' for a bound at the right's time).

        Both inputs must be insert-only (an append_only source, or what keeps it so) and carry an
        event time (the source's ``event_time``; ``left_time`` / ``right_time`` default to it).
        The watermark drops each row's state once no row of the other side can meet it any more;
        an outer join (``how`` left, right or full) then emits an unmatched row padded with nulls.
        ``late_rows``: 'drop' (count in ``changelake_late_rows_total``) or 'dead_letter' (count,
        and write the row to the dead-letter path).
        """
        how = how.lower()
        if how not in ("inner", "left", "right", "full"):
            raise ConfigError(f"interval_join: how must be inner, left, right or full, got {how!r}")
        pairs = _join_pairs(self, other, on, "interval_join")
        node_name = name or self.pipeline._fresh(f"interval_join_{self.name}_{other.name}")
        return self.pipeline._add(node_name, "interval_join", (self.name, other.name), on=pairs, how=how,
                                  before_ms=duration_ms(f"interval_join {node_name!r} before", before, signed=True),
                                  after_ms=duration_ms(f"interval_join {node_name!r} after", after, signed=True),
                                  left_time=left_time, right_time=right_time, late_rows=_late_rows(late_rows))

    def temporal_join(self, versions: "Stream", *, on: Mapping[str, str] | Sequence[str], time: str | None = None,
                      version_time: str | None = None, how: str = "inner", late_rows: str = "drop",
                      name: str | None = None) -> "Stream":
        """Each fact (this insert-only stream) joined with the row ``versions`` had at the fact's event time
        (``FOR SYSTEM_TIME AS OF``): ``versions`` is a changelog whose primary key is the join key and whose
        event time says from when each change holds. ``how``: inner (facts without a version are dropped)
        or left (padded with nulls). A fact is emitted once the watermark passes its time.
        """
        how = how.lower()
        if how not in ("inner", "left"):
            raise ConfigError(f"temporal_join: how must be inner or left, got {how!r}")
        pairs = _join_pairs(self, versions, on, "temporal_join")
        node_name = name or self.pipeline._fresh(f"temporal_join_{self.name}_{versions.name}")
        return self.pipeline._add(node_name, "temporal_join", (self.name, versions.name), on=pairs, how=how,
                                  left_time=time, right_time=version_time, late_rows=_late_rows(late_rows))

    def lookup_join(self, lookup: "Lookup", *, on: Mapping[str, str] | Sequence[str], how: str = "inner",
                    name: str | None = None) -> "Stream":
        """Lookup join: each change row looks its key up in the dimension table ``lookup``
        (:class:`~changelake.connectors.lookup.Lookup`); ``on`` maps this stream's columns to the
        lookup's key columns (all of them). ``how``: 'inner' drops rows whose key the table lacks,
        'left' pads them with nulls. No operator state; see docs/pipelines.md "Lookup join".
        """
        from changelake.connectors.lookup import Lookup

        how = how.lower()
        if how not in LOOKUP_JOIN_HOW:
            raise ConfigError(f"lookup_join: how must be one of {LOOKUP_JOIN_HOW}, got {how!r}")
        if not isinstance(lookup, Lookup):
            raise ConfigError(f"lookup_join: lookup must be a Lookup (Lookup.delta(...) or Lookup.postgres(...)), "
                              f"got {type(lookup).__name__}")
        pairs = tuple(on.items()) if isinstance(on, Mapping) else tuple((c, c) for c in on)
        if not pairs:
            raise ConfigError("lookup_join: 'on' must map at least one stream column to a lookup key column")
        return self._then("lookup_join", name, lookup=lookup, on=pairs, how=how)

    def group_by(self, *keys: str) -> "GroupedStream":
        return GroupedStream(self, tuple(keys))

    def top_n(self, n: int, *, order_by: Sequence[str], partition_by: Sequence[str] = (),
              rank_column: str | None = None, two_level: int | None = None,
              name: str | None = None) -> "Stream":
        """ROW_NUMBER() <= n per partition, ordered by ``order_by``; ``rank_column`` adds the row number.

        ``two_level=K`` plans it as two Top-Ns (for a hot partition, or a global Top-N): the first
        partitioned by ``partition_by`` plus a hash of the row key into K buckets, the second merging
        the buckets' candidates per ``partition_by``; the result is the single-level Top-N's.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigError(f"top_n: n must be an integer >= 1, got {n!r}")
        if two_level is not None and (not isinstance(two_level, int) or isinstance(two_level, bool)
                                      or two_level < 2):
            raise ConfigError(f"top_n: two_level must be an integer >= 2 (the number of first-level buckets), "
                              f"got {two_level!r}; leave it unset for a single-level Top-N")
        sorts = tuple(SortSpec.parse(s) for s in order_by)
        if not sorts:
            raise ConfigError("top_n: order_by must name at least one column")
        return self._then("rank", name, n=n, order_by=sorts, partition_by=tuple(partition_by),
                          rank_column=rank_column, two_level=two_level)

    def to_table(self, table: str, *, primary_key: Sequence[str]) -> None:
        """Upsert this changelog into the Delta table ``table`` keyed by ``primary_key``."""
        if not primary_key:
            raise ConfigError(f"table {table!r}: primary_key must name at least one column")
        self.pipeline._add(f"sink_{table}", "sink", (self.name,), table=table, primary_key=tuple(primary_key))


@dataclass(frozen=True)
class GroupedStream:
    stream: Stream
    keys: tuple[str, ...]

    def agg(self, aggregates: Mapping[str, str] | None = None, *, name: str | None = None,
            **named: str) -> Stream:
        """``agg(total="sum(price)", n="count(*)")`` (or a mapping, for names that are not identifiers)."""
        calls = {**(aggregates or {}), **named}
        if not calls:
            raise ConfigError("agg: give at least one aggregate, e.g. agg(n='count(*)')")
        specs = tuple(AggSpec.parse(out, text) for out, text in calls.items())
        return self.stream._then("aggregate", name, group_by=self.keys, aggregates=specs)


def _join_pairs(left: Stream, right: Stream, on, what: str) -> tuple[tuple[str, str], ...]:
    if right.pipeline is not left.pipeline:
        raise ConfigError(f"{what}: both streams must belong to the same Pipeline")
    pairs = tuple(on.items()) if isinstance(on, Mapping) else tuple((c, c) for c in on)
    if not pairs:
        raise ConfigError(f"{what}: 'on' must name at least one pair of key columns")
    return pairs


LATE_ROWS = ("drop", "dead_letter")


def _late_rows(policy: str) -> str:
    if policy not in LATE_ROWS:
        raise ConfigError(f"late_rows must be one of {LATE_ROWS}, got {policy!r}")
    return policy


def _check_columns(node: str, what: str, columns: Sequence[str], known: Sequence[str]) -> None:
    missing = [c for c in columns if c not in known]
    if missing:
        raise ConfigError(f"{node!r}: {what} names column(s) {missing} that its input does not have; "
                          f"columns are {list(known)}")
