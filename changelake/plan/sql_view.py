"""Views written in SQL: a Flink SQL query planned into the graph the step form builds.

``Pipeline.sql(name, query)`` (YAML: ``views[].sql``) parses the query with sqlglot and adds the
same logical nodes the step methods add, so ``explain``, changelog-mode inference,
materializers, state TTL and every runner see no difference. The rules:

============================================================  ======================================
SQL                                                           step
============================================================  ======================================
``FROM a [JOIN b ON a.x = b.y [AND ...]]``, ``FROM a, b``      ``join(on={x: y}, how=...)``
``LEFT`` / ``RIGHT`` / ``FULL [OUTER] JOIN``                   ``join(how="left"|"right"|"full")``
``... AND a.t BETWEEN b.t - INTERVAL '4' HOUR AND b.t``        ``interval_join(before=, after=)``
``JOIN r FOR SYSTEM_TIME AS OF a.t ON ...`` (r a source/view)  ``temporal_join(time="t")``
``JOIN lk FOR SYSTEM_TIME AS OF a.proc_time ON ...``           ``lookup_join(lookups["lk"])``
``WHERE x IN (SELECT y ...)`` / ``EXISTS (... b.y = a.x)``     ``join(how="semi")``
``NOT EXISTS (...)``, ``NOT IN`` over never-NULL columns        ``join(how="anti")``
``WHERE p``                                                    ``filter(p)``
``GROUP BY k`` + ``COUNT/SUM/AVG/MIN/MAX``, ``HAVING h``       ``group_by(k).agg(...)``, ``filter(h)``
``ROW_NUMBER() OVER (PARTITION BY p ORDER BY o) AS rn``
with ``WHERE rn <= N`` in the enclosing query                  ``top_n(N, rank_column="rn" if kept)``
the same ``= 1`` ordered by ``PROCTIME()`` or an event time    ``deduplicate(keep="first"|"last")``
``SELECT e AS c, ...``                                         ``select({c: e})`` (none if identity)
============================================================  ======================================

Node names: the view's last node takes the view's name; the others ``<view>_<step>`` (``join``,
``on``, ``where``, ``semi``, ``anti``, ``pre``, ``group_by``, ``having``, ``top_n``, ``dedup``,
``select``; ``_2``, ``_3`` when a step repeats), in the order the query is planned: FROM and
its joins left to right, WHERE, semi/anti joins, GROUP BY, HAVING, SELECT. A subquery or a
``WITH`` query is planned where it is read (a ``WITH`` query read twice, once).

Errors are :class:`~changelake.errors.ConfigError` naming the construct, its line and column
in the query, and the fix; :func:`check_query` lists the errors found without planning.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlglot
from sqlglot import exp, tokens
from sqlglot.dialects.dialect import Dialect
from sqlglot.dialects.spark import Spark

from changelake.errors import ConfigError

if TYPE_CHECKING:
    from changelake.connectors.lookup import Lookup
    from changelake.plan.graph import Pipeline, Stream


class Flink(Dialect):
    """Flink SQL as far as the views need it: the default dialect, identifiers in backquotes, and
    Flink's NULL order: NULLs first ascending / last descending unless NULLS FIRST / LAST says
    otherwise (the step form's default too)."""

    NULL_ORDERING = "nulls_are_small"

    class Tokenizer(tokens.Tokenizer):
        IDENTIFIERS = ["`", '"']


#: expressions a filter or select may hold: those DuckDB (in-process) and Spark SQL evaluate alike
_ALLOWED = (exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Add, exp.Sub, exp.Mul, exp.Div,
            exp.Mod, exp.Neg, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not, exp.Is,
            exp.In, exp.Between, exp.Like, exp.Case, exp.If, exp.Cast, exp.DataType, exp.DataTypeParam, exp.Coalesce,
            exp.Upper, exp.Lower, exp.Abs, exp.Round, exp.Floor, exp.Ceil, exp.Length, exp.Substring, exp.Trim,
            exp.DPipe, exp.Concat, exp.Nullif, exp.Greatest, exp.Least, exp.Interval, exp.Var, exp.Tuple,
            exp.Identifier, exp.Star)
#: functions whose value differs between calls: an update's retraction would not find the row it retracts
_NONDETERMINISTIC = {"NOW", "PROCTIME", "UUID", "RAND", "RANDOM", "CURRENT_TIMESTAMP", "CURRENT_DATE",
                     "CURRENT_TIME", "LOCALTIMESTAMP", "LOCALTIME", "UNIX_TIMESTAMP", "CURRENT_ROW_TIMESTAMP"}
_AGGREGATES = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}
_PLAIN = re.compile(r"^[a-z_][a-z0-9_]*$")
_UNITS_MS = {"MILLISECOND": 1, "SECOND": 1000, "MINUTE": 60_000, "HOUR": 3_600_000, "DAY": 86_400_000}


def parse(query: str) -> exp.Expression:
    """The syntax tree of one query; a syntax error names its line and column."""
    try:
        trees = [t for t in sqlglot.parse(query, read=Flink) if t is not None]
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise ConfigError(f"cannot parse the query at line {first.get('line', '?')}, column {first.get('col', '?')}: "
                          f"{first.get('description', exc)} near {first.get('highlight', '')!r}") from None
    if len(trees) != 1:
        raise ConfigError(f"a SQL view holds exactly one query (SELECT ...); this text holds {len(trees)}")
    return trees[0]


def read_names(query: str) -> list[str]:
    """The sources, views and lookups the query reads (not its WITH names), in order of appearance."""
    tree = parse(query)
    ctes = {c.alias for c in tree.find_all(exp.CTE)}
    out: list[str] = []
    for t in tree.find_all(exp.Table):
        if t.name not in ctes and t.name not in out:
            out.append(t.name)
    return out


@dataclass(frozen=True)
class _Col:
    qualifier: str | None
    name: str           # as the query names it
    column: str         # the node's column


@dataclass(frozen=True)
class _Rel:
    """A planned relation: a node of the pipeline and the query's names for its columns."""

    node: str
    cols: tuple[_Col, ...]

    def named(self, qualifier: str | None) -> "_Rel":
        return _Rel(self.node, tuple(_Col(qualifier, c.name, c.column) for c in self.cols))


class SqlError(ConfigError):
    """An error in a SQL view's query, with its position."""


def position(query: str, node: exp.Expression | None) -> str:
    """'line L, column C' of the first token of ``node`` in ``query`` ('' when unknown)."""
    starts = [n.meta["start"] for n in (node.walk() if node is not None else ()) if "start" in n.meta]
    if not starts:
        return ""
    start = min(starts)
    line = query.count("\n", 0, start) + 1
    return f"line {line}, column {start - (query.rfind(chr(10), 0, start) + 1) + 1}"


def check_query(query: str) -> list[str]:
    """The errors a query has whatever it reads: syntax, unsupported constructs and functions."""
    try:
        tree = parse(query)
    except ConfigError as exc:
        return [str(exc)]
    out = []
    for node in tree.walk():
        problem = _unsupported(node, query)
        if problem:
            out.append(f"{problem} ({position(query, node)})")
    return out


def _unsupported(node: exp.Expression, query: str = "") -> str | None:
    """What is wrong with ``node`` anywhere in a query, or None."""
    if isinstance(node, (exp.Union, exp.Intersect, exp.Except)):
        return f"{node.key.upper()} is not supported; write one view per branch and a table per view"
    if isinstance(node, exp.Select):
        if node.args.get("distinct"):
            return "SELECT DISTINCT is not supported; write GROUP BY the columns with an aggregate, e.g. COUNT(*)"
        if node.args.get("order") or node.args.get("limit"):
            return ("ORDER BY / LIMIT is not supported in a view; write a Top-N: ROW_NUMBER() OVER (ORDER BY ...) "
                    "AS rn in a subquery and WHERE rn <= N around it")
    if isinstance(node, exp.Window) and not isinstance(node.this, exp.RowNumber):
        return (f"the window function {node.this.sql(dialect=Flink)} is not supported; only ROW_NUMBER() OVER "
                "(PARTITION BY ... ORDER BY ...) for a Top-N or deduplication")
    if isinstance(node, exp.Func) and not isinstance(node, (*_ALLOWED, *_AGGREGATES, exp.RowNumber, exp.Window,
                                                             exp.Exists)):
        name = _func_name(node, query)
        if name in _NONDETERMINISTIC:
            return None        # allowed over insert-only input, checked where it is planned
        return (f"the function {name}() is not supported in a view; use the functions DuckDB and Spark SQL "
                "evaluate alike: CASE, CAST, COALESCE, NULLIF, ABS, ROUND, FLOOR, CEIL, UPPER, LOWER, LENGTH, "
                "SUBSTRING, TRIM, GREATEST, LEAST, ||, and COUNT/SUM/AVG/MIN/MAX with GROUP BY")
    return None


_NAME_AT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_NAME_BEFORE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\([\s(]*$")


def _func_name(node: exp.Expression, query: str = "") -> str:
    """A function's name as the query writes it (``POSITION`` for ``POSITION(a IN b)``, not sqlglot's
    ``STR_POSITION``); without the query text, sqlglot's name."""
    own = node.meta.get("start")
    if query and own is not None:
        m = _NAME_AT.match(query, own)
        if m:
            return m.group(1).upper()
    starts = [n.meta["start"] for n in node.walk() if "start" in n.meta]
    if query and starts and own is None:
        m = _NAME_BEFORE.search(query, 0, min(starts))       # the name before the first argument
        if m:
            return m.group(1).upper()
    if isinstance(node, exp.Anonymous):
        return str(node.this).upper()
    return node.sql_name().upper() if isinstance(node, exp.Func) else node.key.upper()


def _conjuncts(node: exp.Expression | None) -> list[exp.Expression]:
    if node is None:
        return []
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        return _conjuncts(node.left) + _conjuncts(node.right)
    return [node]


def _uniquify(name: str, taken: set[str]) -> str:
    """``name0``, ``name1``, ...: the first not taken (Flink's name for a repeated output column)."""
    k = 0
    while f"{name}{k}" in taken:
        k += 1
    return f"{name}{k}"


def _ident(name: str) -> exp.Identifier:
    quoted = not _PLAIN.match(name) or name.upper() in Spark.Tokenizer.KEYWORDS
    return exp.Identifier(this=name, quoted=quoted)


def plan_view(pipeline: "Pipeline", name: str, query: str, lookups: Mapping[str, "Lookup"] | None = None) -> "Stream":
    """Add the nodes of the SQL view ``name`` to ``pipeline``; returns the view's stream (its last node)."""
    errors = check_query(query)
    if errors:
        raise SqlError(f"view {name!r}: " + ("; ".join(errors) if len(errors) == 1 else
                                              f"{len(errors)} errors:\n" + "\n".join(f"  - {e}" for e in errors)))
    planner = _QueryPlanner(pipeline, name, query, dict(lookups or {}))
    try:
        return planner.plan(parse(query))
    except SqlError:
        planner.undo()
        raise
    except ConfigError as exc:
        planner.undo()
        raise SqlError(f"view {name!r}: {exc}") from None


class _QueryPlanner:
    def __init__(self, pipeline: "Pipeline", view: str, query: str, lookups: dict[str, "Lookup"]) -> None:
        from changelake.plan.planner import _Builder

        self.p, self.view, self.text, self.lookups = pipeline, view, query, lookups
        # the planner's first pass, node by node: schemas, upsert keys and event-time columns as we go
        self.builder = _Builder(True, pipeline.state)
        for node in pipeline.nodes.values():
            if node.op != "sink":
                self.builder.add(node)
        self.before = list(pipeline.nodes)
        self.ctes: list[dict[str, exp.Expression]] = []
        self.planned_ctes: dict[int, _Rel] = {}

    # -- helpers -----------------------------------------------------------------------------------
    def error(self, node: exp.Expression | None, text: str) -> SqlError:
        where = position(self.text, node)
        return SqlError(f"view {self.view!r}: {text}" + (f" ({where})" if where else ""))

    def undo(self) -> None:
        for n in [n for n in self.p.nodes if n not in self.before]:
            del self.p.nodes[n]

    def draft(self, node: str):
        return self.builder._input(node)

    def schema(self, node: str):
        return self.draft(node).schema

    def insert_only(self, node: str) -> bool:
        return self.builder._insert_only(self.draft(node))

    def add(self, step: str, make) -> str:
        """Add a node named ``<view>_<step>`` by ``make(name)`` (a Stream method call); returns its name."""
        name = self.p._fresh(f"{self.view}_{step}")
        make(name)
        self.builder.add(self.p.nodes[name])
        return name

    def rel_of(self, node: str, qualifier: str | None) -> _Rel:
        return _Rel(node, tuple(_Col(qualifier, c, c) for c in self.schema(node).names))

    def resolve(self, column: exp.Column, rels: list[_Rel]) -> tuple[int, _Col]:
        """Which relation of ``rels`` and which of its columns the reference names."""
        qualifier, name = column.table or None, column.name
        hits = [(i, c) for i, r in enumerate(rels) for c in r.cols
                if c.name == name and (qualifier is None or c.qualifier == qualifier)]
        if not hits:
            known = sorted({(f"{c.qualifier}." if c.qualifier else "") + c.name for r in rels for c in r.cols})
            raise self.error(column, f"unknown column {column.sql(dialect=Flink)}; the columns here are {known}")
        if len({(i, c.column) for i, c in hits}) > 1:
            raise self.error(column, f"the column {name!r} is ambiguous: qualify it with its table's name or alias")
        return hits[0]

    def sides(self, expr: exp.Expression, rels: list[_Rel]) -> set[int]:
        return {self.resolve(c, rels)[0] for c in expr.find_all(exp.Column)}

    def render(self, expr: exp.Expression, rel: _Rel) -> str:
        """``expr`` as a filter/select expression over the node's columns (checked: allowed functions,
        no aggregate, no subquery, deterministic over an updating input)."""
        for node in expr.walk():
            if isinstance(node, (exp.Subquery, exp.Exists)) or isinstance(node, exp.Select):
                raise self.error(node, "a subquery is supported only as WHERE x IN (SELECT ...) or [NOT] EXISTS "
                                       "(SELECT ...), as a term of the WHERE's AND, or in FROM")
            if isinstance(node, tuple(_AGGREGATES)):
                raise self.error(node, f"the aggregate {node.sql(dialect=Flink)} is only allowed in the SELECT list "
                                       "or HAVING of a query with GROUP BY (or a global aggregate)")
            if isinstance(node, exp.Window):
                raise self.error(node, "ROW_NUMBER() OVER (...) belongs in the SELECT list of a subquery whose "
                                       "enclosing query filters it: WHERE rn <= N")
            if isinstance(node, exp.Func) and _func_name(node) in _NONDETERMINISTIC:
                if not self.insert_only(rel.node):
                    raise self.error(node, f"the non-deterministic function {_func_name(node)}() over the updating "
                                           f"input {rel.node!r}: a retraction would compute another value than the "
                                           "row it retracts; compute it from the row's columns instead (e.g. an "
                                           "event-time column), or read an append-only source")
                if _func_name(node) not in ("CURRENT_TIMESTAMP", "CURRENT_DATE"):
                    raise self.error(node, f"the function {_func_name(node)}() is not supported in a view; "
                                           "CURRENT_TIMESTAMP and CURRENT_DATE are, over insert-only input")
        out = expr.transform(lambda n: exp.Column(this=_ident(self.resolve(n, [rel])[1].column))
                             if isinstance(n, exp.Column) else n)
        for lit in out.find_all(exp.Literal):
            if lit.is_string and ("'" in lit.this or "\\" in lit.this):
                raise self.error(lit, f"the string {lit.sql(dialect=Flink)} holds a quote or a backslash, which "
                                      "DuckDB and Spark SQL read differently; write it with CHR(39) / CHR(92) and ||")
        return out.sql(dialect="spark")

    def column_of(self, expr: exp.Expression, rel: _Rel, what: str) -> str:
        e = expr.unnest() if isinstance(expr, exp.Paren) else expr
        if not isinstance(e, exp.Column):
            raise self.error(expr, f"{what} must be a column; compute {expr.sql(dialect=Flink)} in a subquery "
                                   "(SELECT ..., expression AS name FROM ...) and name it here")
        return self.resolve(e, [rel])[1].column

    # -- queries -----------------------------------------------------------------------------------
    def plan(self, tree: exp.Expression) -> "Stream":
        from changelake.plan.graph import LogicalNode, Stream

        rel = self.query(tree)
        created = [n for n in self.p.nodes if n not in self.before]
        if not created or created[-1] != rel.node:
            self.select_all(rel, self.p._fresh(f"{self.view}_select"))
            created = [n for n in self.p.nodes if n not in self.before]
        last = self.p.nodes.pop(created[-1])
        if self.view in self.p.nodes:
            raise self.error(None, f"two nodes are named {self.view!r}; node names must be unique")
        self.p.nodes[self.view] = LogicalNode(self.view, last.op, last.inputs, last.params)
        return Stream(self.p, self.view)

    def select_all(self, rel: _Rel, name: str) -> None:
        from changelake.plan import sql

        self.p.stream(rel.node).select({c: sql.column(c) for c in self.schema(rel.node).names}, name=name)

    def query(self, q: exp.Expression) -> _Rel:
        if isinstance(q, exp.Subquery):
            return self.query(q.this)
        if not isinstance(q, exp.Select):
            raise self.error(q, f"{q.key.upper()} is not a query this planner reads; write SELECT ... FROM ...")
        with_ = q.args.get("with_")
        ctes = {c.alias: c.this for c in (with_.expressions if with_ else [])}
        self.ctes.append(ctes)
        try:
            return self.select(q)
        finally:
            self.ctes.pop()

    def select(self, q: exp.Select) -> _Rel:
        source = q.args.get("from_")
        if source is None:
            raise self.error(q, "a query needs FROM: a source, a view, a WITH query or a subquery")
        where = _conjuncts(q.args["where"].this if q.args.get("where") else None)
        ranked = self.ranked_query(source.this)
        if ranked is not None:
            rel, where = self.top_n(ranked, source.this.alias_or_name or None, where, q)
        else:
            rel = self.relation(source.this)
        for join in q.args.get("joins") or []:
            rel, where = self.join(rel, join, where)
        plain = [c for c in where if not _subquery_test(c)]
        if plain:
            predicate = " AND ".join(f"({self.render(c, rel)})" if len(plain) > 1 else self.render(c, rel)
                                     for c in plain)
            rel = _Rel(self.add("where", lambda n: self.p.stream(rel.node).filter(predicate, name=n)), rel.cols)
        for c in where:
            if _subquery_test(c):
                rel = self.semi_join(rel, c)
        if q.args.get("group") or q.args.get("having") or any(
                isinstance(n, tuple(_AGGREGATES)) for e in q.expressions for n in e.walk()):
            return self.aggregate(q, rel)
        return self.project(q.expressions, rel)

    def relation(self, source: exp.Expression) -> _Rel:
        if isinstance(source, exp.Subquery):
            return self.query(source.this).named(source.alias or None)
        if not isinstance(source, exp.Table):
            raise self.error(source, f"FROM {source.sql(dialect=Flink)} is not supported; read a source, a view, a "
                                     "WITH query or a subquery")
        if source.args.get("version") is not None:
            raise self.error(source, "FOR SYSTEM_TIME AS OF belongs to the right side of a JOIN")
        name, qualifier = source.name, source.alias_or_name
        cte = self.cte(name)
        if cte is not None:
            if id(cte) not in self.planned_ctes:
                self.planned_ctes[id(cte)] = self.query(cte)
            return self.planned_ctes[id(cte)].named(qualifier)
        if name in self.lookups:
            raise self.error(source, f"{name!r} is a lookup table: join it with JOIN {name} FOR SYSTEM_TIME AS OF "
                                     "<stream>.proc_time ON <stream column> = <key column>")
        if name not in self.p.nodes or self.p.nodes[name].op == "sink":
            known = sorted(n for n, v in self.p.nodes.items() if v.op != "sink")
            raise self.error(source, f"no source or view named {name!r} is defined before this view; defined: {known}")
        return self.rel_of(name, qualifier)

    def cte(self, name: str) -> exp.Expression | None:
        for scope in reversed(self.ctes):
            if name in scope:
                return scope[name]
        return None

    def project(self, items: list[exp.Expression], rel: _Rel) -> _Rel:
        """The SELECT list over ``rel``: no node when it passes the columns through as they are."""
        pairs: list[tuple[str, str]] = []
        cols: list[_Col] = []
        for item in items:
            if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
                qualifier = item.table if isinstance(item, exp.Column) else None
                chosen = [c for c in rel.cols if qualifier is None or c.qualifier == qualifier]
                if not chosen:
                    raise self.error(item, f"{qualifier}.* names no table of this query")
                for c in chosen:
                    taken = {n for n, _ in pairs}
                    name = c.name if c.name not in taken else _uniquify(c.name, taken | {c.name for c in rel.cols})
                    pairs.append((name, _ident(c.column).sql(dialect="spark")))
                    cols.append(_Col(c.qualifier, c.name if name == c.name else name, name))
                continue
            name = item.alias_or_name
            if isinstance(item, exp.Column) and name in {n for n, _ in pairs}:
                name = _uniquify(name, {n for n, _ in pairs} | {i.alias_or_name for i in items})
            expr = item.unalias() if isinstance(item, exp.Alias) else item
            if not isinstance(item, (exp.Alias, exp.Column)):
                raise self.error(item, f"name the expression {item.sql(dialect=Flink)}: write it AS a column name")
            pairs.append((name, self.render(expr, rel)))
            cols.append(_Col(None, name, name))
        names = self.schema(rel.node).names
        if [n for n, _ in pairs] == names and all(e in (n, f"`{n}`") for n, e in pairs):
            return _Rel(rel.node, tuple(_Col(c.qualifier, c.name, c.name) for c in cols))
        node = self.add("select", lambda n: self.p.stream(rel.node).select(dict(pairs), name=n))
        if len({n for n, _ in pairs}) != len(pairs):
            raise self.error(items[0], f"the SELECT list names a column twice: {[n for n, _ in pairs]}; rename one "
                                       "with AS")
        return _Rel(node, tuple(cols))

    # -- joins -------------------------------------------------------------------------------------
    def join(self, left: _Rel, join: exp.Join, where: list[exp.Expression]):
        """``left`` joined as ``join`` says; returns the joined relation and the WHERE terms left over."""
        from changelake.plan.sql_joins import plan_join

        return plan_join(self, left, join, where)

    def semi_join(self, rel: _Rel, test: exp.Expression) -> _Rel:
        from changelake.plan.sql_joins import plan_semi_join

        return plan_semi_join(self, rel, test)

    # -- GROUP BY ----------------------------------------------------------------------------------
    def aggregate(self, q: exp.Select, rel: _Rel) -> _Rel:
        from changelake.plan.sql_aggregate import plan_aggregate

        return plan_aggregate(self, q, rel)

    # -- Top-N and deduplication -------------------------------------------------------------------
    def ranked_query(self, source: exp.Expression) -> exp.Select | None:
        """The SELECT of a FROM item that holds ROW_NUMBER() OVER (...), if it does."""
        q = source.this if isinstance(source, exp.Subquery) else None
        if isinstance(source, exp.Table) and source.args.get("version") is None:
            q = self.cte(source.name)
        while isinstance(q, exp.Subquery):
            q = q.this
        if isinstance(q, exp.Select) and any(isinstance(e.unalias(), exp.Window) for e in q.expressions):
            return q
        return None

    def top_n(self, inner: exp.Select, qualifier: str | None, where: list[exp.Expression], outer: exp.Select):
        from changelake.plan.sql_rank import plan_rank

        return plan_rank(self, inner, qualifier, where, outer)


def _subquery_test(term: exp.Expression) -> bool:
    """Whether a WHERE term is ``x IN (SELECT ...)`` or ``[NOT] EXISTS (...)`` (a semi or anti join)."""
    t = term.this if isinstance(term, exp.Not) else term
    t = t.unnest() if isinstance(t, exp.Paren) else t
    return isinstance(t, exp.Exists) or (isinstance(t, exp.In) and t.args.get("query") is not None)


def interval_ms(node: exp.Expression) -> int | None:
    """Milliseconds of ``INTERVAL 'n' UNIT`` (None if ``node`` is not one)."""
    if not isinstance(node, exp.Interval):
        return None
    unit = node.args.get("unit")
    unit = (unit.name if unit is not None else "").upper().rstrip("S")
    value = node.this.name if node.this is not None else ""
    parts = value.split()
    if len(parts) == 2 and not unit:
        value, unit = parts[0], parts[1].upper().rstrip("S")
    if unit not in _UNITS_MS:
        return None
    try:
        return int(round(float(value) * _UNITS_MS[unit]))
    except ValueError:
        return None


__all__ = ["Flink", "SqlError", "check_query", "parse", "plan_view", "read_names", "interval_ms", "position"]
