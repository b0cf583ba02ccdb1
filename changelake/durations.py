"""Durations as users write them ('10 seconds', '500 ms', '7 days'): a leaf, importing nothing of ours
but the error root."""

from __future__ import annotations

import re

from changelake.errors import ConfigError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|seconds?|m|minutes?|h|hours?|d|days?)\s*$")
_UNIT_S = {"ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1, "second": 1, "seconds": 1,
           "m": 60, "minute": 60, "minutes": 60, "h": 3600, "hour": 3600, "hours": 3600,
           "d": 86400, "day": 86400, "days": 86400}


def parse_duration(text: str) -> float:
    """'10 seconds', '500ms', '7 days' -> seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a duration; write e.g. '10 seconds', '500 ms', '7 days'")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def duration_ms(what: str, text: str | None, *, signed: bool = False) -> int:
    """Milliseconds of a duration such as '5 seconds' (None: 0); ``signed`` allows a leading '-'."""
    if text is None:
        return 0
    raw = str(text).strip()
    sign = -1 if signed and raw.startswith("-") else 1
    try:
        return sign * int(round(parse_duration(raw.lstrip("-").strip() if sign < 0 else raw) * 1000))
    except ValueError as exc:
        raise ConfigError(f"{what}: {exc}") from None
