"""GroupAggregate against Flink's GroupAggregateHarnessTest (one-phase, mini-batch, two-phase)."""

import re

import pytest

from changelake.operators.aggregates import AggregateFunction
from changelake.operators.group_aggregate import (
    AggCall, GlobalGroupAggregate, GroupAggregate, GroupAggregateConfig, LocalGroupAggregate,
    LocalGroupAggregateConfig)
from tests.operators.harness import Driver, KernelDriver, case_params, load, run_case


class CntNullNonNull(AggregateFunction):
    """The test's UDF: '<count of non-null values>|<count of null values>' (sees NULLs)."""

    name = "CntNullNonNull"
    skips_nulls = False

    def create(self):
        return [0, 0]

    def accumulate(self, acc, value):
        return [acc[0] + 1, acc[1]] if value is not None else [acc[0], acc[1] + 1]

    def retract(self, acc, value):
        return [acc[0] - 1, acc[1]] if value is not None else [acc[0], acc[1] - 1]

    def value(self, acc):
        return f"{acc[0]}|{acc[1]}"


UDFS = {"CntNullNonNull": CntNullNonNull}
_CALL = re.compile(r"^(\w+)\((DISTINCT\s+)?(\*|\w+)\)$")


def parse_call(text: str, columns: list[str]) -> AggCall:
    m = _CALL.match(text.strip())
    assert m, f"cannot parse aggregate {text!r}"
    name, distinct, arg = m.groups()
    fn = UDFS[name]() if name in UDFS else name
    return AggCall(fn, None if arg == "*" else columns.index(arg), distinct=bool(distinct))


def config_from_case(case: dict) -> GroupAggregateConfig:
    cfg = case["config"]
    columns = [c[0] for c in case["schema"]["input"]]
    mini = cfg.get("mini_batch")
    return GroupAggregateConfig(
        group_keys=tuple(cfg["group_keys"]),
        aggregates=tuple(parse_call(a, columns) for a in cfg["aggregates"]),
        state_ttl_ms=cfg.get("idle_state_retention_ms", 0),
        generate_update_before=cfg.get("generate_update_before", True),
        mini_batch_size=mini["size"] if mini else None)


class TwoPhaseDriver(Driver):
    """Local aggregate fed by 'local_in'; its output is fed to the global aggregate on request."""

    def __init__(self, config: GroupAggregateConfig) -> None:
        self.local = LocalGroupAggregate(LocalGroupAggregateConfig(
            group_keys=config.group_keys, aggregates=config.aggregates, mini_batch_size=config.mini_batch_size))
        self.global_ = GlobalGroupAggregate(config)
        self.local_out = []

    def process(self, side, batch, now):
        assert side == "local_in"
        out = self.local.process(batch, now=now)
        self.local_out.append(out)
        return out

    def finish(self, now):
        return self.global_.finish(now=now)

    def feed_local_output_to_global(self, now):
        self.local_out.append(self.local.flush(now=now))
        result = type(self.local_out[0])()
        for batch in self.local_out:
            result.extend(self.global_.process(batch, now=now))
        result.extend(self.global_.flush(now=now))
        self.local_out = []
        return result


@pytest.mark.parametrize("path", case_params("GroupAggregate"))
def test_case(path):
    case = load(path)
    config = config_from_case(case)
    if case["config"].get("agg_phase_strategy") == "TWO_PHASE":
        driver = TwoPhaseDriver(config)
    else:
        driver = KernelDriver.of(GroupAggregate, config)
    run_case(case, driver)
