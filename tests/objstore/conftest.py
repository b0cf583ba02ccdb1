"""One moto S3 server per test session; a fresh bucket and a fault proxy per test."""

from __future__ import annotations

import itertools

import pytest

from .s3_server import FaultProxy, MotoS3

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra: pip install -e '.[test]')")
    server = MotoS3(tmp_path_factory.mktemp("moto")).start()
    yield server
    server.stop()


@pytest.fixture
def bucket(s3) -> str:
    return s3.bucket(f"lake-{next(_buckets)}")


@pytest.fixture
def proxy(s3):
    front = FaultProxy(s3.port)
    yield front
    front.stop()
