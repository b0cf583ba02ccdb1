"""Filter and select expressions are checked in Spark SQL's dialect before deploy (plan/spark_sql.py)."""

from __future__ import annotations

import pytest

from changelake.errors import ConfigError
from changelake.plan import Pipeline
from changelake.plan.spark_sql import spark_problem

pytestmark = pytest.mark.unit

#: DuckDB takes each of these (the planner's type check passes), Spark does not
DUCKDB_ONLY = {
    "regexp_matches(name, 'a.*')": ("regexp_matches", "rlike"),
    "list_value(qty)[1] > 0": ("list_value", "array("),
    "price // 2 > 1": ("'//'", "div"),
    "price ** 2 > 1": ("'**'", "power(a, b)"),
    "price ^ 2 > 1": ("bitwise XOR in Spark", "power(a, b)"),
    "strftime(ts, '%Y') = '2024'": ("strftime", "date_format"),
    "starts_with(name, 'a')": ("starts_with", "LIKE 'prefix%'"),
    "[qty, qty][1] > 0": ("list literal", "array("),
}

#: in both dialects: these must keep passing
COMMON = ["qty > 10 AND name LIKE 'a%'", "CAST(price AS DECIMAL(10,2)) > 1", "coalesce(qty, 0) > 1",
          "CASE WHEN qty IN (1, 2) THEN true ELSE NOT (qty > 3) END", "qty IS DISTINCT FROM 3",
          "`order` + 1 > 0", "EXTRACT(YEAR FROM ts) = 2024", "trim(BOTH 'x' FROM name) <> ''",
          "length(name) BETWEEN 1 AND 10", "abs(qty) % 4 = 1", "ts > TIMESTAMP '2024-01-01 00:00:00'",
          "regexp_extract(name, 'a(.*)', 1) <> ''", "CAST(floor(price / 2) AS BIGINT) > 1"]


def _pipeline(predicate: str) -> Pipeline:
    p = Pipeline()
    p.source("s", columns={"id": "bigint", "qty": "int", "price": "double", "name": "string", "ts": "timestamp",
                           "order": "int"}, primary_key=["id"]).filter(predicate, name="f").to_table("t", primary_key=["id"])
    return p


@pytest.mark.parametrize("expression", DUCKDB_ONLY)
def test_duckdb_only_sql_fails_validation_naming_the_function_and_spark_s(expression):
    culprit, instead = DUCKDB_ONLY[expression]
    with pytest.raises(ConfigError) as info:
        _pipeline(expression).plan()
    message = str(info.value)
    assert message.startswith("filter 'f': ") and "is not Spark SQL" in message
    assert culprit in message and instead in message


@pytest.mark.parametrize("expression", COMMON)
def test_sql_of_both_dialects_passes(expression):
    assert spark_problem(expression) is None
    _pipeline(expression).plan()


def test_select_expressions_are_checked_per_column():
    p = Pipeline()
    p.source("s", columns={"id": "bigint", "qty": "int"}, primary_key=["id"]).select(
        {"id": "id", "half": "qty // 2"}, name="v").to_table("t", primary_key=["id"])
    with pytest.raises(ConfigError, match=r"select 'v' column 'half': 'qty // 2' is not Spark SQL: '//'"):
        p.plan()


def test_an_unknown_function_gets_the_closest_spark_names():
    assert spark_problem("cnt(qty) > 1") == "Spark has no function cnt(); did you mean count()?"
