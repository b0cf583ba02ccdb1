"""SinkUpsertMaterializer: turns a changelog keyed by one key into upserts keyed by the sink's key.

Follows Flink's ``SinkUpsertMaterializer``. Per sink key it keeps the list of rows
currently alive for that key, in arrival order; the last one is what the sink holds.
Rows are matched on the upsert key (when the input has one) or on the whole row.

Emission rules (per input row, ``L`` = the key's list, ``r`` = input row)::

    kind    condition                                   state change               emit
    ------  ------------------------------------------  -------------------------  -------------
    +I/+U   L empty                                     L = [r]                    +I r
    +I/+U   L has a row matching r                      replace it in place        +U r
    +I/+U   otherwise                                   append r                   +U r
    -U/-D   no row of L matches r                       -                          (stale: nothing)
    -U/-D   the match is the only row                   L cleared                  -D r  (the input row)
    -U/-D   the match is the last row                   remove it                  +U new last row
    -U/-D   the match is an earlier row                 remove it                  nothing

``+U`` of an unchanged last row is not suppressed: Flink emits it, and the
conformance cases assert it. A retraction of the current row that restores an
earlier one is counted in ``changelake_materializer_corrections_total``.
"""

from __future__ import annotations

from dataclasses import dataclass

from changelake.errors import ConfigError
from changelake.log_values import shown_row
from changelake.operators import changelog_mode as cm
from changelake.operators._base import Kernel
from changelake.operators._rows import DELETE, INSERT, UPDATE_AFTER, Changes, is_accumulate, project
from changelake.operators._state import KeyedState, StaleRetractionPolicy, StaleRetractions, check_ttl

#: key -> list of rows alive for the sink key, oldest first.
STATE_ROWS_BY_KEY = "sink-materializer-rows"


@dataclass(frozen=True)
class SinkUpsertMaterializerConfig:
    keys: tuple[int, ...]
    upsert_key: tuple[int, ...] | None = None
    state_ttl_ms: int = 0
    on_stale_retraction: StaleRetractionPolicy = "warn"
    table: str = "unknown"

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigError("SinkUpsertMaterializer: keys must name at least one column (the sink's primary key)")
        if self.upsert_key is not None and not self.upsert_key:
            raise ConfigError("SinkUpsertMaterializer: upsert_key must be None or a non-empty list of columns")
        check_ttl("SinkUpsertMaterializer", self.state_ttl_ms)


class SinkUpsertMaterializer(Kernel):
    OPERATOR = "SinkUpsertMaterializer"

    def __init__(self, config: SinkUpsertMaterializerConfig) -> None:
        super().__init__()
        self.config = config
        self.rows = self._register(KeyedState(STATE_ROWS_BY_KEY, config.state_ttl_ms))
        self.stale = StaleRetractions(self.OPERATOR, config.on_stale_retraction, self.figures)
        self._match = (lambda r: r) if config.upsert_key is None else (lambda r: project(r, config.upsert_key))

    @staticmethod
    def contract() -> cm.ChangelogContract:
        return cm.ChangelogContract(produces=cm.UPSERT, accepts=cm.ALL, needs_update_before=True)

    def _process_rows(self, batch: Changes, now: int, out: Changes) -> None:
        keys, match, store = self.config.keys, self._match, self.rows
        for kind, row in batch:
            key = project(row, keys)
            alive: list = store.get(key, now) or []
            target = match(row)
            pos = next((i for i, r in enumerate(alive) if match(r) == target), -1)
            if is_accumulate(kind):
                out.emit(INSERT if not alive else UPDATE_AFTER, row)
                alive = list(alive)
                if pos >= 0:
                    alive[pos] = row
                else:
                    alive.append(row)
                store.put(key, alive, now)
                continue
            if pos < 0:
                self.stale(lambda: f"retraction ({shown_row(row)}) found no row for sink key {key!r}")
                continue
            alive = alive[:pos] + alive[pos + 1:]
            if not alive:
                store.delete(key)
                out.emit(DELETE, row)
                continue
            store.put(key, alive, now)
            if pos == len(alive):
                out.emit(UPDATE_AFTER, alive[-1])
                self.figures["materializer_corrections", self.config.table] += 1
