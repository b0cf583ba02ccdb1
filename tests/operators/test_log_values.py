"""No row values in logs by default (changelake/log_values.py): a history that makes every operator warn
about a stale retraction logs keys and counts, never a customer's data, unless CHANGELAKE_LOG_ROW_VALUES is on."""

from __future__ import annotations

import logging

import pytest

from changelake.errors import StateError
from changelake.log_values import ENV
from changelake.operators._rows import Changes
from changelake.operators._topn_buffer import SortColumn
from changelake.operators.deduplicate import Deduplicate, DeduplicateConfig
from changelake.operators.group_aggregate import AggCall, GroupAggregate, GroupAggregateConfig
from changelake.operators.join_state import InputSpec
from changelake.operators.rank import RankConfig, make_rank
from changelake.operators.sink_upsert_materializer import SinkUpsertMaterializer, SinkUpsertMaterializerConfig
from changelake.operators.streaming_join import StreamingJoin, StreamingJoinConfig

pytestmark = pytest.mark.unit

EMAIL, NAME, SPEND = "alice.secret@example.com", "Alice Secretname", 98765.43


def _history() -> list[tuple[str, object, list, str]]:
    """(operator, kernel, changes, side) whose retractions find no state: each one a stale-retraction warning.
    Rows are (customer id, email, name, spend); the key is the customer id 4242."""
    row = (4242, EMAIL, NAME, SPEND)
    spec = InputSpec("join_key_contains_unique_key", (0,))
    join = StreamingJoin(StreamingJoinConfig(join_type="INNER", left_key=(0,), right_key=(0,), left_arity=4,
                                             right_arity=4, left_input=spec, right_input=spec))
    updatable = make_rank(RankConfig(strategy="update", partition_keys=(), sort_keys=(SortColumn(3),),
                                     rank_end=3, row_key=(0,), output_rank_number=True))
    return [
        ("Deduplicate", Deduplicate(DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False)),
         [("-D", row)], None),
        ("GroupAggregate", GroupAggregate(GroupAggregateConfig(group_keys=(0,), aggregates=(AggCall("SUM", 3),))),
         [("-U", row)], None),
        ("SinkUpsertMaterializer", SinkUpsertMaterializer(SinkUpsertMaterializerConfig(keys=(0,))),
         [("-D", row)], None),
        ("Rank", make_rank(RankConfig(strategy="retract", partition_keys=(0,),
                                                 sort_keys=(SortColumn(3),), rank_end=2)), [("-D", row)], None),
        ("Rank", updatable, [("+I", (4242, EMAIL, NAME, 1.5)), ("+U", row)], None),
        ("StreamingJoin", join, [("-D", row)], "left"),
        ("StreamingJoin", join, [("-U", row)], "right"),
    ]


def _run(caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for _, kernel, changes, side in _history():
            if side is None:
                kernel.process(Changes.of(changes))
            else:
                kernel.process(Changes.of(changes), side=side)
    return caplog.text


def test_stale_retraction_warnings_name_keys_not_values(caplog, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    text = _run(caplog)
    warned = {r.getMessage().split(":")[0] for r in caplog.records}
    assert warned == {"Deduplicate", "GroupAggregate", "SinkUpsertMaterializer", "Rank", "StreamingJoin"}, text
    assert len(caplog.records) == 7, text
    for value in (EMAIL, NAME, "Secretname", str(SPEND), "98765", "1.5"):
        assert value not in text
    assert "4242" in text                                    # keys are shown: they identify the row
    assert f"{ENV}=1 shows them" in text                     # and the log says how to see the rest


def test_row_values_are_logged_when_asked_for(caplog, monkeypatch):
    monkeypatch.setenv(ENV, "1")
    text = _run(caplog)
    assert EMAIL in text and NAME in text


def test_a_failing_stale_retraction_names_the_key_not_the_row(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    dedup = Deduplicate(DeduplicateConfig(keys=(0,), keep="last", input_insert_only=False,
                                          on_stale_retraction="fail"))
    with pytest.raises(StateError) as raised:
        dedup.process(Changes.of([("-D", (4242, EMAIL, NAME, SPEND))]))
    assert "4242" in str(raised.value) and EMAIL not in str(raised.value)
