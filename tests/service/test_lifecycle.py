"""The start check of changelake.service.lifecycle, without Spark: a checkpoint's generation, and the
refusals (a checkpoint behind its tables, an older one, changed views, a view that cannot be recomputed)."""

from __future__ import annotations

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from changelake.connectors.delta_sink import TableSpec, open_sink
from changelake.service.config import load_config
from changelake.service.lifecycle import RestartRefused, prepare, read_lineage, read_tombstone_tables
from changelake.service.views import pipeline_from_config

from ..integration.helpers import pipeline_config

pytestmark = pytest.mark.unit

VIEWS = [{"name": "enriched", "join": {"left": "orders", "right": "products", "on": {"product_id": "id"}}},
         {"name": "by_category", "from": "enriched", "group_by": ["category"],
          "aggregates": {"orders": "count(*)"}}]


def config_with_views(tmp_path, views=VIEWS, **source_options):
    _, path = pipeline_config("localhost:1", tmp_path, topic_prefix="lc")
    data = yaml.safe_load(path.read_text())
    data["views"] = views
    data["tables"].append({"name": "category_sales", "from": "by_category", "primary_key": ["category"]})
    for s in data["sources"]:
        s["primary_key"] = ["order_id" if s["name"] == "orders" else "id"]
        s.update(source_options)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_config(path)


def start(config):
    graph = pipeline_from_config(config)
    return prepare(config, graph.plan() if graph else None)


def new_checkpoint(config, path):
    return config.model_copy(update={"pipeline": config.pipeline.model_copy(update={"checkpoint": str(path)})})


def write(config, table: str, *, batch_id: int, generation: int = 0) -> None:
    sink = open_sink(TableSpec(name=table, path=config.table_path(table), primary_key=("id",)),
                     pipeline_id=config.pipeline.id, generation=generation)
    sink.apply(pa.table({"id": [1], "_kind": pa.array([0], pa.int8()), "_seq": ["s1"]}), batch_id=batch_id)


def committed(config, batch_id: int) -> None:
    """Pretend Spark committed batches up to ``batch_id`` in the checkpoint."""
    from pathlib import Path

    root = Path(config.pipeline.checkpoint)
    for log in ("offsets", "commits"):
        (root / log).mkdir(parents=True, exist_ok=True)
        for b in range(batch_id + 1):
            (root / log / str(b)).write_text("v1\n{}\n")


def test_a_new_checkpoint_on_a_fresh_lake_is_generation_0_and_on_a_written_lake_the_next(tmp_path):
    config = config_with_views(tmp_path)
    assert start(config).generation == 0
    assert read_lineage(config.pipeline.checkpoint).views.keys() == {"category_sales"}

    write(config, "orders", batch_id=7)
    write(config, "category_sales", batch_id=7)
    begun = start(new_checkpoint(config, tmp_path / "ck2"))
    assert begun.generation == 1 and begun.replaced == {"category_sales"} and begun.new_checkpoint


def test_a_checkpoint_behind_the_batches_it_wrote_is_refused(tmp_path):
    config = config_with_views(tmp_path)
    committed(config, 3)
    write(config, "orders", batch_id=4)                     # a replay of batch 4 is fine
    assert start(config).generation == 0
    write(config, "orders", batch_id=9)
    with pytest.raises(RestartRefused, match="table orders already holds batch 9 .*older than the tables"):
        start(config)


def test_an_older_checkpoint_is_refused_once_a_newer_one_wrote(tmp_path):
    config = config_with_views(tmp_path)
    committed(config, 2)
    start(config)
    write(config, "products", batch_id=0, generation=1)
    with pytest.raises(RestartRefused, match="newer checkpoint .*generation 1"):
        start(config)


def test_changed_views_on_an_existing_checkpoint_are_refused_and_a_removed_table_is_not(tmp_path):
    config = config_with_views(tmp_path)
    start(config)
    changed = [VIEWS[0], {**VIEWS[1], "aggregates": {"orders": "count(*)", "n": "sum(quantity)"}}]
    edited = config_with_views(tmp_path, views=changed)
    with pytest.raises(RestartRefused, match="changed: category_sales.*operators state moved.*move the checkpoint"):
        start(edited)
    assert start(config).generation == 0                    # the recorded views still run


def test_a_view_that_a_new_checkpoint_cannot_recompute_is_refused(tmp_path):
    config = config_with_views(tmp_path, starting_offsets="latest")
    write(config, "category_sales", batch_id=3)
    with pytest.raises(RestartRefused, match="source.* orders, products do not start at earliest"):
        start(new_checkpoint(config, tmp_path / "ck2"))


def test_a_refused_start_is_refused_before_the_spark_session_is_built(tmp_path, monkeypatch):
    """``changelake run`` on changed views, or with an older checkpoint: the refusal comes from the checkpoint's
    files and the Delta logs, before the JVM starts (seconds, not a Spark session's start-up)."""
    from changelake.service import runner

    def no_session(**_):
        raise AssertionError("the Spark session was built for a start that is refused")

    monkeypatch.setattr(runner, "build_session", no_session)
    monkeypatch.setattr(runner, "broker_topics", lambda config: {})      # no broker in the unit tier
    config = config_with_views(tmp_path)
    committed(config, 2)
    start(config)
    changed = [VIEWS[0], {**VIEWS[1], "aggregates": {"orders": "count(*)", "n": "sum(quantity)"}}]
    edited = config_with_views(tmp_path, views=changed)
    with pytest.raises(RestartRefused, match="changed: category_sales.*move the checkpoint"):
        runner.PipelineRunner(edited, serve_http=False).run(install_signal_handlers=False)
    write(config, "products", batch_id=0, generation=1)
    with pytest.raises(RestartRefused, match="newer checkpoint .*generation 1"):
        runner.PipelineRunner(config, serve_http=False).run(install_signal_handlers=False)


def test_checking_a_start_only_changes_nothing(tmp_path):
    """The runner's check before the session (``check_only``) writes no record, so the start itself decides."""
    config = config_with_views(tmp_path)
    graph = pipeline_from_config(config)
    assert prepare(config, graph.plan(), check_only=True).generation == 0
    assert read_lineage(config.pipeline.checkpoint) is None
    write(config, "orders", batch_id=7)
    begun = prepare(config, graph.plan(), check_only=True)
    assert begun.generation == 1 and begun.new_checkpoint
    assert read_lineage(config.pipeline.checkpoint) is None
    assert start(config).generation == 1


def test_the_start_takes_what_its_check_read_and_reads_no_delta_log_again(tmp_path, monkeypatch):
    """``refuse_bad_start`` reads every table's log before the JVM starts; the start after it (the same lease
    held throughout) decides the same from what that read found, without a second request per table."""
    from changelake.service import lifecycle

    config = config_with_views(tmp_path)
    write(config, "orders", batch_id=7)
    write(config, "products", batch_id=7)
    reads = []
    txn = lifecycle._txn
    monkeypatch.setattr(lifecycle, "_txn", lambda path, app, options, keep=None: reads.append(path) or
                        txn(path, app, options, keep))
    graph = pipeline_from_config(config)
    checked = prepare(config, graph.plan(), check_only=True)
    read_by_check = len(reads)
    assert read_by_check >= 2 and set(checked.positions) == {"orders", "products"}
    begun = prepare(config, graph.plan(), positions=checked.positions)
    assert len(reads) == read_by_check           # no Delta log read again
    assert (begun.generation, begun.new_checkpoint, begun.positions) == (1, True, checked.positions)
    assert read_lineage(config.pipeline.checkpoint).generation == 1


def test_the_start_check_reads_the_delta_logs_at_once(tmp_path, monkeypatch):
    """On an object store a log read waits on round trips: the check reads every table's log at the same time
    (up to ``LOG_READERS``), so a pipeline of many tables starts in the time of its slowest log, not the sum.
    Every read waits here until all of them have begun: read one after the other, the first never returns."""
    import threading

    from changelake.service import lifecycle

    config = config_with_views(tmp_path)
    for table in ("orders", "products", "category_sales"):
        write(config, table, batch_id=5)
    txn = lifecycle._txn
    tables = {t.name for t in config.tables} | {name for name, _ in lifecycle._tables_under(config.storage.root)}
    expected = len(tables) + 2                              # and the two dead-letter logs
    all_begun = threading.Barrier(min(expected, lifecycle.LOG_READERS), timeout=30)

    def read_together(path, app, options, keep=None):
        all_begun.wait()
        return txn(path, app, options, keep)

    monkeypatch.setattr(lifecycle, "_txn", read_together)
    checked = prepare(config, pipeline_from_config(config).plan(), check_only=True)
    assert set(checked.positions) == {"orders", "products", "category_sales"}
    assert set(checked.logs) == {config.table_path(t) for t in ("orders", "products", "category_sales")}


def test_a_sink_takes_up_the_log_the_start_check_loaded_and_brings_it_up_to_date(tmp_path):
    """The check's delta-rs handles (``Start.logs``) go to the sinks: the first commit of a restart reads only
    the log entries written since, not the whole log again, and sees every one of them."""
    config = config_with_views(tmp_path)
    write(config, "orders", batch_id=3)
    checked = prepare(config, pipeline_from_config(config).plan(), check_only=True)
    path = config.table_path("orders")
    handle = checked.logs[path].table
    write(config, "orders", batch_id=4)                     # a commit after the check loaded the log
    sink = open_sink(TableSpec(name="orders", path=path, primary_key=("id",)), pipeline_id=config.pipeline.id)
    sink.adopt_logs({path: checked.logs[path]})
    state = sink._state(path)
    assert sink._log(path) is handle                        # taken up, not loaded anew
    assert (state.version, state.txn_version) == (handle.version(), 4)
    assert state.version == DeltaTable(path).version()

    sink.apply(pa.table({"id": [2], "_kind": pa.array([0], pa.int8()), "_seq": ["s2"]}), batch_id=5)
    assert sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist()) == [1, 2]


def test_the_tombstone_tables_read_while_spark_starts_are_the_first_batch_s_copy(tmp_path, monkeypatch):
    """``read_tombstone_tables`` reads each table's tombstone table in the background (the runner starts it
    before the Spark session): the restarted sink's first batch reads no tombstones itself, and a late
    insert of a key deleted before the restart stays deleted."""
    config = config_with_views(tmp_path)
    path = config.table_path("orders")
    spec = TableSpec(name="orders", path=path, primary_key=("id",))
    sink = open_sink(spec, pipeline_id=config.pipeline.id)
    rows = lambda ids, kinds, seqs: pa.table({"id": ids, "_kind": pa.array(kinds, pa.int8()), "_seq": seqs})
    sink.apply(rows([1, 2, 3], [0, 0, 0], ["s1", "s1", "s1"]), batch_id=0)
    sink.apply(rows([2], [3], ["s5"]), batch_id=1)                      # key 2 deleted at s5
    checked = prepare(config, pipeline_from_config(config).plan(), check_only=True)
    reads = read_tombstone_tables(checked.logs, None)
    assert list(reads) == [sink.tombstone_path]
    read = reads[sink.tombstone_path].result(timeout=60)
    assert read.tombstones.to_pylist() == [{"id": 2, "_seq": "s5"}]

    restarted = open_sink(spec, pipeline_id=config.pipeline.id)
    restarted.adopt_logs({**checked.logs, **{p: f.result() for p, f in reads.items()}})
    monkeypatch.setattr(type(restarted), "_read_tombstones",
                        lambda self: pytest.fail("the first batch read the tombstones the start had read"))
    restarted.apply(rows([2, 4], [0, 0], ["s3", "s3"]), batch_id=2)     # an older insert of 2 arrives late
    ids = sorted(DeltaTable(path).to_pyarrow_table().column("id").to_pylist())
    assert ids == [1, 3, 4]
