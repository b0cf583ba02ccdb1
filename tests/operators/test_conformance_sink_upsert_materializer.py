"""SinkUpsertMaterializer against Flink's SinkUpsertMaterializerTest cases."""

import pytest

from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig
from tests.operators.harness import KernelDriver, case_params, load, run_case


def config_from_case(cfg: dict) -> SinkUpsertMaterializerConfig:
    return SinkUpsertMaterializerConfig(
        keys=tuple(cfg["keys"]),
        upsert_key=tuple(cfg["upsert_key"]) if cfg.get("upsert_key") else None,
        state_ttl_ms=cfg.get("state_ttl_ms", 0))


@pytest.mark.parametrize("path", case_params("SinkUpsertMaterializer"))
def test_case(path):
    case = load(path)
    config = config_from_case(case["config"])
    run_case(case, KernelDriver.of(SinkUpsertMaterializer, config))
