"""Join benchmarks (issue 6), one subcommand per join:

    nice -n 19 /tmp/venv/bin/python bench/joins.py interval [--events 1000000] [--quick] [--engines local,spark]

    nice -n 19 /tmp/venv/bin/python bench/joins.py lookup [--events 1000000] [--keys 100000] [--batch 100000]
        [--quick] [--dims delta,postgres] [--pg-url postgresql://user@host:port/db --pg-password-env VAR]

``lookup``: the lookup join operator (``LookupJoiner``, what each Spark Python worker runs per
partition, and what ``LocalRunner`` runs in-process) over ``--events`` order changes whose
``product_id`` is drawn uniformly from ``1.1 x --keys`` ids, of which ``--keys`` exist in the
dimension (so ~9 % of the keys are missing and cached as absent), inner join, micro-batches of
``--batch`` events. Two passes over the same events with one joiner:

* **cold**: the cache starts empty; each batch looks up the keys it has not seen before;
* **warm**: the second pass; every key is cached (max_rows >= keys, TTL 1 hour).

Dimensions: a Delta table (delta-rs, one file) and a PostgreSQL table (primary key on id) on a
throwaway server started from the OS package's binaries (tests/postgres_server.py), unless
``--pg-url`` names one. Events/s is input change rows per second of the join alone (no Spark,
no sink); the output is checked against DuckDB's join.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from changelake.changelog import KIND, SEQ  # noqa: E402
from changelake.connectors.lookup import CacheOptions, Lookup  # noqa: E402
from changelake.operators.lookup_join import LookupJoinConfig, LookupJoiner  # noqa: E402

DIM = {"id": "bigint", "category": "string", "price": "bigint", "name": "string"}


def dimension(keys: int) -> pa.Table:
    ids = np.arange(1, keys + 1, dtype=np.int64)
    return pa.table({"id": ids, "category": pa.array([f"cat{i % 50}" for i in ids]),
                     "price": (ids * 7) % 1000, "name": pa.array([f"product {i}" for i in ids])})


def events(n: int, keys: int, batch: int, seed: int = 6) -> list[pa.Table]:
    rng = np.random.default_rng(seed)
    product = rng.integers(1, int(keys * 1.1) + 1, n, dtype=np.int64)
    kinds = rng.choice(np.array([0, 1, 2, 3], dtype=np.int8), n, p=[0.4, 0.25, 0.25, 0.1])
    table = pa.table({"order_id": np.arange(n, dtype=np.int64), "product_id": product,
                      "qty": rng.integers(1, 10, n, dtype=np.int32), KIND: kinds,
                      SEQ: pa.array([f"{i:012d}" for i in range(n)])})
    return [table.slice(i, batch) for i in range(0, n, batch)]


def run_pass(joiner: LookupJoiner, batches: list[pa.Table]) -> dict:
    rows = out = 0
    started = time.perf_counter()
    for b in batches:
        rows += b.num_rows
        out += joiner.join(b).num_rows
    seconds = time.perf_counter() - started
    stats = joiner.take_stats()
    return {"events": rows, "seconds": seconds, "events_s": rows / seconds, "out": out, "hits": stats.hits,
            "misses": stats.misses, "queries": len(stats.latencies),
            "query_ms_p50": 1000 * float(np.median(stats.latencies)) if stats.latencies else 0.0,
            "cache_rows": stats.cache_rows}


def expected_rows(batches: list[pa.Table], dim: pa.Table) -> int:
    import duckdb

    con = duckdb.connect()
    con.register("e", pa.concat_tables(batches))
    con.register("d", dim)
    n = con.sql("SELECT count(*) FROM e JOIN d ON e.product_id = d.id").fetchall()[0][0]
    con.close()
    return n


def bench_dimension(name: str, lookup: Lookup, batches: list[pa.Table], want: int) -> list[dict]:
    config = LookupJoinConfig(lookup, ("product_id",), ("id",), "INNER", ("id", "category", "price", "name"))
    joiner = LookupJoiner(config)
    try:
        results = []
        for label in ("cold", "warm"):
            r = run_pass(joiner, batches)
            if r["out"] != want:
                raise SystemExit(f"{name} {label}: {r['out']} joined rows, DuckDB says {want}")
            results.append({"dimension": name, "cache": label, **r})
        return results
    finally:
        joiner.close()


def spark_passes(batches: list[pa.Table], dim: pa.Table, want: int, work: Path, cache: CacheOptions) -> list[dict]:
    """The lookup join end to end on Spark (file source -> compile_packed -> foreachBatch, availableNow, a Delta
    dimension): a first query with every worker's cache empty, then a second over the same files with a new
    checkpoint, whose Python workers (reused) hold the keys cached by the first."""
    import pyarrow.parquet as pq
    from deltalake import write_deltalake
    from pyspark.sql.types import StructType

    from bench.common import PeakMemory
    from changelake.plan import Pipeline
    from changelake.spark.compile import compile_packed
    from changelake.spark.session import build_session

    work = work / "spark"
    work.mkdir()
    write_deltalake(str(work / "products"), dim)
    source = work / "orders"
    source.mkdir()
    for i, b in enumerate(batches):
        pq.write_table(b, source / f"part-{i:05d}.parquet")
        os.utime(source / f"part-{i:05d}.parquet", (1_700_000_000 + i,) * 2)   # read in batch order
    p = Pipeline()
    orders = p.source("orders", columns={"order_id": "bigint", "product_id": "bigint", "qty": "int"},
                      primary_key=["order_id"], normalize=False)
    orders.lookup_join(Lookup.delta("products", str(work / "products"), columns=DIM, key=["id"], cache=cache),
                       on={"product_id": "id"}, name="enriched").to_table("enriched", primary_key=["order_id"])
    plan = p.plan()
    results = []
    with PeakMemory() as mem:
        spark = build_session(app_name="bench-lookup", master="local[2]", ui=False, conf={
            "spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.driver.memory": "4g"})
        ddl = "order_id bigint, product_id bigint, qty int, _kind TINYINT, _seq STRING"
        for label in ("cold", "warm"):
            stream = spark.readStream.schema(StructType.fromDDL(ddl)).option("maxFilesPerTrigger", 1) \
                .parquet(str(source))
            packed, _ = compile_packed(plan, {"orders": stream})
            rows = [0]

            def collect(df, batch_id):
                from changelake.spark.payloads import from_ipc

                rows[0] += sum(from_ipc(x).num_rows for x in df.toArrow()["payload"].to_pylist())

            started = time.perf_counter()
            q = (packed.writeStream.foreachBatch(collect).option("checkpointLocation", str(work / f"ckpt-{label}"))
                 .trigger(availableNow=True).start())
            q.awaitTermination()
            seconds = time.perf_counter() - started
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            if rows[0] != want:
                raise SystemExit(f"spark {label}: {rows[0]} joined rows, DuckDB says {want}")
            events_n = sum(b.num_rows for b in batches)
            results.append({"dimension": "delta (Spark)", "cache": label, "events": events_n, "seconds": seconds,
                            "events_s": events_n / seconds, "out": rows[0]})
        spark.stop()
    print(f"Spark peak memory {mem.total_mb:,.0f} MB")
    return results


def lookup_main(args: argparse.Namespace) -> int:
    dims = args.dims.split(",")
    if args.quick:
        args.events, args.keys, args.batch = 100_000, 10_000, 20_000
        if "postgres" in dims and args.pg_url is None:
            from tests.postgres_server import missing

            why = missing()
            if why:
                print(f"postgres: skipped in the quick run: {why}")
                dims.remove("postgres")
    cache = CacheOptions(max_rows=max(args.keys * 2, 1), ttl="1 hour")
    print(f"lookup join: {args.events:,} events over {args.keys:,} dimension keys (ids up to "
          f"{int(args.keys * 1.1):,}), batches of {args.batch:,}; load average {os.getloadavg()[0]:.2f}")
    batches = events(args.events, args.keys, args.batch)
    dim = dimension(args.keys)
    want = expected_rows(batches, dim)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-joins-") as tmp:
        if "delta" in dims:
            from deltalake import write_deltalake

            path = os.path.join(tmp, "products")
            write_deltalake(path, dim)
            lookup = Lookup.delta("products", path, columns=DIM, key=["id"], cache=cache,
                                  batch_size=args.delta_batch_size, max_concurrency=1)
            results += bench_dimension("delta", lookup, batches, want)
        if "postgres" in dims:
            server = None
            url, user, password_env = args.pg_url, None, args.pg_password_env
            if url is None:
                from tests.postgres_server import PostgresServer

                server = PostgresServer.start()
                url, user, password_env = server.url, server.user, "BENCH_PG_PASSWORD"
                os.environ[password_env] = server.password
            try:
                load_postgres(url, user, password_env, dim)
                lookup = Lookup.postgres("products", url, table="bench_products", columns=DIM, key=["id"], user=user,
                                         password_env=password_env, cache=cache, batch_size=args.pg_batch_size,
                                         max_concurrency=args.pg_concurrency)
                results += bench_dimension("postgres", lookup, batches, want)
            finally:
                if server is not None:
                    server.stop()
        if args.spark:
            results += spark_passes(batches, dim, want, Path(tmp), cache)
    print()
    print("| dimension | cache | events/s | seconds | hit rate | lookups (keys) | queries | query p50 ms |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "hits" not in r:          # Spark: its workers' figures go to the metrics, not to this table
            print(f"| {r['dimension']} | {r['cache']} | {r['events_s']:,.0f} | {r['seconds']:.2f} | - | - | - | - |")
            continue
        rate = r["hits"] / max(r["hits"] + r["misses"], 1)
        print(f"| {r['dimension']} | {r['cache']} | {r['events_s']:,.0f} | {r['seconds']:.2f} | {rate:.1%} | "
              f"{r['misses']:,} | {r['queries']:,} | {r['query_ms_p50']:.1f} |")
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")
    return 0


def load_postgres(url: str, user: str | None, password_env: str | None, dim: pa.Table) -> None:
    import psycopg

    from changelake.connectors.lookup import pg_conninfo

    kwargs = pg_conninfo(url)
    if user:
        kwargs["user"] = user
    if password_env:
        kwargs["password"] = os.environ[password_env]
    with psycopg.connect(autocommit=True, **kwargs) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_products")
        conn.execute("CREATE TABLE bench_products (id bigint PRIMARY KEY, category text, price bigint, name text)")
        with conn.cursor().copy("COPY bench_products (id, category, price, name) FROM STDIN") as copy:
            for row in zip(*(dim[c].to_pylist() for c in dim.column_names)):
                copy.write_row(row)
        conn.execute("ANALYZE bench_products")


def interval_main(args) -> int:
    from _interval import run

    figures = run(args.events, args.quick, keys=args.keys, batch=args.batch, buckets=args.buckets,
                  engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()))
    return 0 if all(figures[e]["agrees"] for e in ("local", "spark") if e in figures) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="join", required=True)
    lk = sub.add_parser("lookup", help="lookup join to a Delta and a PostgreSQL dimension, cold and warm cache")
    lk.add_argument("--events", type=int, default=1_000_000)
    lk.add_argument("--keys", type=int, default=100_000, help="dimension rows")
    lk.add_argument("--batch", type=int, default=100_000, help="events per micro-batch")
    lk.add_argument("--quick", action="store_true", help="smoke run: 100,000 events over 10,000 keys; PostgreSQL only where its binaries are")
    lk.add_argument("--dims", default="delta,postgres", help="comma-separated: delta, postgres")
    lk.add_argument("--delta-batch-size", type=int, default=10_000)
    lk.add_argument("--pg-batch-size", type=int, default=1000)
    lk.add_argument("--pg-concurrency", type=int, default=4)
    lk.add_argument("--pg-url", help="an existing server (default: start a throwaway one)")
    lk.add_argument("--pg-password-env", help="environment variable holding --pg-url's password")
    lk.add_argument("--spark", action="store_true", help="also run it end to end on Spark (Delta dimension)")
    lk.set_defaults(run=lookup_main)
    iv = sub.add_parser("interval", help="interval join in-process and on Spark (bench/_interval.py)")
    iv.add_argument("--events", type=int, default=1_000_000)
    iv.add_argument("--keys", type=int, default=None, help="join keys (default: events / 10)")
    iv.add_argument("--batch", type=int, default=None, help="events per micro-batch (default: events / 10)")
    iv.add_argument("--buckets", type=int, default=32, help="state buckets of the join on Spark")
    iv.add_argument("--engines", default="local,spark")
    iv.add_argument("--quick", action="store_true", help="20k events in 4 micro-batches")
    iv.set_defaults(run=interval_main)
    args = ap.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
