"""changelake.service.split without Spark: when a pipeline runs its mirrors in a query of their own, what
each query reads and writes, and the start check of each query against its own tables only."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.errors import ConfigError
from changelake.service.lifecycle import prepare
from changelake.service.split import mirror_checkpoint, query_checkpoint, split
from changelake.service.status import PartitionLag, _slower
from changelake.service.views import pipeline_from_config

from .test_lifecycle import config_with_views

pytestmark = pytest.mark.unit


def own_query(config):
    return config.model_copy(update={"pipeline": config.pipeline.model_copy(update={"mirrors": "own_query"})})


def _offsets(checkpoint: str) -> None:
    os.makedirs(f"{checkpoint}/offsets", exist_ok=True)
    with open(f"{checkpoint}/offsets/0", "w") as f:
        f.write("v1\n{}\n")


def test_a_pipeline_with_views_and_mirrors_runs_two_queries_that_write_disjoint_tables(tmp_path):
    config = own_query(config_with_views(tmp_path))
    two = split(config)
    assert two is not None
    assert two.mirrors.pipeline.checkpoint == mirror_checkpoint(config) == config.pipeline.checkpoint + "/mirrors"
    assert two.mirrors.views == [] and {t.name for t in two.mirrors.tables} == {"customers", "products", "orders"}
    assert [t.name for t in two.graph.tables] == ["category_sales"]
    # the graph's query reads only the sources the views read, and mirrors none of them
    assert sorted(s.name for s in two.graph.sources) == ["orders", "products"]
    assert all(s.table is None for s in two.graph.sources)
    assert two.elsewhere == {"orders", "products"}
    assert query_checkpoint(config, "orders") == mirror_checkpoint(config)
    assert query_checkpoint(config, "category_sales") == config.pipeline.checkpoint
    with pytest.raises(ConfigError, match="rebuild-views"):
        split(config, rebuild_views=True)


def test_the_mode_is_decided_when_the_checkpoint_is_created(tmp_path):
    one = config_with_views(tmp_path / "a")
    assert one.pipeline.mirrors == "with_graph"            # the default
    config = own_query(one)
    assert split(one) is None
    _offsets(config.pipeline.checkpoint)            # an existing checkpoint without <checkpoint>/mirrors
    assert split(config) is None
    os.makedirs(mirror_checkpoint(config))          # ... and one created with the mirrors apart
    assert split(one) is not None and split(config) is not None
    mirrors_only = config.model_copy(update={"views": [], "tables": [t for t in config.tables if t.from_ is None]})
    assert split(mirrors_only) is None


def test_each_query_checks_only_its_own_tables_at_start(tmp_path):
    """The mirrors' query is at batch 40 while the graph's checkpoint has committed nothing: neither start is
    refused, since each compares its own tables with its own checkpoint."""
    config = own_query(config_with_views(tmp_path))
    two = split(config)
    sink = open_sink(TableSpec(name="orders", path=config.table_path("orders"), primary_key=("order_id",)),
                     pipeline_id=config.pipeline.id)
    sink.apply(pa.table({"order_id": [1], "_kind": pa.array([0], pa.int8()), "_seq": ["a"]}), batch_id=40)
    graph_tables = {t.name for t in two.graph.tables}
    plan = pipeline_from_config(two.graph).plan()
    begun = prepare(two.graph, plan, writes=lambda name: name in graph_tables)
    assert begun.generation == 0
    with pytest.raises(Exception, match="already holds batch 40"):
        prepare(config, plan)                       # as one query, the same lake is refused


def test_a_partition_lags_as_the_slower_query():
    graph = [PartitionLag("t", 0, 100, 120), PartitionLag("t", 1, None, 50)]
    mirrors = [PartitionLag("t", 0, 118, 120), PartitionLag("t", 1, 50, 50)]
    assert [(p.committed, p.lag) for p in _slower(graph, mirrors)] == [(100, 20), (None, None)]
    assert [(p.committed, p.lag) for p in _slower(mirrors, graph)] == [(100, 20), (None, None)]
