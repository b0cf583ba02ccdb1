"""Top-N and deduplication written with ROW_NUMBER() in a SQL view (:mod:`changelake.plan.sql_view`).

::

    SELECT ... FROM (
        SELECT ..., ROW_NUMBER() OVER (PARTITION BY p ORDER BY o [ASC|DESC] [NULLS FIRST|LAST]) AS rn
        FROM ...)
    WHERE rn <= N                      -- or rn < N+1, N >= rn, rn BETWEEN 1 AND N, rn = 1

====================================================================  ============================================
the query                                                             planned as
====================================================================  ============================================
rn selected by the enclosing query (by name or ``*``)                 ``top_n(N, rank_column="rn")`` (``<view>_top_n``)
rn not selected                                                       ``top_n(N)``: keyed by the input's key, which
                                                                      needs PARTITION BY inside that key
``rn = 1``, rn not selected, ORDER BY ``PROCTIME()`` ASC / DESC        ``deduplicate(keep="first"/"last")``
``rn = 1``, rn not selected, ORDER BY the input's event time          ``deduplicate(..., order_by=<event time>)``
====================================================================  ============================================

NULLs sort first ascending and last descending unless NULLS FIRST / LAST says otherwise, as in
Flink (and the step form's default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from changelake.plan.sql_view import Flink, _Col, _Rel

if TYPE_CHECKING:
    from changelake.plan.sql_view import _QueryPlanner


def _is_rn(node: exp.Expression, rn: str) -> bool:
    return isinstance(node, exp.Column) and node.name == rn


def _int(node: exp.Expression) -> int | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return int(node.this)
        except ValueError:
            return None
    return None


def rank_bound(term: exp.Expression, rn: str) -> int | None:
    """N of ``rn <= N`` and its equivalents, else None."""
    a, b = term.this, term.args.get("expression")
    if isinstance(term, exp.Between) and _is_rn(a, rn) and _int(term.args["low"]) == 1:
        return _int(term.args["high"])
    if isinstance(term, (exp.GT, exp.GTE)) and a is not None and b is not None:
        a, b, term = b, a, (exp.LT if isinstance(term, exp.GT) else exp.LTE)(this=b, expression=a)
    if not (_is_rn(a, rn) and _int(b) is not None):
        return None
    n = _int(b)
    if isinstance(term, exp.LTE):
        return n
    if isinstance(term, exp.LT):
        return n - 1
    if isinstance(term, exp.EQ) and n == 1:
        return 1
    return None


def plan_rank(pl: "_QueryPlanner", inner: exp.Select, qualifier: str | None, where: list[exp.Expression],
              outer: exp.Select):
    """The Top-N (or deduplicate) of ``inner``'s ROW_NUMBER(), with the enclosing query's WHERE terms left."""
    windows = [e for e in inner.expressions if isinstance(e.unalias(), exp.Window)]
    if len(windows) != 1 or not isinstance(windows[0], exp.Alias):
        raise pl.error(windows[0] if windows else inner, "write one ROW_NUMBER() OVER (PARTITION BY ... ORDER BY "
                                                         "...) AS rn per subquery, named with AS")
    item = windows[0]
    w, rn = item.unalias(), item.alias
    if inner.args.get("group") or inner.args.get("having"):
        raise pl.error(item, "ROW_NUMBER() over a GROUP BY in the same SELECT: aggregate in a subquery and rank "
                             "its rows in the query around it")
    n, rest = None, []
    for t in where:
        bound = rank_bound(t, rn) if n is None else None
        if bound is not None:
            n = bound
        else:
            rest.append(t)
    if n is None or n < 1:
        raise pl.error(item, f"ROW_NUMBER() AS {rn} needs WHERE {rn} <= N (N >= 1; or {rn} < N, {rn} = 1) in the "
                             "query around it: a streaming Top-N keeps only the first N rows per partition")
    order = w.args.get("order").expressions if w.args.get("order") else []
    if not order:
        raise pl.error(item, "ROW_NUMBER() OVER (...) needs ORDER BY: the rows it keeps are the first by that order")
    # PARTITION BY and ORDER BY read the FROM's columns, as the SELECT list does: each is the SELECT item
    # that computes it, else an extra item that a select after the Top-N drops again
    items = [e for e in inner.expressions if not isinstance(e.unalias(), exp.Window)]
    star = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
               for e in items)
    computed = {e.unalias().sql(dialect=Flink): e.alias_or_name for e in items if not isinstance(e, exp.Star)}
    extra: list[str] = []
    refs: dict[str, exp.Expression] = {}
    for e in [*(w.args.get("partition_by") or []), *(o.this for o in order)]:
        text = e.sql(dialect=Flink)
        if text in computed:
            refs[text] = exp.column(computed[text])
        elif not star and not (isinstance(e, exp.Anonymous) and str(e.this).upper() == "PROCTIME"):
            name = e.name if isinstance(e, exp.Column) and e.name not in computed.values() \
                else f"rank_key_{len(extra) + 1}"
            items.append(exp.alias_(e.copy(), name))
            computed[text] = name
            extra.append(name)
            refs[text] = exp.column(name)
    body = inner.copy()
    body.set("expressions", items or [exp.Star()])
    base = pl.query(body)

    def ref(e: exp.Expression) -> exp.Expression:
        return refs.get(e.sql(dialect=Flink), e)

    partition = [pl.column_of(ref(e), base, "a PARTITION BY item") for e in w.args.get("partition_by") or []]
    kept = any(isinstance(s, exp.Star) or (isinstance(s, exp.Column) and isinstance(s.this, exp.Star))
               or any(_is_rn(c, rn) for c in s.find_all(exp.Column)) for s in outer.expressions) \
        or any(_is_rn(c, rn) for t in rest for c in t.find_all(exp.Column))
    first = ref(order[0].this)
    proctime = isinstance(first, exp.Anonymous) and str(first.this).upper() == "PROCTIME"
    rowtime = isinstance(first, exp.Column) and pl.column_of(first, base, "ORDER BY") in pl.draft(base.node).rowtime
    if n == 1 and not kept and len(order) == 1 and (proctime or rowtime) and partition:
        keep = "last" if order[0].args.get("desc") else "first"
        by = None if proctime else pl.column_of(first, base, "ORDER BY")
        node = pl.add("dedup", lambda name: pl.p.stream(base.node).deduplicate(partition, keep=keep, order_by=by,
                                                                                   name=name))
        return _drop(pl, _Rel(node, base.cols), extra).named(qualifier), rest
    if proctime:
        raise pl.error(first, "ORDER BY PROCTIME() is a deduplication: PARTITION BY the key, WHERE rn = 1, and do not "
                              "select rn")
    sorts = []
    for o in order:
        col = pl.column_of(ref(o.this), base, "an ORDER BY item of ROW_NUMBER()")
        desc = bool(o.args.get("desc"))
        nulls_first = bool(o.args.get("nulls_first"))
        nulls = "" if nulls_first != desc else (" nulls first" if nulls_first else " nulls last")   # Flink's default: ""
        sorts.append(f"{col}{' desc' if desc else ''}{nulls}")
    rank_column = rn if kept else None
    if rank_column and rank_column in pl.schema(base.node).names:
        raise pl.error(item, f"the rank column {rn!r} is also a column of the ranked rows; name it otherwise")
    node = pl.add("top_n", lambda name: pl.p.stream(base.node).top_n(
        n, order_by=sorts, partition_by=partition, rank_column=rank_column, name=name))
    if not kept and pl.draft(node).upsert_key is None:
        key = pl.draft(base.node).upsert_key
        raise pl.error(item, f"a Top-N that does not select {rn} is keyed by its input's unique key, and here it has "
                             "none" + (f" within PARTITION BY {partition}" if key else "") + f" (input key: "
                             f"{list(key) if key else 'none'}): select {rn} (a table keyed by the PARTITION BY "
                             f"columns and {rn}), or PARTITION BY columns of the input's key")
    cols = base.cols + ((_Col(None, rn, rn),) if kept else ())
    return _drop(pl, _Rel(node, cols), extra).named(qualifier), rest


def _drop(pl: "_QueryPlanner", rel: _Rel, extra: list[str]) -> _Rel:
    """``rel`` without the columns added for PARTITION BY / ORDER BY alone (a select, ``<view>_select``)."""
    if not extra:
        return rel
    from changelake.plan import sql

    kept = tuple(c for c in rel.cols if c.column not in extra)
    node = pl.add("select", lambda n: pl.p.stream(rel.node).select({c.column: sql.column(c.column) for c in kept},
                                                                   name=n))
    return _Rel(node, kept)
