"""Opening the sink: specs, engine selection, tombstone placement."""

from __future__ import annotations

import pytest

from changelake.connectors.delta_sink import TableSpec
from changelake.spark.delta_sink import delta_spark_missing, open_sink
from changelake.connectors.delta_sink_schema import default_tombstone_path
from changelake.errors import ConfigError, SinkCommitError


@pytest.mark.unit
@pytest.mark.parametrize("path, expected", [
    ("/data/lake/orders", "/data/lake/_changelake_tombstones/orders"),
    ("s3://bucket/warehouse/orders/", "s3://bucket/warehouse/_changelake_tombstones/orders"),
    ("abfss://c@acct.dfs.core.windows.net/db/t", "abfss://c@acct.dfs.core.windows.net/db/_changelake_tombstones/t"),
])
def test_default_tombstone_table_sits_next_to_the_table(path, expected):
    assert default_tombstone_path(path) == expected


@pytest.mark.unit
def test_table_at_a_bucket_root_needs_an_explicit_tombstone_path():
    with pytest.raises(SinkCommitError, match="set TableSpec.tombstone_path"):
        _ = TableSpec(name="t", path="s3://bucket", primary_key=("id",)).resolved_tombstone_path
    spec = TableSpec(name="t", path="s3://bucket", primary_key=("id",), tombstone_path="s3://other/tombs/t")
    assert spec.resolved_tombstone_path == "s3://other/tombs/t"


@pytest.mark.unit
@pytest.mark.parametrize("options, message", [
    ({"primary_key": ()}, "non-empty tuple"),
    ({"primary_key": "id"}, "non-empty tuple"),
    ({"primary_key": ("_seq",)}, "reserved"),
    ({"primary_key": ("id",), "partition_by": ("_db",)}, "reserved"),
])
def test_invalid_specs_are_rejected(options, message):
    with pytest.raises(ConfigError, match=message):
        TableSpec(name="t", path="/tmp/t", **options)


@pytest.mark.unit
def test_unknown_engine_and_missing_pipeline_id_are_config_errors(tmp_path):
    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("id",))
    with pytest.raises(ConfigError, match="unknown sink engine"):
        open_sink(spec, pipeline_id="p", engine="duckdb")
    with pytest.raises(ConfigError, match="pipeline_id"):
        open_sink(spec, pipeline_id="", engine="delta-rs")


@pytest.mark.unit
def test_delta_spark_without_a_session_says_what_is_missing(tmp_path):
    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("id",))
    with pytest.raises(ConfigError, match="no Spark session was given.*engine delta-rs"):
        open_sink(spec, pipeline_id="p", engine="delta-spark")
    assert open_sink(spec, pipeline_id="p").engine == "delta-rs"


@pytest.mark.spark
def test_auto_writes_with_delta_rs_on_a_local_master_and_delta_spark_is_there_on_request(spark, tmp_path):
    spec = TableSpec(name="t", path=str(tmp_path / "t"), primary_key=("id",))
    assert spark.sparkContext.master.startswith("local")
    assert open_sink(spec, pipeline_id="p", engine="auto", spark=spark).engine == "delta-rs"
    missing = delta_spark_missing(spark)
    if missing:      # the `delta` JVM set is not installed: the error says how to install it
        with pytest.raises(ConfigError, match="delta-spark is not available.*changelake.jvm_deps install delta"):
            open_sink(spec, pipeline_id="p", engine="delta-spark", spark=spark)
    else:
        assert open_sink(spec, pipeline_id="p", engine="delta-spark", spark=spark).engine == "delta-spark"


@pytest.mark.unit
def test_specs_from_config_lists_are_normalised_and_hashable():
    spec = TableSpec(name="t", path="/tmp/t", primary_key=["a", "b"], partition_by=["p"],
                     storage_options={"AWS_REGION": "eu-west-1"})
    assert (spec.primary_key, spec.partition_by) == (("a", "b"), ("p",))
    same = TableSpec(name="t", path="/tmp/t", primary_key=("a", "b"), partition_by=("p",),
                     storage_options={"AWS_REGION": "eu-west-1"})
    assert {spec: 1}[same] == 1
    with pytest.raises(TypeError):
        spec.storage_options["AWS_REGION"] = "us-east-1"
