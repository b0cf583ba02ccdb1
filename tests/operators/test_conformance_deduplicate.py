"""Deduplicate against Flink's proc-time / row-time (mini-batch) deduplicate function tests."""

import pytest

from changelake.operators.deduplicate import Deduplicate, DeduplicateConfig
from tests.operators.harness import KernelDriver, case_params, load, run_case


def config_from_case(cfg: dict) -> DeduplicateConfig:
    variant = cfg["variant"]
    mini = cfg.get("mini_batch")
    common = dict(keys=tuple(cfg["keys"]), state_ttl_ms=cfg.get("state_ttl_ms", 0),
                  mini_batch_size=mini["size"] if mini else None,
                  generate_update_before=cfg.get("generate_update_before", True),
                  generate_insert=cfg.get("generate_insert", True),
                  input_insert_only=cfg.get("input_insert_only", True))
    if variant == "proctime_keep_first_row":
        return DeduplicateConfig(keep="first", order="proctime", **common)
    if variant == "proctime_keep_last_row":
        return DeduplicateConfig(keep="last", order="proctime", **common)
    if variant in ("rowtime", "rowtime_minibatch", "rowtime_minibatch_latest_change"):
        return DeduplicateConfig(keep="last" if cfg["keep_last_row"] else "first", order="rowtime",
                                 rowtime_index=cfg["rowtime_index"],
                                 compact_changes=variant == "rowtime_minibatch_latest_change", **common)
    raise AssertionError(f"unknown Deduplicate variant {variant!r}")


@pytest.mark.parametrize("path", case_params("Deduplicate"))
def test_case(path):
    case = load(path)
    config = config_from_case(case["config"])
    run_case(case, KernelDriver.of(Deduplicate, config))
