"""From the logical graph to the physical plan: schemas, upsert keys, changelog modes.

Three passes, as Flink's changelog-mode inference:

1. **Bottom-up** (definition order): each node's output columns and upsert key; a
   ChangelogNormalize behind every source with ``normalize``; a SinkUpsertMaterializer in
   front of every sink whose primary key is not its input's upsert key.
2. **Top-down** (reverse order): whether a node must emit ``-U``. A node's consumers
   decide: GroupAggregate, the joins, a retracting Top-N, the materializer and a filter
   need ``-U`` to retract what they hold; a sink keyed by its input's upsert key needs
   only ``+U`` (Delta MERGE replaces the row by key); a projection passes its consumers'
   need through unless it drops the upsert key.
3. **Configs** (definition order): every stateful node's kernel config is built with
   ``generate_update_before`` set from pass 2, and the node's changelog mode is what its
   kernel declares for that config (``Kernel.contract()``); and the columns that are never
   NULL (:mod:`changelake.plan.nullability`), which tell each table which key columns may be.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import pyarrow as pa

from changelake.errors import ConfigError
from changelake.operators import changelog_mode as cm
from changelake.operators.lookup_join import LookupJoinConfig, LookupJoiner
from changelake.operators import (
    AggCall, Deduplicate, DeduplicateConfig, GroupAggregate, GroupAggregateConfig, InputSpec, RankConfig,
    SinkUpsertMaterializer, SinkUpsertMaterializerConfig, SortColumn, StreamingJoin, StreamingJoinConfig,
    StreamingSemiAntiJoin, make_rank)
from changelake.plan import sql
from changelake.plan.graph import LogicalNode, Pipeline, StateOptions, _check_columns
from changelake.plan.nullability import not_null_columns
from changelake.plan.physical import PhysicalNode, PhysicalPlan

#: Bundle size of the mini-batch operators in the in-process runner; on Spark the micro-batch is the bundle.
MINI_BATCH_SIZE = 10_000


@dataclass
class _Draft:
    id: str
    op: str
    inputs: tuple[str, ...]
    schema: pa.Schema
    upsert_key: tuple[str, ...] | None
    #: the node's config for a given generate_update_before (stateful nodes)
    configure: Callable[[bool], Any] | None = None
    kernel: Any = None
    #: whether the node needs -U from its input, given whether its consumers need -U from it
    needs_ub: Callable[[bool], bool] = lambda required: False
    extra: dict = field(default_factory=dict)
    required: bool = False
    #: event-time columns of the output -> watermark delay (ms) of the input they came from
    rowtime: dict = field(default_factory=dict)


def plan(pipeline: Pipeline, *, mini_batch: bool = True) -> PhysicalPlan:
    if not any(n.op == "sink" for n in pipeline.nodes.values()):
        raise ConfigError("the pipeline writes no table; end it with .to_table(...) (YAML: tables[].from)")
    builder = _Builder(mini_batch, pipeline.state)
    for node in _feeding_a_table(pipeline):
        builder.add(node)
    drafts = builder.drafts
    _prune(drafts)
    for d in reversed(list(drafts.values())):                     # pass 2
        consumers = [c for c in drafts.values() if d.id in c.inputs]
        d.required = any(c.needs_ub(c.required) for c in consumers)
    nodes: dict[str, PhysicalNode] = {}
    for d in drafts.values():                                      # pass 3
        nodes[d.id] = _finish(d, nodes)
    return PhysicalPlan(tuple(nodes.values()))


def check(pipeline: Pipeline) -> list[tuple[str, str]]:
    """Every planner error, as (node name, message), instead of the first one: each node is planned
    on its own inputs; a node whose input already failed is skipped (its error would only echo)."""
    if not any(n.op == "sink" for n in pipeline.nodes.values()):
        return [("", "the pipeline writes no table; end it with .to_table(...) (YAML: tables[].from)")]
    builder = _Builder(True, pipeline.state)
    problems: list[tuple[str, str]] = []
    for node in _feeding_a_table(pipeline):
        if not all(i in builder.output for i in node.inputs):
            continue
        try:
            builder.add(node)
        except ConfigError as exc:
            problems.append((node.name, str(exc)))
    if not problems:
        try:
            plan(pipeline)
        except ConfigError as exc:
            problems.append(("", str(exc)))
    return problems


def _prune(drafts: dict[str, _Draft]) -> None:
    """Drop the nodes no table reads (a ChangelogNormalize whose only reader bypassed it)."""
    while True:
        read = {i for d in drafts.values() for i in d.inputs}
        idle = [k for k, d in drafts.items() if d.op != "sink" and k not in read]
        if not idle:
            return
        for k in idle:
            del drafts[k]


def _feeding_a_table(pipeline: Pipeline) -> list[LogicalNode]:
    """The nodes some table depends on, in definition order (the others would compute for nothing)."""
    needed: set[str] = set()
    stack = [n.name for n in pipeline.nodes.values() if n.op == "sink"]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(pipeline.nodes[name].inputs)
    return [n for n in pipeline.nodes.values() if n.name in needed]


def _finish(d: _Draft, done: dict[str, PhysicalNode]) -> PhysicalNode:
    config = d.configure(d.required) if d.configure else None
    if d.op == "source":
        mode = cm.INSERT_ONLY if d.extra.get("append_only") else cm.ALL
    elif d.op == "lookup_join":                         # stateless: the input's kinds, one row or none per row
        mode = done[d.inputs[0]].mode
    elif config is not None:
        kernel = d.kernel(config)
        mode = kernel.contract().produces
        if d.op == "join" and all(done[i].mode.is_insert_only for i in d.inputs) and \
                config.join_type in ("INNER", "SEMI"):
            mode = cm.INSERT_ONLY                       # no retraction in, none out
    elif d.op == "sink":
        mode = done[d.inputs[0]].mode
    else:                                               # filter / project keep the input's kinds
        mode = done[d.inputs[0]].mode
    node = PhysicalNode(id=d.id, op=d.op, inputs=d.inputs, schema=d.schema, mode=mode, upsert_key=d.upsert_key,
                        kernel=d.kernel, config=config, **d.extra)
    return replace(node, not_null=not_null_columns(node, [done[i] for i in d.inputs]))


def _idx(schema: pa.Schema, columns) -> tuple[int, ...]:
    return tuple(schema.get_field_index(c) for c in columns)


class _Builder:
    def __init__(self, mini_batch: bool, state: StateOptions) -> None:
        self.mini_batch = MINI_BATCH_SIZE if mini_batch else None
        self.state = state
        self.drafts: dict[str, _Draft] = {}
        #: logical name -> physical id of the node that carries its output
        self.output: dict[str, str] = {}

    def _put(self, d: _Draft) -> str:
        if d.id in self.drafts:
            raise ConfigError(f"two plan nodes are named {d.id!r} ({self.drafts[d.id].op} and {d.op}): the planner "
                              "names the nodes it adds after what they serve (normalize_<source>, "
                              "materialize_<table>, <top_n>_bucket / _local / _candidates); rename the view")
        self.drafts[d.id] = d
        return d.id

    def _input(self, name: str) -> _Draft:
        return self.drafts[self.output[name]]

    def add(self, node: LogicalNode) -> None:
        self.output[node.name] = getattr(self, f"_{node.op}")(node)

    def _state(self, node: LogicalNode | None = None) -> dict[str, Any]:
        """The kernel config fields of a node's state options (the pipeline's default if it set none)."""
        options = (node.params.get("state") if node else None) or self.state
        return {"state_ttl_ms": options.ttl_ms, "on_stale_retraction": options.on_stale_retraction}

    # -- sources ---------------------------------------------------------------------------------
    def _source(self, node: LogicalNode) -> str:
        p = node.params
        rowtime = {p["event_time"]: p["watermark_delay_ms"]} if p.get("event_time") else {}
        src = self._put(_Draft(node.name, "source", (), p["schema"], p["primary_key"], rowtime=rowtime,
                               extra={"source": node.name, "state_layout": "",
                                      "append_only": p.get("append_only", False)}))
        if not p["normalize"]:
            return src
        key = p["primary_key"]
        schema = p["schema"]
        mb, state = self.mini_batch, self._state()

        def configure(gub: bool) -> DeduplicateConfig:
            return DeduplicateConfig(keys=_idx(schema, key), keep="last", generate_update_before=gub,
                                     input_insert_only=False, mini_batch_size=mb,
                                     unavailable_value=p.get("unavailable_value"), **state)

        return self._put(_Draft(
            f"normalize_{node.name}", "normalize", (src,), schema, key, configure, Deduplicate, rowtime=rowtime,
            extra={"state_keys": (key,), "drop_update_before": True,
                   "state_layout": f"{list(key)} -> last row",
                   "note": "ChangelogNormalize: re-delivered changes become no-ops (source normalize: true)"}))

    # -- single-input operators ------------------------------------------------------------------
    def _deduplicate(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        p = node.params
        keys, keep, order_by = p["keys"], p["keep"], p["order_by"]
        _check_columns(node.name, "keys", keys, inp.schema.names)
        if order_by is not None:
            _check_columns(node.name, "order_by", [order_by], inp.schema.names)
        insert_only = self._insert_only(inp)
        if not insert_only and (keep != "last" or order_by is not None):
            raise ConfigError(
                f"deduplicate {node.name!r}: its input {node.inputs[0]!r} carries updates and deletes, which only "
                "keep='last' by arrival (no order_by) can apply; deduplicate an insert-only stream instead")
        schema, mb, state = inp.schema, self.mini_batch, self._state(node)

        def configure(gub: bool) -> DeduplicateConfig:
            return DeduplicateConfig(
                keys=_idx(schema, keys), keep=keep, order="proctime" if order_by is None else "rowtime",
                rowtime_index=None if order_by is None else schema.get_field_index(order_by),
                generate_update_before=gub, input_insert_only=insert_only, mini_batch_size=mb, **state)

        order = "arrival" if order_by is None else order_by
        return self._put(_Draft(node.name, "deduplicate", (inp.id,), schema, keys, configure, Deduplicate,
                                rowtime=dict(inp.rowtime),
                                extra={"state_keys": (keys,),
                                       "state_layout": f"{list(keys)} -> {keep} row by {order}"}))

    def _insert_only(self, d: _Draft) -> bool:
        """Whether ``d`` emits only +I whatever its consumers need (decided before pass 2)."""
        if d.op == "source":
            return bool(d.extra.get("append_only"))
        if d.op in ("filter", "project", "lookup_join"):
            return self._insert_only(self.drafts[d.inputs[0]])
        if d.configure is None:
            return False
        return d.kernel(d.configure(True)).contract().produces.is_insert_only

    def _filter(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        predicate = node.params["predicate"]
        sql.check_predicate(node.name, inp.schema, predicate)
        return self._put(_Draft(node.name, "filter", (inp.id,), inp.schema, inp.upsert_key,
                                needs_ub=lambda required: True, extra={"predicate": predicate},
                                rowtime=dict(inp.rowtime)))

    def _project(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        pairs = node.params["projections"]
        schema = sql.project_schema(node.name, inp.schema, pairs)
        passed = {c: name for name, expr in pairs if (c := _column_ref(expr)) in inp.schema.names}
        key = None
        if inp.upsert_key and all(c in passed for c in inp.upsert_key):
            key = tuple(passed[c] for c in inp.upsert_key)
        rowtime = {passed[c]: delay for c, delay in inp.rowtime.items() if c in passed}
        return self._put(_Draft(node.name, "project", (inp.id,), schema, key,
                                needs_ub=lambda required: required or key is None,
                                extra={"projections": pairs}, rowtime=rowtime))

    def _aggregate(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        group_by, aggs = node.params["group_by"], node.params["aggregates"]
        _check_columns(node.name, "group_by", group_by, inp.schema.names)
        _check_columns(node.name, "aggregates", [a.column for a in aggs if a.column], inp.schema.names)
        fields = [inp.schema.field(c) for c in group_by]
        fields += [pa.field(a.output, _agg_type(node.name, a, inp.schema)) for a in aggs]
        schema = _unique_schema(node.name, fields)
        in_schema, mb, state = inp.schema, self.mini_batch, self._state(node)
        calls = tuple(AggCall(a.function, None if a.column is None else in_schema.get_field_index(a.column),
                              a.distinct) for a in aggs)

        def configure(gub: bool) -> GroupAggregateConfig:
            return GroupAggregateConfig(group_keys=_idx(in_schema, group_by), aggregates=calls,
                                        generate_update_before=gub, mini_batch_size=mb, **state)

        accs = ", ".join(str(a) for a in aggs)
        return self._put(_Draft(node.name, "aggregate", (inp.id,), schema, tuple(group_by), configure,
                                GroupAggregate, needs_ub=lambda required: True,
                                extra={"state_keys": (tuple(group_by),),
                                       "state_layout": f"{list(group_by)} -> accumulators of {accs}"}))

    def _rank(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        p = node.params
        sorts, partition, rank_column = p["order_by"], p["partition_by"], p["rank_column"]
        _check_columns(node.name, "partition_by", partition, inp.schema.names)
        _check_columns(node.name, "order_by", [s.column for s in sorts], inp.schema.names)
        # without the rank number, rows are keyed by the input's key, which the sink can rely on
        # only when a key's rows stay in one partition
        stable = inp.upsert_key and set(partition) <= set(inp.upsert_key)
        key = (*partition, rank_column) if rank_column else (inp.upsert_key if stable else None)
        if p.get("two_level"):
            return self._two_level_rank(node, inp, key)
        return self._rank_draft(node.name, node, inp, partition, rank_column, key)

    def _rank_draft(self, node_id: str, node: LogicalNode, inp: _Draft, partition: tuple[str, ...],
                    rank_column: str | None, key: tuple[str, ...] | None, *,
                    layout: Callable[[str], str] | None = None, note: str = "") -> str:
        """One Top-N node over ``inp`` (``layout(strategy)`` overrides the explained state layout)."""
        n, sorts = node.params["n"], node.params["order_by"]
        in_schema = inp.schema
        fields = list(in_schema)
        if rank_column:
            fields.append(pa.field(rank_column, pa.int64()))
        schema = _unique_schema(node.name, fields)
        strategy = "append_only" if self._insert_only(inp) else "retract"
        state = self._state(node)
        # Flink's default NULL order: first ascending, last descending (SortUtil.getNullDefaultOrder)
        sort_columns = tuple(SortColumn(in_schema.get_field_index(s.column), s.ascending,
                                        not s.ascending if s.nulls_last is None else s.nulls_last) for s in sorts)

        def configure(gub: bool) -> RankConfig:
            return RankConfig(strategy=strategy, partition_keys=_idx(in_schema, partition), sort_keys=sort_columns,
                              rank_end=n, generate_update_before=gub, output_rank_number=bool(rank_column),
                              input_schema=in_schema, **state)

        order = ", ".join(str(s) for s in sorts)
        text = layout(strategy) if layout else (f"{list(partition) or 'one partition'} -> rows sorted by {order} "
                                                f"({strategy} strategy, top {n} emitted)")
        return self._put(_Draft(node_id, "rank", (inp.id,), schema, key, configure, make_rank,
                                needs_ub=lambda required: strategy == "retract",
                                extra={"state_keys": (tuple(partition),), "state_layout": text, "note": note}))

    def _two_level_rank(self, node: LogicalNode, inp: _Draft, key: tuple[str, ...] | None) -> str:
        """Top-N ``two_level=K`` (seed 003's nested Top-N against a hot partition)::

            <name>_bucket      Calc: the input + a bucket column, hash of the row key mod K
            <name>_local       Rank partitioned by partition_by + bucket, top n, no rank number
            <name>_candidates  Calc: the bucket column dropped
            <name>             Rank partitioned by partition_by over the candidates (retract)

        Every change of a row (its +I, -U, +U, -D) carries the same row key, so it reaches the
        same first-level partition, in order; a partition's Top-N is among the union of its
        buckets' Top-Ns, so the second level's result is the single-level Top-N's (rows whose
        sort keys tie may be picked in another order). Schema, upsert key and changelog mode of
        ``<name>`` are the single-level node's.
        """
        p = node.params
        k, n, partition, sorts = p["two_level"], p["n"], p["partition_by"], p["order_by"]
        row_key = inp.upsert_key or tuple(inp.schema.names)
        bucket = "topn_bucket"
        while bucket in inp.schema.names:
            bucket += "_"
        hashed = ((bucket, sql.hash_bucket(row_key, k)),)
        bucket_field = sql.project_schema(node.name, inp.schema, hashed).field(bucket)
        passed = tuple((c, sql.column(c)) for c in inp.schema.names)
        in_key = inp.upsert_key
        first = self._put(_Draft(
            f"{node.name}_bucket", "project", (inp.id,), inp.schema.append(bucket_field), in_key,
            needs_ub=lambda required: required or in_key is None,
            extra={"projections": passed + hashed,
                   "note": f"two-level Top-N {node.name!r}: {bucket} = hash of the row key {list(row_key)} mod {k}, "
                           "so every change of a row reaches the same level-1 partition"}))
        # the bucket is a function of the row key: a key's rows stay in one level-1 partition
        # exactly when they stay in one partition of partition_by
        local_key = in_key if in_key and set(partition) <= set(in_key) else None
        order = ", ".join(str(s) for s in sorts)
        local = self._rank_draft(
            f"{node.name}_local", node, self.drafts[first], (*partition, bucket), None, local_key,
            layout=lambda strategy: f"{[*partition, bucket]} -> "
                                    f"{'every row of the bucket' if strategy == 'retract' else f'its best {n} rows'}"
                                    f", sorted by {order} ({strategy} strategy, top {n} emitted)",
            note=f"two-level Top-N level 1 of 2: the top {n} of each of {k} buckets per partition, as candidates "
                 "(no rank number); " + ("a bucket's state goes with its last row" if not self._insert_only(inp)
                                         else "state kept until the state TTL"))
        candidates = self._put(_Draft(
            f"{node.name}_candidates", "project", (local,), inp.schema, local_key,
            needs_ub=lambda required: required or local_key is None,
            extra={"projections": passed, "note": f"two-level Top-N: drops {bucket} before the merge"}))
        return self._rank_draft(
            node.name, node, self.drafts[candidates], partition, p["rank_column"], key,
            layout=lambda strategy: f"{list(partition) or 'one partition'} -> candidate rows (at most {k} x {n}), "
                                    f"sorted by {order} ({strategy} strategy, top {n} emitted)",
            note=f"two-level Top-N level 2 of 2 (two_level: {k}): merges the buckets' candidates into the top {n}; "
                 "a partition's state goes with its last candidate")

    # -- join ------------------------------------------------------------------------------------
    def _two_inputs(self, node: LogicalNode, what: str):
        """A join's inputs, key columns (checked, equal types) and the right columns' output names."""
        left, right = self._input(node.inputs[0]), self._input(node.inputs[1])
        pairs = node.params["on"]
        lkey, rkey = tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
        _check_columns(node.name, "on (left)", lkey, left.schema.names)
        _check_columns(node.name, "on (right)", rkey, right.schema.names)
        for a, b in pairs:
            lt, rt = left.schema.field(a).type, right.schema.field(b).type
            if lt != rt:
                raise ConfigError(f"{what} {node.name!r}: key {a} is {lt} on the left but {b} is {rt} on the right; "
                                  "cast one side with a select first")
        renamed = {c: (f"{node.inputs[1]}_{c}" if c in left.schema.names else c) for c in right.schema.names}
        return left, right, lkey, rkey, renamed

    @staticmethod
    def _joined_schema(node: LogicalNode, left: _Draft, right: _Draft, renamed: dict[str, str],
                       join_type: str) -> pa.Schema:
        fields = list(left.schema) + [f.with_name(renamed[f.name]) for f in right.schema]
        if left.schema.names and join_type in ("RIGHT", "FULL"):
            fields[:len(left.schema)] = [f.with_nullable(True) for f in fields[:len(left.schema)]]
        if join_type in ("LEFT", "FULL"):
            fields[len(left.schema):] = [f.with_nullable(True) for f in fields[len(left.schema):]]
        return _unique_schema(node.name, fields)

    def _join(self, node: LogicalNode) -> str:
        how, where = node.params["how"], node.params["where"]
        pairs = node.params["on"]
        left, right, lkey, rkey, renamed = self._two_inputs(node, "join")
        join_type = how.upper()
        semi = join_type in ("SEMI", "ANTI")
        schema = (_unique_schema(node.name, list(left.schema)) if semi
                  else self._joined_schema(node, left, right, renamed, join_type))
        lspec, llayout = _join_input(left, lkey)
        rspec, rlayout = _join_input(right, rkey)
        key = _join_upsert_key(left, right, lkey, rkey, renamed, join_type)
        state = self._state(node)
        condition = None if where is None else RowPredicate(where, tuple(left.schema.names),
                                                             tuple(right.schema.names))
        config = StreamingJoinConfig(
            join_type=join_type, left_key=_idx(left.schema, lkey), right_key=_idx(right.schema, rkey),
            left_arity=len(left.schema), right_arity=len(right.schema), left_input=lspec, right_input=rspec,
            condition=condition, mini_batch_size=None if semi else self.mini_batch,  # no mini-batch semi/anti kernel
            left_state_ttl_ms=state["state_ttl_ms"],
            right_state_ttl_ms=state["state_ttl_ms"], on_stale_retraction=state["on_stale_retraction"],
            left_schema=left.schema, right_schema=right.schema)
        on = " AND ".join(f"{a} = {b}" for a, b in pairs)
        return self._put(_Draft(
            node.name, "join", (left.id, right.id), schema, key, lambda gub: config,
            StreamingSemiAntiJoin if semi else StreamingJoin, needs_ub=lambda required: True,
            extra={"state_keys": (lkey, rkey),
                   "state_layout": f"left {llayout}; right {rlayout}; by join key ({on})"
                                   + ("" if where is None else " with a residual predicate")}))

    def _lookup_join(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        lookup, pairs, how = node.params["lookup"], node.params["on"], node.params["how"]
        skeys, dkeys = tuple(a for a, _ in pairs), tuple(b for _, b in pairs)
        _check_columns(node.name, "on (stream)", skeys, inp.schema.names)
        dim = lookup.columns
        unknown = [c for c in dkeys if c not in dim.names]
        if unknown:
            raise ConfigError(f"lookup join {node.name!r}: on names column(s) {unknown} that lookup {lookup.name!r} "
                              f"does not declare; its columns are {dim.names}")
        if sorted(dkeys) != sorted(lookup.key) or len(set(dkeys)) != len(dkeys):
            raise ConfigError(f"lookup join {node.name!r}: on must map stream columns to exactly the key of lookup "
                              f"{lookup.name!r} {list(lookup.key)} (one dimension row per key); got {list(dkeys)}")
        for a, b in pairs:
            st, dt = inp.schema.field(a).type, dim.field(b).type
            if st != dt:
                raise ConfigError(f"lookup join {node.name!r}: {a} is {st} on the stream but {lookup.name}.{b} is "
                                  f"{dt}; cast the stream column with a select first, or declare the lookup column "
                                  f"as {st}")
        names = tuple(f"{lookup.name}_{c}" if c in inp.schema.names else c for c in dim.names)
        fields = list(inp.schema) + [f.with_name(n).with_nullable(True) for f, n in zip(dim, names)]
        schema = _unique_schema(node.name, fields)
        join_type = how.upper()
        config = LookupJoinConfig(lookup, skeys, dkeys, join_type, names)
        # an inner lookup join drops rows whose key is missing, as a filter does: it needs the input's -U
        # so that a row whose update is dropped is retracted; a left join emits one row per input row
        return self._put(_Draft(
            node.name, "lookup_join", (inp.id,), schema, inp.upsert_key, lambda gub: config, LookupJoiner,
            needs_ub=(lambda required: True) if join_type == "INNER" else (lambda required: required),
            rowtime=dict(inp.rowtime),
            extra={"state_keys": (skeys,),
                   "state_layout": f"no state (cache: {lookup.cache.describe()})",
                   "note": "a retraction is joined with the dimension's current row (as Flink): a dimension row "
                           "changed or deleted between a row's +I and its -D can leave stale results downstream"}))

    # -- time-bounded joins ----------------------------------------------------------------------
    def _time_column(self, node: LogicalNode, d: _Draft, given: str | None, side: str) -> tuple[str, int]:
        """The event-time column of one input and its watermark delay."""
        what = f"{node.op} {node.name!r}"
        if not d.rowtime:
            raise ConfigError(f"{what}: its {side} input {d.id!r} has no event time; declare the source's event_time "
                              "(and watermark_delay), and keep that column through filters and selects")
        if given is None:
            if len(d.rowtime) > 1:
                raise ConfigError(f"{what}: the {side} input has event-time columns {sorted(d.rowtime)}; name one "
                                  f"with {side}_time")
            given = next(iter(d.rowtime))
        if given not in d.rowtime:
            raise ConfigError(f"{what}: {side} time column {given!r} is not an event-time column of {d.id!r} "
                              f"(those are {sorted(d.rowtime)}): declare it as the source's event_time")
        return given, d.rowtime[given]

    def _needs_insert_only(self, node: LogicalNode, d: _Draft, side: str) -> None:
        if not self._insert_only(d):
            raise ConfigError(
                f"{node.op} {node.name!r}: its {side} input {d.id!r} carries updates and deletes, but this join takes "
                "only inserts there (a row's window or version cannot be retracted once emitted); declare the source "
                "append_only: true (facts, events)")

    def _time_join_config(self, node: LogicalNode, cls: type, left: _Draft, right: _Draft, lkey, rkey, **own):
        """A time-bounded join's kernel config, its inputs' event-time columns and their delays."""
        p = node.params
        ltime, ldelay = self._time_column(node, left, p["left_time"], "left")
        rtime, rdelay = self._time_column(node, right, p["right_time"], "right")
        config = cls(join_type=p["how"].upper(), left_key=_idx(left.schema, lkey), right_key=_idx(right.schema, rkey),
                     left_arity=len(left.schema), right_arity=len(right.schema),
                     left_time=left.schema.get_field_index(ltime), right_time=right.schema.get_field_index(rtime),
                     left_delay_ms=ldelay, right_delay_ms=rdelay, name=f"{node.op} {node.name!r}", **own)
        return config, (ltime, rtime), (ldelay, rdelay)

    def _interval_join(self, node: LogicalNode) -> str:
        from changelake.operators.interval_join import IntervalJoin, IntervalJoinConfig

        p = node.params
        left, right, lkey, rkey, renamed = self._two_inputs(node, "interval_join")
        self._needs_insert_only(node, left, "left")
        self._needs_insert_only(node, right, "right")
        config, (ltime, rtime), (ldelay, rdelay) = self._time_join_config(
            node, IntervalJoinConfig, left, right, lkey, rkey, before_ms=p["before_ms"], after_ms=p["after_ms"])
        join_type = config.join_type
        schema = self._joined_schema(node, left, right, renamed, join_type)
        on = " AND ".join(f"{a} = {b}" for a, b in p["on"])
        window = (f"{ltime} BETWEEN {renamed[rtime]} - {_ms_text(p['before_ms'])} "
                  f"AND {renamed[rtime]} + {_ms_text(p['after_ms'])}")
        return self._put(_Draft(
            node.name, "interval_join", (left.id, right.id), schema, None, lambda gub: config, IntervalJoin,
            extra={"state_keys": (lkey, rkey), "time_columns": (ltime, rtime), "late_rows": p["late_rows"],
                   "state_layout": f"rows of both inputs by join key ({on}) within {window}; "
                                   f"a left row is dropped once {ltime} + {_ms_text(p['before_ms'])} < watermark, "
                                   f"a right row once {rtime} + {_ms_text(p['after_ms'])} < watermark"
                                   + ("" if join_type == "INNER" else ", an unmatched one then emitted null-padded"),
                   "note": f"watermark = min({ltime} - {_ms_text(ldelay)}, {rtime} - {_ms_text(rdelay)}) "
                           f"over the rows seen; late rows: {p['late_rows']}"}))

    def _temporal_join(self, node: LogicalNode) -> str:
        from changelake.operators.temporal_join import TemporalJoin, TemporalJoinConfig

        p = node.params
        left, right, lkey, rkey, renamed = self._two_inputs(node, "temporal_join")
        if right.op == "normalize":
            # versions are read as they come: ChangelogNormalize would give a -D the stored row, whose
            # event time is the deleted version's, not the deletion's; a re-delivered version is harmless
            right = self.drafts[right.inputs[0]]
        self._needs_insert_only(node, left, "fact (left)")
        if not right.upsert_key or not set(right.upsert_key) <= set(rkey):
            raise ConfigError(
                f"temporal_join {node.name!r}: the versioned input {right.id!r} needs a primary key contained in the "
                f"join key {list(rkey)} (its key is {list(right.upsert_key or [])}); give the source that "
                "primary_key")
        config, (ltime, rtime), (ldelay, rdelay) = self._time_join_config(
            node, TemporalJoinConfig, left, right, lkey, rkey)
        schema = self._joined_schema(node, left, right, renamed, config.join_type)
        on = " AND ".join(f"{a} = {b}" for a, b in p["on"])
        return self._put(_Draft(
            node.name, "temporal_join", (left.id, right.id), schema, None, lambda gub: config, TemporalJoin,
            extra={"state_keys": (lkey, rkey), "time_columns": (ltime, rtime), "late_rows": p["late_rows"],
                   "drop_update_before": True,
                   "state_layout": f"facts by join key ({on}) until the watermark passes {ltime}; versions by "
                                   f"{list(rkey)} ordered by {rtime}, those older than the newest at or before the "
                                   "watermark dropped",
                   "note": f"FOR SYSTEM_TIME AS OF {ltime}; watermark = min({ltime} - {_ms_text(ldelay)}, "
                           f"{rtime} - {_ms_text(rdelay)}) over the rows seen; late rows: {p['late_rows']}"}))

    # -- sinks -----------------------------------------------------------------------------------
    def _sink(self, node: LogicalNode) -> str:
        inp = self._input(node.inputs[0])
        table, pk = node.params["table"], node.params["primary_key"]
        _check_columns(f"table {table}", "primary_key", pk, inp.schema.names)
        source = inp.id
        # an insert-only input needs no materializer: each row upserts by key, the last one wins
        if (inp.upsert_key is None or set(inp.upsert_key) != set(pk)) and not self._insert_only(inp):
            in_schema, key = inp.schema, inp.upsert_key
            config = SinkUpsertMaterializerConfig(
                keys=_idx(in_schema, pk), upsert_key=None if not key else _idx(in_schema, key), table=table,
                **self._state())
            why = ("its input has no upsert key" if not key else
                   f"the input's upsert key {list(key)} is not the table's primary key {list(pk)}")
            source = self._put(_Draft(
                f"materialize_{table}", "materialize", (inp.id,), in_schema, tuple(pk), lambda gub: config,
                SinkUpsertMaterializer, needs_ub=lambda required: True,
                extra={"state_keys": (tuple(pk),),
                       "state_layout": f"{list(pk)} -> rows not yet retracted, in arrival order",
                       "note": f"SinkUpsertMaterializer: {why}"}))
        return self._put(_Draft(node.name, "sink", (source,), inp.schema, tuple(pk),
                                extra={"table": table, "primary_key": tuple(pk)}))


class RowPredicate:
    """A join's residual predicate over (left row, right row) tuples, called with dicts by column name."""

    def __init__(self, fn: Callable[[dict, dict], bool], left: tuple[str, ...], right: tuple[str, ...]) -> None:
        self.fn, self.left, self.right = fn, left, right

    def __call__(self, lrow: tuple, rrow: tuple) -> bool:
        return bool(self.fn(dict(zip(self.left, lrow)), dict(zip(self.right, rrow))))


def _join_input(d: _Draft, key: tuple[str, ...]) -> tuple[InputSpec, str]:
    uk = d.upsert_key
    if not uk:
        return InputSpec(), "no unique key: each distinct row with a count"
    layout = "join_key_contains_unique_key" if set(uk) <= set(key) else "has_unique_key"
    text = ("join key contains the unique key: one row per join key" if layout == "join_key_contains_unique_key"
            else f"unique key {list(uk)}: one row per unique key")
    return InputSpec(layout, _idx(d.schema, uk)), text


def _join_upsert_key(left: _Draft, right: _Draft, lkey, rkey, renamed: dict[str, str],
                     join_type: str) -> tuple[str, ...] | None:
    """The join output's upsert key, as far as the sink may rely on it.

    A side's unique key carries over only when it contains that side's join key: otherwise an
    update that changes the join key retracts the old joined row in one join partition and adds
    the new one in another, and the two may reach the sink in either order (or the new row may
    match nothing). Then the output has no upsert key and a sink gets a materializer.
    """
    lu = left.upsert_key if left.upsert_key and set(lkey) <= set(left.upsert_key) else None
    ru = right.upsert_key if right.upsert_key and set(rkey) <= set(right.upsert_key) else None
    ru_out = None if ru is None else tuple(renamed[c] for c in ru)
    if join_type in ("SEMI", "ANTI"):
        return lu
    if lu and ru and set(ru) <= set(rkey) and join_type in ("INNER", "LEFT"):
        return lu                     # each left row meets at most one right row
    if lu and ru and set(lu) <= set(lkey) and join_type in ("INNER", "RIGHT"):
        return ru_out
    if lu and ru:
        return (*lu, *ru_out)
    return None


def _column_ref(expr: str) -> str:
    """The column an expression only names (``qty`` or ```qty```), else the expression itself."""
    e = expr.strip()
    if len(e) > 1 and e[0] == e[-1] == "`":
        return e[1:-1].replace("``", "`")
    return e


def _ms_text(ms: int) -> str:
    """A duration for explain: '90 s', '5 min', '250 ms'."""
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size} {unit}"
    return f"{ms} ms"


def _agg_type(node: str, a, schema: pa.Schema) -> pa.DataType:
    if a.function == "COUNT":
        return pa.int64()
    t = schema.field(a.column).type
    if a.function in ("MIN", "MAX"):
        return t
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64()
    if pa.types.is_decimal(t):
        return pa.decimal128(38, t.scale)
    raise ConfigError(f"aggregate {node!r}: {a.function}({a.column}) needs a numeric column; {a.column} is {t}")


def _unique_schema(node: str, fields: list[pa.Field]) -> pa.Schema:
    names = [f.name for f in fields]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"{node!r}: output column(s) {dup} appear twice; rename them with a select first")
    return pa.schema(fields)

