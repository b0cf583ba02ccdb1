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
