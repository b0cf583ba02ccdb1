"""``changelake validate`` through the CLI: kafka.properties as librdkafka reads them, properties changelake
manages, secret files (YAML and environment), partition_by, credentials in the file, SQL errors beside other
errors, and one clear error per mistaken value; ``--json``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from changelake.service.cli import main
from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

HEAD = """pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka:
  bootstrap_servers: "localhost:9092"
  properties:
PROPS
sources: [{name: p, topics: [a.b.products], table: products, columns: {id: int, region: string}}]
tables: [{name: products, primary_key: [id]}]
"""


def write(tmp_path, props: str = "    client.id: me", text: str = HEAD):
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("PROPS", props))
    return str(path)


def validate(capsys, path: str, *flags: str) -> tuple[int, str, str]:
    rc = main(["validate", *flags, "-c", path])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_what_librdkafka_rejects_is_an_error_with_file_line_and_did_you_mean(tmp_path, capsys):
    path = write(tmp_path, "    sasl.mechansim: PLAIN\n    security.protocol: SASL_SSLL\n    socket.timeout.ms: 1\n"
                           "    enable.ssl.certificate.verification: ture")
    rc, _, err = validate(capsys, path)
    assert rc == 2 and "4 error(s)" in err
    assert (f"kafka.properties.sasl.mechansim: librdkafka has no property 'sasl.mechansim'; did you mean "
            f"'sasl.mechanism'? [{path}:5]") in err
    assert ("kafka.properties.security.protocol: librdkafka rejects it: Invalid value \"SASL_SSLL\" for "
            f"configuration property \"security.protocol\"; did you mean 'SASL_SSL'? [{path}:6]") in err
    assert "socket.timeout.ms\" value 1 is outside allowed range 10..300000" in err
    assert "enable.ssl.certificate.verification" in err and "true or false" in err


def test_properties_that_only_fail_together_are_a_warning_the_runtime_environment_can_answer(tmp_path, capsys):
    path = write(tmp_path, "    security.protocol: SASL_SSL\n    sasl.mechanism: PLAIN")
    rc, _, err = validate(capsys, path)
    assert rc == 0      # the pod's environment may hold the username and password
    assert (f"warning: kafka.properties: librdkafka would not start a client with these properties: sasl.username "
            f"and sasl.password must be set") in err and f"[{path}:4]" in err
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate", "-c", path], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "CHANGELAKE_KAFKA__PROPERTIES__SASL_USERNAME": "u",
                                         "CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD": "p"})
    assert out.returncode == 0 and "warning" not in out.stderr, out.stderr


def test_valid_properties_of_every_yaml_type_pass(tmp_path, capsys):
    path = write(tmp_path, "    security.protocol: sasl_ssl\n    sasl.mechanism: SCRAM-SHA-512\n"
                           "    sasl.username: me\n    sasl.password: ${PW}\n    fetch.max.bytes: 1048576\n"
                           "    enable.ssl.certificate.verification: false\n    client.id: changelake")
    assert main(["validate", "-c", path]) == 2        # ${PW} is not set
    assert "environment variable PW is not set" in capsys.readouterr().err
    config = parse_config(open(path).read(), environ={"PW": "s3cret"})
    assert config.kafka.plain_properties()["enable.ssl.certificate.verification"] == "false"
    assert config.kafka.plain_properties()["fetch.max.bytes"] == "1048576"


@pytest.mark.parametrize("prop, why", [
    ("group.id: mine", "changelake names its consumer group itself (changelake.<pipeline.id>)"),
    ("enable.auto.commit: true", "an automatic commit would mark records done before their rows are in Delta"),
    ("auto.offset.reset: latest", "sources[].starting_offsets"),
    ("isolation.level: read_uncommitted", "read_committed"),
])
def test_properties_changelake_manages_are_refused_saying_why(tmp_path, capsys, prop, why):
    rc, _, err = validate(capsys, write(tmp_path, "    " + prop))
    name = prop.split(":")[0]
    assert rc == 2 and f"kafka.properties.{name}: {name} is set by changelake, not by the pipeline file" in err
    assert why in err


def test_a_managed_property_from_the_environment_is_refused_naming_the_variable(tmp_path):
    path = write(tmp_path)
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate", "-c", path], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "CHANGELAKE_KAFKA__PROPERTIES__GROUP_ID": "x"})
    assert out.returncode == 2
    assert "kafka.properties.group.id: group.id is set by changelake" in out.stderr
    assert "[environment variable CHANGELAKE_KAFKA__PROPERTIES__GROUP_ID]" in out.stderr


@pytest.mark.parametrize("suffix", ["_file", "_FILE"])
def test_a_secret_file_key_reads_the_file_in_any_case(tmp_path, capsys, suffix):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    props = f"    security.protocol: SASL_SSL\n    sasl.mechanism: PLAIN\n    sasl.username: me\n" \
            f"    sasl.password{suffix}: {secret}"
    path = write(tmp_path, props)
    rc, out, err = validate(capsys, path)
    assert rc == 0, err
    assert "warning" not in err                     # read from a file: not a credential in the file
    plain = parse_config(open(path).read(), environ={}).kafka.plain_properties()
    assert plain["sasl.password"] == "s3cret" and not any(k.lower().endswith("_file") for k in plain)


def test_a_secret_file_named_by_the_environment_reads_the_file(tmp_path):
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    path = write(tmp_path, "    security.protocol: SASL_SSL\n    sasl.mechanism: PLAIN\n    sasl.username: me")
    env = {"CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD_FILE": str(secret),
           "CHANGELAKE_STORAGE__OPTIONS__AWS_SECRET_ACCESS_KEY_FILE": str(secret)}
    config = parse_config(open(path).read(), environ=env)
    assert config.kafka.plain_properties()["sasl.password"] == "s3cret"
    assert "sasl.password.file" not in config.kafka.properties
    assert config.storage.plain_options()["aws_secret_access_key"] == "s3cret"
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate", "-c", path], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 0, out.stderr
    env["CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD_FILE"] = str(tmp_path / "missing")
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate", "-c", path], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", **env})
    assert out.returncode == 2 and "cannot read secret file" in out.stderr and "missing" in out.stderr


def test_credentials_written_in_the_file_are_warnings_that_name_the_alternatives(tmp_path, capsys):
    text = HEAD + "storage: {root: /tmp/lake, options: {aws_secret_access_key: abc, aws_region: eu-west-1}}\n"
    path = write(tmp_path, "    security.protocol: SASL_SSL\n    sasl.mechanism: PLAIN\n    sasl.username: me\n"
                           "    sasl.password: hunter2", text)
    rc, out, err = validate(capsys, path)
    assert rc == 0 and "2 warning(s)" in out
    assert (f"warning: kafka.properties.sasl.password: a credential written in the file as plain text: set "
            f"CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD, or write 'sasl.password_file: /path/to/secret'") in err
    assert f"[{path}:8]" in err and "hunter2" not in err
    assert "storage.options.aws_secret_access_key" in err and "CHANGELAKE_STORAGE__OPTIONS__AWS_SECRET_ACCESS_KEY" in err
    assert "aws_region" not in err
    rc = main(["validate", "--json", "-c", path])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["ok"] is True and doc["errors"] == [] and len(doc["warnings"]) == 2
    assert (doc["sources"], doc["views"], doc["tables"]) == (1, 0, 1)


def test_validate_json_lists_errors_and_exits_non_zero(tmp_path, capsys):
    path = write(tmp_path, "    group.id: mine")
    rc = main(["validate", "--json", "-c", path])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and doc["ok"] is False and len(doc["errors"]) == 1 and "group.id" in doc["errors"][0]
    rc = main(["validate", "--json", "-c", str(tmp_path / "none.yaml")])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2 and "cannot read the pipeline file" in doc["errors"][0]


def test_partition_by_an_unknown_column_fails_at_validate(tmp_path, capsys):
    path = write(tmp_path, text=HEAD.replace("primary_key: [id]}", "primary_key: [id], partition_by: [regionn]}"))
    rc, _, err = validate(capsys, path)
    assert rc == 2 and ("tables.0.partition_by: table 'products': partition_by names ['regionn'], which source 'p' "
                        "does not give; did you mean 'region'?") in err
    graph = """pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [shop.orders], columns: {order_id: bigint, region: string, amount: double}, primary_key: [order_id]}
views:
  - {name: by_region, sql: "SELECT region, SUM(amount) AS total FROM orders GROUP BY region"}
tables: [{name: sales, from: by_region, primary_key: [region], partition_by: [regionn]}]
"""
    rc, _, err = validate(capsys, write(tmp_path, text=graph))
    assert rc == 2 and f"tables.0.partition_by: table 'sales': partition_by names ['regionn'], which 'by_region' " \
                       f"does not give; did you mean 'region'? (its columns: ['region', 'total'])" in err
    assert validate(capsys, write(tmp_path, text=graph.replace("[regionn]", "[region]")))[0] == 0


def test_a_sql_syntax_error_names_the_view_and_path_beside_other_errors(tmp_path, capsys):
    text = """pipeline: {id: "in v", checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources:
  - {name: orders, topics: [shop.orders], columns: {order_id: bigint, region: string}, primary_key: [order_id]}
views:
  - name: by_region
    sql: SELECT region FROM orders WHERE GROUP BY region
tables: [{name: sales, from: by_region, primary_key: [region]}]
"""
    rc, _, err = validate(capsys, write(tmp_path, text=text))
    assert rc == 2 and "pipeline.id" in err
    assert "views.0.sql: view 'by_region': cannot parse the query at line 1, column" in err
    assert f"[{tmp_path / 'p.yaml'}:7]" in err


def test_a_starting_timestamp_that_is_not_a_time_gives_one_error(tmp_path, capsys):
    path = write(tmp_path, text=HEAD.replace("table: products,", "table: products, starting_offsets: "
                                                                 "{timestamp: yesterday},"))
    rc, _, err = validate(capsys, path)
    assert rc == 2 and "1 error(s)" in err
    assert ("sources.0.starting_offsets: timestamp 'yesterday' is not a date and time; write ISO 8601, e.g. "
            "2026-11-01T00:00:00Z") in err
    path = write(tmp_path, text=HEAD.replace("table: products,", "table: products, starting_offsets: earlest,"))
    assert "'earlest' is not a starting position; did you mean 'earliest'?" in validate(capsys, path)[2]


@pytest.mark.parametrize("value, says", [("10", "10 is not a duration; write a number with a unit as text, e.g. "
                                                "'10 seconds'"),
                                         ("'10'", "'10' is not a duration; write e.g. '10 seconds'")])
def test_a_trigger_interval_without_a_unit_says_what_an_interval_looks_like(tmp_path, capsys, value, says):
    path = write(tmp_path, text=HEAD.replace("checkpoint: /tmp/ckpt}", f"checkpoint: /tmp/ckpt, trigger_interval: {value}}}"))
    rc, _, err = validate(capsys, path)
    assert rc == 2 and "1 error(s)" in err and f"pipeline.trigger_interval: {says}" in err
    assert "valid string" not in err


ENGINE_CONFIG = """pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
storage: {engine: ENGINE}
sources:
  - {name: o, topics: [a.b.orders], table: orders, columns: {id: bigint, COLUMN: double}}
  - name: shop
    topic_pattern: 'a\\\\.shop\\\\..*'
    route: [{source_table: 'shop\\\\.(.*)', table: '$1', primary_key: [id], columns: {id: bigint, "x=y": string}}]
views: [{name: per_id, from: o, group_by: [id], aggregates: {AGGREGATE: "count(*)"}}]
tables:
  - {name: orders, primary_key: [id], properties: PROPERTIES}
  - {name: counts, from: per_id, primary_key: [id]}
  - {name: orders_history, from: o, primary_key: [id], history: scd2}
"""


def test_what_delta_spark_refuses_fails_validate_with_engine_delta_spark_only(tmp_path, capsys):
    """Delta for Spark refuses a space or ',;{}()=' in a column name and a log retention shorter than the
    deleted files' (delta-rs writes both): with storage.engine delta-spark, validate names every such
    declared column (a mirror's, a route rule's, and once the sources are right, a view's output) and
    property, and the ways out; delta-rs and auto take the same file."""
    text = ENGINE_CONFIG.replace("COLUMN", '"unit price"').replace("AGGREGATE", "n")
    text = text.replace("PROPERTIES", "{delta.logRetentionDuration: interval 3 days}")
    rc, _, err = validate(capsys, write(tmp_path, text=text.replace("ENGINE", "delta-spark")))
    assert rc == 2 and "3 error(s)" in err, err
    assert ("tables.0.properties: table 'orders': the delta-spark engine refuses delta.logRetentionDuration "
            "(interval 3 days) shorter than delta.deletedFileRetentionDuration (interval 1 week)") in err
    assert ("sources.0.columns: table 'orders': the delta-spark engine cannot write the column(s) 'unit price': "
            "Delta Lake for Spark refuses a space") in err
    assert "or use storage.engine: delta-rs" in err
    assert "sources.1.route.0.columns: table '$1' (a route rule's): the delta-spark engine cannot write the " \
           "column(s) 'x=y'" in err
    assert "orders_history" not in err          # a history table is written with delta-rs whatever the engine

    text = ENGINE_CONFIG.replace("COLUMN", "unit_price").replace("AGGREGATE", '"n (all)"')
    text = text.replace('"x=y"', "x_y").replace("PROPERTIES", "{delta.logRetentionDuration: interval 3 days, "
                                                  "delta.deletedFileRetentionDuration: interval 48 hours}")
    rc, _, err = validate(capsys, write(tmp_path, text=text.replace("ENGINE", "delta-spark")))
    assert rc == 2 and "1 error(s)" in err, err
    assert "tables.1: table 'counts': the delta-spark engine cannot write the column(s) 'n (all)'" in err
    assert "in the view that names them" in err

    for engine in ("delta-rs", "auto"):
        rc, out, err = validate(capsys, write(tmp_path, text=ENGINE_CONFIG.replace("ENGINE", engine).replace(
            "COLUMN", '"unit price"').replace("AGGREGATE", '"n (all)"').replace(
            "PROPERTIES", "{delta.logRetentionDuration: interval 3 days}")))
        assert rc == 0, err


STORE_CONFIG = """pipeline: {id: inv, checkpoint: /tmp/ckpt, spark_conf: SPARK_CONF}
kafka: {bootstrap_servers: "localhost:9092"}
storage: {root: "ROOT", engine: ENGINE}
sources: [{name: p, topics: [a.b.products], table: products, columns: {id: int}},
          {name: o, topics: [a.b.other], table: other, columns: {id: int}}]
tables: [{name: products, primary_key: [id]}, {name: other, primary_key: [id], path: "TABLE_PATH"}]
"""


@pytest.mark.parametrize("root, connector", [("s3a://lake/cdc", "hadoop-aws"), ("s3://lake/cdc", "fs.s3.impl"),
                                             ("abfss://c@acct.dfs.core.windows.net/cdc", "hadoop-azure"),
                                             ("gs://lake/cdc", "gcs-connector")])
def test_delta_spark_on_an_object_store_without_its_hadoop_connector_fails_validate(tmp_path, capsys, root, connector):
    """No pinned JVM set carries Hadoop's object-store connectors: delta-spark on such a lake would fail at the first
    batch with "No FileSystem for scheme"; validate says so for every location on it, with the jars to add and the
    delta-rs way out. Naming the connector in pipeline.spark_conf's spark.jars (or .packages) passes; delta-rs and
    a local lake pass."""
    text = STORE_CONFIG.replace("ROOT", root).replace("TABLE_PATH", root + "/elsewhere")
    delta_spark = text.replace("ENGINE", "delta-spark").replace("SPARK_CONF", "{}")
    rc, _, err = validate(capsys, write(tmp_path, text=delta_spark))
    assert rc == 2 and "2 error(s)" in err, err
    scheme = root.split(":")[0]
    assert f"storage.root: storage.engine: delta-spark cannot write {root}: {scheme}:// needs Hadoop's connector" in err
    assert f"tables.1.path: storage.engine: delta-spark cannot write {root}/elsewhere" in err
    assert connector in err and "storage.engine: delta-rs" in err

    jar = {"s3a": "hadoop-aws-3.5.0.jar", "s3": "/opt/jars/hadoop-aws-3.5.0.jar", "abfss": "hadoop-azure-3.5.0.jar",
           "gs": "gcs-connector-hadoop3-2.2.26-shaded.jar"}[scheme]
    for engine, conf in (("delta-spark", f'{{spark.jars: "x.jar,{jar}"}}'), ("delta-rs", "{}"), ("auto", "{}")):
        rc, _, err = validate(capsys, write(tmp_path, text=text.replace("ENGINE", engine).replace("SPARK_CONF", conf)))
        assert rc == 0, (engine, err)
    local = STORE_CONFIG.replace("ROOT", str(tmp_path / "lake")).replace("TABLE_PATH", str(tmp_path / "t"))
    local = local.replace("ENGINE", "delta-spark").replace("SPARK_CONF", "{}")
    rc, _, err = validate(capsys, write(tmp_path, text=local))
    assert rc == 0, err
