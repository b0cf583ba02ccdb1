"""What the Delta reads and writes get from ``storage.options`` (changelake.connectors.object_store), and what
``validate`` says of a checkpoint on an object store (changelake.spark.checkpoint.checkpoint_store_problem)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake.connectors.delta_read import read_delta
from changelake.connectors.object_store import arrow_filesystem, delta_options
from changelake.service.config import StorageSettings
from changelake.spark.checkpoint import checkpoint_store_problem

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("root, options, added", [
    ("s3://lake/x", {}, {"aws_conditional_put": "etag"}),
    ("s3a://lake/x", {"AWS_REGION": "eu-west-1"}, {"aws_conditional_put": "etag"}),
    ("/var/lake", {"AWS_ENDPOINT_URL": "http://minio:9000"}, {"aws_conditional_put": "etag"}),   # tables on S3 by path
    ("s3://lake/x", {"AWS_S3_LOCKING_PROVIDER": "dynamodb"}, {}),       # the user's DynamoDB lock
    ("s3://lake/x", {"AWS_CONDITIONAL_PUT": "disabled"}, {}),           # the user's choice, any case
    ("/var/lake", {}, {}),
    ("abfss://c@acct.dfs.core.windows.net/x", {"AZURE_STORAGE_ACCOUNT_NAME": "acct"}, {}),
])
def test_the_s3_commit_mode_is_added_only_where_the_user_chose_none(root, options, added):
    assert delta_options(options, [root]) == {**options, **added}
    plain = StorageSettings(root=root, options=options).plain_options()
    assert plain == {**options, **added}


def test_pyarrow_reaches_s3_with_the_storage_options_endpoint_and_credentials(s3, bucket):
    options = delta_options(s3.options(), [f"s3://{bucket}/t"])
    fs, path = arrow_filesystem(f"s3a://{bucket}/t", options)
    assert type(fs).__name__ == "S3FileSystem" and path == f"{bucket}/t"
    write_deltalake(f"s3://{bucket}/t", pa.table({"id": [1, 2]}), storage_options=options)
    assert read_delta(f"s3://{bucket}/t", storage_options=options).column("id").to_pylist() == [1, 2]


@pytest.mark.parametrize("checkpoint, problem", [
    ("/var/lib/changelake/checkpoints/p", None),
    ("file:///var/lib/changelake/checkpoints/p", None),
    ("s3://lake/_checkpoints/p", "write it as s3a://lake/_checkpoints/p"),
    ("s3a://lake/_checkpoints/p", "hadoop-aws-*.jar is in none of"),
    ("gs://lake/_checkpoints/p", "gcs-connector-*.jar is in none of"),
])
def test_an_object_store_checkpoint_needs_hadoops_connector_on_the_classpath(checkpoint, problem, monkeypatch):
    monkeypatch.delenv("SPARK_HOME", raising=False)      # pyspark's own jars: no connector among them
    found = checkpoint_store_problem(checkpoint)
    if problem is None:
        assert found is None
    else:
        assert problem in found and 'docs/operations.md, "Object storage"' in found


def test_a_connector_named_in_spark_jars_satisfies_the_check():
    assert checkpoint_store_problem("s3a://lake/cp", {"spark.jars": "/opt/jars/hadoop-aws-3.5.0.jar,/opt/b.jar"}) is None
