"""The broker metrics of the driver's watching Kafka client (changelake.service.broker_watch), from librdkafka's
statistics as it writes them. The same against a real 3-node cluster whose broker is killed and restarted:
tests/integration/test_broker_faults.py."""

from __future__ import annotations

import json

import pytest

from changelake import metrics
from changelake.service.broker_watch import BrokerWatch

pytestmark = pytest.mark.unit


def _stats(**brokers: tuple[str, int, int]) -> str:
    out = {"brokers": {"h:1/bootstrap": {"name": "h:1/bootstrap", "nodeid": -1, "state": "INIT", "connects": 1,
                                         "disconnects": 1}}}
    for i, (name, (state, connects, disconnects)) in enumerate(brokers.items()):
        out["brokers"][name] = {"name": name, "nodeid": i + 1, "state": state, "connects": connects,
                                "disconnects": disconnects}
    return json.dumps(out)


def _sample(name: str, broker: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"broker": broker})


def test_a_broker_that_goes_away_and_comes_back_counts_one_disconnect_and_one_reconnect(caplog):
    watch = BrokerWatch("h:1")
    a, b = "watch-a:9092/1", "watch-b:9092/2"
    watch.on_stats(_stats(**{a: ("UP", 1, 0), b: ("UP", 1, 0)}))
    assert _sample("changelake_broker_connected", a) == 1
    assert _sample("changelake_broker_disconnects_total", a) == 0
    assert _sample("changelake_broker_reconnects_total", a) == 0
    assert _sample("changelake_broker_connected", "h:1/bootstrap") is None     # bootstrap entries left out
    watch.on_stats(_stats(**{a: ("TRY_CONNECT", 1, 1), b: ("UP", 1, 0)}))
    assert _sample("changelake_broker_connected", a) == 0
    assert _sample("changelake_broker_disconnects_total", a) == 1
    assert "broker watch-a:9092/1: not connected" in caplog.text
    for attempts in range(2, 5):                    # failed attempts while it is down: no reconnect, nothing twice
        watch.on_stats(_stats(**{a: ("CONNECT", attempts, 1), b: ("UP", 1, 0)}))
    assert _sample("changelake_broker_reconnects_total", a) == 0
    watch.on_stats(_stats(**{a: ("UP", 5, 1), b: ("UP", 1, 0)}))
    watch.on_stats(_stats(**{a: ("UP", 5, 1), b: ("UP", 1, 0)}))
    assert _sample("changelake_broker_connected", a) == 1
    assert _sample("changelake_broker_disconnects_total", a) == 1
    assert _sample("changelake_broker_reconnects_total", a) == 1
    assert _sample("changelake_broker_reconnects_total", b) == 0
    assert "broker watch-a:9092/1: connected again" in caplog.text
