"""Fixtures of the sink suite: one behavioural suite, parametrized over the engines present.

A Spark session is created only when a test needs one (delta-spark detection, interop): the test
process's one session (tests/conftest.py, ``spark``), with the project's ``delta`` JVM set on its class
path when it is installed (``python -m changelake.jvm_deps install delta``; changelake/spark/session.py,
``delta_settings``): then the suite runs on delta-spark too, else those tests skip saying so. (A session
of the sink suite's own, started first in a test process, would have served every later test of that
process without the settings they need.)
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest

from changelake.connectors.delta_sink import Maintenance, TableSpec
from changelake.spark.delta_jars import missing as delta_jars_missing
from changelake.spark.delta_sink import delta_spark_missing, open_sink
from tests.jars import unavailable

#: delta-rs runs in-process (no JVM): the ``unit`` tier; delta-spark needs a Spark session.
#: ``delta-spark-frames``: delta-spark given each batch as a DataFrame (``apply_frame``: reduced and
#: merged on the executors, as the pipeline does with that engine) instead of a pyarrow.Table;
#: ``delta-rs-frames``: delta-rs given each batch as a DataFrame (reduced on Spark, the reduced rows
#: merged by delta-rs, as the pipeline does with ``storage.reduce_on: executors``).
ENGINES = (pytest.param("delta-rs", marks=pytest.mark.unit),
           pytest.param("delta-rs-frames", marks=pytest.mark.spark),
           pytest.param("delta-spark", marks=pytest.mark.spark),
           pytest.param("delta-spark-frames", marks=pytest.mark.spark))


def engine_fixture(engines) -> object:
    """The ``engine`` fixture over ``engines`` (a module may narrow the list by assigning its own)."""

    @pytest.fixture(params=engines)
    def engine(request) -> str:
        if request.param.startswith("delta-spark"):
            why = delta_jars_missing()
            if why:
                unavailable(f"delta-spark engine: {why}")
            missing = delta_spark_missing(request.getfixturevalue("spark"))
            if missing:     # the jars are installed, so a session without them is a failure, not a skip
                pytest.fail(f"delta-spark engine: {missing} in the tests' Spark session, although the "
                            "`delta` JVM set is installed")
        return request.param

    return engine


#: the default: delta-spark in its pipeline form for framed tables (``delta-spark-frames``); both
#: delta-spark forms share everything after the batch's reduction (the MERGEs, tombstones, schema
#: changes, truncates), the reduction of ``apply`` is the Arrow kernel delta-rs runs, and each case on
#: delta-spark costs ~10 s of CPU (Spark jobs per MERGE): the modules whose subject is how a batch's
#: values and nulls reach the MERGE (test_schema_positions.py, test_delta_sink_null_keys.py) and the
#: suites around the batch (:data:`AROUND_THE_BATCH`) run ``delta-spark`` (``apply``, an Arrow table) too
#: ``make test`` keeps the whole sink suite on delta-spark-frames out (about 9 minutes of Spark jobs on two
#: cores, most of the suite's time); delta-spark runs there through the suites around the batch, the
#: null-key and schema-position modules, and the pipeline tests (tests/integration/test_cross_engine.py,
#: test_crash_recovery.py, test_delta_spark_driver.py). ``make test-delta-spark`` (SUITE_ENV set) runs
#: the whole suite on it as well.
SUITE_ENV = "CHANGELAKE_TEST_DELTA_SPARK_SUITE"
DEFAULT_FORMS = tuple(p for p in ENGINES if p.values[0] != "delta-spark"
                      and (p.values[0] != "delta-spark-frames" or os.environ.get(SUITE_ENV)))
engine = engine_fixture(DEFAULT_FORMS)
#: the engines without delta-rs-frames, for the suites of what happens around a batch's reduction
#: (maintenance, many-batch properties): delta-rs-frames shares that code with delta-rs, and takes
#: seconds of Spark jobs per batch
AROUND_THE_BATCH = tuple(p for p in ENGINES if p.values[0] != "delta-rs-frames")


class FakeClock:
    """A settable UTC clock for tombstone timestamps and expiry."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_sink(request, engine, tmp_path, clock):
    """``make_sink(name="t", primary_key=("id",), pipeline_id="p", **spec_options)``.

    VACUUM runs only where a test asks for it (``maintenance=``: test_delta_maintenance.py): with
    delta-spark the first batch's VACUUM of the table and its tombstones is ~60 Spark jobs (over a
    minute on a loaded 2-core machine), and no other test looks at its effect."""

    def make(name: str = "t", *, primary_key: tuple[str, ...] = ("id",), pipeline_id: str = "p",
             path: str | None = None, **options):
        options.setdefault("maintenance", Maintenance(vacuum_every=None))
        spec = TableSpec(name=name, path=path or str(tmp_path / "lake" / name), primary_key=primary_key,
                         **options)
        if engine == "delta-rs":
            return open_sink(spec, pipeline_id=pipeline_id, engine=engine, clock=clock)
        spark = request.getfixturevalue("spark")
        sink = open_sink(spec, pipeline_id=pipeline_id, engine=engine.removesuffix("-frames"), spark=spark,
                         clock=clock)
        if engine.endswith("-frames"):
            sink.apply = _as_frame(sink, spark)
        return sink

    return make


def _as_frame(sink, spark):
    """``sink.apply(table, ...)`` through ``sink.apply_frame`` with the table as a DataFrame."""
    from pyspark.sql.pandas.types import from_arrow_schema

    def apply(changes, **kwargs):
        if any(k not in changes.column_names for k in sink.spec.primary_key):
            return type(sink).apply(sink, changes, **kwargs)     # a truncate alone, without the table's columns
        frame = spark.createDataFrame(changes, schema=from_arrow_schema(changes.schema, prefer_timestamp_ntz=True))
        return sink.apply_frame(frame, **kwargs)

    return apply
