"""The adversarial MySQL history of ``tests/adversarial_history.py`` in-process, in seconds: every
message decoded (with and without the schema envelope), the mirrors' rows and the graph of the
integration test (``LocalRunner`` into delta-rs tables, the run killed after some of a micro-batch's
commits and restored from the last snapshot) equal the source's final state and DuckDB over it.

``tests/integration/test_adversarial_history.py`` runs the same history through the service on
Spark; this one catches a decoding or operator regression on the same corners in the unit tier.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from changelake.changelog import RAW_SCHEMA, RowKind
from changelake.connectors.delta_read import read_delta
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.formats import make_decoder
from changelake.formats.encodings import source_schema
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.config import load_config
from changelake.service.views import pipeline_from_config
from tests.adversarial_history import (
    COLUMNS,
    ENVELOPES,
    GRAPH,
    KEYS,
    AdversarialShop,
    columns_of,
    encode,
    pipeline_columns,
    pipeline_yaml,
    truth,
)

pytestmark = pytest.mark.unit


def _decoded(shop_events, prefix: str, schemas: bool) -> dict[str, tuple[pa.Table, int, int]]:
    """source -> (decoded rows, dead letters, malformed messages sent)."""
    messages = encode(shop_events, prefix=prefix, schemas=schemas)
    out = {}
    for table in COLUMNS:
        mine = [m for m in messages if m.topic.endswith(f".{table}")]
        n = len(mine)
        records = pa.Table.from_pydict({"topic": [m.topic for m in mine], "partition": [0] * n,
                                        "offset": list(range(n)), "timestamp": [None] * n,
                                        "key": [m.key for m in mine], "value": [m.value for m in mine]},
                                       schema=RAW_SCHEMA)
        decoder = make_decoder("debezium-json", columns=source_schema(pipeline_columns(table, encodings=not schemas)),
                               options={"schema-include": schemas})
        result = decoder.decode(records)
        out[table] = (result.rows, result.dead_letters, [i for i, m in enumerate(mine) if m.malformed])
    return out


def _last_rows(rows: pa.Table, table: str) -> set[tuple]:
    """The mirror of a decoded changelog: each key's last row in log order (``_seq``), unless deleted."""
    last: dict = {}
    for r in sorted(rows.to_pylist(), key=lambda r: r["_seq"]):
        last[r[KEYS[table]]] = None if r["_kind"] == RowKind.DELETE else r
    return {tuple(r[c] for c in COLUMNS[table]) for r in last.values()
            if r is not None and r["_kind"] != RowKind.UPDATE_BEFORE}


@pytest.mark.parametrize("seed, batches, crash", [(11, 1, None), (3, 4, (2, 1)), (5, 3, (0, 0))])
def test_adversarial_history_in_process_equals_sql(tmp_path, seed, batches, crash):
    shop = AdversarialShop(seed=seed)
    events = (shop.phase(snapshot={"customers": 14, "products": 14, "orders": 30}, changes=110)
              + shop.phase(changes=90, rotate_at=0.3))
    want = truth(shop)
    decoded = {}
    for p, schemas in ENVELOPES.items():
        for table, (rows, letters, malformed) in _decoded(events, f"adv-{p}", schemas).items():
            assert letters.column("offset").to_pylist() == malformed, (p, table, letters.to_pylist()[:2])
            assert _last_rows(rows, table) == want[f"{p}_{table}"], (p, table)
            decoded[f"{p}_{table}"] = rows

    plan = pipeline_from_config(load_config(pipeline_yaml("adv", "localhost:9", tmp_path, 1000))).plan()
    sources = {n.source for n in plan.sources}

    def start():
        return LocalRunner(plan), {n.table: open_sink(TableSpec(name=n.table, path=str(tmp_path / n.table),
                                                                 primary_key=n.primary_key,
                                                                 nullable_key=n.nullable_key),
                                                       pipeline_id="adv", engine="delta-rs") for n in plan.sinks}

    runner, sinks = start()
    checkpoint, b = runner.snapshot(), 0
    while b < batches:
        step = {s: rows.slice(rows.num_rows * b // batches, rows.num_rows * (b + 1) // batches
                              - rows.num_rows * b // batches) for s, rows in decoded.items() if s in sources}
        outs = sorted(runner.step(step).items())
        for i, (table, changes) in enumerate(outs):
            if crash == (b, i):
                break
            sinks[table].apply(sink_changes(changes, primary_key=sinks[table].spec.primary_key, batch_id=b),
                               batch_id=b)
        else:
            checkpoint, b = runner.snapshot(), b + 1
            continue
        crash = None                      # killed mid-batch: a new process restores the last snapshot
        runner, sinks = start()
        runner.restore(checkpoint)
    for table in GRAPH:
        got = {tuple(r.values()) for r in read_delta(str(tmp_path / table), columns=columns_of(table)).to_pylist()}
        assert got == want[table], table
