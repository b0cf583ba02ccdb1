"""The pipeline's lease (changelake.service.lease), one row of its rule per test, on a local lake.

The same lease on S3 and between two real ``changelake run`` processes: tests/objstore/test_s3_pipeline.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from deltalake.exceptions import CommitFailedError

from changelake.service.lease import Lease, LeaseHeld, LeaseLost, lease_path

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _lease(path, clock, *, host=None, pid=None) -> Lease:
    lease = Lease(path, pipeline_id="p", ttl_s=60, clock=clock)
    if host is not None:
        lease.host = host
        lease.owner = f"{host}:{pid}:x"
    if pid is not None:
        lease.pid = pid
    return lease


@pytest.fixture
def path(tmp_path):
    return lease_path(str(tmp_path / "lake"), "p")


def test_a_second_instance_refuses_while_the_lease_is_held_and_starts_once_it_is_released(path):
    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=7)
    first.acquire()
    clock.now += 30
    with pytest.raises(LeaseHeld, match=r"already running.*pod-a.*30 s more"):
        second.acquire()
    first.check(0)                                   # the holder goes on
    first.release()
    second.acquire()
    second.check(1)


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_before_its_next_batch(path):
    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=8)
    first.acquire()
    clock.now += 61                                  # pod-a stalled: no renewal within the ttl
    second.acquire()
    with pytest.raises(LeaseLost, match=r"took the lease .* over: pod-b.*batch 5 was not written"):
        first.check(5)
    with pytest.raises(LeaseLost):
        first.renew()
    first.release()                                  # a fenced instance releases nothing
    second.check(5)


def test_renewals_keep_the_lease_and_a_stalled_holder_renews_before_it_writes(path):
    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=8)
    first.acquire()
    for _ in range(4):                               # 4 x 40 s > ttl, but renewed
        clock.now += 40
        first.check(0)                               # renews: its last renewal is older than ttl / 2
    with pytest.raises(LeaseHeld):
        second.acquire()


def test_a_holder_of_this_host_that_is_gone_is_taken_over_at_once(path):
    clock = Clock()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    crashed = _lease(path, clock, pid=int(dead))
    crashed.host = _lease(path, clock).host
    crashed.acquire()
    restarted = _lease(path, clock)                  # this process, same host: the holder's pid is gone
    restarted.acquire()
    restarted.check(0)
    with pytest.raises(LeaseHeld):                   # a live process of this host is not taken over
        _lease(path, clock, pid=os.getppid()).acquire()


def test_two_instances_taking_the_lease_at_the_same_version_one_wins(path):
    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=8)
    first._table()
    stale = second._table()                         # pod-b read the lease before pod-a took it
    first.acquire()
    with pytest.raises(CommitFailedError):          # the same log version: put-if-absent refuses pod-b's commit
        second._commit(stale, "take")
    with pytest.raises(LeaseHeld):
        second.acquire()


def _state() -> dict[str, float]:
    from changelake import metrics
    from changelake.service.lease import STATES

    return {s: metrics.REGISTRY.get_sample_value("changelake_lease_state", {"pipeline": "p", "state": s}) for s in STATES}


def test_the_lease_state_metric_follows_take_loss_and_release(path):
    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=8)
    first.acquire()
    assert _state() == {"held": 1, "renewal_failing": 0, "lost": 0}
    from changelake import metrics

    assert metrics.REGISTRY.get_sample_value("changelake_lease_renewed_timestamp_seconds") == clock.now
    clock.now += 61
    second.acquire()
    with pytest.raises(LeaseLost):
        first.check(1)
    assert _state()["lost"] == 1 and _state()["held"] == 0
    second.release()
    assert _state() == {"held": 0, "renewal_failing": 0, "lost": 0}


def test_a_store_failing_for_less_than_the_ttl_lets_batches_go_on_and_a_lost_reply_keeps_the_lease(path,
                                                                                                 monkeypatch):
    import changelake.service.lease as lease_module

    clock = Clock()
    first, second = _lease(path, clock, host="pod-a", pid=7), _lease(path, clock, host="pod-b", pid=8)
    first.acquire()
    real = lease_module.write_deltalake
    refused = []

    def store_down(*args, **kwargs):
        refused.append(1)
        raise OSError("Generic S3 error: Error performing PUT ... <Code>SlowDown</Code>")

    monkeypatch.setattr(lease_module, "write_deltalake", store_down)
    clock.now += 40                                  # a renewal is due (> ttl / 2) and fails
    first.check(1)                                   # within the ttl: the batch goes on
    clock.now += 15
    first.check(2)
    assert len(refused) == 2
    clock.now += 10                                  # 65 s since the last renewal: the lease may be taken over
    with pytest.raises(OSError, match="SlowDown"):
        first.check(3)

    def applied_but_reply_lost(*args, **kwargs):
        real(*args, **kwargs)
        raise OSError("Generic S3 error: error sending request")

    monkeypatch.setattr(lease_module, "write_deltalake", applied_but_reply_lost)
    clock.now = 1_800_000_000.0 + 50
    first.check(4)                                   # its renewal went in though the reply was lost
    monkeypatch.setattr(lease_module, "write_deltalake", real)
    first.check(5)                                   # its own commit: still held, not a takeover
    assert first.lost is None
    with pytest.raises(LeaseHeld):
        second.acquire()
