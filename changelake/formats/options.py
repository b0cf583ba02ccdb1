"""Validation of format options.

Options are given as a mapping. Keys may carry the format prefix Flink uses in
SQL (``debezium-json.schema-include``) or not (``schema-include``), and ``_``
may stand for ``-`` (``on_truncate``). Values may be typed (``True``) or the
strings a SQL ``WITH`` clause carries (``'true'``). Every problem is a
:class:`~changelake.errors.ConfigError` naming the option and what is allowed;
the texts for the options Flink also has match Flink's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from changelake.errors import ConfigError

#: option names that hold credentials: their values are kept as ``SecretStr`` (printed as
#: '**********') from the configuration to the client that uses them
SECRET_OPTION = re.compile(r"password|passwd|secret|token|user[-_.]info|credential|api[-_.]key|private[-_.]key",
                           re.IGNORECASE)


def is_secret_option(key: str) -> bool:
    """Whether an option (of a format, or any key/value option map) holds a credential."""
    return bool(SECRET_OPTION.search(key))


@dataclass(frozen=True)
class Option:
    """One accepted option: ``kind`` is bool, choice, text, secret (a credential, kept as
    ``SecretStr``), regex, names or metadata."""

    name: str
    kind: str
    default: Any = None
    choices: tuple[str, ...] = ()
    doc: str = ""


def normalize_key(fmt: str, key: str) -> str:
    k = key.strip().lower().replace("_", "-")
    prefix = fmt + "."
    return k[len(prefix):] if k.startswith(prefix) else k


def parse_options(fmt: str, raw: Mapping[str, Any] | None, specs: Sequence[Option]) -> dict[str, Any]:
    """Validated option values keyed by option name (``-`` and ``.`` become ``_``)."""
    by_name = {s.name: s for s in specs}
    values = {s.name: s.default for s in specs}
    for key, value in (raw or {}).items():
        name = normalize_key(fmt, str(key))
        if name == "format":
            if value not in (None, fmt):
                raise ConfigError(f"option 'format' is {value!r} but this decoder is {fmt!r}")
            continue
        spec = by_name.get(name)
        if spec is None:
            allowed = ", ".join(sorted(by_name))
            raise ConfigError(f"unknown option {key!r} for format {fmt!r}; allowed options: {allowed}")
        values[name] = _parse_value(spec, value)
    return {name.replace("-", "_").replace(".", "_"): v for name, v in values.items()}


def _parse_value(spec: Option, value: Any) -> Any:
    if spec.kind == "secret":
        if isinstance(value, SecretStr):
            return value
        if isinstance(value, str):
            return SecretStr(value)
        raise ConfigError(f"option {spec.name!r} must be a string, got a {type(value).__name__}")   # not the value
    if isinstance(value, SecretStr):                  # a configuration hides any value whose key looks secret
        value = value.get_secret_value()
    if spec.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        raise ConfigError(f"option {spec.name!r}: Unrecognized option for boolean: {value}. "
                          f"Expected either true or false(case insensitive)")
    if spec.kind == "choice":
        text = str(value).strip()
        for choice in spec.choices:
            if text.upper() == choice.upper():
                return choice
        raise ConfigError(f"Unsupported value '{value}' for {_flink_label(spec.name)}. "
                          f"Supported values are [{', '.join(spec.choices)}].")
    if spec.kind == "text":
        if not isinstance(value, str):
            raise ConfigError(f"option {spec.name!r} must be a string, got {value!r}")
        return value
    if spec.kind == "regex":
        if value is None:
            return None
        try:
            return re.compile(str(value))
        except re.error as exc:
            raise ConfigError(f"option {spec.name!r}: {value!r} is not a valid regular expression: {exc}") from None
    if spec.kind == "names":
        names = _name_list(spec.name, value)
        return tuple(names)
    if spec.kind == "metadata":
        return _metadata(spec, value)
    raise AssertionError(f"unknown option kind {spec.kind}")


def _flink_label(name: str) -> str:
    # Flink says "for timestamp-format.standard" but "for option map-null-key.mode"
    return name if name == "timestamp-format.standard" else f"option {name}"


def _name_list(option: str, value: Any) -> list[str]:
    if isinstance(value, str):
        names = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise ConfigError(f"option {option!r} must be a list of names (or one comma-separated string), got {value!r}")
    return names


def _metadata(spec: Option, value: Any) -> tuple[tuple[str, str], ...]:
    """``[key, ...]`` (column named as the key) or ``{key: column name}``, in order."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        pairs = [(k, k) for k in _name_list(spec.name, value)]
    allowed = spec.choices
    for key, column in pairs:
        if key not in allowed:
            raise ConfigError(f"option 'metadata': unknown metadata key {key!r}; allowed keys: {', '.join(allowed)}")
        if column.startswith("_"):
            raise ConfigError(f"option 'metadata': column name {column!r} starts with '_', which is reserved "
                              f"for changelake's own columns; choose another name")
    return tuple(pairs)


#: options every Flink JSON CDC format accepts (decoder side)
def json_format_options() -> list[Option]:
    return [
        Option("ignore-parse-errors", "bool", False,
               doc="accepted for Flink compatibility; bad messages still become dead letters, "
                   "the source's on_error decides what happens to them"),
        Option("timestamp-format.standard", "choice", "SQL", ("SQL", "ISO-8601"),
               doc="layout of timestamp strings; both layouts are read either way"),
        # encoder-side options: accepted and validated so one option set serves source and sink
        Option("map-null-key.mode", "choice", "FAIL", ("LITERAL", "FAIL", "DROP"), doc="encoder only"),
        Option("map-null-key.literal", "text", "null", doc="encoder only"),
        Option("encode.decimal-as-plain-number", "bool", False, doc="encoder only"),
        Option("encode.ignore-null-fields", "bool", False, doc="encoder only"),
        Option("key", "names", (), doc="primary-key columns: a null or absent value is a missing-key dead letter"),
    ]
