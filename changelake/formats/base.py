"""What every decoder promises.

A decoder turns raw Kafka records (:data:`changelake.changelog.RAW_SCHEMA`) into
a changelog batch (user columns + :data:`changelake.changelog.METADATA_FIELDS`)
and a table of dead letters (:data:`changelake.changelog.DEAD_LETTER_SCHEMA`).

Bad input is data, not an exception: a decoder never raises for one bad message,
it returns it as a dead letter with its raw bytes, its position, a short
machine-readable ``reason`` and a human ``error`` that says what to fix. The
pipeline then applies the source's ``on_error`` policy (fail, skip or dlq) and
counts every dead letter by reason. Kafka tombstones (null value) and empty
values produce no rows and no dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pyarrow as pa

from changelake.changelog import DEAD_LETTER_SCHEMA, TRUNCATE_SCHEMA
from changelake.formats.sequence import POSITIONS_SCHEMA

#: reasons a dead letter can carry (bounded: they become metric label values)
REASONS = (
    "malformed",          # not parseable (bad JSON / Avro, truncated, not UTF-8)
    "unknown-op",         # an op / type the format does not define
    "schema-mismatch",    # a value does not fit the declared column type
    "missing-key",        # a primary-key column is null or absent
    "missing-before",     # an update/delete without the before-image the format needs
    "unsupported",        # valid message the configuration says not to accept (a truncate with on_truncate: fail)
    "schema-incompatible",  # its writer schema changed in a way the table cannot take (the source is quarantined)
    "unrouted",           # a routed source's message that names no source table, or one no route rule takes
)


@dataclass(frozen=True)
class DecodeResult:
    rows: pa.Table
    dead_letters: pa.Table
    #: messages that produced no rows on purpose, by cause (``tombstone``, ``message``, ``ddl``,
    #: ``filtered``, ...): counted, never silently lost
    skipped: dict[str, int] = field(default_factory=dict)
    #: TRUNCATE messages (:data:`~changelake.changelog.TRUNCATE_SCHEMA`) of a source whose
    #: ``on_truncate`` is apply or skip; the pipeline counts them and applies them (apply)
    truncates: pa.Table = field(default_factory=TRUNCATE_SCHEMA.empty_table)
    #: per message with a log position: its server marker, order and source time
    #: (:data:`changelake.formats.sequence.POSITIONS_SCHEMA`), read by the epoch rule of that module
    positions: pa.Table = field(default_factory=POSITIONS_SCHEMA.empty_table)

    @staticmethod
    def empty_dead_letters() -> pa.Table:
        return DEAD_LETTER_SCHEMA.empty_table()


class Decoder(Protocol):
    """Turns a batch of raw Kafka records into changelog rows and dead letters."""

    #: Arrow schema of the user columns this decoder emits (None until known, for schema-less formats)
    columns: pa.Schema | None

    def decode(self, records: pa.Table) -> DecodeResult:
        ...
