"""Logging of the ``changelake`` command: text for a terminal, or one JSON object per line.

JSON lines use the field names of Spark 4's own structured logs (``ts``, ``level``, ``logger``,
``msg``, ``exception``), so one log pipeline reads both the service's and Spark's lines.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("text", "json")

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts (UTC, ISO 8601, ms), level, logger, msg, and exception
    (the formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Log to stderr at ``level`` in ``log_format``; py4j stays at WARNING because at DEBUG it logs
    every command sent to the JVM, Kafka credentials in reader options included."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_changelake", False)]:
        root.removeHandler(old)
    handler._changelake = True          # type: ignore[attr-defined]  # replaced, not stacked, on a second call
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    logging.getLogger("py4j").setLevel(logging.WARNING)
