"""Dimension sources against real tables: a Delta table written with delta-rs, and a PostgreSQL
server started by the ``postgres`` fixture from the OS package's binaries."""

from __future__ import annotations

import decimal
import os

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from changelake.connectors.lookup import CacheOptions, Lookup, pg_conninfo
from changelake.errors import ConfigError, LookupSourceError

COLUMNS = {"id": "bigint", "category": "string", "price": "decimal(10,2)"}


def _rows(table: pa.Table) -> set[tuple]:
    return {tuple(r.values()) for r in table.to_pylist()}


# --- Delta ---------------------------------------------------------------------------------------------
@pytest.mark.unit
def test_delta_lookup_reads_the_latest_version_on_refresh(tmp_path):
    path = str(tmp_path / "products")
    write_deltalake(path, pa.table({"id": pa.array([1, 2, 3], pa.int64()), "category": ["a", "b", "c"],
                                    "extra": [0, 0, 0]}))
    source = Lookup.delta("products", path, columns={"id": "bigint", "category": "string"}, key=["id"]).open()
    source.refresh()
    assert _rows(source.lookup([(1,), (3,), (9,)])) == {(1, "a"), (3, "c")}
    write_deltalake(path, pa.table({"id": pa.array([9], pa.int64()), "category": ["z"], "extra": [1]}), mode="append")
    assert _rows(source.lookup([(9,)])) == set()                  # the version read at the last refresh
    source.refresh()
    assert _rows(source.lookup([(9,)])) == {(9, "z")}


@pytest.mark.unit
def test_delta_lookup_with_a_composite_key(tmp_path):
    path = str(tmp_path / "shops")
    write_deltalake(path, pa.table({"region": ["eu", "eu", "us"], "code": pa.array([1, 2, 1], pa.int32()),
                                    "name": ["Paris", "Rome", "Boston"]}))
    source = Lookup.delta("shops", path, columns={"region": "string", "code": "int", "name": "string"},
                          key=["region", "code"]).open()
    # ("eu", 1) and ("us", 2) are wanted: the isin filters alone would also let ("us", 1) through
    assert _rows(source.lookup([("eu", 1), ("us", 2)])) == {("eu", 1, "Paris")}


@pytest.mark.unit
def test_delta_lookup_names_a_missing_column(tmp_path):
    path = str(tmp_path / "products")
    write_deltalake(path, pa.table({"id": pa.array([1], pa.int64())}))
    source = Lookup.delta("products", path, columns={"id": "bigint", "category": "string"}, key=["id"]).open()
    with pytest.raises(ConfigError, match=r"lookup 'products': table delta:.*products has no column\(s\) \['category'\]"):
        source.refresh()


@pytest.mark.unit
def test_delta_lookup_of_a_missing_table_says_so(tmp_path):
    source = Lookup.delta("products", str(tmp_path / "nope"), columns={"id": "bigint"}, key=["id"]).open()
    with pytest.raises(ConfigError, match="no Delta table at"):
        source.refresh()


# --- PostgreSQL -----------------------------------------------------------------------------------------
@pytest.mark.unit
def test_jdbc_and_libpq_urls_are_read():
    assert pg_conninfo("jdbc:postgresql://db.example:6543/shop?ssl=true&currentSchema=dim") == {
        "host": "db.example", "port": 6543, "dbname": "shop", "sslmode": "require", "options": "-c search_path=dim"}
    assert pg_conninfo("postgresql://reader@db/shop") == {"host": "db", "port": 5432, "dbname": "shop",
                                                          "user": "reader"}
    with pytest.raises(ConfigError, match="unknown parameter 'loginTimeout'"):
        pg_conninfo("jdbc:postgresql://db/shop?loginTimeout=3")
    with pytest.raises(ConfigError, match="write jdbc:postgresql://host:port/database") as err:
        pg_conninfo("mysql://u:secret@db/shop")
    assert "secret" not in str(err.value)


@pytest.fixture
def products(postgres):
    postgres.execute("DROP TABLE IF EXISTS products",
                     "CREATE TABLE products (id bigint PRIMARY KEY, category text, price numeric(10,2), note text)",
                     "INSERT INTO products SELECT i, 'c' || (i % 3), i * 1.5, 'n' FROM generate_series(1, 50) i",
                     "DROP TABLE IF EXISTS shops",
                     "CREATE TABLE shops (region text, code int, name text, PRIMARY KEY (region, code))",
                     "INSERT INTO shops VALUES ('eu', 1, 'Paris'), ('eu', 2, 'Rome'), ('us', 1, 'Boston')")
    return postgres


def pg_lookup(server, **kw) -> Lookup:
    os.environ["CHANGELAKE_TEST_PG_PASSWORD"] = server.password
    kw.setdefault("columns", COLUMNS)
    kw.setdefault("key", ["id"])
    return Lookup.postgres(kw.pop("name", "products"), kw.pop("url", server.url), table=kw.pop("table", "products"),
                           user=server.user, password_env="CHANGELAKE_TEST_PG_PASSWORD", **kw)


@pytest.mark.postgres
def test_postgres_lookup_returns_the_rows_of_the_keys_it_has(products):
    source = pg_lookup(products).open()
    try:
        got = source.lookup([(1,), (2,), (77,)])
        assert got.schema == pa.schema([("id", pa.int64()), ("category", pa.string()),
                                        ("price", pa.decimal128(10, 2))])
        assert _rows(got) == {(1, "c1", decimal.Decimal("1.50")), (2, "c2", decimal.Decimal("3.00"))}
        assert source.lookup([(404,)]).num_rows == 0
    finally:
        source.close()


@pytest.mark.postgres
def test_postgres_lookup_with_a_composite_key_and_a_schema_qualified_table(products):
    source = pg_lookup(products, name="shops", table="public.shops", key=["region", "code"],
                       columns={"region": "string", "code": "int", "name": "string"}).open()
    try:
        assert _rows(source.lookup([("eu", 1), ("us", 2), ("us", 1)])) == {("eu", 1, "Paris"), ("us", 1, "Boston")}
    finally:
        source.close()


@pytest.mark.postgres
def test_postgres_queries_run_concurrently_on_pooled_connections(products):
    from changelake.operators.lookup_join import LookupJoinConfig, LookupJoiner

    lookup = pg_lookup(products, batch_size=4, max_concurrency=3, cache=CacheOptions(max_rows=0))
    joiner = LookupJoiner(LookupJoinConfig(lookup, ("pid",), ("id",), "LEFT", lookup.columns.names))
    try:
        for _ in range(3):
            batch = pa.table({"pid": pa.array(range(1, 31), pa.int64()), "_kind": pa.array([0] * 30, pa.int8())})
            out = joiner.join(batch)
            assert out["category"].to_pylist() == [f"c{i % 3}" for i in range(1, 31)]
        stats = joiner.take_stats()
        assert (stats.misses, len(stats.latencies)) == (90, 24)          # 30 keys in 8 queries, 3 times
        assert joiner.source.pool.open <= 3                              # connections reused across batches
    finally:
        joiner.close()


@pytest.mark.postgres
def test_postgres_lookup_names_a_missing_column(products):
    source = pg_lookup(products, columns={"id": "bigint", "colour": "string"}).open()
    with pytest.raises(ConfigError, match=r"lookup 'products': table 'products' \(PostgreSQL at 127\.0\.0\.1:\d+\) "
                                          r"has no column\(s\) \['colour'\]"):
        source.lookup([(1,)])
    source.close()


@pytest.mark.postgres
def test_postgres_lookup_names_a_missing_table(products):
    source = pg_lookup(products, table="nope").open()
    with pytest.raises(ConfigError, match="has no table 'nope'"):
        source.lookup([(1,)])
    source.close()


@pytest.mark.postgres
def test_postgres_reconnects_after_the_server_closed_the_connection(products):
    source = pg_lookup(products).open()
    try:
        assert source.lookup([(1,)]).num_rows == 1
        products.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE usename = 'postgres' AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
        assert source.lookup([(2,)]).num_rows == 1
    finally:
        source.close()


@pytest.mark.unit
def test_an_unreachable_server_is_named_with_what_to_check(monkeypatch):
    import socket

    with socket.socket() as s:                      # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DIM_PASSWORD", "hunter2")
    lookup = Lookup.postgres("products", f"jdbc:postgresql://127.0.0.1:{port}/shop", table="products",
                             columns={"id": "bigint"}, key=["id"], user="reader", password_env="DIM_PASSWORD",
                             retries=1)
    source = lookup.open()
    source.backoff_s = 0.01
    with pytest.raises(LookupSourceError) as err:
        source.lookup([(1,)])
    text = str(err.value)
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}" in text and "pg_hba.conf" in text
    assert "$DIM_PASSWORD" in text and "hunter2" not in text


@pytest.mark.unit
def test_an_unset_password_variable_is_named(monkeypatch):
    monkeypatch.delenv("NO_SUCH_PASSWORD", raising=False)
    lookup = Lookup.postgres("products", "postgresql://127.0.0.1:1/shop", table="products",
                             columns={"id": "bigint"}, key=["id"], password_env="NO_SUCH_PASSWORD")
    with pytest.raises(ConfigError, match="NO_SUCH_PASSWORD"):
        lookup.open().lookup([(1,)])


@pytest.mark.postgres
def test_postgres_lookup_names_declared_types_that_do_not_fit(products):
    source = pg_lookup(products, columns={"id": "string", "category": "string"}).open()
    with pytest.raises(ConfigError, match="column id of 'products' does not fit its declared type string"):
        source.lookup([("1",)])
    source.close()
    source = pg_lookup(products, columns={"id": "bigint", "category": "bigint"}).open()
    with pytest.raises(ConfigError, match="column category of 'products' does not fit its declared type int64"):
        source.lookup([(1,)])
    source.close()
