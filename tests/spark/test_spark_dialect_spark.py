"""The Spark-dialect check agrees with Spark itself: its function list is Spark's, what it rejects
Spark rejects, and what it passes Spark evaluates."""

from __future__ import annotations

import pytest

from changelake.plan.spark_functions import SPARK_FUNCTIONS
from tests.plan.test_spark_dialect import COMMON, DUCKDB_ONLY

pytestmark = pytest.mark.spark


#: table-valued functions Delta's SQL extension registers in a session that has it (change data feed reads,
#: not expressions a view's SELECT list can use): not Spark's built-ins
DELTA_EXTENSION_FUNCTIONS = {"table_changes", "table_changes_by_path"}


def test_the_function_list_is_the_running_spark_s(spark):
    live = {r[0] for r in spark.sql("SHOW FUNCTIONS").collect() if r[0].replace("_", "a").isalnum()}
    if "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions", ""):
        live -= DELTA_EXTENSION_FUNCTIONS
    assert SPARK_FUNCTIONS == live, (f"regenerate changelake/plan/spark_functions.py: missing {sorted(live - SPARK_FUNCTIONS)}, "
                                     f"extra {sorted(SPARK_FUNCTIONS - live)}")


def test_spark_analyzes_what_passes_and_rejects_or_reads_differently_what_fails(spark):
    df = spark.sql("SELECT 1L AS id, 2 AS qty, 3.5D AS price, 'abc' AS name, TIMESTAMP '2024-01-01' AS ts, "
                   "4 AS `order`")
    for expression in COMMON:
        df.selectExpr(f"({expression}) AS p").collect()          # no error
    from pyspark.errors import AnalysisException, ParseException

    for expression in DUCKDB_ONLY:
        with pytest.raises((AnalysisException, ParseException)):
            df.selectExpr(f"({expression}) AS p").collect()
