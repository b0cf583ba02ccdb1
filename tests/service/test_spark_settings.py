"""Which Spark settings take effect: the launcher's, then the pipeline YAML's, then code defaults."""

from __future__ import annotations

import pytest

from changelake.spark import delta_jars
from changelake.spark.session import (
    DEFAULTS,
    delta_settings,
    launcher_settings,
    master_cores,
    read_spark_defaults,
    session_settings,
    submit_args_settings,
)

pytestmark = pytest.mark.unit


def test_code_defaults_apply_only_where_nothing_was_set():
    s = session_settings(master=None, conf=None, launcher={})
    assert s.master == "local[2]"
    assert s.conf["spark.driver.memory"] == DEFAULTS["spark.driver.memory"]
    assert s.conf["spark.sql.shuffle.partitions"] == "2"        # one per core of local[2]
    assert not s.overridden


def test_the_pipeline_beats_code_defaults():
    s = session_settings(master="local[4]", conf={"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8"},
                         launcher={})
    assert s.master == "local[4]"
    assert s.conf["spark.driver.memory"] == "4g" and s.conf["spark.sql.shuffle.partitions"] == "8"


def test_the_launcher_beats_the_pipeline_and_code_defaults():
    # spark-submit --master local-cluster[2,1,1024] --conf spark.driver.memory=3g: the session gets
    # neither the YAML's values nor the code's defaults for those keys, and the override is reported
    launcher = {"spark.master": "local-cluster[2,1,1024]", "spark.driver.memory": "3g"}
    s = session_settings(master="local[4]", conf={"spark.driver.memory": "4g", "spark.executor.cores": "1"},
                         launcher=launcher)
    assert s.master == "local-cluster[2,1,1024]"
    assert "spark.driver.memory" not in s.conf and "spark.master" not in s.conf    # the launcher's stand
    assert s.conf["spark.executor.cores"] == "1"                                   # YAML keys it left alone
    assert s.overridden == {"spark.master": ("local[4]", "local-cluster[2,1,1024]"),
                            "spark.driver.memory": ("4g", "3g")}
    assert s.conf["spark.sql.shuffle.partitions"] == "2"        # 2 executors x 1 core


def test_the_launchers_shuffle_partitions_are_not_replaced():
    s = session_settings(master=None, conf=None, launcher={"spark.master": "k8s://https://api:6443",
                                                             "spark.sql.shuffle.partitions": "64"})
    assert s.master == "k8s://https://api:6443" and "spark.sql.shuffle.partitions" not in s.conf


def test_statefulset_spark_defaults_reach_the_session(tmp_path):
    # what the chart's ConfigMap renders for statefulset-values.yaml (spark.master local[4], 4g, 8 partitions)
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.driver.memory 4g\nspark.executor.pyspark.memory 1g\n# a comment\n"
        "spark.master local[4]\nspark.sql.shuffle.partitions=8\n")
    launcher = launcher_settings({"SPARK_CONF_DIR": str(tmp_path), "SPARK_DRIVER_MEMORY": "9g"})
    assert launcher == {"spark.driver.memory": "4g", "spark.executor.pyspark.memory": "1g",
                        "spark.master": "local[4]", "spark.sql.shuffle.partitions": "8"}
    s = session_settings(master=None, conf={}, launcher=launcher)
    assert s.master == "local[4]"
    assert not {"spark.driver.memory", "spark.sql.shuffle.partitions"} & set(s.conf)


def test_the_environment_counts_as_the_launcher(tmp_path):
    launcher = launcher_settings({"SPARK_CONF_DIR": str(tmp_path),       # no spark-defaults.conf there
                                  "SPARK_DRIVER_MEMORY": "5g",
                                  "PYSPARK_SUBMIT_ARGS": "--master local[3] --conf spark.a=1 --conf=spark.b=x=y "
                                                         "--verbose pyspark-shell"})
    assert launcher == {"spark.master": "local[3]", "spark.a": "1", "spark.b": "x=y", "spark.driver.memory": "5g"}
    assert session_settings(master="local[2]", conf=None, launcher=launcher).master == "local[3]"


def test_spark_defaults_format(tmp_path):
    f = tmp_path / "spark-defaults.conf"
    f.write_text("  spark.a   1 2\n!x y\nspark.b=2\nspark.c:3\nspark.d\n")
    assert read_spark_defaults(f) == {"spark.a": "1 2", "spark.b": "2", "spark.c": "3", "spark.d": ""}
    assert read_spark_defaults(tmp_path / "absent.conf") == {}
    assert submit_args_settings("--driver-memory=6g --num-executors 3") == {
        "spark.driver.memory": "6g", "spark.executor.instances": "3"}


def test_master_cores():
    assert [master_cores(m) for m in ("local", "local[3]", "local[4,2]", "local-cluster[2,1,1024]", "yarn")] == \
        [1, 3, 4, 2, None]


EXTENSION = ("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
CATALOG = ("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")


def test_the_delta_set_goes_into_spark_jars_after_the_users_with_delta_extension_and_catalog(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(delta_jars, "spark_home_jars", lambda: [])
    monkeypatch.setattr(delta_jars, "session_jars", lambda: ["/j/delta-spark_4.2_2.13-4.4.0.jar", "/j/ds.jar"])
    for engine in ("auto", "delta-spark"):
        got = delta_settings(engine, {"spark.jars": "/u/a.jar"}, {"spark.jars": "/u/b.jar"}, "local[2]")
        assert got["spark.jars"] == "/u/a.jar,/u/b.jar,/j/delta-spark_4.2_2.13-4.4.0.jar,/j/ds.jar"
        assert dict([EXTENSION, CATALOG]).items() <= got.items()
        assert got["spark.databricks.delta.snapshotPartitions"] == "2"
    assert delta_settings("delta-rs", {}, {}, "local[2]") == {}
    on_cluster = delta_settings("delta-spark", {}, {}, "k8s://https://api:6443")
    assert "spark.databricks.delta.snapshotPartitions" not in on_cluster
    # the launcher's or the pipeline's own extension settings are left alone
    assert EXTENSION[0] not in delta_settings("auto", {EXTENSION[0]: "x.Ext"}, {}, "local[2]")


def test_no_delta_jars_no_delta_settings(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(delta_jars, "spark_home_jars", lambda: [])
    monkeypatch.setattr(delta_jars, "session_jars", lambda: [])
    assert delta_settings("auto", {}, {}, "local[2]") == {}


def test_jars_in_sparks_own_directory_need_only_the_extension(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(delta_jars, "spark_home_jars", lambda: ["/opt/spark/jars/delta-spark_2.13-4.4.0.jar"])
    monkeypatch.setattr(delta_jars, "session_jars", lambda: [])
    got = delta_settings("delta-spark", {}, {}, "spark://m:7077")
    assert "spark.jars" not in got and dict([EXTENSION, CATALOG]) == got
