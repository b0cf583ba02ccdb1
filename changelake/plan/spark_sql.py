"""Filter and select expressions checked in Spark SQL's dialect, before the pipeline is deployed.

The planner derives an expression's type with DuckDB (:mod:`changelake.plan.sql`), but on Spark
the same text goes to ``F.expr``: an expression DuckDB takes and Spark does not would pass
``validate`` and fail at run time. This module parses the text with sqlglot's Spark dialect,
without a JVM, and rejects what Spark lacks:

==========================================  ==============================================
written                                      why it is rejected
==========================================  ==============================================
``f(...)`` with ``f`` no Spark built-in      Spark has no such function (``regexp_matches``,
                                             ``list_value``, ``strftime``, ...); the Spark one
                                             is named where there is an obvious one
``a // b``, ``a ** b``                       DuckDB's integer division and power operators
``a ^ b``                                    power in DuckDB, bitwise XOR in Spark
``a && b``                                   DuckDB's list overlap; Spark has no such operator
``x[i]``                                     Spark counts array positions from 0, DuckDB from 1
``[a, b]``, ``{'k': v}``                     DuckDB's list and struct literals
anything sqlglot's Spark parser rejects      not Spark SQL
==========================================  ==============================================

What passes here is then checked by DuckDB, so what reaches a pipeline is in both dialects.
"""

from __future__ import annotations

import sqlglot
from sqlglot.dialects.spark import Spark
from sqlglot.tokens import Token, TokenType

from changelake.errors import ConfigError
from changelake.plan.spark_functions import SPARK_FUNCTIONS

#: written like functions, parsed by Spark's grammar itself (not in SHOW FUNCTIONS)
_SYNTAX_FUNCTIONS = frozenset({"try_cast", "timestampadd", "timestampdiff"})

#: DuckDB functions with an obvious Spark counterpart -> what to write instead
_INSTEAD = {
    "regexp_matches": "Spark's is rlike (s RLIKE 'pattern') or regexp_like(s, 'pattern'); in both engines: "
                      "regexp_extract(s, 'pattern', 0) <> ''",
    "regexp_full_match": "Spark's is rlike with '^...$'",
    "list_value": "Spark's is array(...)",
    "list_pack": "Spark's is array(...)",
    "list_extract": "Spark's is element_at(array, n)",
    "array_extract": "Spark's is element_at(array, n)",
    "list_contains": "Spark's is array_contains(array, value)",
    "struct_pack": "Spark's is named_struct('name', value, ...)",
    "strftime": "Spark's is date_format(ts, 'yyyy-MM-dd')",
    "strptime": "Spark's is to_timestamp(s, 'yyyy-MM-dd HH:mm:ss')",
    "epoch_ms": "Spark's is timestamp_millis(n) (or unix_millis(ts))",
    "epoch": "Spark's is unix_timestamp(ts)",
    "string_split": "Spark's is split(s, 'regex')",
    "str_split": "Spark's is split(s, 'regex')",
    "starts_with": "Spark's is startswith(s, prefix); in both engines: s LIKE 'prefix%'",
    "ends_with": "Spark's is endswith(s, suffix); in both engines: s LIKE '%suffix'",
    "prefix": "in both engines: s LIKE 'prefix%'",
    "suffix": "in both engines: s LIKE '%suffix'",
    "strlen": "Spark's is length(s)",
    "today": "Spark's is current_date()",
    "gen_random_uuid": "Spark's is uuid()",
}

_OPERATORS = {
    (TokenType.SLASH, TokenType.SLASH): "'//' is DuckDB's integer division; Spark writes 'a div b'; in both "
                                        "engines: CAST(floor(a / b) AS BIGINT)",
    (TokenType.STAR, TokenType.STAR): "'**' is DuckDB's power operator; write power(a, b) (both engines)",
}

_VALUE_END = {TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.VAR, TokenType.IDENTIFIER, TokenType.STRING,
              TokenType.NUMBER}


def check_expression(what: str, expression: str) -> None:
    """Raise ConfigError naming what Spark SQL lacks in ``expression``; ``what`` says where it is
    (``filter 'big'``)."""
    problem = spark_problem(expression)
    if problem:
        raise ConfigError(f"{what}: {expression!r} is not Spark SQL: {problem}")


def spark_problem(expression: str) -> str | None:
    """Why Spark SQL would reject ``expression``, or None."""
    try:
        tokens = Spark().tokenizer_class().tokenize(expression)
    except sqlglot.errors.TokenError as exc:
        return f"cannot read it ({exc})"
    for i, tok in enumerate(tokens):
        prev = tokens[i - 1] if i else None
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        if nxt is not None and _adjacent(tok, nxt) and (tok.token_type, nxt.token_type) in _OPERATORS:
            return _OPERATORS[(tok.token_type, nxt.token_type)]
        if tok.token_type == TokenType.CARET:
            return "'^' is power in DuckDB but bitwise XOR in Spark; write power(a, b)"
        if tok.token_type == TokenType.DAMP:
            return "'&&' is not a Spark operator; write AND"
        if tok.token_type == TokenType.L_BRACE:
            return "'{...}' is DuckDB's struct literal; Spark writes named_struct('name', value, ...)"
        if tok.token_type == TokenType.L_BRACKET:
            if prev is not None and prev.token_type in _VALUE_END:
                return "'x[i]' counts array positions from 0 in Spark and from 1 in DuckDB, so the two engines " \
                       "would pick different elements; keep array access out of filters and selects"
            return "'[...]' is DuckDB's list literal; Spark writes array(...)"
        if _is_call(tok, prev, nxt):
            name = tok.text.lower()
            if name not in SPARK_FUNCTIONS and name not in _SYNTAX_FUNCTIONS:
                hint = _INSTEAD.get(name)
                return f"Spark has no function {name}()" + (f"; {hint}" if hint else
                                                             _close(name))
    try:
        sqlglot.parse_one(f"SELECT ({expression})", read="spark")
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" near column {first['col'] - len('SELECT (')}" if first.get("col") else ""
        return f"Spark's parser rejects it: {first.get('description') or exc}{where}"
    return None


def _adjacent(a: Token, b: Token) -> bool:
    return b.start == a.end + 1


def _is_call(tok: Token, prev: Token | None, nxt: Token | None) -> bool:
    """A function name: an unquoted word right before '(' and not a type in ``CAST(x AS t(...))``."""
    return (tok.token_type == TokenType.VAR and nxt is not None and nxt.token_type == TokenType.L_PAREN
            and not (prev is not None and prev.token_type == TokenType.ALIAS))


def _close(name: str) -> str:
    import difflib

    close = difflib.get_close_matches(name, SPARK_FUNCTIONS, n=3, cutoff=0.75)
    return f"; did you mean {' or '.join(f'{c}()' for c in sorted(close))}?" if close else ""
