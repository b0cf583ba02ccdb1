"""How the chain's nodes share the query's operators (changelake.spark.chain.Chain.stages).

A new checkpoint runs one operator per level of the graph: the stateful nodes of a level side by
side in one ``transformWithStateInPandas``, each on its own range of that operator's buckets. A node
must run after every chain node upstream of it, each node exactly once, and every bucket of every node
must have a group of its own in its operator that leads back to it. Checkpoints recorded before
per-level operators keep one operator per stateful node.
"""

from __future__ import annotations

import numpy as np
import pytest

from changelake.spark.chain import DRIVER, REPORTS, Chain
from changelake.spark.groups import GroupLayout

from .test_plan_spark import shop

pytestmark = pytest.mark.unit

BUCKETS = {"enriched": 5, "by_category": 4}      # unequal counts, so the ranges' offsets matter


def _upstream(plan, node_id: str, chain_nodes: set[str]) -> set[str]:
    """The chain nodes upstream of ``node_id`` (through stateless nodes)."""
    found: set[str] = set()
    for i in plan[node_id].inputs:
        found |= {i} if i in chain_nodes else _upstream(plan, i, chain_nodes)
    return found


def test_per_level_operators_run_each_stateful_node_once_after_everything_it_reads():
    plan = shop().plan()
    chain = Chain.of(plan, BUCKETS, 3, True, GroupLayout(2))
    stateful = [n.id for n in plan if n.stateful]
    ran = [chain.order[i] for stage in chain.stages for i in stage]
    assert sorted(ran) == sorted(stateful)
    stage_of = {chain.order[i]: s for s, stage in enumerate(chain.stages) for i in stage}
    for node_id in stateful:
        for up in _upstream(plan, node_id, set(chain.order)):
            assert stage_of[up] < stage_of[node_id], (up, node_id)
    # the two normalizes share level 1; the aggregate and the lines' materializer level 3
    assert len(chain.stages) == 4 and len(stateful) == 6
    assert max(len(stage) for stage in chain.stages) == 2

    per_node = Chain.of(plan, BUCKETS, 3, True, GroupLayout(2, per_level=False))
    assert per_node.stages == tuple((i,) for i in range(len(stateful)))
    assert Chain.of(plan, BUCKETS, 3, True, None).stages == per_node.stages   # the old numbering


@pytest.mark.parametrize("partitions", [1, 2, 3])
def test_every_bucket_of_every_node_has_its_own_group_in_its_operator(partitions):
    chain = Chain.of(shop().plan(), BUCKETS, 3, True, GroupLayout(partitions))
    for s, stage in enumerate(chain.stages):
        groups = []
        for i in stage:
            buckets = chain.buckets[chain.order[i]]
            g = chain.next_group(np.full(buckets, i), np.arange(buckets), s)
            assert (g >= 0).all()
            assert [chain.stage_bucket(s, chain.groups.bucket(int(x))) for x in g] == [(i, b) for b in range(buckets)]
            assert (chain.next_group(np.full(buckets, i), np.arange(buckets), s + 1) < 0).all()
            groups.extend(g.tolist())
        assert len(set(groups)) == len(groups) == sum(chain.buckets[chain.order[i]] for i in stage)
    others = np.array([REPORTS, DRIVER, len(chain.order), len(chain.order) + 1])     # reports, driver, sinks
    for s in range(len(chain.stages)):
        assert (chain.next_group(others, np.arange(4), s) < 0).all()
