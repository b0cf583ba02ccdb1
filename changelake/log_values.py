"""Row values in logs: off by default, so that customers' data never reaches a log by accident.

A log line or an error that concerns a row names its key and counts; the row's other values are
shown only where the user asked for them:

==============================================  ==============================================
setting                                          what a log line about a row shows
==============================================  ==============================================
default                                          the key (``key (1,)``) and counts; a row as
                                                 how many values it holds, a value as its type
                                                 and size (``<str, 12 chars>``)
``CHANGELAKE_LOG_ROW_VALUES=1`` (or
``logging.row_values: true`` in the YAML, which
sets the variable for the process and its
Spark workers)                                   the whole row, ``repr`` of its values
==============================================  ==============================================

Keys are shown in both cases (a key identifies a row; it is what an operator needs to find it).
The variable is read at each call, so a test or a debugging session can turn it on at any time.
"""

from __future__ import annotations

import os
from typing import Any

ENV = "CHANGELAKE_LOG_ROW_VALUES"
_ON = frozenset({"1", "true", "yes", "on"})


def row_values_in_logs() -> bool:
    """True when the user asked for row values in logs (module doc)."""
    return os.environ.get(ENV, "").strip().lower() in _ON


def shown(value: Any, *, limit: int = 80) -> str:
    """``value`` as a log line may show it: its ``repr`` (cut at ``limit``) when row values are on, else its
    type and size only."""
    if row_values_in_logs():
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "..."
    if value is None:
        return "None"
    size = len(value) if isinstance(value, (str, bytes, tuple, list, dict)) else None
    unit = "chars" if isinstance(value, str) else "bytes" if isinstance(value, bytes) else "items"
    return f"<{type(value).__name__}{f', {size} {unit}' if size is not None else ''}>"


def shown_row(row: Any) -> str:
    """A row (tuple of values or dict) as a log line may show it: the row when row values are on, else how many
    values it holds."""
    if row_values_in_logs():
        return repr(row)
    n = len(row) if isinstance(row, (tuple, list, dict)) else 1
    return f"{n} value(s) hidden; {ENV}=1 shows them"
