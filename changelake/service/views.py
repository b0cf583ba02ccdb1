"""The operator graph of a service config: ``views`` and ``tables[].from`` as a :class:`Pipeline`.

::

    sources:
      - {name: orders, topics: [shop.orders], columns: {...}, primary_key: [order_id]}
      - {name: products, topics: [shop.products], columns: {...}, primary_key: [id]}
    views:
      - name: enriched
        join: {left: orders, right: products, on: {product_id: id}, how: inner}
      - name: by_category
        from: enriched
        group_by: [category]
        aggregates: {orders: "count(*)", revenue: "sum(price)"}
    tables:
      - {name: category_sales, from: by_category, primary_key: [category]}

A view has ``from`` (or a ``join`` with ``left`` and ``right``) and one operation:
``deduplicate``, ``filter``, ``select``, ``group_by`` + ``aggregates``, ``top_n``, ``join``,
``interval_join``, ``temporal_join`` (the joins name ``left`` and ``right`` instead of ``from``),
``lookup_join`` (``{lookup: <name under lookups>, on: {stream column: key column}, how}``),
or ``sql`` (one Flink SQL query, which names what it reads itself; :mod:`changelake.plan.sql_view`).
Sources that only mirror into a table (``sources[].table``) stay outside the graph.
``pipeline.state_ttl`` / ``pipeline.on_stale_retraction`` set every operator's state options;
a view's own ``state_ttl`` / ``on_stale_retraction`` override them.
"""

from __future__ import annotations

import pyarrow as pa

from changelake.connectors.lookup import CacheOptions, Lookup
from changelake.errors import ConfigError
from changelake.formats.encodings import source_schema
from changelake.plan.graph import Pipeline, StateOptions, Stream
from changelake.plan.physical import STATEFUL_OPS
from changelake.plan.planner import check as planner_check
from changelake.plan.planner import plan as planner_plan
from changelake.plan.sql_view import check_query
from changelake.service.config import VIEW_OPERATIONS, ChangelakeConfig, Loc, LookupSpec, SourceSpec, ViewSpec, parse_duration


def pipeline_from_config(config: ChangelakeConfig) -> Pipeline | None:
    """The graph of ``views`` and ``tables[].from``, or None when the config has none."""
    p, problems = _build(config, collect=False)
    return p


def graph_problems(config: ChangelakeConfig) -> list[tuple[Loc, str]]:
    """Every error of the operator graph, each with the YAML path of the source, view or table
    it belongs to: those of building it, then the planner's (columns, keys, join key types,
    expressions, changelog modes). A node whose input failed is not checked again."""
    p, problems = _build(config, collect=True)
    if p is None or problems:
        return problems
    where = _node_locs(config)
    problems = [(where.get(node, ()), message) for node, message in planner_check(p)]
    return problems or _partition_problems(config, p) + _engine_problems(config, p)


def _partition_problems(config: ChangelakeConfig, p: Pipeline) -> list[tuple[Loc, str]]:
    """``partition_by`` columns of a graph table that its input does not have (mirrored tables:
    :func:`changelake.service.config_checks.partition_problems`)."""
    from changelake.service.config import _did_you_mean

    columns = {n.table: n.schema.names for n in planner_plan(p).nodes if n.op == "sink"}
    problems: list[tuple[Loc, str]] = []
    for i, t in enumerate(config.tables):
        known = [c for c in columns.get(t.name, ()) if not c.startswith("_")]
        missing = [c for c in t.partition_by if c not in known]
        if t.from_ is not None and missing:
            problems.append((("tables", i, "partition_by"), f"table {t.name!r}: partition_by names {missing}, which "
                             f"{t.from_!r} does not give{_did_you_mean(missing[0], known)} (its columns: {known})"))
    return problems


def _engine_problems(config: ChangelakeConfig, p: Pipeline) -> list[tuple[Loc, str]]:
    """A graph table's column names that ``storage.engine: delta-spark`` cannot write (mirrored tables:
    :func:`changelake.service.config_checks.engine_problems`)."""
    from changelake.connectors.delta_sink import delta_spark_refusal, delta_spark_refused_columns

    if config.storage.engine != "delta-spark":
        return []
    columns = {n.table: n.schema.names for n in planner_plan(p).nodes if n.op == "sink"}
    problems: list[tuple[Loc, str]] = []
    for i, t in enumerate(config.tables):
        refused = delta_spark_refused_columns(columns.get(t.name, ()))
        if t.from_ is not None and t.history is None and refused:
            problems.append((("tables", i), delta_spark_refusal(repr(t.name), refused)))
    return problems


def _node_locs(config: ChangelakeConfig) -> dict[str, Loc]:
    where: dict[str, Loc] = {s.name: ("sources", i) for i, s in enumerate(config.sources)}
    where.update({v.name: ("views", i, next(k for k in VIEW_OPERATIONS if getattr(v, k) is not None))
                  for i, v in enumerate(config.views)})
    where.update({f"sink_{t.name}": ("tables", i) for i, t in enumerate(config.tables)})
    return where


def _build(config: ChangelakeConfig, *, collect: bool) -> tuple[Pipeline | None, list[tuple[Loc, str]]]:
    """The graph; with ``collect``, every construction error as (path, message) instead of raising the first."""
    graph_tables = [(i, t) for i, t in enumerate(config.tables) if t.from_ is not None]
    if not graph_tables:
        return None, []
    problems: list[tuple[Loc, str]] = []
    failed: set[str] = set()

    def attempt(loc: Loc, name: str, inputs: list[str], step) -> None:
        if failed.intersection(inputs):
            failed.add(name)
            return
        try:
            step()
        except ConfigError as exc:
            if not collect:
                raise
            failed.add(name)
            problems.append((loc, str(exc)))

    read = {i for v in config.views for i in config.view_inputs(v)} | {t.from_ for _, t in graph_tables}
    defaults = StateOptions(config.pipeline.state_ttl, config.pipeline.on_stale_retraction)
    p = Pipeline(state=defaults)
    for i, s in enumerate(config.sources):
        if s.name in read:
            attempt(("sources", i), s.name, [], lambda s=s: _source(p, config, s))
    lookups: dict[str, Lookup] = {}
    for i, lk in enumerate(config.lookups):
        attempt(("lookups", i), lk.name, [], lambda lk=lk: lookups.__setitem__(lk.name, lookup_of(config, lk)))
    for i, v in enumerate(config.views):
        inputs = [*v.inputs, *([v.lookup_join.lookup] if v.lookup_join else [])]
        if v.sql is not None and collect and not failed.intersection(inputs):
            errors = check_query(v.sql)        # every unsupported construct, each with its position
            if errors:
                failed.add(v.name)
                problems.extend((("views", i, "sql"), f"view {v.name!r}: {e}") for e in errors)
                continue
        attempt(("views", i) if v.sql is None else ("views", i, "sql"), v.name, inputs,
                lambda v=v: _view_with_state(p, v, lookups, defaults))
    for i, t in graph_tables:
        attempt(("tables", i), t.name, [t.from_],
                lambda t=t: p.stream(t.from_).to_table(t.name, primary_key=t.primary_key))
    return p, problems


def _view_with_state(p: Pipeline, v: ViewSpec, lookups: dict[str, Lookup], defaults: StateOptions) -> None:
    before = set(p.nodes)
    _view(p, v, lookups)
    if v.state_ttl is not None or v.on_stale_retraction is not None:
        for name in [n for n in p.nodes if n not in before and p.nodes[n].op in STATEFUL_OPS]:   # a sql view's too
            p.stream(name).with_state(ttl=v.state_ttl or defaults.ttl,
                                      on_stale_retraction=v.on_stale_retraction or defaults.on_stale_retraction)


def _source(p: Pipeline, config: ChangelakeConfig, s: SourceSpec) -> Stream:
    if not s.columns:
        raise ConfigError(f"source {s.name!r} feeds views or tables through 'from', so it must declare its columns "
                          "(sources[].columns: name -> type)")
    key = s.primary_key or (config.table(s.table).primary_key if s.table else None)
    # the normalize state fills unavailable values; a source without it passes them on as they came
    fills = bool(key) and s.normalize is not False and not s.append_only
    return p.source(s.name, columns=_decoded_columns(s), primary_key=key, normalize=s.normalize, event_time=s.event_time,
                    watermark_delay=s.watermark_delay, append_only=s.append_only,
                    unavailable_value=s.unavailable_value if fills else None)


def _decoded_columns(s: SourceSpec) -> pa.Schema:
    """The columns a source's decoder gives: the declared ones, then requested metadata columns
    (``options.metadata``, e.g. the change's operation time as a versioned table's event time)."""
    from changelake.formats import make_decoder

    schema = make_decoder(s.format, columns=source_schema(s.columns), options=s.decoder_options()).output_schema
    # Spark holds timestamps in microseconds (a metadata time may be declared in ms)
    return pa.schema([f.with_type(pa.timestamp("us", tz=f.type.tz)) if pa.types.is_timestamp(f.type) else f
                      for f in schema if not f.name.startswith("_")])


def lookup_of(config: ChangelakeConfig, spec: LookupSpec) -> Lookup:
    """The :class:`Lookup` of a ``lookups`` entry (Delta paths under ``storage.root``, its options)."""
    cache = CacheOptions(max_rows=spec.cache.max_rows, ttl=spec.cache.ttl)
    tuning = {k: v for k, v in (("batch_size", spec.batch_size), ("max_concurrency", spec.max_concurrency))
              if v is not None}
    if spec.delta is not None:
        return Lookup.delta(spec.name, config.lookup_path(spec.name), columns=spec.columns, key=spec.key, cache=cache,
                            storage_options=config.storage.plain_options(), **tuning)
    pg = spec.postgres
    return Lookup.postgres(spec.name, pg.url, table=pg.table, columns=spec.columns, key=spec.key, user=pg.user,
                           password_env=pg.password_env, cache=cache,
                           connect_timeout_s=parse_duration(pg.connect_timeout), retries=pg.retries, **tuning)


def _view(p: Pipeline, v: ViewSpec, lookups: dict[str, Lookup]) -> Stream:
    if v.sql is not None:
        return p.sql(v.name, v.sql, lookups=lookups)
    if v.join is not None:
        j = v.join
        return p.stream(j.left).join(p.stream(j.right), on=j.on, how=j.how, name=v.name)
    if v.interval_join is not None:
        j = v.interval_join
        return p.stream(j.left).interval_join(p.stream(j.right), on=j.on, before=j.before, after=j.after,
                                              left_time=j.left_time, right_time=j.right_time, how=j.how,
                                              late_rows=j.late_rows, name=v.name)
    if v.temporal_join is not None:
        j = v.temporal_join
        return p.stream(j.left).temporal_join(p.stream(j.right), on=j.on, time=j.time, version_time=j.version_time,
                                              how=j.how, late_rows=j.late_rows, name=v.name)
    inp = p.stream(v.from_)
    if v.lookup_join is not None:
        lj = v.lookup_join
        return inp.lookup_join(lookups[lj.lookup], on=lj.on, how=lj.how, name=v.name)
    if v.deduplicate is not None:
        d = v.deduplicate
        return inp.deduplicate(d.keys, keep=d.keep, order_by=d.order_by, name=v.name)
    if v.filter is not None:
        return inp.filter(v.filter, name=v.name)
    if v.select is not None:
        return inp.select(v.select, name=v.name)
    if v.aggregates is not None:
        return inp.group_by(*(v.group_by or ())).agg(v.aggregates, name=v.name)
    t = v.top_n
    return inp.top_n(t.n, order_by=t.order_by, partition_by=t.partition_by, rank_column=t.rank_column,
                     two_level=t.two_level, name=v.name)
