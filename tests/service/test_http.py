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


def test_livez_fails_for_a_query_that_made_no_progress_while_records_wait():
    health = Health(max_silence_s=60, stalled_after_s=300)
    endpoint = HttpEndpoint(health, host="127.0.0.1", port=0).start()
    waiting = {"sources": [{"latestOffset": '{"t": {"0": 900}}', "endOffset": '{"t": {"0": 400}}'}]}
    caught_up = {"sources": [{"latestOffset": '{"t": {"0": 900}}', "endOffset": '{"t": {"0": 900}}'}]}
    try:
        assert _get(endpoint.url("/livez"))[0] == 200              # no query yet: the startup probe's business
        health.query_active = lambda: True
        assert _get(endpoint.url("/livez"))[0] == 200              # starting, within stalled_after
        health.started_at -= 3600                                   # an hour without a first batch
        status, body = _get(endpoint.url("/livez"))
        assert status == 503 and "stalled" in body
        health.batch_finished(waiting)
        assert _get(endpoint.url("/livez"))[0] == 200
        health.last_batch_at -= 301                                 # no batch since, 500 records wait
        status, body = _get(endpoint.url("/livez"))
        assert status == 503 and "500 records wait in Kafka" in body and "metrics.stalled_after 300s" in body
        health.batch_finished(caught_up)
        health.last_batch_at -= 3600                                # nothing waiting: idle, not stalled
        assert _get(endpoint.url("/livez")) == (200, "ok (idle)\n")
        health.trigger_active = lambda: True                        # ... unless a batch hangs
        assert _get(endpoint.url("/livez"))[0] == 503
        assert _get(endpoint.url("/healthz"))[0] == 200             # the process itself still answers
    finally:
        endpoint.stop()


def test_livez_lets_a_long_first_batch_run_while_its_work_moves_and_fails_once_it_hangs():
    # A first catch-up batch longer than metrics.stalled_after: no batch has finished for an hour, but its
    # stages keep reading records, so the pod must not be restarted (a restart would start that batch over).
    health = Health(max_silence_s=60, stalled_after_s=300)
    health.query_active = lambda: True
    health.trigger_active = lambda: True
    health.started_at -= 3600
    work = [("stage 3", 0)]
    health.work = lambda: work[0]
    endpoint = HttpEndpoint(health, host="127.0.0.1", port=0).start()
    try:
        health.sample_work()                                        # the first look: no evidence either way
        assert _get(endpoint.url("/livez"))[0] == 503
        work[0] = ("stage 3", 120_000)                              # records read since
        health.sample_work()
        status, body = _get(endpoint.url("/livez"))
        assert status == 200 and "a batch is running" in body and "no batch finished for 3600s" in body
        health.last_work_at -= 200                                  # the same work for 200 s: still within 300 s
        health.sample_work()
        assert _get(endpoint.url("/livez"))[0] == 200
        health.last_work_at -= 101                                  # ... and for 301 s: hung
        status, body = _get(endpoint.url("/livez"))
        assert status == 503 and "no running one has read or written a record for 301s" in body
        work[0] = None                                              # the store cannot be read: not progress
        health.sample_work()
        assert _get(endpoint.url("/livez"))[0] == 503
        work[0] = ("stage 4", 0)                                    # the next stage started: progress
        health.sample_work()
        assert _get(endpoint.url("/livez"))[0] == 200
        health.last_work_at -= 3600
        health.batch_finished({"sources": []})                      # a finished batch counts as before
        assert _get(endpoint.url("/livez")) == (200, "ok\n")
    finally:
        endpoint.stop()
