"""The joins of a SQL view (:mod:`changelake.plan.sql_view`): FROM's joins and WHERE's subquery tests.

=====================================================================  =============================
written                                                                planned as
=====================================================================  =============================
``a [INNER|LEFT|RIGHT|FULL] JOIN b ON a.x = b.y``, ``FROM a, b WHERE``  ``join(on, how)``
  other ON terms of an inner join (and WHERE terms over both sides)     ``filter`` after the join
  ON terms over b alone in a LEFT join (a alone in a RIGHT join)       ``filter`` on that input first
``... ON a.x = b.y AND a.t BETWEEN b.t - INTERVAL .. AND b.t + ..``    ``interval_join(before, after)``
``... ON a.x = b.y AND a.t >= b.t - INTERVAL .. AND a.t < b.t + ..``  the same (a strict bound: 1 ms in)
``JOIN b FOR SYSTEM_TIME AS OF a.t ON a.x = b.y`` (b a source/view)    ``temporal_join(time=t)``
``JOIN lk FOR SYSTEM_TIME AS OF a.proc_time ON a.x = lk.k``            ``lookup_join(lookups[lk])``
``x IN (SELECT y FROM ...)``                                           ``join(on={x: y}, how="semi")``
``[NOT] EXISTS (SELECT .. FROM b WHERE b.y = a.x [AND ..])``           ``join(how="semi"|"anti")``
``x NOT IN (SELECT y ...)``, x and y proven never NULL                 ``join(on={x: y}, how="anti")``
=====================================================================  =============================
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

from changelake.plan.sql_view import Flink, SqlError, _Col, _conjuncts, _Rel, _subquery_test, interval_ms

if TYPE_CHECKING:
    from changelake.plan.sql_view import _QueryPlanner

_HOW = {"": "inner", "INNER": "inner", "LEFT": "left", "RIGHT": "right", "FULL": "full"}


def _sides(pl: "_QueryPlanner", term: exp.Expression, rels: list[_Rel]) -> set[int] | None:
    """Which of ``rels`` the term's columns name; None when one names none of them (a later join's)."""
    try:
        return pl.sides(term, rels)
    except SqlError:
        return None


def _equi(pl: "_QueryPlanner", term: exp.Expression, left: _Rel, right: _Rel) -> tuple[str, str] | None:
    """(left column, right column) of ``l.x = r.y`` (either way round), else None."""
    if not isinstance(term, exp.EQ):
        return None
    a, b = term.this, term.expression
    if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
        return None
    (sa, ca), (sb, cb) = pl.resolve(a, [left, right]), pl.resolve(b, [left, right])
    if (sa, sb) == (0, 1):
        return ca.column, cb.column
    if (sa, sb) == (1, 0):
        return cb.column, ca.column
    return None


def _time_point(pl: "_QueryPlanner", node: exp.Expression, rels: list[_Rel]) -> tuple[int, str, int] | None:
    """``col``, ``col - INTERVAL``, ``col + INTERVAL``: (side, column, offset ms)."""
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.Column):
        side, c = pl.resolve(node, rels)
        return side, c.column, 0
    if isinstance(node, (exp.Add, exp.Sub)):
        col, iv = node.this, node.expression
        if isinstance(node, exp.Add) and isinstance(col, exp.Interval):
            col, iv = iv, col
        ms = interval_ms(iv)
        if isinstance(col, exp.Column) and ms is not None:
            side, c = pl.resolve(col, rels)
            return side, c.column, -ms if isinstance(node, exp.Sub) else ms
    return None


def _interval(pl: "_QueryPlanner", term: exp.Expression, left: _Rel, right: _Rel):
    """(left time, right time, before ms, after ms) of ``a.t BETWEEN b.t - X AND b.t + Y``, else None."""
    if not isinstance(term, exp.Between):
        return None
    rels = [left, right]
    points = [_time_point(pl, term.args.get(k), rels) for k in ("this", "low", "high")]
    if any(p is None for p in points):
        return None
    (s, col, off), (s1, other, lo), (s2, other2, hi) = points
    if off != 0 or s1 != s2 or s1 == s or other != other2:
        return None
    if s == 0:                                   # l.t in [r.t + lo, r.t + hi]
        return col, other, -lo, hi
    return other, col, hi, -lo                    # r.t in [l.t + lo, l.t + hi]: l.t in [r.t - hi, r.t - lo]


#: a comparison read as ``l.t <op> r.t + c``: lower or upper bound; a strict one moves by a millisecond
#: (event times are milliseconds), as Flink's interval join does
_BOUNDS = {exp.GTE: ("lower", 0), exp.GT: ("lower", 1), exp.LTE: ("upper", 0), exp.LT: ("upper", -1)}
_FLIPPED = {exp.GTE: exp.LTE, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.LT: exp.GT}


def _bound(pl: "_QueryPlanner", term: exp.Expression, left: _Rel, right: _Rel):
    """(left time, right time, "lower" | "upper", c ms) of a comparison between a time point of each
    input (``l.t >= r.t - INTERVAL ..``, ``r.t + INTERVAL .. > l.t``, ...) read as ``l.t <op> r.t + c``."""
    kind = type(term)
    if kind not in _BOUNDS:
        return None
    a, b = (_time_point(pl, term.args.get(k), [left, right]) for k in ("this", "expression"))
    if a is None or b is None or {a[0], b[0]} != {0, 1}:
        return None
    if a[0] == 1:                                # r.t + x <op> l.t + y  ->  l.t <flipped op> r.t + x - y
        a, b, kind = b, a, _FLIPPED[kind]
    (_, ltime, loff), (_, rtime, roff) = a, b
    which, strict = _BOUNDS[kind]
    return ltime, rtime, which, roff - loff + strict


def _intervals_of_bounds(pl: "_QueryPlanner", terms: list, left: _Rel, right: _Rel):
    """The interval of a lower and an upper bound over the same two time columns (``l.t >= r.t - X AND
    l.t <= r.t + Y``), as (left time, right time, before ms, after ms), and the terms it came from;
    (None, []) when the terms hold no such pair."""
    found: dict[tuple[str, str], dict[str, tuple[int, exp.Expression]]] = {}
    for t in terms:
        b = _bound(pl, t, left, right)
        if b is not None:
            ltime, rtime, which, c = b
            found.setdefault((ltime, rtime), {}).setdefault(which, (c, t))
    event_times = (pl.draft(left.node).rowtime, pl.draft(right.node).rowtime)
    for (ltime, rtime), sides in found.items():
        # on other columns the comparisons are a join condition, as in Flink: an interval join is on event times
        if "lower" in sides and "upper" in sides and ltime in event_times[0] and rtime in event_times[1]:
            (lo, t_lo), (hi, t_hi) = sides["lower"], sides["upper"]
            return (ltime, rtime, -lo, hi), [t_lo, t_hi]
    return None, []


def plan_join(pl: "_QueryPlanner", left: _Rel, join: exp.Join, where: list[exp.Expression]):
    right_src = join.this
    side = (join.args.get("side") or "").upper()
    kind = (join.args.get("kind") or "").upper()
    if kind in ("SEMI", "ANTI"):
        raise pl.error(join, f"{kind} JOIN: write WHERE x IN (SELECT y ...) or [NOT] EXISTS (SELECT ... WHERE ...) "
                             "for a semi or anti join")
    if kind == "CROSS" and join.args.get("on") is None:
        kind = ""
    if kind not in ("", "OUTER", "INNER"):
        raise pl.error(join, f"{kind} JOIN is not supported; write [INNER] JOIN, LEFT, RIGHT or FULL [OUTER] JOIN")
    how = _HOW[side]
    terms = _conjuncts(join.args.get("on"))
    version = right_src.args.get("version") if isinstance(right_src, exp.Table) else None
    if version is not None:
        return _versioned_join(pl, left, join, right_src, version, how, terms, where)
    right = pl.relation(right_src)
    if how == "inner":           # WHERE terms over both sides are the join's condition
        both = [t for t in where if not _subquery_test(t) and _sides(pl, t, [left, right]) == {0, 1}]
        where = [t for t in where if not any(t is b for b in both)]
        terms = terms + both
    using = join.args.get("using")
    pairs: dict[str, str] = {}
    for ident in using or []:
        pairs[pl.resolve(exp.Column(this=ident.copy()), [left])[1].column] = \
            pl.resolve(exp.Column(this=ident.copy()), [right])[1].column
    interval, bounds = _intervals_of_bounds(pl, terms, left, right)
    terms = [t for t in terms if not any(t is b for b in bounds)]
    residual = []
    for t in terms:
        pair = _equi(pl, t, left, right)
        bound = None if pair else _interval(pl, t, left, right)
        if pair and pair[0] not in pairs:
            pairs[pair[0]] = pair[1]
        elif bound and interval is None:
            interval = bound
        else:
            residual.append(t)
    if not pairs:
        raise pl.error(join, "a join needs an equality between a column of each input (ON a.x = b.y); a cross "
                             "join or a join on a non-equality alone is not supported")
    left, right = _push_outer_residual(pl, left, right, how, residual, join)
    lnode, rnode = pl.p.stream(left.node), pl.p.stream(right.node)
    if interval is not None:
        ltime, rtime, before, after = interval
        node = pl.add("join", lambda n: lnode.interval_join(
            rnode, on=pairs, before=f"{before} ms", after=f"{after} ms", left_time=ltime, right_time=rtime,
            how=how, name=n))
    else:
        node = pl.add("join", lambda n: lnode.join(rnode, on=pairs, how=how, name=n))
    rel = _joined(pl, node, left, right)
    return _residual_filter(pl, rel, residual), where


def _push_outer_residual(pl, left: _Rel, right: _Rel, how: str, residual: list, join: exp.Join):
    """An outer join's non-equi ON terms over its padded side alone filter that side first; others are errors.
    ``residual`` keeps the inner join's terms (a filter after the join) and loses those pushed here."""
    if how == "inner" or not residual:
        return left, right
    pushed: list[exp.Expression] = []
    for t in residual:
        sides = pl.sides(t, [left, right])
        if (how == "left" and sides == {1}) or (how == "right" and sides == {0}):
            pushed.append(t)
        else:
            raise pl.error(t, f"the ON condition {t.sql(dialect=Flink)} of a {how.upper()} JOIN: only equalities "
                              "between the inputs and conditions on the padded input alone are supported; move it "
                              "into WHERE (which filters the joined rows) or into a subquery of one input")
    residual.clear()
    target = right if how == "left" else left
    predicate = " AND ".join(f"({pl.render(t, target)})" if len(pushed) > 1 else pl.render(t, target) for t in pushed)
    node = pl.add("on", lambda n: pl.p.stream(target.node).filter(predicate, name=n))
    moved = _Rel(node, target.cols)
    return (left, moved) if how == "left" else (moved, right)


def _residual_filter(pl: "_QueryPlanner", rel: _Rel, residual: list[exp.Expression]) -> _Rel:
    if not residual:
        return rel
    predicate = " AND ".join(f"({pl.render(t, rel)})" if len(residual) > 1 else pl.render(t, rel) for t in residual)
    return _Rel(pl.add("on", lambda n: pl.p.stream(rel.node).filter(predicate, name=n)), rel.cols)


def _joined(pl: "_QueryPlanner", node: str, left: _Rel, right: _Rel, right_columns: list[str] | None = None) -> _Rel:
    """The joined node's relation: the left's columns, then the right's under their output names."""
    names = pl.schema(node).names
    lnames = pl.schema(left.node).names
    rnames = right_columns if right_columns is not None else pl.schema(right.node).names
    out = {c: names[len(lnames) + i] for i, c in enumerate(rnames)}
    return _Rel(node, left.cols + tuple(_Col(c.qualifier, c.name, out[c.column]) for c in right.cols))


def _versioned_join(pl, left: _Rel, join: exp.Join, table: exp.Table, version: exp.Expression, how: str,
                    terms: list[exp.Expression], where: list[exp.Expression]):
    """``JOIN t FOR SYSTEM_TIME AS OF <time>``: a lookup join when t is a lookup, else a temporal join."""
    if how not in ("inner", "left"):
        raise pl.error(join, f"FOR SYSTEM_TIME AS OF joins INNER or LEFT, not {how.upper()}")
    at = version.args.get("expression")
    name, qualifier = table.name, table.alias_or_name
    if name in pl.lookups:
        lookup = pl.lookups[name]
        right = _Rel("", tuple(_Col(qualifier, c, c) for c in lookup.columns.names))
        rowtime = pl.draft(left.node).rowtime
        if isinstance(at, exp.Column) and at.name in {c.name for c in left.cols if c.column in rowtime}:
            raise pl.error(at, f"lookup table {name!r} has no versions by event time; look it up AS OF the "
                               "processing time: FOR SYSTEM_TIME AS OF <stream>.proc_time (or PROCTIME())")
        pairs, residual = {}, []
        for t in terms:
            sides = _sides(pl, t, [left, right])
            if isinstance(t, exp.EQ) and sides == {0, 1} and isinstance(t.this, exp.Column) \
                    and isinstance(t.expression, exp.Column):
                (sa, ca), (_, cb) = pl.resolve(t.this, [left, right]), pl.resolve(t.expression, [left, right])
                stream_col, dim_col = (ca, cb) if sa == 0 else (cb, ca)
                pairs[stream_col.column] = dim_col.column
            else:
                residual.append(t)
        if residual and how == "left":
            raise pl.error(residual[0], "a LEFT lookup join takes equalities with the lookup key in ON; filter in "
                                        "WHERE")
        node = pl.add("join", lambda n: pl.p.stream(left.node).lookup_join(lookup, on=pairs, how=how, name=n))
        rel = _joined(pl, node, left, right, right_columns=list(lookup.columns.names))
        return _residual_filter(pl, rel, residual), where
    bare = table.copy()
    bare.set("version", None)
    right = pl.relation(bare)
    if not isinstance(at, exp.Column):
        raise pl.error(at, "FOR SYSTEM_TIME AS OF takes the fact's event-time column: AS OF o.order_time")
    side, time = pl.resolve(at, [left, right])
    if side != 0:
        raise pl.error(at, "FOR SYSTEM_TIME AS OF names the left input's event-time column, not the versioned table's")
    pairs, residual = {}, []
    for t in terms:
        pair = _equi(pl, t, left, right)
        if pair and pair[0] not in pairs:
            pairs[pair[0]] = pair[1]
        else:
            residual.append(t)
    if residual and how == "left":
        raise pl.error(residual[0], "a LEFT temporal join takes equalities of the key in ON; filter in WHERE")
    if not pairs:
        raise pl.error(join, "a temporal join needs ON <fact column> = <versioned table's key column>")
    node = pl.add("join", lambda n: pl.p.stream(left.node).temporal_join(
        pl.p.stream(right.node), on=pairs, time=time.column, how=how, name=n))
    return _residual_filter(pl, _joined(pl, node, left, right), residual), where


def plan_semi_join(pl: "_QueryPlanner", rel: _Rel, test: exp.Expression) -> _Rel:
    """``x IN (SELECT y ...)`` / ``[NOT] EXISTS (SELECT ... WHERE inner = outer ...)`` as a semi / anti join."""
    negated = isinstance(test, exp.Not)
    t = test.this if negated else test
    t = t.unnest() if isinstance(t, exp.Paren) else t
    if isinstance(t, exp.In):
        outer_col = pl.column_of(t.this, rel, "the tested value of IN (SELECT ...)")
        sub_q = t.args["query"]
        sub_q = sub_q.this if isinstance(sub_q, exp.Subquery) else sub_q
        sub = pl.query(sub_q)
        if len(sub.cols) != 1:
            raise pl.error(sub_q, f"the subquery of IN selects {len(sub.cols)} columns; select exactly one")
        pairs = {outer_col: sub.cols[0].column}
        how = "semi"
        if negated:
            nullable = [what for what, n, c in ((t.this.sql(dialect=Flink), rel.node, outer_col),
                                                 (f"the subquery's {sub.cols[0].name}", sub.node, sub.cols[0].column))
                        if not _never_null(pl, n, c)]
            if nullable:
                raise pl.error(test, f"NOT IN (SELECT ...) over a column that may be NULL ({', '.join(nullable)}): "
                                     "it returns no row at all once the subquery holds a NULL, which an anti join "
                                     "cannot retract; filter the NULLs out (WHERE x IS NOT NULL, and in the "
                                     "subquery WHERE y IS NOT NULL), or write NOT EXISTS (SELECT * FROM ... WHERE "
                                     "sub.y = outer.x), which the anti join computes exactly")
            how = "anti"              # over never-NULL columns NOT IN is NOT EXISTS
    elif isinstance(t, exp.Exists):
        sub_q = t.this.this if isinstance(t.this, exp.Subquery) else t.this
        if not isinstance(sub_q, exp.Select):
            raise pl.error(t, "EXISTS takes a SELECT")
        inner_names = {sub_q.args["from_"].this.alias_or_name} | {j.this.alias_or_name
                                                                    for j in sub_q.args.get("joins") or []}
        outer_names = {c.qualifier for c in rel.cols if c.qualifier}
        correlated, own = [], []
        for term in _conjuncts(sub_q.args["where"].this if sub_q.args.get("where") else None):
            refs = {c.table for c in term.find_all(exp.Column) if c.table}
            (correlated if refs & (outer_names - inner_names) else own).append(term)
        if not correlated:
            raise pl.error(t, "EXISTS (SELECT ...) needs a correlation: WHERE sub.y = outer.x (qualify the outer "
                              "column with its table's name or alias)")
        inner = sub_q.copy()
        inner.set("expressions", [exp.Star()])
        inner.set("where", exp.Where(this=exp.and_(*own)) if own else None)
        sub = pl.query(inner)
        pairs = {}
        for term in correlated:
            if not (isinstance(term, exp.EQ) and isinstance(term.this, exp.Column)
                    and isinstance(term.expression, exp.Column)):
                raise pl.error(term, f"the correlation {term.sql(dialect=Flink)} must be an equality of an inner and "
                                     "an outer column (sub.y = outer.x)")
            a, b = term.this, term.expression
            outer, inner_c = (a, b) if a.table in outer_names - inner_names else (b, a)
            pairs[pl.resolve(outer, [rel])[1].column] = pl.resolve(inner_c, [sub])[1].column
        how = "anti" if negated else "semi"
    else:                                         # pragma: no cover - guarded by _subquery_test
        raise pl.error(test, "not a subquery test")
    node = pl.add(how, lambda n: pl.p.stream(rel.node).join(pl.p.stream(sub.node), on=pairs, how=how, name=n))
    return _Rel(node, rel.cols)


def _never_null(pl: "_QueryPlanner", node: str, column: str) -> bool:
    """Whether the planner proves ``column`` of ``node`` never NULL (:mod:`changelake.plan.nullability`):
    plans the pipeline so far with a probe table on ``node``."""
    from changelake.plan.graph import Pipeline
    from changelake.plan.planner import plan

    probe = Pipeline(state=pl.p.state)
    probe.nodes = {n: v for n, v in pl.p.nodes.items() if v.op != "sink"}
    probe.stream(node).to_table("not_null_probe", primary_key=[column])
    physical = plan(probe)
    fed = physical[physical["sink_not_null_probe"].inputs[0]]
    if fed.op == "materialize":
        fed = physical[fed.inputs[0]]
    return column in fed.not_null
