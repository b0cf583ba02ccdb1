"""Routing a source's changes to tables named from each change's own database and table.

A routed source (``sources[].route``) reads many source tables' topics. For each
message the :class:`Router` reads its origin (:mod:`changelake.formats.origin`:
``inventory.orders_7``), takes the first rule whose ``source_table`` matches that
name whole, and names the target table from the rule's ``table`` template::

    origin name                 rule                                       target table
    inventory.orders_7          source_table: 'inventory\\.orders_\\d+'       orders
                                table: orders
    inventory.customers         source_table: '(\\w+)\\.(\\w+)'               inventory_customers
                                table: '$1_$2'
    inventory.customers         source_table: 'inventory\\..*'               ods_customers
                                table: 'ods_<>', replace_symbol: '<>'

A message goes to the dead letters (reason ``unrouted``, or ``malformed`` when it cannot
be read) when it names no table, when no rule matches, when the name is not a usable
table name, or when the table is already written by a ``tables[]`` entry or another rule:
a table has one writer. A Kafka tombstone (no value) produces nothing, as in every source.

The router is pure (Arrow in, Arrow out): :meth:`Router.split` groups a batch's raw
records by (target table, origin), in their order; the pipeline decodes each group with
the target table's own decoder (its columns come from the messages, or the rule's
``columns``) and applies it through the table's own idempotent Delta sink.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.formats.assemble import dead_letters
from changelake.formats.origin import NoOrigin, Origin, OriginReader
from changelake.service.config import RouteRule, SourceSpec, TableSpecModel, _join

#: what a routed table name may not be: empty, starting with '_' or '.' (changelake's own directories,
#: hidden files), or holding a path separator or a control character
_BAD_NAME = re.compile(r"^$|^[_.]|[/\\\x00-\x1f\x7f]")
_REF = re.compile(r"\$(\d)")


def expand(template: str, match: re.Match[str], origin: Origin, replace_symbol: str | None) -> str:
    """``template`` with ``$1``..``$9`` replaced by the match's groups and ``replace_symbol`` by the origin's table."""
    out = _REF.sub(lambda m: match.group(int(m.group(1))) or "", template)
    return out.replace(replace_symbol, origin.table) if replace_symbol else out


@dataclass(frozen=True)
class Target:
    """Where one origin's changes go: the rule (its index in the source's ``route``) and the table."""

    rule: int
    table: str
    path: str | None


@dataclass
class RoutedBatch:
    """A batch's raw records grouped by (target table, origin), plus what could not be routed."""

    groups: list[tuple[Target, Origin, pa.Table]] = field(default_factory=list)
    dead_letters: pa.Table = field(default_factory=DEAD_LETTER_SCHEMA.empty_table)


class Router:
    """The routing of one source (its ``route`` rules); ``taken`` are the names ``tables[]`` entries use."""

    def __init__(self, spec: SourceSpec, *, storage_root: str, taken: Iterable[str] = (), decoder: Any = None,
                 owners: dict[str, tuple[str, int]] | None = None) -> None:
        assert spec.route is not None
        self.spec = spec
        self.rules: list[RouteRule] = list(spec.route)
        self._patterns = [re.compile(r.source_table) for r in self.rules]
        self._root = storage_root
        self._taken = frozenset(taken)
        self._reader = OriginReader(spec.format, decoder)
        self._resolved: dict[Origin, Target | str] = {}
        #: table -> (source, rule index) that writes it, shared by the pipeline's routers: one writer per table
        self.owners: dict[str, tuple[str, int]] = {} if owners is None else owners

    def target(self, origin: Origin) -> Target | str:
        """The target of ``origin``, or the error text saying why it has none (cached per origin)."""
        found = self._resolved.get(origin)
        if found is None:
            found = self._resolved[origin] = self._resolve(origin)
        return found

    def _resolve(self, origin: Origin) -> Target | str:
        name = origin.name
        for i, (rule, rx) in enumerate(zip(self.rules, self._patterns)):
            m = rx.fullmatch(name)
            if m is None:
                continue
            table = expand(rule.table, m, origin, rule.replace_symbol)
            where = f"source {self.spec.name!r}, route[{i}] (source_table {rule.source_table!r})"
            if _BAD_NAME.search(table):
                return (f"{where} names table {table!r} for source table {name!r}: a table name may not be empty, "
                        "start with '_' or '.', or hold '/', '\\' or control characters; change the rule's "
                        "'table' template")
            if table in self._taken:
                return (f"{where} routes source table {name!r} to table {table!r}, which a tables[] entry "
                        "already writes (a table has one writer); rename one of them")
            owner = self.owners.setdefault(table, (self.spec.name, i))
            if owner != (self.spec.name, i):
                return (f"{where} routes source table {name!r} to table {table!r}, which source {owner[0]!r} "
                        f"route[{owner[1]}] writes (a table has one writer: let one rule match every source table "
                        "that goes there)")
            path = expand(rule.path, m, origin, rule.replace_symbol) if rule.path else None
            return Target(i, table, path)
        return (f"source {self.spec.name!r}: no route rule matches source table {name!r} "
                f"(rules: {[r.source_table for r in self.rules]}); add a rule for it, or narrow the source's topics")

    def split(self, records: pa.Table) -> RoutedBatch:
        """Group raw records (RAW_SCHEMA) by (target, origin), keeping their order within each group."""
        out = RoutedBatch()
        groups: dict[tuple[Target, Origin], list[int]] = {}
        letters: list[tuple[int, str, str]] = []
        for i, value in enumerate(records.column("value").to_pylist()):
            if not value:
                continue                      # a tombstone: nothing to apply
            try:
                origin = self._reader.origin(value)
            except NoOrigin as no:
                letters.append((i, no.reason, no.error))
                continue
            target = self.target(origin)
            if isinstance(target, str):
                letters.append((i, "unrouted", target))
                continue
            groups.setdefault((target, origin), []).append(i)
        for (target, origin), rows in groups.items():
            out.groups.append((target, origin, records.take(pa.array(rows, pa.int64()))))
        if letters:
            out.dead_letters = dead_letters(records, letters)
        return out

    def table_model(self, target: Target) -> TableSpecModel:
        """The ``tables[]`` entry a routed table behaves as: its rule's settings, its name and path."""
        rule = self.rules[target.rule]
        path = target.path or _join(self._root, target.table)
        return TableSpecModel(name=target.table, path=path, **rule.table_settings())
