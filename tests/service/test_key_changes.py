"""Key changes on the service's mirror path, in process: decode stage -> driver -> delta-rs sinks (no JVM).

The key-change history of ``tests/keychange_history.py`` in Canal, Maxwell, OGG and Debezium JSON,
interleaved, goes through :class:`BatchProcessor` (its decode stage called as Spark's tasks would
call it) in micro-batches. Every mirror must equal the database's final state, whether its key is
the source's, the table's or learnt from the message keys, and whether the rows were split on the
driver (mirrors only) or already in the decode stage (the source also feeds the graph). Each move
is counted once in ``changelake_key_changes_total{source}``.
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake import metrics
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from tests.keychange_history import (
    FORMATS,
    PREFIX,
    TABLES,
    KeyChangeDatabase,
    Message,
    encode,
    pipeline_sections,
    source_batches,
)

pytestmark = pytest.mark.unit


def _config(tmp_path, sections: dict, pipeline_id: str):
    raw = {"pipeline": {"id": pipeline_id, "checkpoint": str(tmp_path / "ckpt")},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")}, **sections}
    return parse_config(yaml.safe_dump(raw))


def _run(processor: BatchProcessor, messages: list[Message], size: int, first_batch: int = 0) -> None:
    for b, batch in enumerate(source_batches(messages, size), start=first_batch):
        out = pa.Table.from_batches(list(processor.stage(iter([batch]))))
        processor.process_decoded(out, b)


def _table(config, name: str) -> dict:
    table = name.split("_", 1)[1]
    key = TABLES[table]["key"]
    rows = read_delta(config.table_path(name), columns=list(TABLES[table]["columns"])).to_pylist()
    return {r[key]: r for r in rows}


def _count(source: str) -> float:
    return metrics.REGISTRY.get_sample_value("changelake_key_changes_total", {"source": source}) or 0.0


@pytest.mark.parametrize("views", [False, True], ids=["mirrors", "mirrors-and-graph"])
def test_mirrors_of_every_format_equal_the_final_state(tmp_path, views):
    db = KeyChangeDatabase(seed=13).history(changes=160)
    per_format = [encode(db, fmt, topic_prefix=f"kc-{PREFIX[fmt]}") for fmt in FORMATS]
    messages = [m for group in zip(*[iter(ms) for ms in per_format]) for m in group]   # interleaved
    messages += [m for ms in per_format for m in ms[len(messages) // len(FORMATS):]]
    config = _config(tmp_path, pipeline_sections("kc", FORMATS, views=views), f"kc-{views}")
    processor = BatchProcessor(config)
    assert bool(processor.graph_routes) == views
    before = {s.name: _count(s.name) for s in config.sources}
    _run(processor, messages, 150)

    for fmt in FORMATS:
        for table in TABLES:
            assert _table(config, f"{PREFIX[fmt]}_{table}") == db.state[table], (fmt, table)
    moves = {}
    for m in messages:
        fmt_prefix, table = m.topic.split(".")
        source = f"{fmt_prefix.removeprefix('kc-')}_{table}"
        moves[source] = moves.get(source, 0) + m.moves
    assert processor.totals.key_changes == {s: n for s, n in moves.items() if n}
    assert {s: _count(s) - before[s] for s in moves} == moves          # counted once, on the driver
    assert processor.keys.key_of("ogg_customers") == ("id",)          # learnt from the message keys


def _maxwell(table: str, kind: str, pos: int, data: dict, old: dict | None = None) -> bytes:
    value = {"database": "shop", "table": table, "type": kind, "ts": 1_700_000_000, "xid": pos,
             "position": f"mysql-bin.000003:{pos}", "data": data}
    if old is not None:
        value["old"] = old
    return orjson.dumps(value)


def test_an_older_change_of_a_moved_away_key_cannot_bring_it_back(tmp_path):
    # Maxwell partitioned by primary key: the move of customer 1 to 2 lands in 2's partition and is read
    # before an older update of 1 from 1's partition. The binlog positions order them; the move left a
    # tombstone on key 1, which keeps the older update out.
    config = _config(tmp_path, pipeline_sections("kc", ["maxwell-json"], views=False), "kc-tomb")
    processor = BatchProcessor(config)
    topic = "kc-maxwell.customers"
    row = {"id": 1, "name": "Ada", "region": "north"}
    first = [Message(topic, b"", _maxwell("customers", "insert", 1000, row))]
    moved = [Message(topic, b"", _maxwell("customers", "update", 3000, {**row, "id": 2}, {"id": 1}))]
    older = [Message(topic, b"", _maxwell("customers", "update", 2000, {**row, "region": "south"},
                                          {"region": "north"}))]
    for b, (messages, partition) in enumerate([(first, 0), (moved, 1), (older, 0)]):
        batch = next(source_batches(messages, 10))
        batch = batch.set_column(1, "partition", pa.array([partition] * batch.num_rows, pa.int32()))
        batch = batch.set_column(2, "offset", pa.array([b] * batch.num_rows, pa.int64()))
        processor.process_decoded(pa.Table.from_batches(list(processor.stage(iter([batch])))), b)
    assert _table(config, "maxwell_customers") == {2: {**row, "id": 2}}
    assert processor.totals.key_changes == {"maxwell_customers": 1}
