"""GROUP BY, the aggregates and HAVING of a SQL view (:mod:`changelake.plan.sql_view`).

=========================================================  ===========================================
written                                                    planned as
=========================================================  ===========================================
``GROUP BY k`` (columns), ``COUNT(*)``, ``SUM(c)``, ...    ``group_by(k).agg(out="sum(c)")`` ``<view>_group_by``
a key or an argument that is an expression                 a ``select`` first (``<view>_pre``): the key
                                                           under its SELECT alias (else ``group_N``), the
                                                           argument as ``<output>_arg``
``HAVING h``                                               ``filter(h)`` (``<view>_having``)
a SELECT list other than the keys then the aggregates       a ``select`` after (``<view>_select``)
=========================================================  ===========================================

An aggregate's output column is its SELECT alias when the item is just the aggregate, else
``agg_N``; an aggregate written twice (in SELECT and HAVING) is computed once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from changelake.plan.sql_view import _AGGREGATES, Flink, SqlError, _Col, _Rel

if TYPE_CHECKING:
    from changelake.plan.sql_view import _QueryPlanner


def plan_aggregate(pl: "_QueryPlanner", q: exp.Select, rel: _Rel) -> _Rel:
    group = q.args.get("group")
    having = q.args["having"].this if q.args.get("having") else None
    aliases = {e.unalias().sql(dialect=Flink): e.alias for e in q.expressions if isinstance(e, exp.Alias)}
    pre: list[tuple[str, str]] = []           # computed columns of the pre-projection
    keys: list[str] = []                      # the aggregate's group columns
    key_cols: list[_Col] = []
    key_of: dict[str, str] = {}               # key expression text -> group column
    for i, k in enumerate(group.expressions if group else []):
        if isinstance(k, exp.Column):
            c = pl.resolve(k, [rel])[1]
            keys.append(c.column)
            key_cols.append(c)
        else:
            out = aliases.get(k.sql(dialect=Flink)) or f"group_{i + 1}"
            pre.append((out, pl.render(k, rel)))
            keys.append(out)
            key_cols.append(_Col(None, out, out))
        key_of[k.sql(dialect=Flink)] = keys[-1]
    calls: dict[str, tuple[str, str]] = {}   # aggregate text -> (output column, "fn(arg)")
    items_and_having = list(q.expressions) + ([having] if having is not None else [])
    for item in items_and_having:
        for node in item.walk():
            if not isinstance(node, tuple(_AGGREGATES)) or node.sql(dialect=Flink) in calls:
                continue
            if any(isinstance(n, tuple(_AGGREGATES)) for n in node.walk() if n is not node):
                raise pl.error(node, f"an aggregate inside an aggregate ({node.sql(dialect=Flink)}) is not supported")
            direct = isinstance(item, exp.Alias) and item.this is node
            out = item.alias if direct else f"agg_{len(calls) + 1}"
            fn = _AGGREGATES[type(node)]
            arg = node.this
            distinct = isinstance(arg, exp.Distinct)
            if distinct:
                if len(arg.expressions) != 1:
                    raise pl.error(node, "COUNT(DISTINCT ...) takes one column")
                arg = arg.expressions[0]
            if isinstance(arg, exp.Star):
                if fn != "count" or distinct:
                    raise pl.error(node, "only COUNT takes *")
                text = "count(*)"
            else:
                if isinstance(arg, exp.Column):
                    col = pl.resolve(arg, [rel])[1].column
                else:
                    col = f"{out}_arg"
                    pre.append((col, pl.render(arg, rel)))
                text = f"{fn}({'distinct ' if distinct else ''}{col})"
            calls[node.sql(dialect=Flink)] = (out, text)
    if not calls:
        raise pl.error(group, "GROUP BY without an aggregate: add one, e.g. COUNT(*) AS n")
    clash = set(keys) & {o for o, _ in calls.values()}
    if clash:
        raise pl.error(q, f"an aggregate's name {sorted(clash)} is also a GROUP BY column; rename it with AS")
    node = rel.node
    if pre:
        from changelake.plan import sql

        computed = dict(pre)
        projection: dict[str, str] = {}
        for text in keys + [t for _, t in calls.values()]:
            col = text if "(" not in text else text[text.index("(") + 1:-1].replace("distinct ", "")
            if col != "*" and col not in projection:
                projection[col] = computed.get(col, sql.column(col))
        node = pl.add("pre", lambda n: pl.p.stream(rel.node).select(projection, name=n))
    aggs = {out: text for out, text in calls.values()}
    source = node
    node = pl.add("group_by", lambda n: pl.p.stream(source).group_by(*keys).agg(aggs, name=n))
    agg_rel = _Rel(node, tuple(_Col(c.qualifier, c.name, k) for c, k in zip(key_cols, keys))
                   + tuple(_Col(None, out, out) for out in aggs))

    def over_outputs(e: exp.Expression) -> exp.Expression:
        def swap(n: exp.Expression) -> exp.Expression:
            text = n.sql(dialect=Flink)
            if isinstance(n, tuple(_AGGREGATES)) and text in calls:
                return exp.Column(this=exp.to_identifier(calls[text][0]))
            if text in key_of and not isinstance(n, (exp.Column, exp.Identifier, exp.Literal)):
                return exp.Column(this=exp.to_identifier(key_of[text]))
            return n

        return e.transform(swap)

    def grouped(e: exp.Expression) -> exp.Expression:
        out = over_outputs(e)
        for col in out.find_all(exp.Column):
            try:
                pl.resolve(col, [agg_rel])
            except SqlError:
                raise pl.error(col, f"the column {col.sql(dialect=Flink)} is neither in GROUP BY nor inside an "
                                    "aggregate; add it to GROUP BY or aggregate it (e.g. MAX(...))") from None
        return out

    if having is not None:
        predicate = pl.render(grouped(having), agg_rel)
        agg_rel = _Rel(pl.add("having", lambda n: pl.p.stream(agg_rel.node).filter(predicate, name=n)), agg_rel.cols)
    items = []
    for item in q.expressions:
        body = grouped(item.unalias() if isinstance(item, exp.Alias) else item)
        name = item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else None
        if name is None:
            raise pl.error(item, f"name the expression {item.sql(dialect=Flink)}: write it AS a column name")
        items.append(exp.alias_(body, name) if not (isinstance(body, exp.Column) and body.name == name) else body)
    return pl.project(items, agg_rel)
