"""Debezium Avro in the Confluent wire format (Flink format ``debezium-avro-confluent``).

Each message is ``0x00`` (magic byte), a 4-byte big-endian schema id, then the
Avro binary body written with that schema. Writer schemas are fetched once per
id through ``confluent_kafka.schema_registry.SchemaRegistryClient`` (or an
injected ``schema_lookup``, e.g. in tests) and parsed once; the op rules are
those of Debezium JSON (:mod:`changelake.formats.debezium`).

A schema id the registry does not know is a ``malformed`` dead letter; a
registry that cannot be reached raises :class:`~changelake.errors.SourceError`
(the data is fine, the batch must be retried).

Schema evolution, when the columns come from the writer schemas (no ``columns``
declared). Before a batch is decoded, every writer schema it uses is read: the
decoder reads with every column seen so far (a dropped one reads null), a widened
type with its new type, then the new columns (:func:`~changelake.formats.assemble.evolve_specs`),
and lists the batch's writer schemas as columns in ``source_schemas`` (each record's in
``record_schemas``, so that the table follows the schema of the newest position). What the table
does with them (add, widen, drop, keep, quarantine) is its ``schema_change`` behaviour
(:mod:`changelake.connectors.delta_sink_schema`), applied by the pipeline.
"""

from __future__ import annotations

import io
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import fastavro
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import SecretStr

from changelake.errors import ConfigError, SourceError
from changelake.formats import debezium as dbz
from changelake.formats import debezium_avro_bulk as bulk
from changelake.formats.assemble import (ChangeCollector, ColumnSpec, MetaColumn, Reject, evolve_specs, gc_paused,
                                         infer_columns,
                                         SchemaMixin, merge_results)
from changelake.formats.base import DecodeResult
from changelake.formats.encodings import column_spec
from changelake.formats.debezium_bulk import present_values
from changelake.formats.options import Option, parse_options

FORMAT = "debezium-avro-confluent"

#: metadata keys readable from Avro (the JSON envelope's 'schema' has no Avro counterpart)
METADATA_TYPES = {k: v for k, v in dbz.METADATA_TYPES.items() if k != "schema"}

SchemaLookup = Callable[[int], "str | dict"]

#: messages per chunk: a bad message sends at most one chunk down the per-message path
CHUNK = 8192
_BULK_META = {"ingestion-timestamp", "source.timestamp", "source.database", "source.schema", "source.table"}


def option_specs() -> list[Option]:
    return [
        Option("url", "text", None, doc="Schema Registry URL (required unless a schema_lookup is injected)"),
        Option("subject", "text", None, doc="accepted for Flink compatibility; decoding uses the id in each message"),
        Option("basic-auth.user-info", "secret", None, doc="user:password for the registry (never printed)"),
        Option("bearer-auth.token", "secret", None, doc="a static bearer token for the registry (never printed)"),
        Option("bearer-auth.logical-cluster", "text", None,
               doc="Confluent Cloud's logical cluster id of the registry (header target-sr-cluster), with a token"),
        Option("bearer-auth.identity-pool-id", "text", None, doc="Confluent Cloud's identity pool id, with a token"),
        Option("ssl.ca.location", "text", None, doc="PEM file of the CA(s) that signed an https registry's certificate"),
        Option("ssl.certificate.location", "text", None, doc="PEM client certificate (mutual TLS)"),
        Option("ssl.key.location", "text", None, doc="PEM private key of the client certificate"),
        Option("ssl.key.password", "secret", None, doc="password of the client key (never printed)"),
        Option("key", "names", ()),
        *dbz.debezium_options(),
        Option("metadata", "metadata", (), tuple(METADATA_TYPES)),
    ]


class DebeziumAvroDecoder(SchemaMixin):
    """Decodes Confluent-framed Debezium Avro change events."""

    format_name = FORMAT

    def __init__(self, *, columns: pa.Schema | None = None, options: Mapping[str, Any] | None = None,
                 schema_lookup: SchemaLookup | None = None) -> None:
        opts = parse_options(FORMAT, options, option_specs())
        self.url: str | None = opts["url"]
        self.subject: str | None = opts["subject"]
        self.upsert: bool = opts["upsert"]
        self.on_truncate: str = opts["on_truncate"]
        self.metadata: tuple[tuple[str, str], ...] = opts["metadata"]
        self._user_info: SecretStr | None = opts["basic_auth_user_info"]
        self._client_conf = _client_settings(opts)
        if schema_lookup is None and not self.url:
            raise ConfigError("format 'debezium-avro-confluent' needs option 'url' (the Schema Registry URL)")
        if self.url and any(k.startswith("ssl.") for k in self._client_conf) and \
                not self.url.lower().startswith("https://"):
            raise ConfigError(f"format 'debezium-avro-confluent': ssl.* options are set but url {self.url!r} is not "
                              "https://; use the registry's https URL")
        self._lookup = schema_lookup
        self._client = None
        self._schemas: dict[int, Any] = {}           # schema id -> parsed writer schema
        self._columns_by_id: dict[int, dict[str, ColumnSpec]] = {}
        self._raw: dict[int, Any] = {}               # schema id -> registered schema as JSON data
        self._framed: dict[int, bytes] = {}          # schema id -> bulk container schema
        self._declared = columns
        self._specs = [column_spec(f) for f in columns] if columns is not None else None
        self._meta = [MetaColumn(k, c, METADATA_TYPES[k]) for k, c in self.metadata]
        self._key = opts["key"]
        #: the distinct writer schemas (as user columns) of the last decoded batch, in order of appearance
        self.source_schemas: list[pa.Schema] = []
        #: per record of the last decoded batch: the index of its writer schema in ``source_schemas`` (null: none)
        self.record_schemas: pa.Array | None = None

    def __getstate__(self) -> dict:
        # the registry client holds connections: executors create their own
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    # --- schemas -----------------------------------------------------------------------

    def registered_schema(self, schema_id: int) -> Any:
        """The schema registered under ``schema_id`` as JSON data (fetched once)."""
        raw = self._raw.get(schema_id)
        if raw is None:
            text = self._fetch(schema_id)
            raw = self._raw[schema_id] = orjson.loads(text) if isinstance(text, (str, bytes)) else text
        return raw

    def _writer_schema(self, schema_id: int) -> Any:
        parsed = self._schemas.get(schema_id)
        if parsed is None:
            raw = self.registered_schema(schema_id)
            parsed = fastavro.parse_schema(raw)
            self._schemas[schema_id] = parsed
            columns = self._columns_by_id[schema_id] = _row_columns(raw)
            if self._declared is None and columns:
                self._specs = evolve_specs(self._specs or [], list(columns.values()))
        return parsed

    def _fetch(self, schema_id: int) -> Any:
        if self._lookup is not None:
            try:
                return self._lookup(schema_id)
            except KeyError:
                raise Reject("malformed", f"schema id {schema_id} is unknown to the schema lookup") from None
        from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError
        if self._client is None:
            conf = {"url": self.url}
            if self._user_info:
                conf["basic.auth.user.info"] = self._user_info.get_secret_value()
            conf.update({k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in self._client_conf.items()})
            try:
                self._client = SchemaRegistryClient(conf)
            except ssl.SSLError as exc:        # a subclass of OSError: first
                raise ConfigError(f"format 'debezium-avro-confluent': the Schema Registry client's TLS files are not "
                                  f"usable ({exc.reason or exc}): ssl.certificate.location and ssl.key.location must be "
                                  "a matching PEM certificate and key (ssl.key.password for an encrypted key)") from None
            except OSError as exc:     # a CA, certificate or key file that cannot be read (the path, not a secret)
                raise ConfigError(f"format 'debezium-avro-confluent': cannot read a TLS file of the Schema Registry "
                                  f"client: {exc.strerror or exc} ({exc.filename or 'ssl.* options'}); fix the "
                                  "ssl.ca.location / ssl.certificate.location / ssl.key.location option") from None
        try:
            return self._client.get_schema(schema_id).schema_str
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise Reject("malformed", f"schema id {schema_id} is not in the Schema Registry at {self.url}; "
                                          f"the message was written against another registry") from None
            if exc.http_status_code in (401, 403):
                raise SourceError(f"Schema Registry at {self.url} refused the credentials (HTTP {exc.http_status_code}) "
                                  f"for schema id {schema_id}: check basic-auth.user-info or bearer-auth.token") from exc
            raise SourceError(f"Schema Registry at {self.url} failed for schema id {schema_id}: {exc}") from exc
        except Exception as exc:  # connection problems: not the message's fault, retry the batch
            raise SourceError(f"Schema Registry at {self.url} unreachable ({exc}); the batch will be retried") from exc

    # --- decoding ----------------------------------------------------------------------

    def decode(self, records: pa.Table) -> DecodeResult:
        """Healthy chunks of one writer schema go through the bulk path (when polars is
        installed); the others, message by message through fastavro."""
        with gc_paused():
            self.record_schemas = self._read_writer_schemas(records)
            results = []
            for start in range(0, max(records.num_rows, 1), CHUNK):
                chunk = records.slice(start, CHUNK)
                result = self._bulk(chunk) if bulk.AVAILABLE else None
                results.append(result if result is not None else self._decode(chunk))
            return merge_results(results)

    def _read_writer_schemas(self, records: pa.Table) -> pa.Array:
        """Fetch every writer schema the batch uses before decoding it, so that the whole batch is read
        with the evolved columns (or quarantined). Returns each record's writer schema as an index into
        ``source_schemas`` (null: none known)."""
        self.source_schemas = []
        heads = pc.binary_slice(records.column("value"), 0, 5).combine_chunks()
        unique = pc.unique(heads)
        index: list[int | None] = []
        for head in unique.to_pylist():   # in order of first appearance
            index.append(None)
            if not (head and len(head) == 5 and head[0] == 0):
                continue
            schema_id = int.from_bytes(head[1:5], "big")
            try:
                self._writer_schema(schema_id)
            except Reject:   # an unknown schema id: its messages become dead letters
                continue
            columns = self._columns_by_id.get(schema_id)
            if columns:
                schema = pa.schema([pa.field(c.name, c.type) for c in columns.values()])
                found = next((i for i, s in enumerate(self.source_schemas) if schema.equals(s)), None)
                if found is None:
                    found = len(self.source_schemas)
                    self.source_schemas.append(schema)
                index[-1] = found
        return pa.array(index, pa.int32()).take(pc.index_in(heads, unique))

    def _bulk(self, chunk: pa.Table) -> DecodeResult | None:
        values = chunk.column("value").combine_chunks()
        idx = present_values(values)
        if len(idx) == 0:
            return None
        bodies = values.take(pa.array(idx)).to_pylist()
        header = bodies[0][:5]
        if len(header) < 5 or header[0] != 0 or not all(b[:5] == header for b in bodies):
            return None   # mixed schema ids or not Confluent-framed: message by message
        schema_id = int.from_bytes(header[1:5], "big")
        try:
            self._writer_schema(schema_id)
        except Reject:
            return None
        specs = self._effective_specs(schema_id)
        if not specs or any(m.key not in _BULK_META for m in self._meta):
            return None
        framed = self._framed.get(schema_id)
        if framed is None:
            framed = self._framed[schema_id] = bulk.framed_schema_json(self._raw[schema_id])
        return bulk.decode_avro_chunk(framed, [b[5:] for b in bodies], chunk, idx, specs, self._meta,
                                      key=self._key)

    def _effective_specs(self, schema_id: int) -> list[ColumnSpec] | None:
        encodings = self._columns_by_id.get(schema_id)
        if self._declared is not None and encodings:
            return [dbz.with_source_encoding(s, encodings.get(s.name)) for s in self._specs]
        return self._specs

    def _decode(self, records: pa.Table) -> DecodeResult:
        """Message by message through fastavro. Declared columns are read with the encodings of each
        message's writer schema: consecutive messages whose schemas read them alike are decoded
        together (usually the whole chunk), so a batch that mixes writer schemas is read right."""
        runs = self._runs(records)
        if len(runs) == 1:
            return self._decode_run(records, runs[0][2])
        return merge_results([self._decode_run(records.slice(start, stop - start), specs)
                              for start, stop, specs in runs])

    def _runs(self, records: pa.Table) -> list[tuple[int, int, list[ColumnSpec] | None]]:
        """(start, stop, column specs) of the consecutive records that share how columns are read;
        a record without a known writer schema joins the run it is in."""
        if self._declared is None:
            return [(0, records.num_rows, None)]   # columns from the writer schemas: one set for all
        self._read_writer_schemas(records)
        runs: list[list] = []
        by_id: dict[int, list[ColumnSpec] | None] = {}
        heads = pc.binary_slice(records.column("value"), 0, 5).to_pylist()
        for i, head in enumerate(heads):
            specs = None
            if head and len(head) == 5 and head[0] == 0:
                schema_id = int.from_bytes(head[1:5], "big")
                if schema_id in self._columns_by_id:
                    if schema_id not in by_id:
                        by_id[schema_id] = self._effective_specs(schema_id)
                    specs = by_id[schema_id]
            if not runs:
                runs.append([0, 1, specs])
            elif specs is None or runs[-1][2] is None or specs == runs[-1][2]:
                runs[-1][1] = i + 1
                runs[-1][2] = runs[-1][2] or specs
            else:
                runs.append([i, i + 1, specs])
        return [tuple(r) for r in runs] or [(0, records.num_rows, None)]

    def _decode_run(self, records: pa.Table, specs: list[ColumnSpec] | None) -> DecodeResult:
        out = ChangeCollector(records, len(self._meta))
        values = records.column("value").to_pylist()
        partitions = records.column("partition").to_pylist()
        offsets = records.column("offset").to_pylist()
        reader = fastavro.schemaless_reader
        for i, raw in enumerate(values):
            if not raw:
                out.skip("tombstone")
                continue
            try:
                if len(raw) < 5 or raw[0] != 0:
                    raise Reject("malformed", "not in the Confluent wire format (magic byte 0, 4-byte schema id, "
                                              "Avro body); check that the producer uses the Avro converter with "
                                              "the Schema Registry")
                schema_id = int.from_bytes(raw[1:5], "big")
                writer = self._writer_schema(schema_id)
                body = io.BytesIO(raw[5:])
                try:
                    event = reader(body, writer, None)
                except UnicodeDecodeError as exc:
                    raise Reject("malformed", f"a string in the Avro body is not valid UTF-8 ({exc}); the producer "
                                              f"wrote bytes that are not text into a string field") from None
                except Exception as exc:  # noqa: BLE001 - truncated/corrupt body
                    raise Reject("malformed", f"the Avro body does not match writer schema {schema_id} "
                                              f"({type(exc).__name__}: {exc}); the message is truncated or "
                                              f"corrupt") from None
                # bytes after the record are ignored, as Flink does (Flink's own test messages end
                # with a newline); the bulk path's sentinel check sends such chunks here
                skipped = self._event(out, i, event, partitions[i], offsets[i])
            except Reject as rej:
                out.reject(i, rej.reason, rej.error)
                continue
            if skipped:
                out.skip(skipped)
        if self._specs is None and out.images:
            self._specs = infer_columns(out.images)
        return out.finish(specs or self._specs or [], self._meta, self._key)

    def _event(self, out: ChangeCollector, record: int, event: Any, partition: int, offset: int) -> str | None:
        if not isinstance(event, dict):
            raise Reject("malformed", "the Avro record is not a Debezium envelope (before/after/op)")
        return dbz.collect_event(out, record, event, schema=None, meta=self._meta, partition=partition,
                                 offset=offset, upsert=self.upsert, on_truncate=self.on_truncate)


# --- Avro schema -> columns ------------------------------------------------------------

_AVRO_TO_CONNECT = {"int": "int32", "long": "int64", "float": "float32", "double": "float64",
                    "boolean": "boolean", "string": "string", "bytes": "bytes"}


#: option -> the ``SchemaRegistryClient`` setting it becomes (besides ``url`` and ``basic-auth.user-info``)
CLIENT_SETTINGS = {
    "bearer_auth_token": "bearer.auth.token",
    "bearer_auth_logical_cluster": "bearer.auth.logical.cluster",
    "bearer_auth_identity_pool_id": "bearer.auth.identity.pool.id",
    "ssl_ca_location": "ssl.ca.location",
    "ssl_certificate_location": "ssl.certificate.location",
    "ssl_key_location": "ssl.key.location",
    "ssl_key_password": "ssl.key.password",
}


def _client_settings(opts: Mapping[str, Any]) -> dict[str, Any]:
    """The registry client's TLS and bearer settings from the parsed options (secrets stay ``SecretStr``
    until the client is made); a ConfigError for a combination the client cannot use.

    | options | client |
    | --- | --- |
    | ``bearer-auth.token`` | ``bearer.auth.credentials.source: STATIC_TOKEN``, header ``Authorization: Bearer …`` |
    | ``bearer-auth.logical-cluster`` / ``identity-pool-id`` | Confluent Cloud's headers (the client needs a logical cluster: empty when not given) |
    | ``ssl.ca.location`` | verify the registry's certificate against this CA file (else the system's CAs) |
    | ``ssl.certificate.location`` + ``ssl.key.location`` (+ ``ssl.key.password``) | client certificate |
    """
    conf = {CLIENT_SETTINGS[k]: v for k, v in opts.items() if k in CLIENT_SETTINGS and v is not None}
    if "bearer.auth.token" in conf:
        if opts.get("basic_auth_user_info") is not None:
            raise ConfigError("format 'debezium-avro-confluent': set either basic-auth.user-info or "
                              "bearer-auth.token, not both")
        conf["bearer.auth.credentials.source"] = "STATIC_TOKEN"
        conf.setdefault("bearer.auth.logical.cluster", "")
    elif any(k.startswith("bearer.") for k in conf):
        raise ConfigError("format 'debezium-avro-confluent': bearer-auth.logical-cluster and identity-pool-id go "
                          "with bearer-auth.token; set the token (or bearer-auth.token_file)")
    if ("ssl.key.location" in conf or "ssl.key.password" in conf) and "ssl.certificate.location" not in conf:
        raise ConfigError("format 'debezium-avro-confluent': ssl.key.location / ssl.key.password need "
                          "ssl.certificate.location (the client certificate)")
    return conf


def _row_record(envelope: Any) -> dict | None:
    """The row record inside a Debezium Avro envelope (its 'after', else 'before')."""
    if not isinstance(envelope, dict):
        return None
    fields = {f.get("name"): f for f in envelope.get("fields", []) if isinstance(f, dict)}
    for side in ("after", "before"):
        record = _non_null(fields.get(side, {}).get("type"))
        if isinstance(record, dict) and record.get("type") == "record":
            return record
        # else a named reference to the record defined under 'before'
    return None


def _row_columns(envelope: Any) -> dict[str, ColumnSpec]:
    """Columns of the row record inside a Debezium Avro envelope."""
    record = _row_record(envelope)
    return {f["name"]: _avro_column(f["name"], f.get("type")) for f in record["fields"]} if record else {}


def _non_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        rest = [t for t in avro_type if t != "null"]
        return rest[0] if len(rest) == 1 else avro_type
    return avro_type


def _avro_column(name: str, avro_type: Any) -> ColumnSpec:
    t = _non_null(avro_type)
    if isinstance(t, str):
        t = {"type": t}
    if not isinstance(t, dict):
        return ColumnSpec(name, pa.string())
    logical = t.get("logicalType")
    if logical == "decimal":   # fastavro hands out decimal.Decimal
        precision = min(max(int(t.get("precision", 38)), 1), 38)
        return ColumnSpec(name, pa.decimal128(precision, min(int(t.get("scale", 0)), precision)))
    base = t.get("type")
    field = {"type": _AVRO_TO_CONNECT.get(base, base), "name": t.get("connect.name"),
             "parameters": t.get("connect.parameters")}
    spec = dbz.connect_column(name, field)
    if logical in ("date", "timestamp-millis", "timestamp-micros", "time-millis", "time-micros"):
        # fastavro already turned these into date/datetime/time objects
        return ColumnSpec(name, spec.type, spec.nullable)
    return spec
