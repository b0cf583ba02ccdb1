"""The object-store options every Delta read and write of a pipeline gets (``storage.options``).

delta-rs takes the user's ``storage.options`` as they are (endpoint, region, credentials: see
docs/operations.md, "Object storage"); for S3 it adds one default, the commit mode, because two
writers must never both believe they wrote the same table version::

    S3 options given by the user                        added
    AWS_S3_LOCKING_PROVIDER (dynamodb)                  nothing: the user's DynamoDB lock serialises commits
    aws_conditional_put (any value)                     nothing: the user's choice
    neither, and the lake is on S3 (s3://, s3a://)     aws_conditional_put: etag -- a commit is a PUT with
      or an AWS_* option is given                         If-None-Match: *, which S3 (since 2024), MinIO,
                                                          Cloudflare R2 and moto honour

Keys are matched case-insensitively, as delta-rs does. Transient errors (HTTP 5xx, timeouts) are retried
by delta-rs's object store client with exponential backoff (10 tries within 3 minutes by default; the
options ``max_retries``, ``retry_timeout`` and ``backoff_config.*`` change that).

:func:`arrow_filesystem` opens the same store through pyarrow, with the same endpoint and credentials
(listing the tables under ``storage.root``, reading a checkpoint's files on S3).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CONDITIONAL_PUT", "HADOOP_CONNECTORS", "arrow_filesystem", "delta_options", "hadoop_connector_missing",
           "is_s3"]

#: The option naming S3's commit mode, and the value changelake defaults it to.
CONDITIONAL_PUT = ("aws_conditional_put", "etag")
LOCKING_PROVIDER = "aws_s3_locking_provider"


def is_s3(uri: str) -> bool:
    return uri.split("://", 1)[0].lower() in ("s3", "s3a") if "://" in uri else False


#: What delta-spark (Hadoop's file systems) needs to read and write an object-store URI, per scheme; none of it
#: is in pyspark's jars or the project's pinned JVM sets (jvm/pom.xml):
#:
#: ===========  ====================================================  =========================================
#: scheme       jars (Maven coordinates)                              note
#: ===========  ====================================================  =========================================
#: ``s3a``      ``org.apache.hadoop:hadoop-aws`` at pyspark's Hadoop   the AWS SDK bundle it depends on as well
#:              version, ``software.amazon.awssdk:bundle``
#: ``s3``       the same                                              and ``spark.hadoop.fs.s3.impl=
#:                                                                    org.apache.hadoop.fs.s3a.S3AFileSystem``
#: ``abfss``    ``org.apache.hadoop:hadoop-azure``
#: ``gs``       ``com.google.cloud.bigdataoss:gcs-connector`` (hadoop3)
#: ===========  ====================================================  =========================================
_HADOOP_AWS = "org.apache.hadoop:hadoop-aws (pyspark's Hadoop version) with software.amazon.awssdk:bundle"
HADOOP_CONNECTORS: dict[str, tuple[tuple[str, ...], str]] = {
    "s3a": (("hadoop-aws",), _HADOOP_AWS),
    "s3": (("hadoop-aws",), f"{_HADOOP_AWS}, and spark.hadoop.fs.s3.impl=org.apache.hadoop.fs.s3a.S3AFileSystem"),
    "abfss": (("hadoop-azure",), "org.apache.hadoop:hadoop-azure (pyspark's Hadoop version)"),
    "gs": (("gcs-connector",), "com.google.cloud.bigdataoss:gcs-connector (its hadoop3 build)"),
}


def hadoop_connector_missing(uri: str, jars: Iterable[str]) -> str | None:
    """Why delta-spark cannot open ``uri``: its scheme needs a Hadoop connector (:data:`HADOOP_CONNECTORS`) that no
    name in ``jars`` (jar file names or Maven coordinates on the classpath) is; None for a local path, another
    scheme, or a connector that is there."""
    scheme = uri.split("://", 1)[0].lower() if "://" in uri else ""
    if scheme not in HADOOP_CONNECTORS:
        return None
    names, install = HADOOP_CONNECTORS[scheme]
    if any(n in j for j in jars for n in names):
        return None
    return (f"{scheme}:// needs Hadoop's connector for it on Spark's classpath, which neither pyspark nor the project's "
            f"pinned JVM sets (jvm/pom.xml) carry: add {install} to spark.jars / spark-submit --jars (or to "
            "the image's Spark jars), or write this lake with storage.engine: delta-rs, which reaches the store itself")


def delta_options(options: Mapping[str, str], locations: Iterable[str] = ()) -> dict[str, str]:
    """``options`` with the S3 commit mode of the module docstring added where it applies."""
    out = dict(options)
    keys = {k.lower() for k in out}
    on_s3 = any(is_s3(u) for u in locations) or any(k.startswith("aws_") for k in keys)
    if on_s3 and LOCKING_PROVIDER not in keys and CONDITIONAL_PUT[0] not in keys:
        out[CONDITIONAL_PUT[0]] = CONDITIONAL_PUT[1]
    return out


def _option(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {k.lower(): v for k, v in options.items()}
    return next((lowered[n] for n in names if n in lowered), None)


def arrow_filesystem(uri: str, options: Mapping[str, str] | None = None) -> tuple[Any, str]:
    """(pyarrow filesystem, path in it) of ``uri``; on S3 with ``options``' endpoint, region and credentials
    (the environment's when the options name none, as delta-rs does)."""
    from pyarrow import fs as pafs

    if "://" not in uri:
        return pafs.LocalFileSystem(), str(Path(uri).absolute())
    scheme, rest = uri.split("://", 1)
    if scheme.lower() in ("s3a", "s3n"):
        uri, scheme = f"s3://{rest}", "s3"
    if scheme.lower() != "s3" or not options:
        return pafs.FileSystem.from_uri(uri)
    endpoint = _option(options, "aws_endpoint_url", "aws_endpoint", "endpoint", "aws_endpoint_url_s3")
    kwargs: dict[str, Any] = {}
    if endpoint:
        proto, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or proto, scheme=proto if host else "https")
    for key, names in (("region", ("aws_region", "region", "aws_default_region")),
                       ("access_key", ("aws_access_key_id", "access_key_id")),
                       ("secret_key", ("aws_secret_access_key", "secret_access_key")),
                       ("session_token", ("aws_session_token", "session_token"))):
        value = _option(options, *names)
        if value:
            kwargs[key] = value
    if not kwargs:
        return pafs.FileSystem.from_uri(uri)
    return pafs.S3FileSystem(**kwargs), rest


#: how long a commit is tried again while the object store fails it transiently (connectors.delta_sink, dead_letters)
STORE_RETRY_S = 300.0
#: what delta-rs's object-store errors say when the store (or the way to it) failed for a while
_TRANSIENT = re.compile(r"SlowDown|ServiceUnavailable|InternalError|RequestTimeout|Throttl|TooManyRequests|"
                        r"\b50[0-4]\b|\b429\b|timed? ?out|[Cc]onnection (refused|reset|closed)|error sending request|"
                        r"[Bb]roken pipe|dns error")


def is_transient_store_error(exc: BaseException) -> bool:
    """True for an object-store failure worth trying again (not a refused request: 403, 404, a conflict)."""
    return isinstance(exc, OSError) and bool(_TRANSIENT.search(str(exc)))


class StoreBrownout:
    """The pace of the tries at one commit while the store fails it transiently: 1 s doubling to 30 s, for
    up to ``limit_s`` since the first such failure (the table sinks and the dead-letter table alike)."""

    def __init__(self, limit_s: float = STORE_RETRY_S) -> None:
        self.limit_s = limit_s
        self._since: float | None = None
        self._next = 1.0

    def delay(self, exc: BaseException) -> float | None:
        """Seconds to wait before trying again after ``exc``; None: give up (not transient, or too long)."""
        if not is_transient_store_error(exc):
            return None
        now = time.monotonic()
        self._since = now if self._since is None else self._since
        if now - self._since >= self.limit_s:
            return None
        wait, self._next = self._next, min(self._next * 2, 30.0)
        return wait

    @staticmethod
    def sleep(seconds: float) -> None:
        """Wait ``seconds`` (a :meth:`delay`) before the next try. Tests replace this rather than
        :func:`time.sleep`, which every thread of the process shares (py4j's finalizer thread loops on it)."""
        time.sleep(seconds)
