"""Stateful changelog operators: pure batch-at-a-time kernels (no Spark import).

See ``docs/operators.md`` for the kernel API, each operator's emission rules and the
deliberate differences from Flink.
"""

from changelake.operators._rows import Changes
from changelake.operators.deduplicate import Deduplicate, DeduplicateConfig
from changelake.operators.group_aggregate import (
    AggCall, GlobalGroupAggregate, GroupAggregate, GroupAggregateConfig, LocalGroupAggregate,
    LocalGroupAggregateConfig)
from changelake.operators.join_state import InputSpec
from changelake.operators.rank import RankConfig, make_rank
from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig
from changelake.operators.streaming_join import StreamingJoin, StreamingJoinConfig, StreamingSemiAntiJoin
from changelake.operators._topn_buffer import SortColumn

__all__ = [
    "AggCall", "Changes", "Deduplicate", "DeduplicateConfig", "GlobalGroupAggregate", "GroupAggregate",
    "GroupAggregateConfig", "InputSpec", "LocalGroupAggregate", "LocalGroupAggregateConfig", "RankConfig",
    "SinkUpsertMaterializer", "SinkUpsertMaterializerConfig", "SortColumn", "StreamingJoin",
    "StreamingJoinConfig", "StreamingSemiAntiJoin", "make_rank",
]
