"""Key changes through the operator graph, in process (LocalRunner; Spark: tests/integration/test_key_changes.py).

Per format, the decoded history of ``tests/keychange_history.py`` runs through the graph of the
service config (``orders LEFT JOIN customers`` -> rows with a customer -> sales by region -> top 2)
in micro-batches, with a restart from a snapshot in the middle. The graph tables must equal DuckDB
over the database's final state: an order whose customer moved to another id joins nothing (NULL
customer columns), and the old key of a moved order is gone from every table.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from changelake.changelog import KIND, RowKind
from changelake.formats import make_decoder
from changelake.plan.explain import explain_plan
from changelake.plan.local import LocalRunner
from changelake.plan.physical import sink_changes
from changelake.service.views import pipeline_from_config
from changelake.service.config import parse_config
from changelake.types import arrow_schema
from tests.keychange_history import (
    FORMATS,
    GRAPH_TABLES,
    PREFIX,
    TABLES,
    KeyChangeDatabase,
    encode,
    expected_graph_tables,
    pipeline_sections,
    raw_records,
    topic,
)

pytestmark = pytest.mark.unit


def _config(tmp_path, fmt):
    import yaml

    raw = {"pipeline": {"id": "keychange-plan", "checkpoint": str(tmp_path / "ckpt")},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")},
           **pipeline_sections("kc", [fmt])}
    return parse_config(yaml.safe_dump(raw))


def _fold(table: dict, changes: pa.Table, key: list[str], columns: list[str]) -> None:
    """Apply a graph table's changes of one batch as the sink does (ordered; a lone -U is a -D)."""
    for row, kind in zip(changes.select(columns).to_pylist(), changes[KIND].to_pylist()):
        k = tuple(row[c] for c in key)
        if kind == RowKind.DELETE:
            table.pop(k, None)
        elif kind != RowKind.UPDATE_BEFORE:
            table[k] = tuple(row.values())


@pytest.mark.parametrize("fmt", FORMATS)
def test_graph_tables_equal_duckdb_over_the_final_state(tmp_path, fmt):
    db = KeyChangeDatabase(seed=11).history(changes=200)
    config = _config(tmp_path, fmt)
    plan = pipeline_from_config(config).plan()
    p = PREFIX[fmt]
    messages = encode(db, fmt, topic_prefix=f"kc-{p}")
    decoded = {}
    for table, spec in TABLES.items():
        decoder = make_decoder(fmt, columns=arrow_schema(spec["columns"]))
        result = decoder.decode(raw_records([m for m in messages if m.topic == topic("kc", fmt, table)]))
        assert result.dead_letters.num_rows == 0
        decoded[f"{p}_{table}"] = result.rows
    runner = LocalRunner(plan)
    out: dict[str, dict] = {t: {} for t in GRAPH_TABLES}
    cuts = 7
    snapshot = None
    for b in range(cuts):
        inputs = {}
        for source, rows in decoded.items():       # whole messages: the rows of one never part
            n = pc.max(rows["_offset"]).as_py() + 1
            at = rows["_offset"]
            inputs[source] = rows.filter(pc.and_(pc.greater_equal(at, n * b // cuts), pc.less(at, n * (b + 1) // cuts)))
        if b == cuts // 2:                                 # a restart from the last snapshot
            runner = LocalRunner(plan)
            runner.restore(snapshot)
        for t, changes in runner.step(inputs).items():
            pk, columns, _ = GRAPH_TABLES[t.removeprefix(f"{p}_")]
            _fold(out[t.removeprefix(f"{p}_")], sink_changes(changes, primary_key=pk, batch_id=b), pk, columns)
        snapshot = runner.snapshot()
    expected = expected_graph_tables(db)
    for t in GRAPH_TABLES:
        assert set(out[t].values()) == expected[t], t
    assert any(r[3] is None for r in expected["orders_enriched"])       # orders whose customer moved away
    assert sum(runner.key_changes.values()) > 0


def test_explain_says_how_key_changes_are_applied(tmp_path):
    from changelake.service.explain import explain

    config = _config(tmp_path, "canal-json")
    text = explain_plan(pipeline_from_config(config).plan())
    assert "Source(name=[canal_customers], columns=[id, name, region], keyChanges=[id changed: -D old, +I new])" \
        in text
    full = explain(config)
    assert "Decode(format=[canal-json], source=[canal_orders], onError=[fail], keyChanges=[order_id changed: " \
           "-D old, +I new])" in full
    assert "canal-json: an UPDATE whose old[i] holds a key column" in full
    learnt = explain(_config(tmp_path, "ogg-json"))
    assert "keyChanges=[the key changed: -D old, +I new]" in learnt and "ogg-json: a U whose before" in learnt

