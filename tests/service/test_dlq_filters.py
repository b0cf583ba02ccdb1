"""``changelake dlq replay``'s choice of letters, on a real Delta quarantine table (no broker: dry runs)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml
from deltalake import write_deltalake

from changelake.changelog import DEAD_LETTER_SCHEMA
from changelake.connectors.dead_letters import DeadLetterStore
from changelake.service.config import parse_config
from changelake.errors import ConfigError
from changelake.service.dlq import Filters, replay

pytestmark = pytest.mark.unit


def _config(tmp_path):
    return parse_config(yaml.safe_dump({
        "pipeline": {"id": "dlq-filters", "checkpoint": str(tmp_path / "ckpt")},
        "kafka": {"bootstrap_servers": "localhost:1"},
        "sources": [{"name": "db", "topic_pattern": r"db\..*", "route": [
            {"source_table": r"shop\.(.*)", "table": "$1", "primary_key": ["id"]}]}],
        "storage": {"root": str(tmp_path / "lake")}}))


def _letters(offsets, reason="schema-incompatible") -> pa.Table:
    n = len(offsets)
    return pa.table({"topic": ["db.shop"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(offsets, pa.int64()), "timestamp": pa.array([None] * n, pa.int64()),
                     "key": [b"k"] * n, "value": [b"v%d" % o for o in offsets],
                     "reason": [reason] * n, "error": ["column 'name' changed"] * n}).cast(DEAD_LETTER_SCHEMA)


def test_replay_narrows_to_one_table_of_a_routed_source(tmp_path):
    config = _config(tmp_path)
    store = DeadLetterStore(config.dead_letter_path(), pipeline_id=config.pipeline.id)
    store.append(_letters([1, 2, 3]), source="db", batch_id=0, table="items")
    store.append(_letters([4, 5]), source="db", batch_id=1, table="orders")
    store.append(_letters([6], reason="unrouted"), source="db", batch_id=2, table=None)

    assert replay(config, Filters(table="items"), dry_run=True).by_reason == {"schema-incompatible": 3}
    assert replay(config, Filters(table="orders"), dry_run=True).by_reason == {"schema-incompatible": 2}
    with pytest.raises(ConfigError, match="unknown table 'itemz': did you mean 'items'"):
        replay(config, Filters(table="itemz"), dry_run=True)
    assert replay(config, dry_run=True).by_reason == {"schema-incompatible": 5, "unrouted": 1}
    assert replay(config, Filters(reason="unrouted", table="items"), dry_run=True).by_reason == {}


def test_a_quarantine_table_written_before_letters_named_their_table_still_replays(tmp_path):
    config = _config(tmp_path)
    old = _letters([7, 8]).append_column("source", pa.array(["db"] * 2)) \
        .append_column("pipeline_id", pa.array([config.pipeline.id] * 2)) \
        .append_column("batch_id", pa.array([0, 0], pa.int64()))           # no "table" column
    write_deltalake(config.dead_letter_path(), old)

    assert replay(config, dry_run=True).by_reason == {"schema-incompatible": 2}


def test_every_reason_a_letter_can_carry_has_a_replay_rule():
    from changelake.formats import REASONS
    from changelake.service.dlq import ALL_REASONS, REPLAY_RULE

    assert set(ALL_REASONS) == set(REPLAY_RULE) and set(REASONS) <= set(REPLAY_RULE)
    assert {r for r, rule in REPLAY_RULE.items() if rule != "after-fix"} == \
        {"malformed", "unknown-op", "late", "operator-error"}


def test_list_and_replay_refuse_unknown_filters_and_apply_the_reason_rules(tmp_path):
    from changelake.service.dlq import list_letters

    config = _config(tmp_path)
    store = DeadLetterStore(config.dead_letter_path(), pipeline_id=config.pipeline.id)
    store.append(_letters([1, 2]), source="db", batch_id=0, table="items")
    store.append(_letters([3], reason="malformed"), source="db", batch_id=1, table=None)
    store.append(_letters([1], reason="schema-incompatible"), source="db", batch_id=2, table="items")  # again

    listed = list_letters(config)
    assert [(r["offset"], r["quarantined"], r["replay"]) for r in listed] == \
        [(1, 2, "after-fix"), (2, 1, "after-fix"), (3, 1, "force")]
    assert [r["offset"] for r in list_letters(config, Filters(min_offset=2, max_offset=2))] == [2]
    with pytest.raises(ConfigError, match=r"unknown source 'dv'.*valid sources: db"):
        list_letters(config, Filters(source="dv"))
    with pytest.raises(ConfigError, match="did you mean 'schema-mismatch'"):
        replay(config, Filters(reason="schema-mismatc"), dry_run=True)
    with pytest.raises(ConfigError, match="ISO 8601"):
        list_letters(config, Filters(since="yesterday"))

    dry = replay(config, dry_run=True)
    assert (dry.by_reason, dry.refused) == ({"schema-incompatible": 2}, {"malformed": 1})
    assert dry.topics == {"db.shop.replay": 2}
    assert replay(config, dry_run=True, force=True).by_reason == {"schema-incompatible": 2, "malformed": 1}


def test_the_kafka_source_reads_each_sources_replay_topics():
    from changelake.service.pipeline import _Route
    from changelake.service.query_start import kafka_reader_options
    from changelake.spark.kafka_source import KafkaOptions

    config = parse_config(yaml.safe_dump({
        "pipeline": {"id": "p1", "checkpoint": "/tmp/x"}, "kafka": {"bootstrap_servers": "localhost:1"},
        "sources": [{"name": "a", "topics": ["db.a", "db.b"], "table": "a"},
                    {"name": "c", "topic_pattern": r"cdc\.shop\..*", "table": "c"},
                    {"name": "d", "topics": ["db.d"], "table": "d", "replay_topic": "d-replays"}],
        "tables": [{"name": n} for n in "acd"]}))
    options = KafkaOptions.parse(kafka_reader_options(config))
    assert options.replay_pipeline == "p1"
    assert [t for t in ("db.a.replay", "db.b.replay", "cdc.shop.x.replay", "d-replays") if options.is_replay(t)] == \
        ["db.a.replay", "db.b.replay", "cdc.shop.x.replay", "d-replays"]
    assert not any(options.is_replay(t) for t in ("db.a", "db.d.replay", "cdc.shop.x", "db.a.replay.x"))
    assert _Route(config.sources[2].model_copy()).matches("d-replays")
    with pytest.raises(Exception, match="replay_topic 'db.x' is one of the source's own topics"):
        parse_config(yaml.safe_dump({
            "pipeline": {"id": "p1", "checkpoint": "/tmp/x"}, "kafka": {"bootstrap_servers": "localhost:1"},
            "sources": [{"name": "a", "topics": ["db.x"], "table": "a", "replay_topic": "db.x"}],
            "tables": [{"name": "a"}]}))
