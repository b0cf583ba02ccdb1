"""The PyFlink side of bench/operators.py; runs in PyFlink's own venv (no changelake import).

    /tmp/venv-flink/bin/python bench/pyflink_ops_job.py {a|b} {blackhole|collect} files DATA_DIR
    /tmp/venv-flink/bin/python bench/pyflink_ops_job.py {a|b} {blackhole|collect} kafka BOOTSTRAP TOPICS JARS

The sources, ``format = 'debezium-json'`` (flink-json, shipped in PyFlink's lib/):

=========  ======================================================================================
files      DATA_DIR holds ``products/`` and ``orders/``, Debezium JSON lines (filesystem connector)
kafka      the Kafka connector (flink-connector-kafka, the ``flink-kafka`` JVM set, whose jar paths
           JARS lists, ``;``-separated, as ``pipeline.jars``) reads the topics of each table from
           BOOTSTRAP: TOPICS is ``products=t1;t2,orders=t3;t4``. From the earliest offset, bounded
           at the latest offset when the job starts (``scan.bounded.mode``), so the job ends
=========  ======================================================================================

Parallelism 2, ``table.exec.source.cdc-events-duplicate`` at its default (false: no
ChangelogNormalize behind the sources), primary keys declared NOT ENFORCED so the join picks the
unique-key state layouts. ``blackhole`` is the timed run; ``collect`` (untimed) prints the final
result per category, with mini-batch on so that the collect sink receives few updates rather than
one per event.

Prints ``STARTUP s`` (TableEnvironment created: gateway JVM started), ``SECONDS s`` (script
start to job end) and, for collect, ``RESULT category count sum`` lines.
"""

import sys
import time
from pathlib import Path

t0 = time.perf_counter()
from pyflink.common import RowKind
from pyflink.table import EnvironmentSettings, TableEnvironment

QUERIES = {
    "a": "SELECT category, COUNT(*), SUM(price) FROM products GROUP BY category",
    "b": "SELECT p.category, COUNT(*), SUM(p.price) FROM orders o JOIN products p ON o.product_id = p.id "
         "GROUP BY p.category",
}
COLUMNS = {"products": "id BIGINT, category STRING, price BIGINT, PRIMARY KEY (id) NOT ENFORCED",
           "orders": "order_id BIGINT, product_id BIGINT, qty INT, PRIMARY KEY (order_id) NOT ENFORCED"}


def source_options(kind: str, args: list[str], table: str) -> str:
    """The WITH clause of source ``table``."""
    if kind == "files":
        return f"'connector' = 'filesystem', 'path' = '{args[0]}/{table}', 'format' = 'debezium-json'"
    bootstrap, topics = args[0], dict(t.split("=", 1) for t in args[1].split(","))
    return (f"'connector' = 'kafka', 'topic' = '{topics[table]}', 'properties.bootstrap.servers' = '{bootstrap}', "
            f"'properties.group.id' = 'bench-ops-pyflink', 'scan.startup.mode' = 'earliest-offset', "
            f"'scan.bounded.mode' = 'latest-offset', 'format' = 'debezium-json'")


def main() -> None:
    query, sink, kind, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    conf.set("parallelism.default", "2")
    if kind == "kafka":
        conf.set("pipeline.jars", ";".join(Path(j).resolve().as_uri() for j in args[2].split(";")))
    print("STARTUP", time.perf_counter() - t0, flush=True)
    for table, columns in COLUMNS.items():
        env.execute_sql(f"CREATE TABLE {table} ({columns}) WITH ({source_options(kind, args, table)})")
    if sink == "blackhole":
        env.execute_sql("CREATE TABLE out_t (category STRING, cnt BIGINT, total BIGINT) "
                        "WITH ('connector' = 'blackhole')")
        env.execute_sql(f"INSERT INTO out_t {QUERIES[query]}").wait()
        print("SECONDS", time.perf_counter() - t0, flush=True)
        return
    final = collect_final(env, QUERIES[query])
    print("SECONDS", time.perf_counter() - t0, flush=True)
    for k, (count, total) in sorted(final.items()):
        print("RESULT", k, count, total)


def collect_final(env, sql: str) -> dict:
    """The final rows of a ``key, a, b`` query, keyed by ``key``: its changelog collected and applied.

    Mini-batch is switched on so that the collect sink receives few updates, not one per event.
    """
    conf = env.get_config()
    conf.set("table.exec.mini-batch.enabled", "true")
    conf.set("table.exec.mini-batch.allow-latency", "5 s")
    conf.set("table.exec.mini-batch.size", "100000")
    final = {}
    with env.execute_sql(sql).collect() as rows:
        for r in rows:
            kind = r.get_row_kind()
            if kind in (RowKind.INSERT, RowKind.UPDATE_AFTER):
                final[r[0]] = (r[1], r[2])
            elif kind == RowKind.DELETE:
                final.pop(r[0], None)
    return final


if __name__ == "__main__":
    main()
