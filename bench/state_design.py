"""State-design benchmark (issue 4): GROUP BY category COUNT(*), SUM(price) with retraction.

One generated input, four designs, one run::

    nice -n 19 /tmp/venv/bin/python bench/state_design.py [--events 1000000] [--keys 200000]
        [--buckets 8,32,128] [--normalize-buckets 32,128] [--per-key-files 2]
        [--flink-python /tmp/venv-flink/bin/python] [--skip pyflink,jvm,bucketed,normalize,per-key]
    python bench/state_design.py --quick    # smoke run: 20,000 events, 4,000 keys, one bucket count each

Input: ``--events`` Debezium-style change events over ``--keys`` product ids (9 categories,
integer prices in cents). Per event a random id is drawn: absent -> insert; present -> update
(90%; 20% of updates move the product to another category) or delete (10%). Written once as
changelog parquet files (``+I`` / ``-U``+``+U`` / ``-D``, with ``_seq``) for Spark and as
Debezium JSON lines for PyFlink.

Designs:

* ``bucketed-B``: :func:`changelake.spark.binding.apply_kernel` with the
  GroupAggregate kernel (mini-batch, vectorised) keyed by category, B buckets.
* ``jvm-signed``: Spark's own streaming aggregation ``groupBy(category).agg(sum(sign),
  sum(sign * price))``, RocksDB state, Update mode.
* ``per-key-row``: ``groupBy(category).transformWithState`` (Row API), one ValueState
  (count, sum) per group key, rows folded in Python one by one; on the first ``--per-key-files``
  of the 10 parquet files only.
* ``normalize``: not the GROUP BY, for contrast: a keep-last Deduplicate keyed by product id
  (ChangelogNormalize, 200k keys of state) through the same binding; its final rows, summed per
  category, must give the same result.
* ``pyflink``: Flink SQL 2.3 in a subprocess (filesystem source, debezium-json, parallelism 2),
  once into a blackhole sink (timed) and once into a print sink (results, not timed).

Each Spark design runs as an availableNow query over the 10 parquet files (5 per micro-batch),
timed from ``start()`` to the end (query start included, as for Flink's job start). Final
results (category -> count, sum) are compared with a direct fold of the generated data; the run
fails when one differs.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import machine, run_python_job, skip_pyflink
from changelake.changelog import KIND, SEQ

CATEGORIES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"]
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
FILES = 10
FILES_PER_BATCH = 5  # two micro-batches over the whole input: state carries over from the first
SPARK_SCHEMA = "id BIGINT, category STRING, price BIGINT, _kind TINYINT, _seq STRING"


# -- data -----------------------------------------------------------------------------------------
def generate(events: int, keys: int, seed: int = 11):
    """Yields (op, before, after) with rows as (id, category, price)."""
    rng = random.Random(seed)
    current: dict[int, tuple] = {}
    for _ in range(events):
        k = rng.randrange(keys)
        pre = current.get(k)
        if pre is None:
            row = (k, rng.choice(CATEGORIES), rng.randrange(100, 100_000))
            current[k] = row
            yield "c", None, row
        elif rng.random() < 0.9:
            cat = rng.choice(CATEGORIES) if rng.random() < 0.2 else pre[1]
            row = (k, cat, rng.randrange(100, 100_000))
            current[k] = row
            yield "u", pre, row
        else:
            del current[k]
            yield "d", pre, None


def write_inputs(events: int, keys: int, root: Path) -> dict:
    """Changelog parquet files (root/changelog) and Debezium JSON lines (root/debezium/...)."""
    cl_dir, dbz_dir = root / "changelog", root / "debezium"
    cl_dir.mkdir(parents=True)
    dbz_dir.mkdir()
    cols = {"id": [], "category": [], "price": [], KIND: [], SEQ: []}
    ops = {"c": 0, "u": 0, "d": 0}
    per_file = -(-events // FILES)
    expected: dict[str, list[int]] = {}
    file_no = 0
    with open(dbz_dir / "products.json", "w") as dbz:
        for i, (op, before, after) in enumerate(generate(events, keys)):
            ops[op] += 1
            seq = f"e{i:012d}"
            for kind, row in (((0, after),) if op == "c" else ((1, before), (2, after)) if op == "u"
                              else ((3, before),)):
                cols["id"].append(row[0])
                cols["category"].append(row[1])
                cols["price"].append(row[2])
                cols[KIND].append(kind)
                cols[SEQ].append(seq)
                acc = expected.setdefault(row[1], [0, 0])
                sign = 1 if kind in (0, 2) else -1
                acc[0] += sign
                acc[1] += sign * row[2]
            dbz.write(json.dumps({
                "before": None if before is None else dict(zip(("id", "category", "price"), before)),
                "after": None if after is None else dict(zip(("id", "category", "price"), after)),
                "op": op, "ts_ms": 1_700_000_000_000 + i}) + "\n")
            if (i + 1) % per_file == 0 or i + 1 == events:
                table = pa.table({**{k: cols[k] for k in ("id", "category", "price")},
                                  KIND: pa.array(cols[KIND], pa.int8()), SEQ: cols[SEQ]})
                pq.write_table(table, cl_dir / f"part-{file_no:03d}.parquet")
                file_no += 1
                cols = {k: [] for k in cols}
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in cl_dir.iterdir())
    return {"ops": ops, "changelog_rows": rows, "expected": {k: tuple(v) for k, v in expected.items() if v[0]}}


# -- Spark designs -----------------------------------------------------------------------------
def _source(spark, root: Path, limit_files: int | None = None):
    src = root / "changelog"
    if limit_files is not None:
        src = root / f"changelog-{limit_files}"
        if not src.exists():
            src.mkdir()
            for p in sorted((root / "changelog").iterdir())[:limit_files]:
                shutil.copy(p, src / p.name)
    return spark.readStream.schema(SPARK_SCHEMA).option("maxFilesPerTrigger", FILES_PER_BATCH).parquet(str(src))


def _timed(query_df, mode: str, ckpt: Path, collect) -> float:
    start = time.perf_counter()
    q = (query_df.writeStream.outputMode(mode).foreachBatch(collect)
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return time.perf_counter() - start


def _apply_changelog(result: dict, rows) -> None:
    for r in rows:
        kind = r[KIND]
        if kind in (0, 2):
            result[r["category"]] = (r["cnt"], r["total"])
        elif kind == 3:
            result.pop(r["category"], None)


def run_bucketed(spark, root: Path, work: Path, buckets: int) -> tuple[float, dict]:
    from pyspark.sql.types import StructType

    from changelake.operators import AggCall, GroupAggregate, GroupAggregateConfig
    from changelake.spark.binding import apply_kernel

    config = GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("COUNT"), AggCall("SUM", 1)),
                                  mini_batch_size=1 << 20)
    out_schema = StructType.fromDDL("category STRING, cnt BIGINT, total BIGINT")
    df = _source(spark, root).select("category", "price", KIND, SEQ)
    out = apply_kernel(df, GroupAggregate, config, key_columns=["category"], output_schema=out_schema,
                       buckets=buckets)
    result: dict = {}
    secs = _timed(out, "append", work / f"ckpt-bucketed-{buckets}",
                  lambda d, _: _apply_changelog(result, d.collect()))
    return secs, result


def run_bucketed_normalize(spark, root: Path, work: Path, buckets: int) -> tuple[float, dict]:
    """Keep-last Deduplicate keyed by product id (ChangelogNormalize): 200k keys of state."""
    from pyspark.sql.types import StructType

    from changelake.operators import Deduplicate, DeduplicateConfig
    from changelake.spark.binding import apply_kernel

    config = DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False, mini_batch_size=1 << 20)
    out_schema = StructType.fromDDL("id BIGINT, category STRING, price BIGINT")
    out = apply_kernel(_source(spark, root), Deduplicate, config, key_columns=["id"], output_schema=out_schema,
                       buckets=buckets)
    rows: dict = {}

    def collect(d, _):  # the driver replays the output changelog (included in the time)
        t = d.toArrow()
        for i, cat, price, kind in zip(*(t.column(c).to_pylist() for c in ("id", "category", "price", KIND))):
            if kind in (0, 2):
                rows[i] = (cat, price)
            elif kind == 3:
                rows.pop(i, None)

    secs = _timed(out, "append", work / f"ckpt-normalize-{buckets}", collect)
    result: dict = {}
    for cat, price in rows.values():
        a = result.setdefault(cat, [0, 0])
        a[0] += 1
        a[1] += price
    return secs, {k: tuple(v) for k, v in result.items()}


def run_jvm_signed(spark, root: Path, work: Path) -> tuple[float, dict]:
    from pyspark.sql import functions as F

    df = _source(spark, root)
    sign = F.when(F.col(KIND).isin(0, 2), F.lit(1)).otherwise(F.lit(-1)).cast("bigint")
    agg = (df.withColumn("sign", sign).groupBy("category")
           .agg(F.sum("sign").alias("cnt"), F.sum(F.col("sign") * F.col("price")).alias("total")))
    result: dict = {}

    def collect(d, _):
        for r in d.collect():
            result[r["category"]] = (r["cnt"], r["total"])

    secs = _timed(agg, "update", work / "ckpt-jvm", collect)
    return secs, {k: v for k, v in result.items() if v[0]}


def _per_key_processor():
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class SignedSum(StatefulProcessor):
        def init(self, handle) -> None:
            self.acc = handle.getValueState("acc", "cnt BIGINT, total BIGINT")

        def handleInputRows(self, key, rows, timerValues):
            cnt, total = self.acc.get() if self.acc.exists() else (0, 0)
            for r in rows:
                s = 1 if r[KIND] in (0, 2) else -1
                cnt += s
                total += s * r["price"]
            self.acc.update((cnt, total))
            yield Row(category=key[0], cnt=cnt, total=total, _kind=2 if cnt else 3)

        def close(self) -> None:
            pass

    return SignedSum()


def run_per_key(spark, root: Path, work: Path, files: int) -> tuple[float, dict]:
    df = _source(spark, root, files).select("category", "price", KIND)
    out = df.groupBy("category").transformWithState(
        statefulProcessor=_per_key_processor(),
        outputStructType="category STRING, cnt BIGINT, total BIGINT, _kind TINYINT",
        outputMode="Update", timeMode="None")
    result: dict = {}
    secs = _timed(out, "update", work / "ckpt-per-key", lambda d, _: _apply_changelog(result, d.collect()))
    return secs, result


def expected_prefix(root: Path, files: int) -> dict:
    acc: dict = {}
    for p in sorted((root / "changelog").iterdir())[:files]:
        t = pq.read_table(p).to_pydict()
        for cat, price, kind in zip(t["category"], t["price"], t[KIND]):
            s = 1 if kind in (0, 2) else -1
            a = acc.setdefault(cat, [0, 0])
            a[0] += s
            a[1] += s * price
    return {k: tuple(v) for k, v in acc.items() if v[0]}


# -- PyFlink ---------------------------------------------------------------------------------------
FLINK_JOB = r'''
import sys, time
from pyflink.table import EnvironmentSettings, TableEnvironment
path, sink = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
env.get_config().set("parallelism.default", "2")
env.execute_sql(f"""CREATE TABLE products (id BIGINT, category STRING, price BIGINT)
  WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'debezium-json')""")
if sink == "blackhole":
    env.execute_sql("CREATE TABLE out_t (category STRING, cnt BIGINT, total BIGINT) WITH ('connector' = 'blackhole')")
    env.execute_sql("INSERT INTO out_t SELECT category, COUNT(*), SUM(price) FROM products GROUP BY category").wait()
    print("SECONDS", time.perf_counter() - t0)
else:
    # untimed result run (mini-batch on, see bench/pyflink_ops_job.py)
    sys.path.insert(0, "@BENCH@")
    from pyflink_ops_job import collect_final
    final = collect_final(env, "SELECT category, COUNT(*), SUM(price) FROM products GROUP BY category")
    for k, v in sorted(final.items()):
        print("RESULT", k, v[0], v[1])
'''


def run_pyflink(python: str, root: Path, work: Path) -> tuple[float, float, dict]:
    job = work / "flink_job.py"
    job.write_text(FLINK_JOB.replace("@BENCH@", str(Path(__file__).resolve().parent)))
    path = str(root / "debezium")
    done = run_python_job(python, job, [path, "blackhole"])
    wall = done.seconds
    inner = float(next(l.split()[1] for l in done.stdout.splitlines() if l.startswith("SECONDS")))
    print(f"pyflink blackhole run: {wall:.1f}s wall ({inner:.1f}s in the job)", flush=True)
    res = run_python_job(python, job, [path, "print"])
    result = {}
    for line in res.stdout.splitlines():
        if line.startswith("RESULT"):
            _, k, c, s = line.split()
            result[k] = (int(c), int(s))
    return wall, inner, result


# -- main ---------------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--buckets", default="8,32,128")
    ap.add_argument("--per-key-files", type=int, default=2, help="parquet files (of 10) for per-key-row")
    ap.add_argument("--flink-python", default="/tmp/venv-flink/bin/python")
    ap.add_argument("--normalize-buckets", default="32,128")
    ap.add_argument("--skip", default="",
                    help="comma list of designs to skip: bucketed,jvm,normalize,per-key,pyflink")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20,000 events over 4,000 keys, B=8 only, per-key on 1 file; PyFlink only "
                         "where installed")
    args = ap.parse_args()
    if args.quick:
        args.events, args.keys, args.buckets, args.normalize_buckets, args.per_key_files = 20_000, 4_000, "8", "8", 1
    skip = set(filter(None, args.skip.split(",")))
    if skip_pyflink(args.flink_python, quick=args.quick, skipped="pyflink" in skip):
        skip.add("pyflink")

    work = Path(tempfile.mkdtemp(prefix="changelake-state-design-"))
    print(f"machine: {machine()}; work dir {work}")
    t = time.perf_counter()
    info = write_inputs(args.events, args.keys, work / "data")
    print(f"generated {args.events:,} events ({info['ops']}), {info['changelog_rows']:,} changelog rows "
          f"in {time.perf_counter() - t:.1f}s")
    expected = info["expected"]
    figures: list[tuple[str, int, float, bool]] = []

    flink_eps = None
    if "pyflink" not in skip:
        wall, inner, res = run_pyflink(args.flink_python, work / "data", work)
        flink_eps = args.events / wall
        figures.append(("pyflink (p=2, blackhole)", args.events, wall, res == expected))
        print(f"pyflink: {wall:.1f}s wall incl. JVM start ({inner:.1f}s in job) -> {flink_eps:,.0f} events/s; "
              f"results agree: {res == expected}")

    from changelake.spark.session import build_session
    spark = build_session(app_name="state-design", master="local[2]", ui=False, conf={
        "spark.sql.shuffle.partitions": "2", "spark.sql.streaming.stateStore.providerClass": ROCKSDB,
        "spark.driver.memory": "4g"})

    def report(name: str, events: int, secs: float, res: dict, want: dict) -> None:
        ok = res == want
        figures.append((name, events, secs, ok))
        ratio = f"; {events / secs / flink_eps:.2f}x pyflink" if flink_eps else ""
        print(f"{name}: {events:,} events in {secs:.1f}s -> {events / secs:,.0f} events/s{ratio}; "
              f"results agree: {ok}" + ("" if ok else f"\n  got {sorted(res.items())}\n  want {sorted(want.items())}"),
              flush=True)

    if "jvm" not in skip:
        secs, res = run_jvm_signed(spark, work / "data", work)
        report("jvm-signed (RocksDB)", args.events, secs, res, expected)
    if "bucketed" not in skip:
        for b in (int(x) for x in args.buckets.split(",")):
            secs, res = run_bucketed(spark, work / "data", work, b)
            report(f"bucketed kernel B={b}", args.events, secs, res, expected)
    if "normalize" not in skip:
        for b in (int(x) for x in args.normalize_buckets.split(",")):
            secs, res = run_bucketed_normalize(spark, work / "data", work, b)
            report(f"normalize by id (keep-last Deduplicate, {args.keys:,} keys) bucketed B={b}", args.events, secs,
                   res, expected)
    if "per-key" not in skip:
        n = args.per_key_files
        secs, res = run_per_key(spark, work / "data", work, n)
        events = min(args.events, -(-args.events // FILES) * n)
        report(f"per-key transformWithState Row API ({n} of {FILES} files)", events, secs, res,
               expected_prefix(work / "data", n))
    spark.stop()
    print("\n| design | events | seconds | events/s | vs PyFlink | results agree |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, events, secs, ok in figures:
        ratio = f"{events / secs / flink_eps:.2f}x" if flink_eps else "-"
        print(f"| {name} | {events:,} | {secs:.1f} | {events / secs:,.0f} | {ratio} | {ok} |")
    shutil.rmtree(work, ignore_errors=True)
    wrong = [name for name, _, _, ok in figures if not ok]
    if wrong:
        raise SystemExit(f"results differ from the direct fold of the data: {wrong}")


if __name__ == "__main__":
    main()
