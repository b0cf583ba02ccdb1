"""Decoders: raw Kafka records -> changelog rows. One module per format.

>>> decoder = make_decoder("debezium-json", options={"schema-include": "false"})
>>> decoder.schema_include
False
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from changelake.errors import ConfigError
from changelake.formats.base import REASONS, Decoder, DecodeResult

__all__ = ["FORMATS", "REASONS", "DecodeResult", "Decoder", "make_decoder"]


def _debezium_json(columns, options):
    from changelake.formats.debezium_json import DebeziumJsonDecoder
    return DebeziumJsonDecoder(columns=columns, options=options)


def _canal_json(columns, options):
    from changelake.formats.canal_json import CanalJsonDecoder
    return CanalJsonDecoder(columns=columns, options=options)


def _maxwell_json(columns, options):
    from changelake.formats.maxwell_json import MaxwellJsonDecoder
    return MaxwellJsonDecoder(columns=columns, options=options)


def _ogg_json(columns, options):
    from changelake.formats.ogg_json import OggJsonDecoder
    return OggJsonDecoder(columns=columns, options=options)


def _debezium_avro(columns, options):
    from changelake.formats.debezium_avro import DebeziumAvroDecoder
    return DebeziumAvroDecoder(columns=columns, options=options)


_FACTORIES: dict[str, Callable[[pa.Schema | None, Mapping[str, Any] | None], Decoder]] = {
    "debezium-json": _debezium_json,
    "debezium-avro-confluent": _debezium_avro,
    "canal-json": _canal_json,
    "maxwell-json": _maxwell_json,
    "ogg-json": _ogg_json,
}

#: format names :func:`make_decoder` accepts
FORMATS: tuple[str, ...] = ("debezium-json", "debezium-avro-confluent", "canal-json", "maxwell-json", "ogg-json")


def make_decoder(format: str, *, columns: pa.Schema | None = None,  # noqa: A002 - the option is called format
                 options: Mapping[str, Any] | None = None) -> Decoder:
    """The decoder for ``format`` with its options validated (:class:`ConfigError` otherwise)."""
    factory = _FACTORIES.get(format)
    if factory is None:
        raise ConfigError(f"unknown format {format!r}; supported formats: {', '.join(FORMATS)}")
    if columns is not None and not isinstance(columns, pa.Schema):
        raise ConfigError(f"columns must be a pyarrow.Schema, got {type(columns).__name__}")
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"options must be a mapping of option name to value, got {type(options).__name__}")
    return factory(columns, options)
