"""Column-wise conversion of decoded values into Arrow arrays of a declared type.

A decoder collects the values of one column for a whole batch as a Python list
and calls :func:`to_arrow` once. The fast path lets Arrow infer the list and
cast it (C speed); only when that fails, or when the inferred type needs care
(e.g. strings that hold numbers, as Canal sends them), are values coerced one
by one. A value that does not fit comes back in ``bad`` (row index -> what is
wrong) and its slot becomes null: the caller turns its message into a
``schema-mismatch`` dead letter.

``unit`` says how integers stand for time values: Debezium's
``io.debezium.time.Timestamp`` is milliseconds, ``MicroTimestamp`` microseconds,
``Date`` days, and so on. It comes from the Debezium schema or a declared encoding
(:mod:`changelake.formats.encodings`, which also sets ``wire``: only values written
that way are taken); integers for TIMESTAMP/TIME columns default to milliseconds,
for DATE to days.

Nothing is wrapped, clipped or rounded: an integer out of its type's range, a
decimal with more places than its scale, and a date, time or timestamp outside
0001-01-01 .. 9999-12-31 (a time: outside one day) - values no engine reading the
table could hold - come back in ``bad``.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pat

from changelake.log_values import row_values_in_logs, shown

_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


class Unfit(ValueError):
    """A single value cannot be represented in the target type."""


def to_arrow(values: Sequence[Any], target: pa.DataType, *, unit: str | None = None,
             decimal_scale: int | None = None, wire: str | None = None) -> tuple[pa.Array, dict[int, str]]:
    """Convert ``values`` to an array of ``target``; returns ``(array, bad)``.

    ``decimal_scale`` marks values as Kafka Connect ``Decimal`` bytes (base64 in
    JSON, raw in Avro) holding an unscaled integer with that scale. ``wire``, a
    declared encoding's (:class:`changelake.formats.encodings.Encoding`), admits only
    values written that way; without it, any value that converts exactly is taken.
    """
    if decimal_scale is None:
        fast = _fast(values, target, unit, wire)
        if fast is not None:
            return in_range(fast, values, target, unit)
    coerce = _coercer(target, unit, decimal_scale, wire)
    out: list[Any] = []
    bad: dict[int, str] = {}
    append = out.append
    for i, v in enumerate(values):
        if v is None:
            append(None)
            continue
        try:
            append(coerce(v))
        except (Unfit, ValueError, TypeError, ArithmeticError, OverflowError) as exc:
            bad[i] = _describe(v, target, exc)
            append(None)
    try:
        arr = pa.array(out, type=target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError):
        # a coerced value Arrow still rejects (nested types, integers beyond 64 bits): isolate it
        for i, v in enumerate(out):
            if v is None:
                continue
            try:
                pa.array([v], type=target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError) as exc:
                bad[i] = _describe(values[i], target, exc)
                out[i] = None
        arr = pa.array(out, type=target)
    arr, outside = in_range(arr, values, target, unit)
    bad.update(outside)
    return arr, bad


# --- the range every engine reading the table accepts ------------------------------------

#: SQL's DATE / TIMESTAMP range (what Spark, Delta and Python's datetime hold): 0001-01-01 up to
#: 9999-12-31 23:59:59.999999, as days and seconds since the epoch
_MIN_DAY, _MAX_DAY = -719_162, 2_932_896
_MIN_SECOND, _END_SECOND = _MIN_DAY * 86_400, (_MAX_DAY + 1) * 86_400
_INT64 = (-(2 ** 63), 2 ** 63 - 1)


def bounds(target: pa.DataType) -> tuple[int, int] | None:
    """Smallest and largest stored integer of a date / time / timestamp type (None: no limit)."""
    if pat.is_date32(target):
        return _MIN_DAY, _MAX_DAY
    if pat.is_timestamp(target):
        per = _UNIT_PER_SECOND[target.unit]
        lo, hi = _MIN_SECOND * per, _END_SECOND * per - 1
        return None if lo < _INT64[0] and hi > _INT64[1] else (max(lo, _INT64[0]), min(hi, _INT64[1]))
    if pat.is_time(target):
        return 0, 86_400 * _UNIT_PER_SECOND[target.unit] - 1
    return None


def outside(arr: pa.Array, target: pa.DataType) -> pa.Array | None:
    """Boolean mask of the values of a temporal array outside :func:`bounds` (None: all inside).
    One min/max pass; the mask only when something is outside."""
    limits = bounds(target)
    if limits is None or arr.null_count == len(arr):
        return None
    ints = arr.view(pa.int32() if target.bit_width == 32 else pa.int64())
    low, high = pc.min_max(ints).values()
    if limits[0] <= low.as_py() and high.as_py() <= limits[1]:
        return None
    return pc.fill_null(pc.or_(pc.less(ints, limits[0]), pc.greater(ints, limits[1])), False)


def in_range(arr: pa.Array, values: Sequence[Any], target: pa.DataType,
             unit: str | None) -> tuple[pa.Array, dict[int, str]]:
    """``arr`` with the dates / times / timestamps outside :func:`bounds` set to null, and what is
    wrong with each (an engine cannot read such a value back: it must not reach a table)."""
    mask = outside(arr, target) if pat.is_temporal(target) else None
    if mask is None:
        return arr, {}
    bad = {i: _describe(values[i], target, out_of_range(values[i], target, unit))
           for i in pc.indices_nonzero(mask).to_pylist()}
    return pc.if_else(mask, pa.scalar(None, target), arr), bad


def out_of_range(value: Any, target: pa.DataType, unit: str | None) -> Unfit:
    """The error for a date / time / timestamp outside :func:`bounds`."""
    what = "a time of day (00:00:00 to 23:59:59.999999999)" if pat.is_time(target) else \
        "the SQL range 0001-01-01 to 9999-12-31"
    hint = ""
    if isinstance(value, int) and not isinstance(value, bool):
        if unit is None:   # the unit was assumed: the likely mistake
            hint = (f" when read as {_UNIT_NAME['d' if pat.is_date32(target) else 'ms']} (the default for an "
                    f"integer); if the source sends another unit, declare the column's encoding (e.g. "
                    f"io.debezium.time.MicroTimestamp)")
        else:
            hint = f" when read as {_UNIT_NAME[unit]}"
    return Unfit(f"outside {what}{hint}")


_UNIT_NAME = {"d": "days since 1970-01-01", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
              "ns": "nanoseconds"}


def error_text(exc: BaseException) -> str:
    """An exception's text for a dead letter's error: ours (:class:`Unfit`) say what is wrong without the value;
    others (Python's, Arrow's) may quote it, so they are named by type unless row values are on."""
    if isinstance(exc, Unfit) or row_values_in_logs():
        return str(exc) or type(exc).__name__
    return type(exc).__name__


def _describe(value: Any, target: pa.DataType, exc: BaseException) -> str:
    detail = error_text(exc)
    return f"value {shown(value)} ({type(value).__name__}) does not fit {target}: {detail}"


#: the Arrow type Arrow must infer for a declared wire encoding to take the fast path
_FAST_WIRE = {"int": pat.is_integer, "iso": pat.is_string, "decimal-text": pat.is_string}


def _fast(values: Sequence[Any], target: pa.DataType, unit: str | None, wire: str | None = None) -> pa.Array | None:
    """Arrow inference + cast when the inferred type converts losslessly; else None."""
    try:
        inferred = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, UnicodeError):
        return None
    src = inferred.type
    if pat.is_null(src):
        return pa.nulls(len(values), type=target)
    if pat.is_floating(src) and any(type(v) is bool for v in values):
        return None   # Arrow infers [1.5, True] as doubles (True as 1.0): a boolean is not a number
    if wire is not None and not _FAST_WIRE.get(wire, lambda _: False)(src):
        return None   # values of another shape than declared (or a wire read value by value)
    try:
        if src == target:
            return inferred
        if pat.is_integer(target) and pat.is_integer(src):
            return inferred.cast(target, safe=True)
        if pat.is_floating(target) and (pat.is_integer(src) or pat.is_floating(src)):
            return to_float(inferred, target)
        if pat.is_string(target) and (pat.is_string(src) or pat.is_large_string(src)):
            return inferred.cast(target)
        if pat.is_decimal(target) and pat.is_decimal(src):
            return inferred.cast(target, safe=True)
        if pat.is_timestamp(target) and pat.is_timestamp(src) and src.tz is None and target.tz is None:
            return inferred.cast(target, safe=True)
        if pat.is_integer(src) and (pat.is_timestamp(target) or pat.is_time(target) or pat.is_duration(target)):
            return _rescale(inferred, unit or "ms", target.unit).cast(target)
        if pat.is_integer(src) and pat.is_date32(target) and (unit or "d") == "d":
            return inferred.cast(pa.int32(), safe=True).cast(target)
        if pat.is_string(src) and pat.is_floating(target):
            return to_float(inferred.cast(pa.float64(), safe=True), target)
        if pat.is_string(src) and (pat.is_integer(target) or pat.is_floating(target) or pat.is_decimal(target)
                                   or pat.is_boolean(target) or pat.is_date32(target)
                                   or (pat.is_timestamp(target) and target.tz is None)):
            # numbers sent as text (Canal): Arrow parses them, strictly; failures go value by value
            return inferred.cast(target, safe=True)
        if pat.is_date32(target) and pat.is_date(src):
            return inferred.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    return None


def _rescale(ints: pa.Array, src_unit: str, dst_unit: str) -> pa.Array:
    num, den = _UNIT_PER_SECOND[dst_unit], _UNIT_PER_SECOND[src_unit]
    ints = ints.cast(pa.int64())
    if num > den:
        return pc.multiply_checked(ints, num // den)
    if num < den:  # floor division, as for single values (pc.divide truncates toward zero)
        step = den // num
        quotient = pc.divide(ints, step)
        negative_rest = pc.less(pc.subtract(ints, pc.multiply(quotient, step)), 0)
        return pc.subtract(quotient, pc.cast(negative_rest, pa.int64()))
    return ints


# --- one-value coercions ------------------------------------------------------------


def _coercer(target: pa.DataType, unit: str | None, decimal_scale: int | None, wire: str | None = None):
    if decimal_scale is not None:
        return _decimal_bytes(target, decimal_scale)
    if wire is not None and wire in _WIRES:
        return _WIRES[wire](target, unit)
    if pat.is_boolean(target):
        return _to_bool
    if pat.is_integer(target):
        return _int_in_range(target)
    if pat.is_floating(target):
        return _to_float32 if pat.is_float32(target) else _to_float
    if pat.is_string(target) or pat.is_large_string(target):
        return _to_text
    if pat.is_binary(target) or pat.is_large_binary(target) or pat.is_fixed_size_binary(target):
        return _to_bytes
    if pat.is_decimal(target):
        return _to_decimal(target)
    if pat.is_date(target):
        return _date(unit)
    if pat.is_timestamp(target):
        return _timestamp(target, unit)
    if pat.is_time(target):
        return _time(target, unit)
    if pat.is_duration(target):
        return _int_in_range(pa.int64())
    return lambda v: v  # nested types: Arrow checks them


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "1"):
            return True
        if low in ("false", "0"):
            return False
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise Unfit("expected true or false")


#: doubles from this magnitude on are not all integers exactly (2^53)
_EXACT_FLOAT_INT = 2.0 ** 53


def _int_in_range(target: pa.DataType):
    bits = target.bit_width
    lo, hi = (0, 2 ** bits - 1) if pat.is_unsigned_integer(target) else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)

    def coerce(v: Any) -> int:
        if isinstance(v, bool):
            raise Unfit("a boolean is not a number")
        if isinstance(v, int):
            n = v
        elif isinstance(v, float):
            if not v.is_integer():
                raise Unfit("has a fractional part")
            if abs(v) >= _EXACT_FLOAT_INT:
                # a JSON integer beyond 64 bits arrives as a double: its last digits are gone
                raise Unfit("is too large to have been read exactly")
            n = int(v)
        elif isinstance(v, decimal.Decimal):
            if not v.is_finite() or v != v.to_integral_value():
                raise Unfit("has a fractional part")
            n = int(v)
        elif isinstance(v, str):
            n = int(v.strip())
        else:
            raise Unfit("expected an integer")
        if not lo <= n <= hi:
            raise Unfit(f"out of range {lo}..{hi}")
        return n

    return coerce


#: the least magnitude that rounds to infinity as a FLOAT (float32): FLT_MAX plus half its last step
_FLOAT32_OVERFLOW = 2.0**128 - 2.0**103


def to_float(column: pa.Array, target: pa.DataType) -> pa.Array | None:
    """Numbers as ``target`` (FLOAT or DOUBLE), rounded to the nearest value as SQL casts do; None
    when a finite number is beyond FLOAT's range (it would become infinity), for the caller to
    find which one value by value."""
    out = column.cast(target, safe=False)
    if pat.is_float32(target) and pat.is_floating(column.type):     # (any 64-bit integer fits a FLOAT)
        infinite = [pc.sum(pc.is_inf(c), min_count=0).as_py() for c in (column, out)]
        if infinite[0] != infinite[1]:
            return None
    return out


def _to_float32(v: Any) -> float:
    f = _to_float(v)
    if _FLOAT32_OVERFLOW <= abs(f) < float("inf"):
        raise Unfit("beyond FLOAT's range (about ±3.4028235e38)")
    return f


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        raise Unfit("a boolean is not a number")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return float(v.strip())
    if isinstance(v, decimal.Decimal):
        return float(v)
    raise Unfit("expected a number")


def _to_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float, decimal.Decimal)):
        return str(v)
    if isinstance(v, (dict, list)):
        return orjson.dumps(v).decode()
    if isinstance(v, bytes):
        return v.decode("utf-8")
    raise Unfit("expected text")


def _to_bytes(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return base64.b64decode(v, validate=True)
    raise Unfit("expected base64 text")


def _to_decimal(target: pa.DataType):
    quantum = decimal.Decimal(1).scaleb(-target.scale)
    context = decimal.Context(prec=60)

    def coerce(v: Any) -> decimal.Decimal:
        if isinstance(v, bool):
            raise Unfit("a boolean is not a number")
        if isinstance(v, decimal.Decimal):
            d = v
        elif isinstance(v, (int, str)):
            d = decimal.Decimal(v.strip() if isinstance(v, str) else v)
        elif isinstance(v, float):
            d = decimal.Decimal(repr(v))
        elif isinstance(v, dict) and "value" in v and "scale" in v:  # io.debezium.data.VariableScaleDecimal
            d = unscaled_decimal(_to_bytes(v["value"]), int(v["scale"]))
        else:
            raise Unfit("expected a decimal number")
        if not d.is_finite():
            raise Unfit("not a finite number")
        q = d.quantize(quantum, context=context)
        if q != d:
            raise Unfit(f"has more than {target.scale} decimal places")
        if len(q.as_tuple().digits) > target.precision and q != 0:
            raise Unfit(f"has more than {target.precision} digits")
        return q

    return coerce


#: a context in which scaleb is exact (the default one keeps 28 digits: DECIMAL(38, s) would be rounded)
_EXACT = decimal.Context(prec=decimal.MAX_PREC, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)


def unscaled_decimal(raw: bytes, scale: int) -> decimal.Decimal:
    """The decimal of a big-endian two's-complement unscaled integer and its scale, exactly."""
    return decimal.Decimal(int.from_bytes(raw, "big", signed=True)).scaleb(-scale, _EXACT)


def _decimal_bytes(target: pa.DataType, scale: int):
    after = _to_decimal(target) if pat.is_decimal(target) else None

    def coerce(v: Any) -> Any:
        d = unscaled_decimal(_to_bytes(v), scale)
        if after is not None:
            return after(d)
        if pat.is_floating(target):
            return _to_float32(d) if pat.is_float32(target) else float(d)
        if pat.is_string(target):
            return str(d)
        raise Unfit("a Connect Decimal needs a DECIMAL, DOUBLE or STRING column")

    return coerce


def _date(declared_unit: str | None):
    unit = declared_unit or "d"

    def coerce(v: Any) -> dt.date:
        if isinstance(v, dt.datetime):
            return v.date()
        if isinstance(v, dt.date):
            return v
        if isinstance(v, bool):
            raise Unfit("a boolean is not a date")
        if isinstance(v, int):
            try:
                return (_EPOCH + dt.timedelta(days=v)).date() if unit == "d" else \
                    (_EPOCH + dt.timedelta(microseconds=v * 1_000_000 // _UNIT_PER_SECOND[unit])).date()
            except OverflowError:
                raise out_of_range(v, pa.date32(), declared_unit) from None
        if isinstance(v, str):
            return dt.date.fromisoformat(v.strip()[:10])
        raise Unfit("expected days since epoch or YYYY-MM-DD")

    return coerce


def _parse_datetime(text: str) -> dt.datetime:
    s = text.strip().replace(" ", "T", 1)
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    # Python parses at most 6 fractional digits: drop nanoseconds beyond that
    dot = s.find(".")
    if dot != -1:
        end = dot + 1
        while end < len(s) and s[end].isdigit():
            end += 1
        if end - dot - 1 > 6:
            s = s[:dot + 7] + s[end:]
    return dt.datetime.fromisoformat(s)


def _timestamp(target: pa.TimestampType, declared_unit: str | None):
    scale_to = _UNIT_PER_SECOND[target.unit]
    scale_from = _UNIT_PER_SECOND[declared_unit or "ms"]

    lo, hi = bounds(target) or _INT64

    def coerce(v: Any) -> int:
        if isinstance(v, bool):
            raise Unfit("a boolean is not a timestamp")
        if isinstance(v, int):
            n = v * scale_to // scale_from
            if not lo <= n <= hi:
                raise out_of_range(v, target, declared_unit)
            return n
        if isinstance(v, str):
            v = _parse_datetime(v)
        if isinstance(v, dt.datetime):
            if v.tzinfo is not None:
                delta = v - _EPOCH_UTC
            else:
                delta = v - _EPOCH
            return (delta.days * 86_400 + delta.seconds) * scale_to + delta.microseconds * scale_to // 1_000_000
        raise Unfit("expected an epoch number or an ISO-8601 timestamp")

    return coerce


def _time(target: pa.DataType, declared_unit: str | None):
    scale_to = _UNIT_PER_SECOND[target.unit]
    scale_from = _UNIT_PER_SECOND[declared_unit or "ms"]

    lo, hi = bounds(target) or _INT64

    def coerce(v: Any) -> int:
        if isinstance(v, bool):
            raise Unfit("a boolean is not a time")
        if isinstance(v, int):
            n = v * scale_to // scale_from
            if not lo <= n <= hi:
                raise out_of_range(v, target, declared_unit)
            return n
        if isinstance(v, (str, dt.time)):
            t = v if isinstance(v, dt.time) else dt.time.fromisoformat(v.strip()[:15])
            micros = ((t.hour * 60 + t.minute) * 60 + t.second) * 1_000_000 + t.microsecond
            return micros * scale_to // 1_000_000
        raise Unfit("expected a time of day")

    return coerce


# --- declared wire encodings (changelake.formats.encodings) -----------------------------

_UNIT_OF = {"d": "days", "s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds"}


def _digits(text: str) -> bool:
    body = text[1:] if text[:1] in ("+", "-") else text
    return body.isascii() and body.isdigit()


def _wire_int(target: pa.DataType, unit: str | None):
    """An integer in ``unit`` (or a string of digits, as Canal sends numbers); nothing else."""
    inner = _coercer(target, unit, None)
    expected = f"expected an integer of {_UNIT_OF[unit or 'ms']}, as the column's declared encoding says"

    def coerce(v: Any) -> Any:
        if type(v) is int:
            return inner(v)
        if isinstance(v, str) and _digits(v):
            return inner(int(v))
        raise Unfit(expected)

    return coerce


def _wire_text(target: pa.DataType, unit: str | None):
    """ISO-8601 text (DATE, TIME, TIMESTAMP) or decimal text; nothing else."""
    inner = _coercer(target, unit, None)
    what = "a decimal number as text" if pat.is_decimal(target) else "ISO-8601 text"

    def coerce(v: Any) -> Any:
        if not isinstance(v, str):
            raise Unfit(f"expected {what}, as the column's declared encoding says")
        if pat.is_date32(target):
            return dt.date.fromisoformat(v)   # the whole text, not only its first ten characters
        return inner(v)

    return coerce


def _wire_zoned(target: pa.DataType, unit: str | None):
    """io.debezium.time.ZonedTimestamp: ISO-8601 text with a UTC offset (or Z)."""
    inner = _coercer(target, unit, None)

    def coerce(v: Any) -> Any:
        if not isinstance(v, str):
            raise Unfit("expected ISO-8601 text with a UTC offset (io.debezium.time.ZonedTimestamp)")
        parsed = _parse_datetime(v)
        if parsed.tzinfo is None:
            raise Unfit("has no UTC offset, which io.debezium.time.ZonedTimestamp text always has")
        return inner(parsed)

    return coerce


def _wire_variable_decimal(target: pa.DataType, unit: str | None):
    """io.debezium.data.VariableScaleDecimal: {"scale": s, "value": base64 of the unscaled integer}."""
    inner = _coercer(target, unit, None)

    def coerce(v: Any) -> Any:
        if not (isinstance(v, dict) and "scale" in v and "value" in v) or type(v["scale"]) is not int:
            raise Unfit('expected {"scale": <int>, "value": <base64>} (io.debezium.data.VariableScaleDecimal)')
        d = unscaled_decimal(_to_bytes(v["value"]), v["scale"])
        return inner(str(d) if pat.is_string(target) else d)

    return coerce


def _wire_bytes(decode, what: str):
    def make(target: pa.DataType, unit: str | None):
        def coerce(v: Any) -> bytes:
            if not isinstance(v, str):
                raise Unfit(f"expected {what} text, as the column's declared encoding says")
            return decode(v)
        return coerce
    return make


def _url_safe(v: str) -> bytes:
    return base64.b64decode(v + "=" * (-len(v) % 4), altchars=b"-_", validate=True)


_WIRES = {
    "int": _wire_int,
    "iso": _wire_text,
    "decimal-text": _wire_text,
    "zoned": _wire_zoned,
    "variable-decimal": _wire_variable_decimal,
    "base64": _wire_bytes(lambda v: base64.b64decode(v, validate=True), "base64"),
    "base64-url-safe": _wire_bytes(_url_safe, "URL-safe base64"),
    "hex": _wire_bytes(bytes.fromhex, "hexadecimal"),
    "latin-1": _wire_bytes(lambda v: v.encode("latin-1"), "ISO-8859-1"),
}
