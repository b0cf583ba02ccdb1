"""``SteadyProducer.stop``: what the generator drew is sent, so its database's state is what the topics hold."""

from __future__ import annotations

import time

import pytest

from changelake.service.inventory import InventoryDatabase, SteadyProducer, fold

pytestmark = pytest.mark.unit


def test_stop_sends_every_message_the_generator_drew():
    db = InventoryDatabase(seed=3)
    drawn = []

    def history():
        for m in db.history(snapshot_sizes={"customers": 5, "products": 5, "orders": 5}, changes=100_000):
            drawn.append(m)
            yield m

    # librdkafka's mock cluster in the producer's own process: nothing else to start
    producer = SteadyProducer(history(), "", rate=2_000, extra={"test.mock.num.brokers": 1}).start()
    time.sleep(0.5)
    producer.stop()
    sent = producer.wait(60)
    assert 0 < sent < 100_000 and sent == len(drawn)
    assert fold((m.topic, m.key, m.value) for m in drawn) == db.state
