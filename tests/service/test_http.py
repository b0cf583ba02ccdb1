from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from changelake import metrics
from changelake.service.http import Health, HttpEndpoint

pytestmark = pytest.mark.unit


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_health_readiness_and_metrics():
    health = Health(max_silence_s=60)
    endpoint = HttpEndpoint(health, host="127.0.0.1", port=0).start()
    try:
        assert _get(endpoint.url("/healthz")) == (200, "ok\n")
        status, body = _get(endpoint.url("/readyz"))
        assert status == 503 and "not running" in body
        health.query_active = lambda: True
        status, body = _get(endpoint.url("/readyz"))
        assert status == 503 and "no micro-batch has finished yet" in body
        health.batch_finished()
        assert _get(endpoint.url("/readyz"))[0] == 200
        health.last_batch_at = health.started_at - 3600     # an hour without a finished batch
        status, body = _get(endpoint.url("/readyz"))
        assert status == 503 and "last micro-batch finished" in body
        metrics.ROWS_OUT.labels("http_test", "+I").inc(3)
        status, body = _get(endpoint.url("/metrics"))
        assert status == 200
        assert 'changelake_rows_out_total{kind="+I",table="http_test"} 3.0' in body
        assert _get(endpoint.url("/nope"))[0] == 404
    finally:
        endpoint.stop()
