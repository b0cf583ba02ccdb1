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
(:func:`changelake.plan.yaml.pipeline_from_config`). Every node gets a name (given, or
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
from typing import Any

import pyarrow as pa

from changelake.errors import ConfigError
from changelake.types import arrow_schema

JOIN_HOW = ("inner", "left", "right", "full", "semi", "anti")
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
    nulls_last: bool | None = None      # None: SQL's default (nulls last ascending, first descending)

    @classmethod
    def parse(cls, text: str) -> "SortSpec":
        m = _SORT.match(str(text))
        if not m:
            raise ConfigError(f"cannot read the sort key {text!r}; write 'column', 'column desc' or "
                              "'column asc nulls first'")
        nulls = m.group(3)
        return cls(m.group(1), (m.group(2) or "asc").lower() == "asc",
                   None if nulls is None else nulls.lower() == "last")

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
        if self.ttl is None:
            return 0
        from changelake.service.config import parse_duration

        try:
            return int(parse_duration(self.ttl) * 1000)
        except ValueError as exc:
            raise ConfigError(f"state ttl: {exc}") from None


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
               normalize: bool | None = None) -> "Stream":
        """A decoded CDC source with these columns.

        ``normalize`` (default: on when the source has a primary key) puts Flink's
        ChangelogNormalize behind the source: a keep-last state per primary key that turns
        re-delivered changes (Kafka is at-least-once) into no-ops before stateful operators
        see them. It costs one stored row per key; turn it off only when duplicates cannot occur.
        """
        schema = columns if isinstance(columns, pa.Schema) else arrow_schema(dict(columns))
        key = tuple(primary_key) if primary_key else None
        if key:
            _check_columns(name, "primary_key", key, schema.names)
        if normalize and not key:
            raise ConfigError(f"source {name!r}: normalize needs a primary_key (the normalize state is keyed by it)")
        return self._add(name, "source", (), schema=schema, primary_key=key,
                         normalize=bool(key) if normalize is None else normalize)

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
        if node.op in ("source", "sink", "filter", "project"):
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


def _check_columns(node: str, what: str, columns: Sequence[str], known: Sequence[str]) -> None:
    missing = [c for c in columns if c not in known]
    if missing:
        raise ConfigError(f"{node!r}: {what} names column(s) {missing} that its input does not have; "
                          f"columns are {list(known)}")
