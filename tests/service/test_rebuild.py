"""``run --rebuild-views`` without Spark (changelake.service.rebuild): where the rebuilt checkpoint starts
(the old checkpoint's offsets, the mirrored tables at its last batch), the old checkpoint kept aside, a
rebuild interrupted by a crash resumed, a source that is not mirrored refused; and the pieces it reads with
(a table's version at a batch, its snapshot as +I changes, the carried epoch states)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from changelake.changelog import commit_position
from changelake.connectors.delta_read import TableSnapshot, read_delta, version_at_position
from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.service.config import load_config
from changelake.service.lifecycle import RestartRefused, prepare, read_lineage
from changelake.service.views import pipeline_from_config
from changelake.spark.checkpoint import carry_epochs, epochs_at, write_epochs

from .test_lifecycle import VIEWS, config_with_views

pytestmark = pytest.mark.unit

CHANGED = [VIEWS[0], {**VIEWS[1], "aggregates": {"orders": "count(*)", "n": "sum(quantity)"}}]


def start(config, **options):
    return prepare(config, pipeline_from_config(config).plan(), **options)


def write(config, table: str, key: str, rows: list[tuple[int, str]], *, batch_id: int, generation: int = 0,
          columns: bool = True) -> None:
    """Rows of ``table`` (key and _seq given; with ``columns``, its source's other columns null)."""
    sink = open_sink(TableSpec(name=table, path=config.table_path(table), primary_key=(key,)),
                     pipeline_id=config.pipeline.id, generation=generation)
    data = {key: pa.array([k for k, _ in rows], pa.int64())}
    source = next((n for n in pipeline_from_config(config).plan().sources if n.source == table), None)
    for f in (source.schema if source is not None and columns else ()):
        data.setdefault(f.name, pa.nulls(len(rows), f.type))
    data |= {"_kind": pa.array([0] * len(rows), pa.int8()), "_seq": [s for _, s in rows]}
    sink.apply(pa.table(data), batch_id=batch_id)


def committed(config, batch_id: int, offsets: dict) -> None:
    """Pretend Spark committed batches up to ``batch_id``, the last one ending at ``offsets``."""
    root = Path(config.pipeline.checkpoint)
    for log in ("offsets", "commits"):
        (root / log).mkdir(parents=True, exist_ok=True)
        for b in range(batch_id + 1):
            (root / log / str(b)).write_text("v1\n{}\n" + (json.dumps(offsets) if log == "offsets" else ""))


def lake(config, *, columns: bool = True) -> None:
    """Batches 0-3 of generation 0 wrote the mirrors; batch 4 was half written (orders only) when it crashed."""
    for b in range(4):
        write(config, "orders", "order_id", [(b, f"l{b:020d}")], batch_id=b, columns=columns)
        write(config, "products", "id", [(b, f"l{b:020d}")], batch_id=b, columns=columns)
    write(config, "orders", "order_id", [(99, f"l{99:020d}")], batch_id=4)


def test_a_tables_version_at_a_batch_and_its_snapshot_as_inserts(tmp_path):
    config = config_with_views(tmp_path)
    lake(config)
    path, app = config.table_path("orders"), f"changelake:{config.pipeline.id}:orders"
    at3 = version_at_position(path, app, commit_position(3), storage_options=None)
    assert at3 is not None and at3 < version_at_position(path, app, commit_position(4))
    changes = TableSnapshot(path, at3).changes()
    assert sorted(changes["order_id"].to_pylist()) == [0, 1, 2, 3]          # not batch 4's row
    assert set(changes["_kind"].to_pylist()) == {0} and changes["_seq"].to_pylist()
    assert 99 in read_delta(path)["order_id"].to_pylist()
    assert version_at_position(path, app, commit_position(0)) < at3
    assert version_at_position(str(tmp_path / "none"), app, 0) is None


def test_rebuild_views_starts_the_next_generation_at_the_old_checkpoints_offsets_and_keeps_it(tmp_path):
    config = config_with_views(tmp_path)
    offsets = {"lc.inventory.orders": {"0": 17, "1": 4}}
    start(config)
    lake(config)
    write(config, "category_sales", "category", [(1, "b1")], batch_id=3)
    committed(config, 3, offsets)
    edited = config_with_views(tmp_path, views=CHANGED)
    with pytest.raises(RestartRefused, match="--rebuild-views"):
        start(edited)

    begun = start(edited, rebuild_views=True)
    checkpoint = config.pipeline.checkpoint
    assert begun.generation == 1 and begun.new_checkpoint and begun.replaced == {"category_sales"}
    assert begun.rebuild.offsets == offsets and begun.rebuild.batch == 3
    orders = version_at_position(config.table_path("orders"), f"changelake:{config.pipeline.id}:orders",
                                 commit_position(3))
    assert begun.rebuild.tables["orders"] == orders                     # batch 3's version, not batch 4's
    assert os.path.isdir(checkpoint + ".gen0") and not os.path.isdir(checkpoint + "/commits")
    assert read_lineage(checkpoint).rebuild["kept"] == checkpoint + ".gen0"
    assert start(edited, rebuild_views=True).rebuild == begun.rebuild    # a restart continues the rebuild

    shutil.rmtree(checkpoint)                # a crash after the move, before the new checkpoint was recorded
    resumed = start(edited)
    assert resumed.generation == 1 and resumed.rebuild == begun.rebuild

    write(config, "orders", "order_id", [(5, f"l{5:020d}")], batch_id=0, generation=1)
    committed(edited, 0, {"lc.inventory.orders": {"0": 20, "1": 4}})   # its first batch done: rebuilt
    assert start(edited).rebuild is None
    again = config_with_views(tmp_path, views=[VIEWS[0], {**VIEWS[1], "aggregates": {"orders": "count(*)"}}])
    rebuilt = start(again, rebuild_views=True)                          # the views changed once more
    assert rebuilt.generation == 2 and rebuilt.rebuild.offsets == {"lc.inventory.orders": {"0": 20, "1": 4}}
    assert rebuilt.rebuild.generation == 1 and os.path.isdir(checkpoint + ".gen1")


def test_rebuild_views_with_nothing_changed_continues_the_checkpoint(tmp_path):
    config = config_with_views(tmp_path)
    start(config)
    lake(config)
    committed(config, 3, {"lc.inventory.orders": {"0": 17}})
    begun = start(config, rebuild_views=True)
    assert begun.generation == 0 and begun.rebuild is None and not begun.new_checkpoint


def test_rebuild_views_over_a_source_that_is_not_mirrored_is_refused_with_the_fix(tmp_path):
    config = config_with_views(tmp_path)
    start(config)
    lake(config)
    committed(config, 3, {"lc.inventory.orders": {"0": 17}})
    path = tmp_path / "pipeline.yaml"
    data = yaml.safe_load(path.read_text())
    data["views"] = CHANGED
    data["sources"] = [{k: v for k, v in s.items() if not (s["name"] == "products" and k == "table")}
                       for s in data["sources"]]
    data["tables"] = [t for t in data["tables"] if t["name"] != "products"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RestartRefused, match=r"source\(s\) products are not mirrored.*move the checkpoint .*"
                                             r"starting_offsets: earliest.*sources\[\]\.table"):
        start(load_config(path), rebuild_views=True)
    assert not os.path.isdir(config.pipeline.checkpoint + ".gen0")


def test_a_rebuilt_checkpoint_starts_from_the_old_ones_epoch_states(tmp_path):
    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    write_epochs(old, 2, {("t", 0): {"at": 10, "epoch": 1}})
    write_epochs(old, 5, {("t", 1): {"at": 40, "epoch": 2}})
    write_epochs(old, 6, {("t", 1): {"at": 90, "epoch": 3}})           # after the batch rebuilt from
    carry_epochs(old, new, 5)
    assert epochs_at(new, {("t", 0): 12, ("t", 1): 45}) == {("t", 0): {"at": 10, "epoch": 1},
                                                            ("t", 1): {"at": 40, "epoch": 2}}
    write_epochs(new, 0, {("t", 1): {"at": 50, "epoch": 3}})            # the new checkpoint's first batch
    assert epochs_at(new, {("t", 0): 12, ("t", 1): 55}) == {("t", 0): {"at": 10, "epoch": 1},
                                                            ("t", 1): {"at": 50, "epoch": 3}}


def test_rebuild_views_over_a_history_table_is_refused(tmp_path):
    config = config_with_views(tmp_path)
    start(config)
    committed(config, 3, {"lc.inventory.orders": {"0": 17}})
    path = tmp_path / "pipeline.yaml"
    data = yaml.safe_load(path.read_text())
    data["views"] = CHANGED
    for t in data["tables"]:
        if t["name"] == "orders":
            t["history"] = "scd2"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(RestartRefused, match=r"orders are mirrored into history tables.*Move the checkpoint"):
        start(load_config(path), rebuild_views=True)


def test_rebuild_views_from_a_table_that_lacks_a_column_the_views_read_is_refused(tmp_path):
    config = config_with_views(tmp_path)
    start(config)
    lake(config, columns=False)                  # the tables hold the keys only
    committed(config, 3, {"lc.inventory.orders": {"0": 17}})
    with pytest.raises(RestartRefused, match=r"source products.s view input needs column\(s\) name, .*at batch 3"):
        start(config_with_views(tmp_path, views=CHANGED), rebuild_views=True)
