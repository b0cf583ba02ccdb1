"""Transaction-consistent commits (``consistency: transaction``), in process: decode stage -> driver gate ->
delta-rs sinks -> ``_changelake_consistency`` (no JVM, no broker).

Generated histories of multi-table transactions (tests/txn_history.py), spread over topics and partitions
and read in micro-batches cut at random offsets. After every batch a reader takes the documented consistent
snapshot (each table at the versions of the progress table's newest row) and checks what every source
transaction keeps: the sum of balances is constant, every order line has its order, and, stronger, the
snapshot is the database's state after the n-th transaction, n being the row's ``transactions``. With the
default (``consistency: offset``) the same reader sees broken invariants: the check can fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from deltalake import DeltaTable

from changelake import metrics
from changelake.changelog import commit_position
from changelake.connectors.consistency import ConsistencyLog
from changelake.connectors.delta_read import read_delta
from changelake.errors import ConfigError
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from tests import txn_history as th

pytestmark = pytest.mark.unit

SEEDS = [1, 2]


def _config(tmp_path, *, consistency: str = "transaction", **pipeline):
    sources = [{"name": t, "topics": [th.TOPICS[t]], "format": "debezium-json", "table": t,
                "columns": {c: "bigint" for c in cols}, "consistency": consistency}
               for t, cols in th.TABLES.items()]
    raw = {"pipeline": {"id": "txn-test", "checkpoint": str(tmp_path / "ckpt"), "consistency_table": True,
                        **pipeline},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")},
           "sources": sources, "tables": [{"name": t, "primary_key": ["id"]} for t in th.TABLES]}
    return parse_config(yaml.safe_dump(raw))


def _run(processor: BatchProcessor, batch: pa.RecordBatch, batch_id: int):
    out = pa.Table.from_batches(list(processor.stage(iter([batch]))))
    return processor.process_decoded(out, batch_id)


DOC = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
#: the documented reader (docs/pipelines.md, "Reading several tables at one consistent point")
READER = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.DOTALL)
              if lang == "python" and "_changelake_consistency" in body)
SETUP, QUERY = READER.split("[(total, orphans)] =")


def consistent_snapshot(config) -> tuple[dict, dict[str, dict[int, dict]]]:
    """The documented read: the progress table's newest row, each table at its version (through DuckDB);
    when all three tables exist, the documented invariant query must agree with the rows read."""
    scope: dict = {}
    lake = config.storage.root
    exec(compile(SETUP.replace('"/var/lib/lake"', repr(lake)), "docs/pipelines.md", "exec"), scope)
    con = scope["con"]
    transactions, held_rows, position = con.execute(
        "SELECT transactions, held_rows, source_position FROM progress WHERE batch_id = ?",
        [scope["batch_id"]]).fetchall()[0]
    row = {"batch_id": scope["batch_id"], "last_transaction": scope["last_transaction"], "transactions": transactions,
           "held_rows": held_rows, "source_position": position}
    tables = {}
    for name in scope["versions"]:
        cols = th.TABLES[name]
        tables[name] = {r[0]: dict(zip(cols, r)) for r in con.execute(f"SELECT {', '.join(cols)} FROM {name}").fetchall()}
    if set(tables) == set(th.TABLES):
        exec(compile("[(total, orphans)] =" + QUERY, "docs/pipelines.md", "exec"), scope)
        assert scope["total"] == (sum(r["balance"] for r in tables["accounts"].values()) if tables["accounts"] else None)
        assert scope["orphans"] == sum(1 for r in tables["order_lines"].values() if r["order_id"] not in tables["orders"])
    return row, tables


def violations(tables: dict[str, dict[int, dict]]) -> list[str]:
    found = []
    balances = [r["balance"] for r in tables.get("accounts", {}).values()]
    if balances and sum(balances) != th.TOTAL:
        found.append(f"sum of balances {sum(balances)} != {th.TOTAL}")
    orders = tables.get("orders", {})
    orphans = [r["id"] for r in tables.get("order_lines", {}).values() if r["order_id"] not in orders]
    if orphans:
        found.append(f"order lines without their order: {orphans}")
    return found


def _drive(tmp_path, seed: int, consistency: str, **pipeline) -> tuple[list[str], int, th.History, object]:
    config = _config(tmp_path, consistency=consistency, **pipeline)
    history = th.generate(seed, transactions=40)
    processor = BatchProcessor(config, graph=None)
    found = []
    batches = th.random_batches(history, seed)
    for b, batch in enumerate(batches):
        _run(processor, batch, b)
        row, tables = consistent_snapshot(config)
        assert row["batch_id"] == b
        found += [f"batch {b}: {v}" for v in violations(tables)]
        if consistency == "transaction":
            expected = {t: rows for t, rows in history.states[row["transactions"]].items() if rows}
            assert {t: rows for t, rows in tables.items() if rows} == expected, f"seed {seed} batch {b}"
    return found, len(batches), history, config


@pytest.mark.parametrize("seed", SEEDS)
def test_every_snapshot_is_a_state_the_database_had(tmp_path, seed):
    found, batches, history, config = _drive(tmp_path, seed, "transaction")
    assert found == []
    assert batches > 10
    row, tables = consistent_snapshot(config)       # all read: the final state, no row held
    assert row["transactions"] == len(history.states) - 1 and row["held_rows"] == 0
    assert tables == history.states[-1]


def test_the_default_shows_half_transactions(tmp_path):
    """The reader and the invariants are able to fail: cut at offsets, snapshots break them."""
    found = []
    found, _, history, config = _drive(tmp_path, SEEDS[0], "offset")
    assert consistent_snapshot(config)[1] == history.states[-1]      # and the end is right all the same
    assert len(found) >= 3, found


def test_held_rows_survive_a_restart_and_a_crash_between_two_tables(tmp_path, monkeypatch):
    """A batch whose second table commit fails (after the first went in), then a new process replays it:
    the held rows come back from the checkpoint, each change is applied once, and the progress table and
    the tables agree after every batch."""
    seed = 4
    config = _config(tmp_path)
    history = th.generate(seed, transactions=30)
    batches = th.random_batches(history, seed)
    processor = BatchProcessor(config, graph=None)
    crash_at = None
    for b, batch in enumerate(batches):
        if crash_at is None and b >= 3:
            report = _run(processor, batch, b)
            if len(report.committed_tables) >= 2 and report.transactions["held_rows"]:
                crash_at = b + 1
            continue
        if b == crash_at:
            calls = []
            original = type(processor._sink("orders")).apply

            def failing(self, changes, **kw):
                calls.append(self.spec.name)
                if self.spec.name == "orders":
                    raise RuntimeError("killed between two tables' commits")
                return original(self, changes, **kw)

            monkeypatch.setattr(type(processor._sink("orders")), "apply", failing)
            with pytest.raises(RuntimeError):
                _run(processor, batch, b)
            monkeypatch.undo()
            position = commit_position(b)
            written = {t: DeltaTable(config.table_path(t)).transaction_version(f"changelake:txn-test:{t}") == position
                       for t in th.TABLES}
            assert written["orders"] is False and any(written.values()), written    # between two tables' commits
            assert consistent_snapshot(config)[0]["batch_id"] == b - 1            # no cut for the half batch
            processor = BatchProcessor(config, graph=None)       # restart: state from the checkpoint only
        _run(processor, batch, b)
        row, tables = consistent_snapshot(config)
        expected = {t: rows for t, rows in history.states[row["transactions"]].items() if rows}
        assert {t: rows for t, rows in tables.items() if rows} == expected
    assert crash_at is not None
    assert consistent_snapshot(config)[1] == history.states[-1]
    # one progress row per batch, none twice
    ids = read_delta(config.consistency_table_path(), columns=["batch_id"])["batch_id"].to_pylist()
    assert sorted(ids) == list(range(len(batches)))


def test_the_limit_splits_and_says_so(tmp_path, caplog):
    before = metrics.REGISTRY.get_sample_value("changelake_transactions_split_total") or 0
    config = _config(tmp_path, max_held_rows=2)
    history = th.generate(5, transactions=30)
    processor = BatchProcessor(config, graph=None)
    with caplog.at_level("WARNING"):
        for b, batch in enumerate(th.random_batches(history, 5)):
            _run(processor, batch, b)
    assert (metrics.REGISTRY.get_sample_value("changelake_transactions_split_total") or 0) > before
    assert "exceed pipeline.max_held_rows (2)" in caplog.text
    assert consistent_snapshot(config)[1] == history.states[-1]      # split, not lost


def test_each_table_commit_records_its_consistent_position(tmp_path):
    config = _config(tmp_path)
    history = th.generate(6, transactions=10)
    processor = BatchProcessor(config, graph=None)
    for b, batch in enumerate(th.random_batches(history, 6)):
        _run(processor, batch, b)
    row, _ = consistent_snapshot(config)
    commit = DeltaTable(config.table_path("accounts")).history(1)[0]
    assert commit["changelake.consistency"]
    import json

    meta = json.loads(commit["changelake.consistency"])
    assert meta["last_transaction"] and meta["source_position"].startswith(th.TXN_TOPIC + ":0:")
    assert row["source_position"].startswith(th.TXN_TOPIC + ":0:")


def test_config_refuses_what_it_cannot_keep(tmp_path):
    raw = {"pipeline": {"id": "p", "checkpoint": str(tmp_path)}, "kafka": {"bootstrap_servers": "x:1"},
           "sources": [{"name": "s", "topics": ["a.b.c"], "format": "canal-json", "table": "t",
                        "consistency": "transaction"}],
           "tables": [{"name": "t", "primary_key": ["id"]}]}
    with pytest.raises(ConfigError, match="carries none"):
        parse_config(yaml.safe_dump(raw))
    raw["sources"][0]["format"] = "debezium-json"
    raw["views"] = [{"name": "v", "from": "s", "filter": "id > 1"}]
    raw["tables"].append({"name": "vt", "from": "v", "primary_key": ["id"]})
    raw["sources"][0]["columns"] = {"id": "bigint"}
    parse_config(yaml.safe_dump(raw))          # views behind the gate (tests/service/test_transaction_views.py)
    raw["pipeline"]["mirrors"] = "own_query"
    with pytest.raises(ConfigError, match="no batch is one transaction-consistent cut"):
        parse_config(yaml.safe_dump(raw))
    del raw["pipeline"]["mirrors"]
    del raw["views"]
    raw["tables"].pop()
    config = parse_config(yaml.safe_dump(raw))
    assert config.sources[0].transaction_topic_name() == "a.transaction"
    assert ConsistencyLog  # the progress table's writer is importable without Spark


@pytest.mark.spark
def test_the_spark_sql_reader_sees_the_same_consistent_point(spark, tmp_path):
    """docs/pipelines.md's Spark SQL: the newest progress row, then each table VERSION AS OF its version."""
    from changelake.spark.delta_sink import delta_spark_missing

    from tests.jars import unavailable

    missing = delta_spark_missing(spark)
    if missing:
        unavailable(f"Spark SQL on Delta tables (delta.`path`): {missing}; the test session gets Delta's SQL "
                    "extension when delta-spark's jars are in pyspark's jars directory or $SPARK_HOME/jars")
    config = _config(tmp_path)
    history = th.generate(8, transactions=12)
    processor = BatchProcessor(config, graph=None)
    for b, batch in enumerate(th.random_batches(history, 8)):
        _run(processor, batch, b)
        row, tables = consistent_snapshot(config)
        if len(tables) == 3 and row["held_rows"]:
            break       # a point inside the history, with rows held back
    sql = next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", DOC, flags=re.DOTALL)
               if lang == "sql" and "_changelake_consistency" in body)
    statements = [s.strip() for s in re.sub(r"--[^\n]*", "", sql).split(";") if s.strip()]
    statements = [s.replace("/var/lib/lake", config.storage.root) for s in statements]
    newest = spark.sql(statements[0]).collect()[0]
    assert newest["batch_id"] == row["batch_id"]
    versions = dict(newest["tables"])
    at = [re.sub(r"delta\.`[^`]*/(\w+)` VERSION AS OF \d+",
                 lambda m: f"delta.`{config.table_path(m.group(1))}` VERSION AS OF {versions[m.group(1)]}", s)
          for s in statements[1:]]
    total = spark.sql(at[0]).collect()[0][0]
    orphans = spark.sql(at[1]).collect()[0][0]
    assert total == (sum(r["balance"] for r in tables["accounts"].values()) if tables.get("accounts") else None)
    assert orphans == 0


def test_the_transaction_topic_starts_where_its_sources_start(tmp_path):
    from changelake.service.query_start import kafka_reader_options

    raw = {"pipeline": {"id": "p", "checkpoint": str(tmp_path)}, "kafka": {"bootstrap_servers": "x:1"},
           "sources": [{"name": "s", "topics": ["dbz.shop.a"], "table": "t", "consistency": "transaction",
                        "starting_offsets": "latest"}],
           "tables": [{"name": "t", "primary_key": ["id"]}]}
    options = kafka_reader_options(parse_config(yaml.safe_dump(raw)))
    assert options["topics"] == "dbz.shop.a,dbz.transaction"
    import json

    assert json.loads(options["startingOffsets"]) == {"dbz.shop.a": "latest", "dbz.transaction": "latest"}
