"""Truncates on the service's mirror path, in process: decode stage -> driver -> delta-rs sinks (no JVM).

``on_truncate: apply`` empties a mirror at the truncate's position: rows and changes older than it
go, also when they arrive in a later batch or another partition; newer ones apply. ``skip`` counts
the truncate; ``fail`` makes it a dead letter that names its position. A source that views read
refuses ``apply`` (the views' state would keep the rows).
"""

from __future__ import annotations

import orjson
import pyarrow as pa
import pytest
import yaml

from changelake.connectors.delta_read import read_delta
from changelake.errors import ConfigError
from changelake.service.config import parse_config
from changelake.service.pipeline import BatchProcessor
from changelake.spark.kafka_source import ARROW_SCHEMA, EXPIRED
from changelake import metrics

pytestmark = pytest.mark.unit

TOPIC = "shop.orders"


def _config(tmp_path, pipeline_id: str, *, fmt: str = "debezium-json", views: bool = False, **source):
    src = {"name": "orders", "topics": [TOPIC], "format": fmt, "table": "orders",
           "columns": {"id": "bigint", "amount": "bigint"}, **source}
    raw = {"pipeline": {"id": pipeline_id, "checkpoint": str(tmp_path / "ckpt")},
           "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")},
           "sources": [src], "tables": [{"name": "orders", "primary_key": ["id"]}]}
    if views:
        raw["views"] = [{"name": "big", "from": "orders", "filter": "amount > 10"}]
        raw["tables"].append({"name": "big_orders", "from": "big", "primary_key": ["id"]})
    return parse_config(yaml.safe_dump(raw))


def dbz(op: str, pos: int, row: dict | None = None) -> dict:
    """A Debezium MySQL change of shop.orders at binlog position ``pos`` (row as after, or before for d)."""
    source = {"connector": "mysql", "db": "shop", "table": "orders", "file": "mysql-bin.000001", "pos": pos,
              "row": 0, "ts_ms": 1_700_000_000_000}
    before = row if op == "d" else None
    after = row if op in ("c", "u", "r") else None
    return {"op": op, "before": before, "after": after, "source": source, "ts_ms": 1_700_000_000_000}


def _batch(messages: list[tuple[int, int, dict]]) -> pa.RecordBatch:
    """``(partition, offset, value)`` records of TOPIC."""
    n = len(messages)
    return pa.RecordBatch.from_pydict({
        "topic": [TOPIC] * n, "partition": [m[0] for m in messages], "offset": [m[1] for m in messages],
        "timestamp": [1_700_000_000_000] * n, "key": [None] * n,
        "value": [orjson.dumps(m[2]) for m in messages], EXPIRED: [0] * n}, schema=ARROW_SCHEMA)


def _process(processor: BatchProcessor, batch_id: int, messages) -> None:
    out = pa.Table.from_batches(list(processor.stage(iter([_batch(messages)]))))
    processor.process_decoded(out, batch_id)


def _rows(config) -> dict[int, int]:
    return {r["id"]: r["amount"] for r in read_delta(config.table_path("orders"), columns=["id", "amount"]).to_pylist()}


def _truncates(source: str, action: str) -> float:
    return metrics.REGISTRY.get_sample_value("changelake_truncates_total", {"source": source, "action": action}) or 0


def test_apply_empties_the_mirror_at_the_truncate_position(tmp_path):
    config = _config(tmp_path, "trunc-apply", on_truncate="apply")
    processor = BatchProcessor(config)
    before = _truncates("orders", "apply")
    _process(processor, 0, [(0, 0, dbz("c", 100, {"id": 1, "amount": 10})),
                            (1, 0, dbz("c", 200, {"id": 2, "amount": 20})),
                            (0, 1, dbz("c", 300, {"id": 3, "amount": 30}))])
    # the truncate at 500 in partition 0; partition 1 delivers a change from before it (450) and after it
    _process(processor, 1, [(1, 1, dbz("u", 450, {"id": 2, "amount": 21})),
                            (0, 2, dbz("t", 500)),
                            (1, 2, dbz("c", 600, {"id": 5, "amount": 50}))])
    assert _rows(config) == {5: 50}
    assert processor.totals.truncates == {"orders": 1}
    # a restarted process replays batch 1 (Spark had not recorded it; Spark replays only its last batch):
    # nothing changes
    again = BatchProcessor(config)
    _process(again, 1, [(1, 1, dbz("u", 450, {"id": 2, "amount": 21})), (0, 2, dbz("t", 500)),
                        (1, 2, dbz("c", 600, {"id": 5, "amount": 50}))])
    assert _rows(config) == {5: 50}
    # later: older late changes stay out, newer ones apply
    _process(again, 2, [(1, 3, dbz("c", 480, {"id": 9, "amount": 90})),
                        (1, 4, dbz("d", 490, {"id": 5, "amount": 50})),
                        (0, 3, dbz("c", 700, {"id": 6, "amount": 60}))])
    assert _rows(config) == {5: 50, 6: 60}
    assert _truncates("orders", "apply") - before == 2          # read twice: in batch 1 and in its replay


def test_skip_counts_the_truncate_and_keeps_the_rows(tmp_path):
    config = _config(tmp_path, "trunc-skip")           # the default
    processor = BatchProcessor(config)
    before = _truncates("orders", "skip")
    _process(processor, 0, [(0, 0, dbz("c", 100, {"id": 1, "amount": 10})), (0, 1, dbz("t", 200))])
    assert _rows(config) == {1: 10}
    assert _truncates("orders", "skip") - before == 1


def test_fail_names_the_position(tmp_path):
    config = _config(tmp_path, "trunc-fail", on_truncate="fail", on_error="fail")
    processor = BatchProcessor(config)
    with pytest.raises(Exception, match=r"TRUNCATE event \(op 't'\) of shop.orders at position l0+1"):
        _process(processor, 0, [(0, 0, dbz("c", 100, {"id": 1, "amount": 10})), (0, 7, dbz("t", 200))])


def test_canal_truncate_applies_within_its_partition(tmp_path):
    config = _config(tmp_path, "trunc-canal", fmt="canal-json", on_truncate="apply")
    processor = BatchProcessor(config)

    def canal(kind: str, rows=None, **extra):
        return {"data": rows, "old": None, "database": "shop", "table": "orders", "type": kind, "isDdl": False,
                "es": 1_700_000_000_000, "ts": 1_700_000_000_000, "pkNames": ["id"], **extra}

    _process(processor, 0, [(0, 0, canal("INSERT", [{"id": "1", "amount": "10"}])),
                            (0, 1, canal("TRUNCATE", isDdl=True, sql="truncate table orders")),
                            (0, 2, canal("INSERT", [{"id": "2", "amount": "20"}]))])
    assert _rows(config) == {2: 20}


def test_apply_is_refused_on_a_source_that_views_read(tmp_path):
    with pytest.raises(ConfigError, match="on_truncate: apply, but views or tables read it"):
        _config(tmp_path, "trunc-graph", views=True, on_truncate="apply")
    with pytest.raises(ConfigError, match="on_truncate: apply, but views"):
        _config(tmp_path, "trunc-graph2", views=True, options={"on_truncate": "apply"})
    assert _config(tmp_path, "trunc-graph3", views=True, on_truncate="skip").sources[0].truncate_policy == "skip"


def _doc_yaml(doc: str, heading: str) -> str:
    from pathlib import Path
    import re

    text = (Path(__file__).resolve().parents[2] / "docs" / doc).read_text()
    start = text.index(heading)
    section = text[start:text.find("\n## ", start + 1)]
    return next(body for lang, body in re.findall(r"```(\w*)\n(.*?)```", section, flags=re.DOTALL) if lang == "yaml")


def _doc_config(tmp_path, doc: str, heading: str, pipeline_id: str):
    header = {"pipeline": {"id": pipeline_id, "checkpoint": str(tmp_path / "ckpt")},
              "kafka": {"bootstrap_servers": "localhost:1"}, "storage": {"root": str(tmp_path / "lake")}}
    return parse_config(yaml.safe_dump(header) + _doc_yaml(doc, heading))


def test_the_formats_doc_example_empties_the_mirror(tmp_path):
    config = _doc_config(tmp_path, "formats.md", "## Truncates", "trunc-doc")
    processor = BatchProcessor(config)
    _process(processor, 0, [(0, 0, dbz("c", 100, {"id": 1, "amount": 10})), (0, 1, dbz("t", 200)),
                            (0, 2, dbz("c", 300, {"id": 2, "amount": 20}))])
    assert _rows(config) == {2: 20}


def test_the_pipelines_doc_example_splits_mirror_and_views(tmp_path):
    config = _doc_config(tmp_path, "pipelines.md", "## Truncates and views", "trunc-doc-views")
    processor = BatchProcessor(config)
    assert {s.name: s.truncate_policy for s in config.sources} == {"orders_mirror": "apply", "orders": "fail"}
    _process(processor, 0, [(0, 0, dbz("c", 100, {"id": 1, "amount": 10})), (0, 1, dbz("t", 200)),
                            (0, 2, dbz("c", 300, {"id": 2, "amount": 200}))])
    assert _rows(config) == {2: 200}
    letters = read_delta(config.dead_letter_path()).to_pylist()
    assert [(d["reason"], d["offset"]) for d in letters] == [("unsupported", 1)]
    assert "at position l" in letters[0]["error"]
