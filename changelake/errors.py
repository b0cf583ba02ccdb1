"""One exception root for everything changelake raises on purpose.

Every message says what to fix, not only what went wrong.
"""


class ChangelakeError(Exception):
    """Root of changelake's own errors."""


class ConfigError(ChangelakeError):
    """The pipeline configuration is invalid; the message names the offending path."""


class DecodeError(ChangelakeError):
    """A message could not be turned into changelog rows.

    Raised only when the source's ``on_error`` is ``fail``; otherwise the same
    information travels as a dead-letter record.
    """

    def __init__(self, message: str, *, reason: str = "malformed", topic: str | None = None,
                 partition: int | None = None, offset: int | None = None) -> None:
        where = ""
        if topic is not None:
            where = f" (topic {topic}, partition {partition}, offset {offset})"
        super().__init__(message + where)
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset


class SourceError(ChangelakeError):
    """The Kafka source cannot read what it was asked to read."""


class SinkCommitError(ChangelakeError):
    """A Delta commit failed or the table is not what the pipeline expects."""


class ValueOverflowError(ChangelakeError):
    """An operator computed a value its output column cannot hold (a SUM beyond BIGINT or DECIMAL(38, s))."""


class StateError(ChangelakeError):
    """Operator state is inconsistent with its input (e.g. a retraction of an unknown row)."""


class LookupSourceError(ChangelakeError):
    """A lookup join's dimension table cannot be read (unreachable server, broken connection)."""
