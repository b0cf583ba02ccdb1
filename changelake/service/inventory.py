"""A simulated inventory database (customers, products, orders) that writes its
change history to Kafka as a MySQL Debezium connector would (JSON converter,
schemas disabled).

The history has a snapshot (op ``r``), inserts, updates, deletes followed by
Kafka tombstones, and a block of re-delivered messages (as after a connector
restart), with keys spread over the topic's partitions. The simulator keeps the
database's final state, which is what the Delta tables must equal.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import orjson

SERVER = "dbserver1"
DATABASE = "inventory"
BINLOG_FILE = "mysql-bin.000003"

TABLES: dict[str, dict[str, Any]] = {
    "customers": {"key": "id", "columns": {"id": "bigint", "first_name": "string", "last_name": "string",
                                           "email": "string"}},
    "products": {"key": "id", "columns": {"id": "bigint", "name": "string", "description": "string",
                                          "category": "string", "weight": "double", "price": "double"}},
    "orders": {"key": "order_id", "columns": {"order_id": "bigint", "order_date": "date", "purchaser": "bigint",
                                              "quantity": "int", "product_id": "bigint"}},
}

_FIRST = ["Sally", "George", "Edward", "Anne", "Ines", "Kenji", "Olu", "Maya", "Tomas", "Priya"]
_LAST = ["Thomas", "Bailey", "Walker", "Kretchmar", "Garcia", "Sato", "Adeyemi", "Cohen", "Novak", "Iyer"]
_CATEGORIES = ["tools", "garden", "kitchen", "toys", "sports", "office", "auto", "outdoor"]
_ITEMS = ["scooter", "car battery", "drill bits", "hammer", "rocks", "jacket", "spare tire", "lamp", "kettle"]


def topic_for(table: str) -> str:
    return f"{SERVER}.{DATABASE}.{table}"


@dataclass
class Message:
    topic: str
    key: bytes
    value: bytes | None


_FACTORY = {"customers": "_customer", "products": "_product", "orders": "_order"}


@dataclass
class InventoryDatabase:
    seed: int = 7
    state: dict[str, dict[int, dict[str, Any]]] = field(default_factory=lambda: {t: {} for t in TABLES})
    counts: dict[str, dict[str, int]] = field(default_factory=lambda: {t: {"c": 0, "r": 0, "u": 0, "d": 0}
                                                                       for t in TABLES})
    _pos: int = 154
    _ts_ms: int = 1_700_000_000_000

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._next_id = {t: 1 for t in TABLES}

    # --- row factories -------------------------------------------------------
    def _customer(self, i: int) -> dict[str, Any]:
        first, last = self.rng.choice(_FIRST), self.rng.choice(_LAST)
        return {"id": i, "first_name": first, "last_name": last,
                "email": f"{first.lower()}.{last.lower()}{i}@example.com"}

    def _product(self, i: int) -> dict[str, Any]:
        item = self.rng.choice(_ITEMS)
        return {"id": i, "name": item, "description": f"{item} model {self.rng.randint(1, 999)}",
                "category": self.rng.choice(_CATEGORIES), "weight": round(self.rng.uniform(0.1, 40), 3),
                "price": round(self.rng.uniform(1, 500), 2)}

    def _order(self, i: int) -> dict[str, Any]:
        return {"order_id": i, "order_date": 19_000 + self.rng.randint(0, 700),   # days since epoch
                "purchaser": self.rng.choice(list(self.state["customers"]) or [1]),
                "quantity": self.rng.randint(1, 10),
                "product_id": self.rng.choice(list(self.state["products"]) or [1])}

    def _new_row(self, table: str) -> dict[str, Any]:
        i = self._next_id[table]
        self._next_id[table] += 1
        return getattr(self, _FACTORY[table])(i)

    def _changed(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        new = dict(row)
        if table == "customers":
            new["email"] = f"{new['first_name'].lower()}.{self.rng.randint(1, 10**6)}@example.org"
        elif table == "products":
            new["price"] = round(self.rng.uniform(1, 500), 2)
            if self.rng.random() < 0.3:
                new["category"] = self.rng.choice(_CATEGORIES)
        else:
            new["quantity"] = self.rng.randint(1, 10)
        return new

    # --- Debezium encoding ---------------------------------------------------
    def _envelope(self, table: str, op: str, before: dict | None, after: dict | None, snapshot: bool) -> Message:
        self._pos += self.rng.randint(100, 400)
        self._ts_ms += self.rng.randint(1, 50)
        key_col = TABLES[table]["key"]
        row = after if after is not None else before
        assert row is not None
        payload = {
            "before": before, "after": after,
            "source": {"version": "2.7.0.Final", "connector": "mysql", "name": SERVER, "ts_ms": self._ts_ms,
                       "snapshot": "true" if snapshot else "false", "db": DATABASE, "table": table,
                       "server_id": 223344, "gtid": None, "file": BINLOG_FILE, "pos": self._pos, "row": 0,
                       "thread": None, "query": None},
            "op": op, "ts_ms": self._ts_ms + 3, "transaction": None,
        }
        self.counts[table][op] += 1
        return Message(topic_for(table), orjson.dumps({key_col: row[key_col]}), orjson.dumps(payload))

    # --- history ---------------------------------------------------------------
    def snapshot(self, sizes: dict[str, int]) -> Iterator[Message]:
        for table in ("customers", "products", "orders"):
            for _ in range(sizes.get(table, 0)):
                row = self._new_row(table)
                self.state[table][row[TABLES[table]["key"]]] = row
                yield self._envelope(table, "r", None, row, snapshot=True)

    def change(self, *, delete_ratio: float = 0.1, insert_ratio: float = 0.1,
               tables: tuple[str, ...] = ("customers", "products", "orders")) -> Iterator[Message]:
        """One random change (two messages for a delete: the event and its tombstone)."""
        table = self.rng.choice(tables)
        live = self.state[table]
        r = self.rng.random()
        key_col = TABLES[table]["key"]
        if not live or r < insert_ratio:
            row = self._new_row(table)
            live[row[key_col]] = row
            yield self._envelope(table, "c", None, row, snapshot=False)
        elif r < insert_ratio + delete_ratio:
            key = self.rng.choice(list(live))
            row = live.pop(key)
            yield self._envelope(table, "d", row, None, snapshot=False)
            yield Message(topic_for(table), orjson.dumps({key_col: key}), None)
        else:
            key = self.rng.choice(list(live))
            before = live[key]
            after = self._changed(table, before)
            live[key] = after
            yield self._envelope(table, "u", before, after, snapshot=False)

    def history(self, *, snapshot_sizes: dict[str, int], changes: int, redeliver: int = 0) -> Iterator[Message]:
        """Snapshot, then ``changes`` changes; the last ``redeliver`` messages before the end are sent twice."""
        yield from self.snapshot(snapshot_sizes)
        recent: list[Message] = []
        for i in range(changes):
            for msg in self.change():
                yield msg
                if redeliver and i >= changes // 2:
                    recent.append(msg)
                    if len(recent) > redeliver:
                        recent.pop(0)
            if redeliver and i == changes * 3 // 4:
                # A connector restart re-sends what it had not committed, in the original order.
                yield from list(recent)
                recent.clear()
                redeliver = 0


def produce(messages: Iterator[Message], bootstrap_servers: str, *,
            on_progress: Callable[[int], None] | None = None, extra: dict[str, Any] | None = None) -> int:
    """Write messages keyed by their Debezium key; returns how many were sent."""
    from confluent_kafka import Producer

    conf = {"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "batch.num.messages": 10_000,
            "compression.type": "zstd", "enable.idempotence": True, "log_level": 3,
            "queue.buffering.max.messages": 500_000}
    conf.update(extra or {})
    producer = Producer(conf)
    failed: list[str] = []

    def delivered(err, _msg) -> None:
        if err is not None:
            failed.append(str(err))

    n = 0
    for m in messages:
        while True:
            try:
                producer.produce(m.topic, key=m.key, value=m.value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            producer.poll(0)
            if on_progress:
                on_progress(n)
    remaining = producer.flush(60)
    if remaining or failed:
        raise RuntimeError(f"{remaining + len(failed)} messages were not acknowledged by the broker at "
                           f"{bootstrap_servers}" + (f" (first error: {failed[0]})" if failed else ""))
    return n


class SteadyProducer:
    """Writes ``messages`` at about ``rate`` messages/s from a thread, as a live database's connector would:
    idempotent and ``acks=all``, waiting out broker faults (a message may wait ``timeout_s`` for a leader).
    :meth:`wait` raises what the producer could not deliver; ``sent`` counts what was handed to the client."""

    def __init__(self, messages: Iterable[Message], bootstrap_servers: str, *, rate: float,
                 timeout_s: float = 300.0, extra: dict[str, Any] | None = None) -> None:
        import threading

        self._messages = iter(messages)
        self.rate = rate
        self.sent = 0
        self.conf = {"bootstrap.servers": bootstrap_servers, "linger.ms": 20, "enable.idempotence": True,
                     "acks": "all", "message.timeout.ms": int(timeout_s * 1000), "log_level": 0,
                     "queue.buffering.max.messages": 1_000_000, **(extra or {})}
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def start(self) -> "SteadyProducer":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop producing before the next message is drawn from ``messages`` (what was drawn is still sent and
        delivered by :meth:`wait`)."""
        self._stop.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def _run(self) -> None:
        import time

        from confluent_kafka import Producer

        failed: list[str] = []
        producer = Producer(self.conf)
        started = time.monotonic()
        try:
            # stop is checked before the next message is drawn: a drawn message changed the generator's
            # database (its final state, what the tables are compared with), so it is always sent
            while not self._stop.is_set():
                m = next(self._messages, None)
                if m is None:
                    break
                ahead = self.sent / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    producer.poll(min(ahead, 0.5))
                    if ahead > 0.5:
                        time.sleep(ahead - 0.5)
                while True:
                    try:
                        producer.produce(m.topic, key=m.key, value=m.value,
                                         on_delivery=lambda err, _m: failed.append(str(err)) if err else None)
                        break
                    except BufferError:
                        producer.poll(0.05)
                self.sent += 1
            remaining = producer.flush(self.conf["message.timeout.ms"] / 1000 + 30)
            if remaining or failed:
                raise RuntimeError(f"{remaining + len(failed)} messages were not acknowledged"
                                   + (f" (first error: {failed[0]})" if failed else ""))
        except BaseException as exc:  # reported by wait()
            self.error = exc

    def wait(self, timeout_s: float | None = None) -> int:
        """Until every message is acknowledged; returns how many were sent."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the producer still had messages to deliver after {timeout_s} s")
        if self.error is not None:
            raise self.error
        return self.sent


def fold(messages: Iterable[tuple[str, bytes | None, bytes | None]]) -> dict[str, dict[Any, dict[str, Any]]]:
    """The tables' final rows from their topics' Debezium messages (topic, key, value), in log order per key:
    the database's state as a reader of those messages must find it (``verify`` compares tables with it)."""
    state: dict[str, dict[Any, dict[str, Any]]] = {t: {} for t in TABLES}
    for topic, key, value in messages:
        table = topic.rsplit(".", 1)[-1]        # <server>.inventory.<table>
        if table not in TABLES or key is None:
            continue
        k = orjson.loads(key)[TABLES[table]["key"]]
        payload = orjson.loads(value) if value is not None else None
        if payload is None or payload.get("op") == "d" or payload.get("after") is None:
            state[table].pop(k, None)
        else:
            state[table][k] = payload["after"]
    return state
