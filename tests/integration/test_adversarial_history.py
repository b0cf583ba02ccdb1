"""Issue #11 end to end: an adversarial MySQL history through the documented CLI equals SQL over the
source, before and after a SIGKILL in the middle of a micro-batch.

``tests/adversarial_history.py`` generates (seeded) the history of three related tables as the
Debezium MySQL connector writes it: a snapshot, then binlog events with values at every type
limit, NULLs in every nullable column, primary-key changes (delete + ``__debezium.newkey``,
tombstone, create + ``__debezium.oldkey``), multi-row events, binlog rotation, re-inserts,
duplicates, a connector-restart replay and malformed messages. The same history goes to the
test broker twice, once with the JSON converter's schema envelope (``schemas.enable=true``,
sources ``s_*``) and once without (``schemas.enable=false``, sources ``n_*`` declaring the wire
encodings of their temporal and decimal columns), and one pipeline runs both through
``changelake run --available-now`` (a child process): per envelope, three mirrors; the
schema-less sources feed ``orders LEFT JOIN customers LEFT JOIN products`` -> revenue per
(nullable) category, whose MIN/MAX columns carry every type's limits through the joins, and the
enveloped products feed the top 3 products by price per (nullable) category (once decoded, both
envelopes give the graph the same rows, which the mirrors check). The tables must equal the
source's final state (mirrors) and DuckDB over it (graph tables); every malformed message must be
in the dead letters, once, with its raw bytes.

Phase 1 (snapshot + changes, two micro-batches) runs to the end and is checked. Phase 2 (more
changes, another rotation, another replay) is written; the run that reads it is killed with
SIGKILL in its micro-batch after one table's commit, and after the restart everything must be
equal again. Kept to three runs of three micro-batches in all, and the graph to 8 stateful
operators on Spark: their fixed cost per micro-batch dominates.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from changelake.connectors.delta_read import read_delta
from tests.adversarial_history import (
    COLUMNS,
    ENVELOPES,
    AdversarialShop,
    Message,
    columns_of,
    encode,
    pipeline_yaml,
    truth,
)

from .test_crash_recovery import _run_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.spark]

def _produce(servers: str, messages: list[Message]) -> dict[tuple[str, int, int], Message]:
    """Writes the messages (keyed, the default partitioner spreading keys over the partitions);
    returns the malformed ones by the (topic, partition, offset) the broker gave them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "enable.idempotence": True,
                         "log_level": 3})
    malformed: dict[tuple[str, int, int], Message] = {}

    def delivered(m: Message):
        def report(err, msg):
            assert err is None, err
            if m.malformed:
                malformed[(msg.topic(), msg.partition(), msg.offset())] = m
        return report

    for m in messages:
        producer.produce(m.topic, key=m.key, value=m.value, headers=m.headers or None, on_delivery=delivered(m))
        producer.poll(0)
    assert producer.flush(60) == 0
    return malformed


def _tables(lake: Path, names) -> dict[str, set[tuple]]:
    out = {}
    for name in names:
        if not (lake / name / "_delta_log").exists():
            out[name] = set()
            continue
        rows = read_delta(str(lake / name), columns=columns_of(name))
        out[name] = {tuple(r.values()) for r in rows.to_pylist()}
    return out


def _dead_letters(lake: Path) -> dict[tuple[str, int, int], tuple[bytes | None, str]]:
    rows = read_delta(str(lake / "_dead_letters"), columns=["topic", "partition", "offset", "value", "reason"])
    out = {}
    for r in rows.to_pylist():
        position = (r["topic"], r["partition"], r["offset"])
        assert position not in out, f"dead letter {position} written twice"
        out[position] = (r["value"], r["reason"])
    return out


def _differences(got: dict[str, set], want: dict[str, set]) -> dict[str, str]:
    out = {}
    for name, rows in want.items():
        if got[name] != rows:
            missing, extra = rows - got[name], got[name] - rows
            out[name] = f"{len(missing)} missing, e.g. {sorted(map(repr, missing))[:2]}; " \
                        f"{len(extra)} unexpected, e.g. {sorted(map(repr, extra))[:2]}"
    return out


def _last_batch(checkpoint: Path) -> int:
    return max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def test_adversarial_mysql_history_equals_sql_before_and_after_sigkill(kafka, tmp_path):
    prefix = kafka.topic("adv")
    shop = AdversarialShop(seed=11)
    phase1 = shop.phase(snapshot={"customers": 14, "products": 14, "orders": 30}, changes=110)
    want1 = truth(shop)
    phase2 = shop.phase(changes=90, rotate_at=0.3)
    want2 = truth(shop)

    # the history reaches every corner it is meant to
    for what in ("key-change", "multi-row-c", "multi-row-u", "multi-row-d", "rotation", "re-insert",
                 "duplicate", "replay", "to-null", "from-null"):
        assert shop.seen.get(what), (what, shop.seen)
    assert sum(v for k, v in shop.seen.items() if k.startswith("malformed-")) >= 5, shop.seen
    for table, columns in COLUMNS.items():
        for c, (_, _, _, nullable) in columns.items():
            if nullable:
                assert any(r[c] is None for r in shop.state[table].values()), f"no NULL left in {table}.{c}"
    ids = {r["customer_id"] for r in shop.state["orders"].values()}
    assert ids & {2**63 - 1, -(2**63), -(2**63 - 1)}, "an order should reference a customer id at the limit"
    assert any(r[0] is None for r in want2["n_revenue_by_category"]), "a NULL category group"
    assert any(r[2] is None for r in want2["s_top_products"]), "a NULL category partition"

    malformed = {}
    for p, schemas in ENVELOPES.items():
        malformed |= _produce(kafka.bootstrap_servers, encode(phase1, prefix=f"{prefix}-{p}", schemas=schemas))
    n1, n2 = 2 * len(phase1), 2 * len(phase2)
    assert n2 < n1, "phase 1 should take two micro-batches and phase 2 one"
    path = pipeline_yaml(prefix, kafka.bootstrap_servers, tmp_path, max_records=max(n2, n1 // 2 + 1))
    lake, checkpoint = tmp_path / "lake", tmp_path / "checkpoints"

    first = _run_pipeline(path)                  # phase 1: two micro-batches
    assert first.returncode == 0, first.stderr[-3000:]
    assert _differences(_tables(lake, want1), want1) == {}
    letters = _dead_letters(lake)
    assert set(letters) == set(malformed)
    assert all(letters[pos][0] == m.value for pos, m in malformed.items())

    for p, schemas in ENVELOPES.items():
        malformed |= _produce(kafka.bootstrap_servers, encode(phase2, prefix=f"{prefix}-{p}", schemas=schemas))
    crash_in = _last_batch(checkpoint) + 1      # phase 2 is one micro-batch
    crashed = _run_pipeline(path, fault=f"after-first-table@{crash_in}")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    assert _tables(lake, want2) != want2, "the crash should leave the tables behind the source"

    restarted = _run_pipeline(path)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert _differences(_tables(lake, want2), want2) == {}
    letters = _dead_letters(lake)
    assert set(letters) == set(malformed)
    assert all(letters[pos][0] == m.value for pos, m in malformed.items())
