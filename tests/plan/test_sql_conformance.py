"""Flink's StreamingJoin harness cases through SQL: each case's "Equivalent SQL" (inner, left, right
join; IN and NOT IN subqueries) plans into the join operator the case drives, with the case's join
type, keys and input layouts, and that planned operator emits the case's expected changes."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from changelake.operators.streaming_join import StreamingJoin, StreamingSemiAntiJoin
from changelake.plan import Pipeline
from tests.operators.harness import case_params, load, run_case
from tests.operators.test_conformance_streaming_join import JoinDriver, config_from_case

pytestmark = pytest.mark.unit

#: fields the harness sets (state retention, bundles) rather than the query; and the right arity: the
#: harness feeds an IN subquery's table whole, the plan projects it to the one column the subquery selects
HARNESS_FIELDS = ("left_state_ttl_ms", "right_state_ttl_ms", "mini_batch_size", "filter_null_keys", "right_arity")


def equivalent_sql(case: dict) -> str | None:
    m = re.search(r"Equivalent SQL: (SELECT [^\"]*)", json.dumps(case["notes"]))
    return m.group(1).rstrip(". ") if m else None


#: the cases with an equivalent query; when the corpus is missing, case_params' one skipping param
#: (its value is None) stays, so the run says what is missing instead of failing at collection
CASES = [p for p in case_params("StreamingJoin") if p.values[0] is None or equivalent_sql(load(p.values[0]))]


def _type(flink: str) -> str:
    base = flink.split("(")[0].split()[0].upper()
    return {"CHAR": "string", "VARCHAR": "string", "STRING": "string", "INT": "int", "BIGINT": "bigint"}[base]


def sources(case: dict) -> Pipeline:
    left = [(n, _type(t)) for n, t in case["schema"]["left"]]
    lnames = {n for n, _ in left}
    # Flink's harness names a right column that clashes <name>0; the query names it <name>
    right = [(n[:-1] if n.endswith("0") and n[:-1] in lnames else n, _type(t)) for n, t in case["schema"]["right"]]
    p = Pipeline()
    for name, cols, spec in (("orders", left, case["config"]["left_input_spec"]),
                             ("line_orders", right, case["config"]["right_input_spec"])):
        key = [cols[i][0] for i in spec.get("unique_key") or []]
        p.source(name, columns=dict(cols), primary_key=key or None)
    return p


@pytest.mark.parametrize("path", CASES)
def test_the_equivalent_sql_plans_the_operator_and_emits_the_expected_changes(path):
    case = load(path)
    p = sources(case)
    p.sql("v", equivalent_sql(case)).to_table("v", primary_key=["order_id"])
    joins = [n for n in p.plan() if n.op == "join"]
    assert len(joins) == 1
    want = config_from_case(case)
    planned = dataclasses.replace(joins[0].config, **{f: getattr(want, f) for f in HARNESS_FIELDS})
    # the planner also hands the join its inputs' columns (an inner join of keyed inputs keeps its state in
    # Arrow columns with them); Flink's harness has none, and the cases run with them
    assert dataclasses.replace(planned, left_schema=None, right_schema=None) == want
    assert planned.left_schema.names == [n for n, _ in case["schema"]["left"]]
    run_case(case, JoinDriver(StreamingSemiAntiJoin if want.join_type in ("SEMI", "ANTI") else StreamingJoin, planned))


def test_the_corpus_has_join_cases_with_a_query():
    if CASES and CASES[0].values[0] is None:
        pytest.skip(CASES[0].marks[0].kwargs["reason"])
    kinds = {config_from_case(load(p.values[0])).join_type for p in CASES}
    assert kinds == {"INNER", "LEFT", "RIGHT", "SEMI", "ANTI"}, kinds
