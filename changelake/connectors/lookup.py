"""Dimension tables for the lookup join: a spec (:class:`Lookup`) and the sources it opens.

A :class:`LookupSource` answers ``lookup(keys)`` with the rows whose key is among ``keys``
(declared columns, declared types; keys it does not hold are simply absent). The lookup join
(:mod:`changelake.operators.lookup_join`) calls it with at most ``batch_size`` keys at a time,
from up to ``max_concurrency`` threads, after one ``refresh()`` per round of lookups::

    lookups = Lookup.delta("products", "s3://lake/products", columns={"id": "bigint", "category": "string"},
                           key=["id"], cache=CacheOptions(max_rows=100_000, ttl="10 minutes"))
    lookups = Lookup.postgres("products", "jdbc:postgresql://db:5432/shop", table="public.products",
                              columns={...}, key=["id"], user="reader", password_env="SHOP_DB_PASSWORD")

Sources:

* **Delta** (:class:`DeltaLookupSource`): ``refresh()`` loads the table's latest version, so a
  key looked up again (a cache miss or an expired entry) sees the dimension's updates; a lookup
  reads the current files through ``pyarrow.dataset`` with ``isin`` filters on the key columns
  (row groups whose statistics exclude the keys are skipped). Not ``DeltaTable.to_pyarrow_dataset``:
  it makes processes abort at exit with deltalake 1.4-1.6 (ARCHITECTURE.md).
* **PostgreSQL** (:class:`PostgresLookupSource`, psycopg 3): ``WHERE k = ANY(%s)`` for one key
  column, ``WHERE (k1, k2) IN ((%s, %s), ...)`` for several; a small pool of connections, one per
  concurrent query, reused across batches; a broken connection is replaced and the query retried
  ``retries`` times before a :class:`~changelake.errors.LookupSourceError` says what to check.
  ``jdbc:postgresql://`` URLs are accepted as well as ``postgresql://``; the password comes from
  the environment variable ``password_env`` and is never logged.

Declared columns are checked against the table on first use: a missing one is a
:class:`~changelake.errors.ConfigError` naming the lookup, the table and the column.
"""

from __future__ import annotations

import abc
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import parse_qsl, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from changelake.errors import ConfigError, LookupSourceError
from changelake.types import arrow_schema

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheOptions:
    """The lookup cache: at most ``max_rows`` keys (least recently used evicted first), each
    kept for ``ttl`` (a duration, '10 minutes'; None: until evicted). Missing keys are cached
    too. ``max_rows=0`` or a zero ``ttl`` turns the cache off (every key is looked up every batch)."""

    max_rows: int = 100_000
    ttl: str | None = "10 minutes"

    def __post_init__(self) -> None:
        if not isinstance(self.max_rows, int) or isinstance(self.max_rows, bool) or self.max_rows < 0:
            raise ConfigError(f"lookup cache: max_rows must be an integer >= 0, got {self.max_rows!r}")
        self.ttl_s  # validates the duration

    @property
    def ttl_s(self) -> float | None:
        if self.ttl is None:
            return None
        from changelake.durations import parse_duration

        try:
            return parse_duration(self.ttl)
        except ValueError as exc:
            raise ConfigError(f"lookup cache ttl: {exc}") from None

    @property
    def enabled(self) -> bool:
        return self.max_rows > 0 and self.ttl_s != 0

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        return f"LRU {self.max_rows} rows, TTL {self.ttl if self.ttl is not None else 'none'}"


@dataclass(frozen=True)
class DeltaDimension:
    path: str
    storage_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)   # may hold credentials

    def where(self) -> str:
        return f"delta:{self.path}"


@dataclass(frozen=True)
class PostgresDimension:
    url: str = field(repr=False)                 # may hold a password: shown through where()
    table: str
    user: str | None = None
    password_env: str | None = None
    connect_timeout_s: float = 5.0
    retries: int = 3

    def where(self) -> str:
        c = pg_conninfo(self.url)
        return f"postgresql://{c['host']}:{c['port']}/{c['dbname']} table {self.table}"


@dataclass(frozen=True)
class Lookup:
    """A dimension table a stream can look its keys up in (see the module docstring).

    ``columns`` are the columns the join reads (name -> type, as a source's), ``key`` the
    columns it looks up by: a key identifies at most one dimension row. ``batch_size`` keys go
    into one query; ``max_concurrency`` queries run at once.
    """

    name: str
    columns: pa.Schema
    key: tuple[str, ...]
    table: DeltaDimension | PostgresDimension
    cache: CacheOptions = CacheOptions()
    batch_size: int = 1000
    max_concurrency: int = 4

    def __post_init__(self) -> None:
        if not self.key:
            raise ConfigError(f"lookup {self.name!r}: key must name at least one column")
        missing = [k for k in self.key if k not in self.columns.names]
        if missing:
            raise ConfigError(f"lookup {self.name!r}: key column(s) {missing} are not among its columns "
                              f"{self.columns.names}; declare them under columns")
        if self.batch_size < 1 or self.max_concurrency < 1:
            raise ConfigError(f"lookup {self.name!r}: batch_size and max_concurrency must be >= 1, "
                              f"got {self.batch_size} and {self.max_concurrency}")
        if isinstance(self.table, PostgresDimension) and self.batch_size * len(self.key) > 60_000:
            raise ConfigError(f"lookup {self.name!r}: batch_size x key columns must stay under 60,000 "
                              "(PostgreSQL takes at most 65,535 query parameters); lower batch_size")

    @classmethod
    def delta(cls, name: str, path: str, *, columns: Mapping[str, str] | pa.Schema, key: Sequence[str],
              cache: CacheOptions | None = None, batch_size: int = 10_000, max_concurrency: int = 1,
              storage_options: Mapping[str, str] | None = None) -> "Lookup":
        """A Delta table (the embedded default): one scan per ``batch_size`` keys."""
        return cls(name, _schema(columns), tuple(key), DeltaDimension(path, tuple(sorted((storage_options or {}).items()))),
                   cache or CacheOptions(), batch_size, max_concurrency)

    @classmethod
    def postgres(cls, name: str, url: str, *, table: str, columns: Mapping[str, str] | pa.Schema,
                 key: Sequence[str], user: str | None = None, password_env: str | None = None,
                 cache: CacheOptions | None = None, batch_size: int = 1000, max_concurrency: int = 4,
                 connect_timeout_s: float = 5.0, retries: int = 3) -> "Lookup":
        """A PostgreSQL table (``jdbc:postgresql://host:port/db`` or ``postgresql://...``)."""
        pg_conninfo(url)            # validates the URL now, not on first use
        return cls(name, _schema(columns), tuple(key),
                   PostgresDimension(url, table, user, password_env, connect_timeout_s, retries),
                   cache or CacheOptions(), batch_size, max_concurrency)

    def where(self) -> str:
        return self.table.where()

    def open(self) -> "LookupSource":
        if isinstance(self.table, DeltaDimension):
            return DeltaLookupSource(self)
        return PostgresLookupSource(self)


def _schema(columns: Mapping[str, str] | pa.Schema) -> pa.Schema:
    return columns if isinstance(columns, pa.Schema) else arrow_schema(dict(columns))


class LookupSource(abc.ABC):
    """Rows of a dimension table by key. ``lookup`` may be called from several threads at once."""

    def __init__(self, spec: Lookup) -> None:
        self.spec = spec

    def refresh(self) -> None:
        """Called once before each round of lookups (not concurrently with ``lookup``)."""

    @abc.abstractmethod
    def lookup(self, keys: list[tuple]) -> pa.Table:
        """The rows (``spec.columns``) whose key columns equal one of ``keys`` (tuples in ``spec.key`` order)."""

    def close(self) -> None:
        pass

    def _check_columns(self, have: Sequence[str], table: str) -> None:
        missing = [c for c in self.spec.columns.names if c not in have]
        if missing:
            raise ConfigError(f"lookup {self.spec.name!r}: table {table} has no column(s) {missing}; its columns "
                              f"are {list(have)}. Fix lookups[].columns / key (or the table)")


def _key_filter(key: Sequence[str], keys: list[tuple], schema: pa.Schema):
    """An ``isin`` filter per key column: exact for one column, a superset for several."""
    expr = None
    for i, name in enumerate(key):
        values = pa.array(sorted({k[i] for k in keys}), schema.field(name).type)
        term = pc.field(name).isin(values)
        expr = term if expr is None else expr & term
    return expr


def _only(table: pa.Table, key: Sequence[str], keys: list[tuple]) -> pa.Table:
    """The rows of ``table`` whose full key is in ``keys`` (for multi-column keys)."""
    if len(key) == 1 or table.num_rows == 0:
        return table
    wanted = pa.table({name: pa.array([k[i] for k in keys], table.schema.field(name).type)
                       for i, name in enumerate(key)})
    wanted = wanted.append_column("__wanted", pa.array([True] * wanted.num_rows))
    joined = table.join(wanted, keys=list(key), join_type="inner", use_threads=False)
    return joined.select(table.column_names)


class DeltaLookupSource(LookupSource):
    """A Delta table read with ``pyarrow.dataset`` over the files of its latest version."""

    def __init__(self, spec: Lookup) -> None:
        super().__init__(spec)
        self.dim: DeltaDimension = spec.table      # type: ignore[assignment]
        self._table = None
        self._version = -1
        self._dataset = None

    def refresh(self) -> None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self._table is None:
            try:
                self._table = DeltaTable(self.dim.path, storage_options=dict(self.dim.storage_options) or None)
            except TableNotFoundError:
                raise ConfigError(f"lookup {self.spec.name!r}: no Delta table at {self.dim.path!r}; check "
                                  "lookups[].delta.path (and storage options)") from None
        else:
            self._table.update_incremental()
        version = self._table.version()
        if version != self._version:
            self._dataset = self._open_dataset()
            self._version = version

    def _open_dataset(self):
        import pyarrow.dataset as ds

        schema = pa.schema(self._table.schema().to_arrow())
        self._check_columns(schema.names, f"delta:{self.dim.path}")
        partition_cols = self._table.metadata().partition_columns
        partitioning = ds.partitioning(pa.schema([schema.field(c) for c in partition_cols]), flavor="hive") \
            if partition_cols else None
        uris = self._table.file_uris()
        if not uris:
            return None
        return ds.dataset(uris, schema=schema, format="parquet", partitioning=partitioning)

    def lookup(self, keys: list[tuple]) -> pa.Table:
        if self._table is None:
            self.refresh()
        columns = self.spec.columns
        if self._dataset is None or not keys:
            return columns.empty_table()
        stored = self._dataset.schema
        found = self._dataset.to_table(columns=columns.names, filter=_key_filter(self.spec.key, keys, stored),
                                       use_threads=False)
        return _only(found, self.spec.key, keys).cast(columns)


# --- PostgreSQL ----------------------------------------------------------------------------------
#: libpq parameters a URL's query string may carry as they are
_LIBPQ = {"sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "options", "target_session_attrs",
          "connect_timeout", "keepalives", "keepalives_idle", "gssencmode"}


def pg_conninfo(url: str) -> dict[str, Any]:
    """``jdbc:postgresql://host:port/db?...`` or ``postgresql://user@host:port/db?...`` -> psycopg
    connect() keyword arguments (host, port, dbname, and user/password/libpq options in the URL).

    JDBC's ``ssl=true`` becomes ``sslmode=require`` and ``currentSchema=s`` the search path.
    """
    text = url[len("jdbc:"):] if url.startswith("jdbc:") else url
    parts = urlsplit(text)
    if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
        raise ConfigError(f"lookup url {_redact(url)!r}: write jdbc:postgresql://host:port/database or "
                          "postgresql://host:port/database")
    out: dict[str, Any] = {"host": parts.hostname, "port": parts.port or 5432,
                           "dbname": parts.path.lstrip("/") or "postgres"}
    if parts.username:
        out["user"] = parts.username
    if parts.password:
        out["password"] = parts.password
    for k, v in parse_qsl(parts.query):
        if k in ("user", "password"):
            out[k] = v
        elif k == "ssl":
            if v.lower() == "true":
                out["sslmode"] = "require"
        elif k == "currentSchema":
            out["options"] = f"-c search_path={v}"
        elif k in _LIBPQ:
            out[k] = v
        else:
            raise ConfigError(f"lookup url {_redact(url)!r}: unknown parameter {k!r}; the URL may carry user, ssl, "
                              f"currentSchema and the libpq parameters {sorted(_LIBPQ)}")
    return out


def _redact(url: str) -> str:
    parts = urlsplit(url[len("jdbc:"):] if url.startswith("jdbc:") else url)
    if parts.password:
        url = url.replace(f":{parts.password}@", ":***@")
    return url.split("?")[0] if "password=" in url else url


class _Pool:
    """Up to ``size`` connections, each used by one thread at a time and reused across batches."""

    def __init__(self, connect: Callable[[], Any], size: int) -> None:
        self.connect, self.size = connect, size
        self.idle: queue.LifoQueue = queue.LifoQueue()
        self.lock = threading.Lock()
        self.open = 0

    def take(self):
        try:
            return self.idle.get_nowait()
        except queue.Empty:
            pass
        with self.lock:
            grow = self.open < self.size
            if grow:
                self.open += 1
        if not grow:
            return self.idle.get()
        try:
            return self.connect()
        except BaseException:
            with self.lock:
                self.open -= 1
            raise

    def give(self, conn) -> None:
        self.idle.put(conn)

    def discard(self, conn) -> None:
        with self.lock:
            self.open -= 1
        try:
            conn.close()
        except Exception:
            pass

    def close(self) -> None:
        while True:
            try:
                self.discard(self.idle.get_nowait())
            except queue.Empty:
                return


class PostgresLookupSource(LookupSource):
    """A PostgreSQL table, queried with psycopg 3 from a small connection pool."""

    #: seconds before the first reconnect attempt; doubles per attempt
    backoff_s = 0.2

    def __init__(self, spec: Lookup) -> None:
        super().__init__(spec)
        self.dim: PostgresDimension = spec.table    # type: ignore[assignment]
        self.conninfo = pg_conninfo(self.dim.url)
        self.pool = _Pool(self._connect, spec.max_concurrency)
        self._query = None
        self._checked = False
        self._check_lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"{self.conninfo['host']}:{self.conninfo['port']}"

    def _connect(self):
        import psycopg

        kwargs = dict(self.conninfo)
        if self.dim.user:
            kwargs["user"] = self.dim.user
        if self.dim.password_env:
            if self.dim.password_env not in os.environ:
                raise ConfigError(f"lookup {self.spec.name!r}: the environment variable {self.dim.password_env} "
                                  "(password_env) is not set; set it on the driver and the executors")
            kwargs["password"] = os.environ[self.dim.password_env]
        kwargs.setdefault("connect_timeout", max(1, round(self.dim.connect_timeout_s)))
        try:
            return psycopg.connect(autocommit=True, **kwargs)
        except psycopg.OperationalError as exc:
            raise _Unreachable(str(exc).strip()) from None

    def _unreachable(self, reason: str) -> LookupSourceError:
        user = self.dim.user or self.conninfo.get("user") or "(the default user)"
        return LookupSourceError(
            f"lookup {self.spec.name!r}: cannot connect to PostgreSQL at {self.address} (database "
            f"{self.conninfo['dbname']!r}, user {user!r}): {reason}. Check that the server runs and listens "
            "there (listen_addresses, firewall), that pg_hba.conf admits this host and user, and the password in "
            f"{'$' + self.dim.password_env if self.dim.password_env else 'the URL'}")

    def _run(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(connection)`` on a pooled connection; a broken connection is replaced and ``fn`` retried."""
        import psycopg

        attempts = self.dim.retries + 1
        for attempt in range(attempts):
            try:
                conn = self.pool.take()
            except _Unreachable as exc:
                if attempt + 1 == attempts:
                    raise self._unreachable(str(exc)) from None
                time.sleep(self.backoff_s * 2 ** attempt)
                continue
            try:
                result = fn(conn)
            except psycopg.OperationalError as exc:
                self.pool.discard(conn)
                if attempt + 1 == attempts:
                    raise LookupSourceError(
                        f"lookup {self.spec.name!r}: the connection to PostgreSQL at {self.address} broke and "
                        f"{self.dim.retries} reconnect(s) did not help: {str(exc).strip()}. Check the server's "
                        "log and the network between here and the server") from None
                log.warning("lookup %s: connection to %s broke (%s); reconnecting", self.spec.name, self.address,
                            str(exc).strip())
                time.sleep(self.backoff_s * 2 ** attempt)
                continue
            except BaseException:
                if conn.closed or conn.broken:
                    self.pool.discard(conn)
                else:
                    self.pool.give(conn)
                raise
            self.pool.give(conn)
            return result
        raise AssertionError("unreachable")

    def _table_sql(self):
        from psycopg import sql

        return sql.Identifier(*self.dim.table.split("."))

    def _check(self) -> None:
        import psycopg
        from psycopg import sql

        with self._check_lock:
            if self._checked:
                return

            def columns(conn) -> list[str]:
                with conn.cursor() as cur:
                    cur.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(self._table_sql()))
                    return [d.name for d in cur.description]

            try:
                have = self._run(columns)
            except psycopg.errors.UndefinedTable:
                raise ConfigError(f"lookup {self.spec.name!r}: PostgreSQL at {self.address} database "
                                  f"{self.conninfo['dbname']!r} has no table {self.dim.table!r}; check "
                                  "lookups[].postgres.table (schema.table) and the user's search_path") from None
            self._check_columns(have, f"{self.dim.table!r} (PostgreSQL at {self.address})")
            cols = sql.SQL(", ").join(sql.Identifier(c) for c in self.spec.columns.names)
            key = self.spec.key
            if len(key) == 1:
                where = sql.SQL("{} = ANY(%s)").format(sql.Identifier(key[0]))
            else:
                where = sql.SQL("({}) IN ").format(sql.SQL(", ").join(sql.Identifier(k) for k in key))
            self._query = (sql.SQL("SELECT {} FROM {} WHERE ").format(cols, self._table_sql()), where)
            self._checked = True

    def lookup(self, keys: list[tuple]) -> pa.Table:
        from psycopg import sql

        self._check()
        columns = self.spec.columns
        if not keys:
            return columns.empty_table()
        head, where = self._query
        if len(self.spec.key) == 1:
            query, params = head + where, [[k[0] for k in keys]]
        else:
            one = sql.SQL("({})").format(sql.SQL(", ").join([sql.Placeholder()] * len(self.spec.key)))
            query = head + where + sql.SQL("({})").format(sql.SQL(", ").join([one] * len(keys)))
            params = [v for k in keys for v in k]

        def fetch(conn) -> list[tuple]:
            with conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall()

        import psycopg

        try:
            rows = self._run(fetch)
        except (psycopg.errors.UndefinedFunction, psycopg.errors.DataError) as exc:
            raise ConfigError(f"lookup {self.spec.name!r}: PostgreSQL at {self.address} cannot look up "
                              f"{list(self.spec.key)} in {self.dim.table!r} with the declared key type(s) "
                              f"{[str(columns.field(k).type) for k in self.spec.key]}: {str(exc).strip()}. Declare "
                              "the key columns with the table's types") from None
        arrays = []
        for i, f in enumerate(columns):
            try:
                arrays.append(pa.array([r[i] for r in rows], f.type))
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise ConfigError(f"lookup {self.spec.name!r}: column {f.name} of {self.dim.table!r} does not fit "
                                  f"its declared type {f.type}: {exc}. Declare the column with the table's type"
                                  ) from None
        return pa.Table.from_arrays(arrays, schema=columns)

    def close(self) -> None:
        self.pool.close()


class _Unreachable(Exception):
    """A new connection could not be made (kept apart from a broken one)."""
