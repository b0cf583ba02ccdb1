"""GroupAggregate: unbounded ``GROUP BY`` with retraction, one-phase or local/global two-phase.

Mirrors Flink's ``GroupAggFunction`` / ``MiniBatchGroupAggFunction`` and
``MiniBatch{Local,Global}GroupAggFunction``. State per group key
(:data:`STATE_ACCUMULATORS`): ``[record_count, [acc per call], {column: {value: count}}]``;
the last part is the distinct-value multiset of each DISTINCT column, so a
DISTINCT aggregate sees a value when its count goes 0 -> 1 and retracts it on 1 -> 0.

Emission rules per group after applying its input (one row, or one bundle)::

    before                after                         emit
    --------------------  ----------------------------  --------------------------------------
    no state, retraction  -                             nothing (stale retraction, counted)
    no state              record_count > 0              +I new
    state                 record_count == 0             -D prev, state cleared
    state                 new == prev, TTL disabled     nothing (no-op suppressed)
    state                 otherwise                     [-U prev if generate_update_before] +U new

With state TTL enabled an unchanged result is still re-emitted (Flink does so to keep
downstream state alive). ``record_count`` counts accumulate minus retract messages,
so a group whose rows are all retracted is deleted even if its SUM is not zero.

Two-phase: :class:`LocalGroupAggregate` folds each bundle per key into partial
accumulators (no state) and emits them; :class:`GlobalGroupAggregate` merges the
partials into its state and emits results with the rules above.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, Sequence

import pyarrow as pa

from changelake.changelog import KIND, user_columns
from changelake.errors import ConfigError
from changelake.log_values import shown_row
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel, MiniBatchBuffer
from changelake.operators._group_fold import GroupDeltas, fold, partial, vectorisable
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, UPDATE_BEFORE, Changes, is_accumulate, project
from changelake.operators._state import KeyedState, StaleRetractionPolicy, StaleRetractions, check_ttl
from changelake.operators._values import canonical, canonical_column
from changelake.operators.aggregates import AggregateFunction, builtin

#: group key -> [record_count, [accumulator per call], {distinct column: {value: count}}]
STATE_ACCUMULATORS = "group-accumulators"


@dataclass(frozen=True)
class AggCall:
    """One aggregate of the SELECT list: ``function(column)``, ``column=None`` for COUNT(*)."""

    function: str | AggregateFunction
    column: int | None = None
    distinct: bool = False

    def resolve(self) -> AggregateFunction:
        return self.function if isinstance(self.function, AggregateFunction) else builtin(self.function)


@dataclass(frozen=True)
class GroupAggregateConfig:
    group_keys: tuple[int, ...]
    aggregates: tuple[AggCall, ...]
    state_ttl_ms: int = 0
    generate_update_before: bool = True
    mini_batch_size: int | None = None
    on_stale_retraction: StaleRetractionPolicy = "warn"
    functions: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.aggregates:
            raise ConfigError("GroupAggregate: aggregates must list at least one aggregate call")
        for call in self.aggregates:
            if call.distinct and call.column is None:
                raise ConfigError("GroupAggregate: DISTINCT needs a column (COUNT(DISTINCT *) is not SQL)")
        check_ttl("GroupAggregate", self.state_ttl_ms)
        object.__setattr__(self, "functions", tuple(c.resolve() for c in self.aggregates))


class _Aggs:
    """Applies input rows to one group's accumulators (the shared helper of all variants)."""

    def __init__(self, config: GroupAggregateConfig) -> None:
        self.calls = config.aggregates
        self.fns: Sequence[AggregateFunction] = config.functions
        self.distinct_cols = sorted({c.column for c in self.calls if c.distinct})

    def create(self) -> list:
        return [0, [f.create() for f in self.fns], {c: {} for c in self.distinct_cols}]

    def apply(self, group: list, kind: int, row: tuple) -> None:
        add = is_accumulate(kind)
        group[0] += 1 if add else -1
        seen_first: dict[int, bool] = {}
        for col in self.distinct_cols:
            counts = group[2][col]
            v = row[col]
            n = counts.get(v, 0)
            m = n + 1 if add else n - 1
            if m == 0:
                counts.pop(v, None)
            else:
                counts[v] = m
            seen_first[col] = (n == 0 and m == 1) if add else (n == 1 and m == 0)
        accs = group[1]
        for i, (call, fn) in enumerate(zip(self.calls, self.fns)):
            if call.distinct and not seen_first[call.column]:
                continue
            value = None if call.column is None else row[call.column]
            if call.column is not None and value is None and fn.skips_nulls:
                continue
            accs[i] = fn.accumulate(accs[i], value) if add else fn.retract(accs[i], value)

    def merge(self, group: list, partial: list) -> None:
        group[0] += partial[0]
        group[1] = [fn.merge(a, b) for fn, a, b in zip(self.fns, group[1], partial[1])]

    def result(self, key: tuple, group: list) -> tuple:
        return key + tuple(canonical(fn.value(a)) for fn, a in zip(self.fns, group[1]))


class _GroupEmitter(Kernel):
    """State handling and emission shared by the one-phase and the global aggregate."""

    def __init__(self, config: GroupAggregateConfig) -> None:
        super().__init__()
        self.config = config
        self.aggs = _Aggs(config)
        self.state = self._register(KeyedState(STATE_ACCUMULATORS, config.state_ttl_ms))
        self.stale = StaleRetractions(self.OPERATOR, config.on_stale_retraction, self.figures)
        if config.mini_batch_size is not None:
            self.mini_batch = MiniBatchBuffer(config.mini_batch_size)

    def _finish_group(self, key: tuple, first: bool, prev: tuple | None, group: list, now: int,
                      out: Changes) -> None:
        if group[0] == 0:
            if not first:
                out.emit(DELETE, prev)
            self.state.delete(key)
            return
        new = self.aggs.result(key, group)
        self.state.put(key, group, now)
        if first:
            out.emit(INSERT, new)
            return
        if self.config.state_ttl_ms == 0 and new == prev:
            return
        if self.config.generate_update_before:
            out.emit(UPDATE_BEFORE, prev)
        out.emit(UPDATE_AFTER, new)

    def _load(self, key: tuple, now: int) -> tuple[list | None, tuple | None]:
        group = self.state.get(key, now)
        if group is None:
            return None, None
        return group, self.aggs.result(key, group)

    def contract(self) -> cm.ChangelogContract:
        return cm.ChangelogContract(
            produces=cm.updates(generate_update_before=self.config.generate_update_before, deletes=True),
            accepts=cm.ALL, needs_update_before=True)


class GroupAggregate(_GroupEmitter):
    OPERATOR = "GroupAggregate"

    def process(self, batch, *, now: int = 0) -> Changes:
        """As :meth:`Kernel.process`; an Arrow batch in mini-batch mode whose aggregates are all
        COUNT or integer SUM/AVG takes the vectorised path (:mod:`._group_fold`): each full bundle
        is summed per group with NumPy, then each group's state is updated once."""
        if (isinstance(batch, (pa.Table, pa.RecordBatch)) and self.mini_batch is not None
                and not len(self.mini_batch)
                and vectorisable(self.config.aggregates, self.config.functions, batch.schema)):
            return self._process_arrow_bundles(batch, now, self._fold_arrow)
        return super().process(batch, now=now)

    def _fold_arrow(self, bundle: pa.Table, now: int, out: Changes) -> None:
        self._apply_deltas(fold(bundle, self.config.group_keys, self.config.aggregates), now, out)

    def _apply_deltas(self, d: GroupDeltas, now: int, out: Changes) -> None:
        fns = self.config.functions
        for g, key in enumerate(d.keys):
            group, prev = self._load(key, now)
            first = group is None
            deltas = d.all_deltas[g]
            if first:
                for _ in range(int(d.leading[g])):
                    self.stale(lambda: f"retraction found no group state for key {key!r}")
                if d.rows[g] == d.leading[g]:
                    continue
                group = self.aggs.create()
                deltas = deltas - d.lead_deltas[g]
            self.aggs.merge(group, partial(fns, deltas))
            self._finish_group(key, first, prev, group, now, out)

    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        keys = self.config.group_keys
        for kind, row in batch:
            self._apply_group(project(row, keys), [(kind, row)], now, out)

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        keys = self.config.group_keys
        per_key: dict[tuple, list[tuple[int, tuple]]] = {}
        for _, kind, row in bundle:
            per_key.setdefault(project(row, keys), []).append((kind, row))
        for key, rows in per_key.items():
            self._apply_group(key, rows, now, out)

    def _apply_group(self, key: tuple, rows: list[tuple[int, tuple]], now: int, out: Changes) -> None:
        group, prev = self._load(key, now)
        first = group is None
        if first:
            # Retractions that arrive before any accumulate message for the group have nothing to retract.
            skip = 0
            while skip < len(rows) and not is_accumulate(rows[skip][0]):
                kind, row = rows[skip]
                self.stale(lambda: f"retraction ({shown_row(row)}) found no group state for key {key!r}")
                skip += 1
            rows = rows[skip:]
            if not rows:
                return
            group = self.aggs.create()
        for kind, row in rows:
            self.aggs.apply(group, kind, row)
        self._finish_group(key, first, prev, group, now, out)


@dataclass(frozen=True)
class LocalGroupAggregateConfig:
    group_keys: tuple[int, ...]
    aggregates: tuple[AggCall, ...]
    mini_batch_size: int = 1


class LocalGroupAggregate(Kernel):
    """Pre-aggregation before the shuffle: per bundle and key, one row ``key + (partial,)``. No state."""

    OPERATOR = "LocalGroupAggregate"

    def __init__(self, config: LocalGroupAggregateConfig) -> None:
        super().__init__()
        inner = GroupAggregateConfig(group_keys=config.group_keys, aggregates=config.aggregates)
        if any(c.distinct for c in config.aggregates):
            raise ConfigError("two-phase aggregation does not support DISTINCT aggregates yet; "
                              "use the one-phase GroupAggregate")
        self.config = config
        self.aggs = _Aggs(inner)
        self.mini_batch = MiniBatchBuffer(config.mini_batch_size)

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        keys = self.config.group_keys
        partials: dict[tuple, list] = {}
        for _, kind, row in bundle:
            key = project(row, keys)
            group = partials.get(key)
            if group is None:
                group = partials[key] = self.aggs.create()
            self.aggs.apply(group, kind, row)
        for key, group in partials.items():
            out.emit(INSERT, key + ([group[0], group[1]],))


class GlobalGroupAggregate(_GroupEmitter):
    """Merges the partial accumulators of :class:`LocalGroupAggregate` (input rows ``key + (partial,)``)."""

    OPERATOR = "GlobalGroupAggregate"

    def __init__(self, config: GroupAggregateConfig) -> None:
        if any(c.distinct for c in config.aggregates):
            raise ConfigError("two-phase aggregation does not support DISTINCT aggregates yet; "
                              "use the one-phase GroupAggregate")
        super().__init__(config)

    def _partial_key(self, row: tuple) -> tuple:
        return tuple(row[:len(self.config.group_keys)])

    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        self._process_bundle([("in", k, r) for k, r in batch], now, out)

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        per_key: dict[tuple, list[Any]] = {}
        for _, _kind, row in bundle:
            per_key.setdefault(self._partial_key(row), []).append(row[-1])
        for key, partials in per_key.items():
            group, prev = self._load(key, now)
            first = group is None
            if first:
                group = self.aggs.create()
            for partial in partials:
                self.aggs.merge(group, partial)
            if first and group[0] == 0:
                continue
            self._finish_group(key, first, prev, group, now, out)


def mergeable(config: GroupAggregateConfig) -> bool:
    """True if the aggregate can run two-phase: no DISTINCT call, and every function implements
    :meth:`AggregateFunction.merge` (the built-ins do; a user-defined one may not)."""
    return all(not call.distinct and type(fn).merge is not AggregateFunction.merge
               for call, fn in zip(config.aggregates, config.functions))


def local_partials(table: pa.Table, config: GroupAggregateConfig) -> tuple[list[list], list[int]]:
    """:class:`LocalGroupAggregate` over one changelog batch (user columns + ``_kind``) as one bundle.

    Returns per group key, in order of the key's first row, its partial accumulator
    ``[record_count, [acc per call]]`` and the position of its first row (where the caller takes
    the key's values). COUNT and integer SUM/AVG take the vectorised fold of :mod:`._group_fold`;
    other aggregates the kernel's row loop. Retractions are folded in (a partial's counts may be
    negative); dropping a stale one is the global step's business.
    """
    if vectorisable(config.aggregates, config.functions, table.schema):
        d = fold(table, config.group_keys, config.aggregates)
        return [partial(config.functions, row) for row in d.all_deltas], [int(i) for i in d.first]
    kernel = LocalGroupAggregate(LocalGroupAggregateConfig(config.group_keys, config.aggregates,
                                                           mini_batch_size=max(table.num_rows, 1)))
    names = user_columns(table)
    columns = [canonical_column(c, c.to_pylist()) for c in (table.column(names[i]) for i in config.group_keys)]
    first: dict[tuple, int] = {}
    for i, key in enumerate(zip(*columns) if columns else [()] * table.num_rows):
        first.setdefault(key, i)
    out = kernel.process(table.select([*names, KIND]))
    out.extend(kernel.finish())
    n = len(config.group_keys)
    return [row[-1] for row in out.rows], [first[tuple(row[:n])] for row in out.rows]


def encode_partial(p: list) -> bytes:
    """A partial accumulator as bytes (the binary column between the local and the global step)."""
    return pickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)


class EncodedGlobalGroupAggregate(GlobalGroupAggregate):
    """:class:`GlobalGroupAggregate` whose input rows carry the partial as :func:`encode_partial`
    bytes (the Spark executor's two-phase path). Its state is the global kernel's, which is the
    one-phase GroupAggregate's (``[record_count, accs, {}]`` per key); its snapshots carry the
    one-phase operator name, so a checkpoint continues when an aggregate switches phase."""

    OPERATOR = GroupAggregate.OPERATOR

    def _process_bundle(self, bundle: list[tuple], now: int, out: Changes) -> None:
        super()._process_bundle([(tag, kind, row[:-1] + (pickle.loads(row[-1]),)) for tag, kind, row in bundle],
                                now, out)
