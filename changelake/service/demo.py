"""``changelake demo``: the whole pipeline on embedded defaults.

Starts an embedded Kafka-protocol broker, writes a Debezium history of a small
inventory database, mirrors it into Delta tables and, in the same Spark query, runs an
operator graph over it (orders JOIN products, sales per category, the top 3
categories), until it has caught up; prints a summary and checks every table against
the database's final state.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import pyarrow as pa
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.connectors.embedded_broker import EmbeddedBroker
from changelake.errors import ConfigError
from changelake.service.config import ChangelakeConfig, parse_config
from changelake.service.inventory import TABLES, InventoryDatabase, produce, topic_for
from changelake.service.runner import PipelineRunner

log = logging.getLogger(__name__)


def demo_config(*, bootstrap_servers: str, workdir: Path, metrics_port: int, pipeline_id: str = "inventory-mirror",
                max_records_per_batch: int = 20_000, views: bool = True) -> dict[str, Any]:
    """The pipeline YAML the demo runs (also written to <workdir>/pipeline.yaml); ``views=False``
    leaves out the operator graph (the mirror alone)."""
    raw = {
        "pipeline": {"id": pipeline_id, "checkpoint": str(workdir / "checkpoints" / pipeline_id),
                     "trigger_interval": "2 seconds", "max_records_per_batch": max_records_per_batch},
        "kafka": {"bootstrap_servers": bootstrap_servers},
        "sources": [{"name": t, "topics": [topic_for(t)], "format": "debezium-json",
                     "columns": spec["columns"], "on_error": "dlq", "table": t} for t, spec in TABLES.items()],
        "views": [
            {"name": "order_lines", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"}}},
            {"name": "sales", "from": "order_lines", "group_by": ["category"],
             "aggregates": {"orders": "count(*)", "units": "sum(quantity)"}},
            {"name": "top3", "from": "sales",
             "top_n": {"n": 3, "order_by": ["units desc", "category asc"], "rank_column": "rank"}},
        ],
        "tables": [{"name": t, "primary_key": [spec["key"]]} for t, spec in TABLES.items()]
        + [{"name": "sales_by_category", "from": "sales", "primary_key": ["category"]},
           {"name": "top_categories", "from": "top3", "primary_key": ["rank"]}],
        "storage": {"root": str(workdir / "lake")},
        "metrics": {"port": metrics_port},
    }
    if not views:
        del raw["views"]
        raw["tables"] = [t for t in raw["tables"] if "from" not in t]
    return raw


def write_demo_config(raw: dict[str, Any], path: Path) -> ChangelakeConfig:
    """Write the demo's pipeline YAML to ``path`` and parse that same text: the run and the file agree,
    and the sources' columns keep their declared order (a sorted dump would have every table created
    with its columns in alphabetical order)."""
    text = yaml.safe_dump(raw, sort_keys=False)
    path.write_text(text)
    return parse_config(text, origin=str(path))


def verify(config: ChangelakeConfig, expected: dict[str, dict[int, dict[str, Any]]]) -> dict[str, str]:
    """Compare each Delta table with the expected final rows; returns table -> 'ok' or what differs."""
    results: dict[str, str] = {}
    for name, rows in expected.items():
        columns = list(TABLES[name]["columns"])
        key = TABLES[name]["key"]
        try:
            actual = read_delta(config.table_path(name), storage_options=config.storage.plain_options(),
                                columns=columns)
        except Exception as exc:  # the table may not exist at all
            results[name] = f"cannot read the table: {exc}"
            continue
        got = {r[key]: r for r in _comparable(actual, columns)}
        want = _normalise(rows.values(), columns, key)
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        if missing or extra or wrong:
            results[name] = (f"{len(missing)} missing (e.g. {missing[:3]}), {len(extra)} unexpected "
                             f"(e.g. {extra[:3]}), {len(wrong)} differ (e.g. {wrong[:3]})")
        else:
            results[name] = "ok"
    return results


def expected_views(state: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[Any, dict[str, Any]]]:
    """The graph tables computed in batch from the database's final state."""
    sales: dict[str, dict[str, Any]] = {}
    for order in state["orders"].values():
        product = state["products"].get(order["product_id"])
        if product is None:
            continue
        row = sales.setdefault(product["category"], {"category": product["category"], "orders": 0, "units": 0})
        row["orders"] += 1
        row["units"] += order["quantity"]
    ranked = sorted(sales.values(), key=lambda r: (-r["units"], r["category"]))[:3]
    return {"sales_by_category": sales,
            "top_categories": {i: {**r, "rank": i} for i, r in enumerate(ranked, start=1)}}


def verify_views(config: ChangelakeConfig, expected: dict[str, dict[Any, dict[str, Any]]]) -> dict[str, str]:
    """Compare each graph table with its batch result; table -> 'ok' or what differs."""
    results: dict[str, str] = {}
    for name, rows in expected.items():
        columns = list(next(iter(rows.values()))) if rows else []
        try:
            actual = read_delta(config.table_path(name), storage_options=config.storage.plain_options(),
                                columns=columns or None).to_pylist()
        except Exception as exc:  # the table may not exist at all
            results[name] = f"cannot read the table: {exc}"
            continue
        got = sorted(tuple(r[c] for c in columns) for r in actual)
        want = sorted(tuple(r[c] for c in columns) for r in rows.values())
        results[name] = "ok" if got == want else f"expected {want[:3]}..., got {got[:3]}..."
    return results


def broker_lag(bootstrap_servers: str, end_offsets: dict[str, dict[str, int]]) -> int:
    """Records the broker holds beyond the offsets the pipeline committed, over every demo topic."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "changelake-demo-lag", "log_level": 3})
    try:
        lag = 0
        for table in TABLES:
            topic = topic_for(table)
            parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            for p in parts:
                _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
                lag += max(0, high - int(end_offsets.get(topic, {}).get(str(p), 0)))
        return lag
    finally:
        consumer.close()


def _comparable(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    out = []
    for r in table.to_pylist():
        out.append({c: _value(r[c]) for c in columns})
    return out


def _normalise(rows: Any, columns: list[str], key: str) -> dict[Any, dict[str, Any]]:
    import datetime as dt
    out = {}
    for r in rows:
        row = {}
        for c in columns:
            v = r[c]
            if TABLES_TYPE.get(c) == "date" and isinstance(v, int):
                v = dt.date(1970, 1, 1) + dt.timedelta(days=v)
            row[c] = _value(v)
        out[row[key]] = row
    return out


TABLES_TYPE = {c: t for spec in TABLES.values() for c, t in spec["columns"].items()}


def _value(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else v
    return v


@contextlib.contextmanager
def _stderr_to(path: Path):
    """Send file descriptor 2 to ``path`` meanwhile: the Spark JVM started inside inherits it, so
    Spark's own output (and pyspark's worker chatter) lands in the file, not on the terminal."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


#: written into a directory the demo created; only a directory holding it is ever emptied by the demo
WORKDIR_MARKER = ".changelake-demo"


def prepare_workdir(workdir: Path) -> Path:
    """An empty work directory for the demo, made absolute.

    A directory the demo created before (it holds :data:`WORKDIR_MARKER`) is emptied; an empty
    directory is taken as is; anything else is refused, never deleted: ``--workdir`` may name a
    user's directory by mistake.
    """
    import shutil

    workdir = workdir.absolute()
    if workdir.exists() and not workdir.is_dir():
        raise ConfigError(f"--workdir {workdir} is a file, not a directory; name a new or empty directory")
    if workdir.is_dir() and any(workdir.iterdir()):
        if not (workdir / WORKDIR_MARKER).is_file():
            raise ConfigError(f"--workdir {workdir} is not empty and was not created by 'changelake demo' (it has "
                              f"no {WORKDIR_MARKER} file), so the demo will not delete it; name a new or empty "
                              "directory, or remove this one yourself")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / WORKDIR_MARKER).write_text("created by 'changelake demo'; the next demo run empties this directory\n")
    return workdir


def run_demo(*, workdir: Path, changes: int = 30_000, seed: int = 7, metrics_port: int = 9108,
             out: TextIO) -> int:
    """Returns the process exit code: 0 when every table equals the source's final state."""
    workdir = prepare_workdir(workdir)
    started = time.monotonic()
    print(f"changelake demo: working in {workdir}", file=out)
    with EmbeddedBroker() as broker:
        print(f"  embedded Kafka broker (librdkafka mock cluster) at {broker.bootstrap_servers}; for Apache Kafka "
              "itself: `changelake broker` (docs/operations.md)", file=out)
        db = InventoryDatabase(seed=seed)
        sizes = {"customers": 1_000, "products": 2_000, "orders": 3_000}
        n = produce(db.history(snapshot_sizes=sizes, changes=changes, redeliver=500), broker.bootstrap_servers)
        print(f"  wrote {n:,} Debezium JSON messages (snapshot {sum(sizes.values()):,} rows, {changes:,} changes, "
              f"500 re-delivered) to {len(TABLES)} topics", file=out)
        raw = demo_config(bootstrap_servers=broker.bootstrap_servers, workdir=workdir, metrics_port=metrics_port)
        config = write_demo_config(raw, workdir / "pipeline.yaml")
        runner = PipelineRunner(config)
        spark_log = workdir / "spark.log"
        print(f"  running the pipeline (Spark's own log: {spark_log})", file=out)
        t0 = time.monotonic()
        with _stderr_to(spark_log):
            result = runner.run(available_now=True)
        elapsed = time.monotonic() - t0
        totals = result.totals
        print(f"  pipeline caught up in {elapsed:.1f}s ({totals.records:,} records, "
              f"{totals.records / max(elapsed, 1e-9):,.0f} records/s including Spark start-up)", file=out)
        lag = broker_lag(broker.bootstrap_servers, result.end_offsets)
        print(f"  consumer lag after catch-up (broker end offsets minus the pipeline's committed offsets): "
              f"{lag}", file=out)
        print("  changes applied by table and kind:", file=out)
        for name in [*TABLES, *expected_views(db.state)]:
            kinds = totals.changes.get(name, {})
            shown = ", ".join(f"{k} {kinds.get(k, 0):,}" for k in ("+I", "-U", "+U", "-D"))
            print(f"    {name:<17} {shown}   -> {config.table_path(name)}", file=out)
        if totals.dead_letters:
            print(f"  dead letters: {totals.dead_letters} -> {config.dead_letter_path()}", file=out)
        if totals.expired:
            print(f"  WARNING: {totals.expired} offsets expired before they were read", file=out)
        print(f"  metrics were served at {result.metrics_url}", file=out)
        print("verification against the source database's final state:", file=out)
        checks = verify(config, db.state)
        views = expected_views(db.state)
        checks.update(verify_views(config, views))
        for name, verdict in checks.items():
            rows = len(db.state[name]) if name in db.state else len(views[name])
            print(f"    {name:<17} {rows:>6,} rows: {verdict}", file=out)
    ok = all(v == "ok" for v in checks.values()) and lag == 0
    print(f"demo {'PASSED' if ok else 'FAILED'} in {time.monotonic() - started:.0f}s", file=out)
    print(next_steps(config, workdir, broker.bootstrap_servers), file=out)
    return 0 if ok else 1


def next_steps(config: ChangelakeConfig, workdir: Path, bootstrap_servers: str) -> str:
    """What to do with the result: read the tables (Python, Spark SQL), and the pipeline.yaml's dead broker."""
    table = config.table_path("top_categories")
    return f"""
look at the result tables (Delta Lake, one directory per table under {workdir / "lake"}):
  with Python (the deltalake package comes with changelake):
    from deltalake import DeltaTable, QueryBuilder
    qb = QueryBuilder().register("top_categories", DeltaTable("{table}"))
    print(qb.execute("SELECT category, orders, units, rank FROM top_categories ORDER BY rank").read_all())
  with Spark SQL (Delta's jars pinned by jvm/jvm.lock, once: .venv/bin/python -m changelake.jvm_deps install delta):
    from pyspark.sql import SparkSession
    from changelake.spark import delta_jars
    assert delta_jars.missing() is None, delta_jars.missing()
    spark = (SparkSession.builder.config("spark.jars", ",".join(delta_jars.session_jars()))
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog").getOrCreate())
    spark.sql("SELECT * FROM delta.`{table}` ORDER BY rank").show()
note: {workdir / "pipeline.yaml"} is the pipeline the demo ran. Its kafka.bootstrap_servers ({bootstrap_servers}) was
  the demo's embedded broker, which stopped with the demo: `changelake run` or `status` on that file cannot reach
  Kafka. Point kafka.bootstrap_servers at your broker (README.md, "Running against your own Kafka and storage").
"""
