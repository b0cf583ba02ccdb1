"""A pipeline's checkpoint against its lake at start: every restart is safe, or refused with what to do.

A checkpoint records, once, in ``<checkpoint>/changelake/lineage.json``: its **generation** (a new
checkpoint gets one more than the newest generation the pipeline's tables recorded; batch ids restart
at 0 with it, and every write carries the pair as its commit position, ``changelog.commit_position``,
so a new checkpoint's writes come after an older one's: ``connectors.commits``), the fingerprint of
each graph table's views and the fingerprint of the operators' state (:mod:`changelake.plan.fingerprint`).

At start (:func:`prepare`), before the query reads anything (and once before the Spark session is built,
``check_only``: ``service.runner.refuse_bad_start``)::

    checkpoint                     lake                                      start
    new (no offset log)            nothing written by this pipeline          generation 0
    new                            written by generations up to g            generation g + 1: mirrors upsert
                                                                              by _seq; each view recomputed from
                                                                              its sources, its table replaced by
                                                                              its first commit -- refused when a
                                                                              source it reads does not start at
                                                                              earliest, or the table keeps history
    existing, recorded             the same views and state                  its generation
    existing, recorded             a view added or changed, or the state     refused: start a new checkpoint
                                   moved (a stateful view added, removed,
                                   reordered; buckets, two_level)
    existing, recorded,            a view added or changed, or the state     generation g + 1 from the mirrored
      run --rebuild-views          moved                                     tables (service.rebuild); the old
                                                                              checkpoint kept at <checkpoint>.gen<g>
    existing, recorded             a view whose table is no longer written   its generation (logged)
    existing, not recorded         (a checkpoint of an older changelake)     generation 0, recorded now (views
                                                                              changed before cannot be told)
    any                            a table written by a newer generation,    refused (connectors.commits)
                                   or by this one at a batch beyond the
                                   checkpoint's last committed one + 1

The tables looked at: the configured tables, the Delta tables directly under ``storage.root`` (a routed
source's), the dead-letter table and the dead-letter topic's ledger. A routed table elsewhere is checked by
its sink at its first commit, by the same rule.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from changelake.changelog import split_commit_position
from changelake.connectors.commits import RESTART_DOC, describe
from changelake.connectors.delta_log import LogRead, TxnVersions
from changelake.connectors.delta_sink_schema import PROP_PRIMARY_KEY, PROP_TOMBSTONES
from changelake.errors import ChangelakeError
from changelake.plan.fingerprint import state_fingerprint, table_fingerprints
from changelake.plan.physical import PhysicalPlan
from changelake.service.config import ChangelakeConfig
from changelake.service.dead_letter_paths import ledger_path
from changelake.spark.checkpoint import filesystem, last_committed_batch

log = logging.getLogger(__name__)

RECORD = "changelake/lineage.json"


class RestartRefused(ChangelakeError):
    """The checkpoint does not fit the pipeline's tables or views; the message says what to do."""


@dataclass(frozen=True)
class Lineage:
    """What a checkpoint records of itself (module docstring)."""

    generation: int
    views: dict[str, str] = field(default_factory=dict)     # graph table -> fingerprint of its views
    state: str | None = None                                 # fingerprint of the operators' state
    created: str = ""
    rebuild: dict | None = None                              # where it starts from the lake (service.rebuild)

    def to_json(self) -> dict:
        out = {"generation": self.generation, "views": self.views, "state": self.state, "created": self.created}
        return out | ({"rebuild": self.rebuild} if self.rebuild else {})

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str) -> "Lineage":
        if not isinstance(data.get("generation"), int) or not isinstance(data.get("views", {}), dict):
            raise RestartRefused(f"{where} holds no checkpoint record this version knows: {dict(data)!r}; was the "
                                 "checkpoint written by a newer changelake?")
        return cls(generation=data["generation"], views=dict(data.get("views", {})), state=data.get("state"),
                   created=str(data.get("created", "")), rebuild=data.get("rebuild"))


@dataclass(frozen=True)
class Start:
    """What :func:`prepare` decided: the checkpoint's generation, and the graph tables an older generation
    wrote, which this one's first commit replaces."""

    generation: int
    replaced: frozenset[str] = frozenset()
    new_checkpoint: bool = False
    #: the checkpoint rebuilds the views from the lake (``service.rebuild``); None: it reads the topics
    rebuild: Any = None
    #: what the Delta logs said: this pipeline's commit position in each table it wrote (``positions`` of
    #: :func:`prepare`)
    positions: Mapping[str, int] = field(default_factory=dict)
    #: what the check read of each table's log (``delta_log.LogRead``), by path: the sinks take them up
    #: (``BatchProcessor.logs_read``) instead of loading each table's log again for their first commit
    logs: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)


def prepare(config: ChangelakeConfig, plan: PhysicalPlan | None, *, buckets: int | Mapping[str, int] = 32,
            default_buckets: int = 32, rebuild_views: bool = False, writes: Callable[[str], bool] | None = None,
            app_suffix: str = "", check_only: bool = False, positions: Mapping[str, int] | None = None) -> Start:
    """Check the checkpoint against the lake and the views (module docstring); record it when it is new.
    ``check_only``: refuse as the start would, but change nothing (no record written, no checkpoint moved):
    the runner asks it before the Spark session starts, so a refused start takes seconds, not a JVM's start.
    With ``rebuild_views``, changed views on an existing checkpoint start the next generation from the
    mirrored tables instead (``service.rebuild``). Raises :class:`RestartRefused` with what to do.
    ``writes``: the tables this checkpoint's query writes (default: every table of the lake); ``app_suffix``:
    of its dead letters' app ids (a pipeline of two queries, ``service.split``). ``positions``: what a
    ``check_only`` call of this start found in the Delta logs (its :attr:`Start.positions`), not read again: the
    pipeline's lease, held since before that call, keeps every other instance from moving them."""
    from changelake.service import rebuild as rebuilds

    checkpoint = config.pipeline.checkpoint
    recorded = read_lineage(checkpoint)
    existing = recorded is not None or _has_offsets(checkpoint)
    logs: dict[str, Any] = {}
    if positions is None:
        positions = dict(_recorded_positions(config, writes=writes, app_suffix=app_suffix, keep=logs))
    views = table_fingerprints(plan) if plan is not None else {}
    state = state_fingerprint(plan, buckets, default_buckets) if plan is not None else None
    rebuild = None
    if recorded is not None and recorded.rebuild and last_committed_batch(checkpoint) is None:
        rebuild = rebuilds.Rebuild.from_json(recorded.rebuild)      # a rebuild whose first batch is not done
    elif rebuild_views and plan is not None and recorded is not None and _views_moved(recorded, views, state):
        try:
            rebuild = rebuilds.plan_rebuild(config, plan, recorded.generation)
        except rebuilds.RebuildRefused as exc:
            raise RestartRefused(str(exc)) from None
        if check_only:
            rebuilds.refuse_kept_taken(rebuild)
        else:
            rebuilds.move_checkpoint(config, rebuild)      # the old checkpoint kept aside
        recorded, existing = None, False
    elif not existing and positions and plan is not None:    # a rebuild interrupted after the move
        newest = max(split_commit_position(p)[0] for p in positions.values())
        rebuild = rebuilds.interrupted(config, newest)
    if rebuild is not None and not existing and not check_only:
        rebuilds.start_new(config, rebuild)
    # (checking only, a checkpoint to be moved away is still there: the new one will have committed nothing)
    last = None if check_only and rebuild is not None and not existing else last_committed_batch(checkpoint)
    note = log.debug if check_only else log.info        # said once, by the start itself

    if recorded is not None:
        generation = recorded.generation
        _check_views(config, recorded, views, state, note=note)
    elif existing:
        generation = 0
        if views and not check_only:
            log.warning("checkpoint %s was created by an older changelake, which recorded no view fingerprints: "
                        "changes to the views made before this start cannot be told; recording the views now",
                        checkpoint)
    else:
        generations = [split_commit_position(p)[0] for p in positions.values()]
        generation = max(generations) + 1 if generations else 0

    _check_positions(positions, generation, -1 if last is None else last[0], checkpoint)
    graph_tables = {n.table for n in plan.sinks} if plan is not None else set()
    replaced = frozenset(t for t in graph_tables
                         if t in positions and split_commit_position(positions[t])[0] < generation)
    if replaced:
        _check_recomputable(config, plan, replaced, generation, positions, from_lake=rebuild is not None,
                            note=note)
    if check_only:
        return Start(generation=generation, replaced=replaced, new_checkpoint=not existing, rebuild=rebuild,
                     positions=positions, logs=logs)
    if recorded is None or recorded.views != views or recorded.state != state:
        created = recorded.created if recorded is not None else datetime.now(timezone.utc).isoformat()
        write_lineage(checkpoint, Lineage(generation=generation, views=views, state=state, created=created,
                                          rebuild=rebuild.to_json() if rebuild is not None else None))
    if not existing and positions:
        log.info("new checkpoint %s on a lake this pipeline wrote before (up to %s): generation %d; its writes "
                 "come after the older checkpoints'", checkpoint, describe(max(positions.values())), generation)
    return Start(generation=generation, replaced=replaced, new_checkpoint=not existing, rebuild=rebuild,
                 positions=positions, logs=logs)


def _views_moved(recorded: Lineage, views: Mapping[str, str], state: str | None) -> bool:
    """A view added or changed, or the operators' state moved, since the checkpoint was recorded."""
    added_or_changed = any(recorded.views.get(t) != f for t, f in views.items())
    return added_or_changed or not (state == recorded.state or recorded.state is None and state is None)


def _check_views(config: ChangelakeConfig, recorded: Lineage, views: Mapping[str, str], state: str | None, *,
                 note: Callable[..., None] = log.info) -> None:
    added = sorted(set(views) - set(recorded.views))
    changed = sorted(t for t in views if t in recorded.views and views[t] != recorded.views[t])
    removed = sorted(set(recorded.views) - set(views))
    if not _views_moved(recorded, views, state):
        for table in removed:
            note("table %s is no longer written by this pipeline (its view was removed); its rows stay", table)
        return
    what = "; ".join(f"{label}: {', '.join(tables)}" for label, tables in
                     (("added", added), ("changed", changed), ("removed", removed)) if tables)
    raise RestartRefused(
        f"the views changed since checkpoint {config.pipeline.checkpoint} was created (graph tables {what or 'the same'}"
        f"{'; the operators state moved' if state != recorded.state else ''}): the checkpoint's operator state "
        "belongs to the old views, and a new or changed view would start empty and write wrong numbers. Start a "
        "new checkpoint: move the checkpoint directory away (or set pipeline.checkpoint to a new path) and run "
        "again. The new checkpoint re-reads every source from its starting_offsets (keep them at earliest), "
        "mirrored tables keep their rows, and each view's table is replaced by the view's recomputed rows in its "
        "first commit. Or run with --rebuild-views: the views are rebuilt from the sources' mirrored tables and "
        f"continue from this checkpoint's offsets, without re-reading the topics ({RESTART_DOC})")


def _check_positions(positions: Mapping[str, int], generation: int, last: int, checkpoint: str) -> None:
    """Refuse a checkpoint that is older than a table it (or a newer checkpoint) wrote."""
    for what, position in sorted(positions.items()):
        g, b = split_commit_position(position)
        if g > generation:
            raise RestartRefused(
                f"{_label(what)} was written by a newer checkpoint ({describe(position)}) than {checkpoint} "
                f"(generation {generation}): running it would write older changes over newer ones. Run the "
                f"pipeline with the newer checkpoint, or move this one away to start a new one ({RESTART_DOC})")
        if g == generation and b > last + 1:
            raise RestartRefused(
                f"{_label(what)} already holds {describe(position)}, but checkpoint {checkpoint} (the same "
                f"generation) has committed {'no batch' if last < 0 else f'batches up to {last}'}: the checkpoint "
                "is older than the tables it wrote (restored from a backup? or created by a changelake that did "
                "not record generations, after an earlier checkpoint?). Its batches would be taken for replays and "
                "skipped. Move the checkpoint away and run again: a new checkpoint gets a new generation and "
                f"re-reads the sources ({RESTART_DOC})")


def _check_recomputable(config: ChangelakeConfig, plan: PhysicalPlan, replaced: frozenset[str], generation: int,
                        positions: Mapping[str, int], *, from_lake: bool = False,
                        note: Callable[..., None] = log.info) -> None:
    """A view recomputed by a new checkpoint is right only when it reads every source from the start (or,
    ``from_lake``, from the mirrored tables' snapshot: ``service.rebuild``)."""
    for table in sorted(replaced):
        if config.table(table).history is not None:
            raise RestartRefused(
                f"table {table} keeps the history of its view (history: scd2) and was written by "
                f"{describe(positions[table])}: a new checkpoint recomputes the view, which would add every "
                f"version again. Keep running the checkpoint that wrote it, or move the table away ({RESTART_DOC})")
        sink = next(n for n in plan.sinks if n.table == table)
        starts = {s.name: s.starting_offsets for s in config.sources}
        late = [] if from_lake else sorted(s for s in _sources_of(plan, sink.id) if starts.get(s) != "earliest")
        if late:
            raise RestartRefused(
                f"table {table} was written by {describe(positions[table])}; this new checkpoint (generation "
                f"{generation}) recomputes its view from the sources, but source(s) {', '.join(late)} do not start "
                "at earliest (starting_offsets), so the view would count only the changes read from there. Set "
                "starting_offsets: earliest on them (the topics must still hold every change), or keep running "
                f"the checkpoint that wrote the table ({RESTART_DOC})")
        note("table %s: written by %s; this checkpoint recomputes its view from the sources and replaces the "
                 "table's rows in its first commit", table, describe(positions[table]))


def _sources_of(plan: PhysicalPlan, node_id: str) -> set[str]:
    node = plan[node_id]
    if node.op == "source":
        return {node.source}
    return set().union(*(_sources_of(plan, i) for i in node.inputs))


def _label(what: str) -> str:
    return what if what.startswith("the ") else f"table {what}"


#: the Delta logs the start check reads at once: on an object store each read is a few round trips that
#: wait on the network, not the CPU (delta-rs lets go of the GIL), so a pipeline of many tables starts
#: in the time of its slowest log instead of the sum (docs/operations.md, "Restart to first commit")
LOG_READERS = 8


def _recorded_positions(config: ChangelakeConfig, *, writes: Callable[[str], bool] | None = None,
                        app_suffix: str = "", keep: dict[str, Any] | None = None) -> Iterator[tuple[str, int]]:
    """(table name, or 'the dead-letter table ...', commit position) of every write this pipeline recorded
    (of the tables ``writes`` accepts); ``keep``: gets what was read of each table (``delta_log.LogRead``), by
    path."""
    pid = config.pipeline.id
    options = config.storage.plain_options() or None
    seen: set[str] = set()
    reads: list[tuple[str, str, str, dict[str, Any] | None]] = []      # (what, path, app id, keep)
    candidates = [(t.name, config.table_path(t.name)) for t in config.tables]
    candidates += [(name, path) for name, path in _tables_under(config.storage.root, options)]
    for name, path in candidates:
        if name in seen or writes is not None and not writes(name):
            continue
        seen.add(name)
        reads.append((name, path, f"changelake:{pid}:{name}", keep))
    reads += [(f"the dead-letter table {config.dead_letter_path()}", config.dead_letter_path(),
               f"changelake:{pid}:dead-letters{app_suffix}", None),
              (f"the dead-letter ledger {ledger_path(config)}", ledger_path(config),
               f"changelake:{pid}:dead-letter-topic{app_suffix}", None)]
    with ThreadPoolExecutor(max_workers=min(LOG_READERS, len(reads)), thread_name_prefix="start-check") as pool:
        found = list(pool.map(lambda r: _txn(r[1], r[2], options, r[3]), reads))
    for (what, _, _, _), position in zip(reads, found):
        if position is not None:
            yield what, position


def _tables_under(root: str, options: Mapping[str, str] | None = None) -> Iterator[tuple[str, str]]:
    """(directory name, URI) of the Delta tables directly under ``root``."""
    from pyarrow import fs as pafs

    try:
        fs, base = filesystem(root, dict(options) if options else None)
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except (OSError, ValueError):
        return
    dirs = [info for info in infos if info.type == pafs.FileType.Directory and not info.base_name.startswith("_")]
    if not dirs:
        return
    logs = fs.get_file_info([f"{info.path}/_delta_log" for info in dirs])    # one call for all of them
    for info, log_dir in zip(dirs, logs):
        if log_dir.type == pafs.FileType.Directory:
            yield info.base_name, (root.rstrip("/") + "/" + info.base_name if "://" in root else info.path)


def _log_read(path: str, app_id: str, options: Mapping[str, str] | None) -> LogRead:
    """The table's log loaded and the transaction version of ``app_id`` in it (``TableNotFoundError``: no
    Delta table at ``path``)."""
    table = DeltaTable(path, storage_options=dict(options) if options else None)
    return LogRead(table, app_id, TxnVersions(app_id, options).of(path, table))


def _txn(path: str, app_id: str, options: Mapping[str, str] | None, keep: dict[str, Any] | None = None) -> int | None:
    try:
        read = _log_read(path, app_id, options)
    except (TableNotFoundError, OSError):
        return None
    if keep is not None:
        keep[path] = read
    return read.txn


def read_tombstone_tables(logs: Mapping[str, LogRead], options: Mapping[str, str] | None, *,
                          keys: bool = True) -> dict[str, Future]:
    """Start reading, in the background, the tombstone table of each table in ``logs`` (what the start's check
    read): its log, the pipeline's transaction version in it and (``keys``: the sinks write with delta-rs) its
    tombstones' keys, as the first batch would have read them after Spark's start (docs/operations.md,
    "Restart to first commit").
    Returns a future of a ``delta_log.LogRead`` (None: no such table, or not read) by tombstone table path;
    the runner calls this before the Spark session starts, so the reads overlap its start."""
    jobs: list[tuple[str, tuple[str, ...], str, Future]] = []
    for read in logs.values():
        try:
            properties = read.table.metadata().configuration
            tomb, key = properties.get(PROP_TOMBSTONES), json.loads(properties.get(PROP_PRIMARY_KEY) or "null")
        except (OSError, ValueError):
            continue
        if tomb and isinstance(key, list) and tomb not in logs:
            jobs.append((tomb, tuple(key), read.app_id, Future()))
    if not jobs:
        return {}
    todo = iter(jobs)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                job = next(todo, None)
            if job is None:
                return
            path, key, app_id, future = job
            future.set_result(_tombstone_read(path, key if keys else None, app_id, options))

    for _ in range(min(LOG_READERS, len(jobs))):    # daemon threads: a read that hangs never holds up an exit
        threading.Thread(target=work, name="tombstone-read", daemon=True).start()
    return {path: future for path, _, _, future in jobs}


def _tombstone_read(path: str, key: tuple[str, ...] | None, app_id: str,
                    options: Mapping[str, str] | None) -> LogRead | None:
    from changelake.connectors.delta_sink_rs import read_tombstone_keys

    try:
        read = _log_read(path, app_id, options)
        return read if key is None else replace(read, tombstones=read_tombstone_keys(read.table, key))
    except Exception:  # the first batch reads it itself, as without this read
        log.debug("tombstone table %s not read ahead", path, exc_info=True)
        return None


def path_exists(path: str) -> bool:
    """A file or directory is at ``path`` (a local path or a URI)."""
    from pyarrow import fs as pafs

    fs, root = filesystem(path)
    try:
        return fs.get_file_info(root).type != pafs.FileType.NotFound
    except OSError:
        return False


def has_offsets(checkpoint: str) -> bool:
    """The checkpoint's query has planned a batch (its offset log is not empty)."""
    return _has_offsets(checkpoint)


def _has_offsets(checkpoint: str) -> bool:
    from pyarrow import fs as pafs

    fs, root = filesystem(checkpoint)
    try:
        infos = fs.get_file_info(pafs.FileSelector(f"{root}/offsets", allow_not_found=True))
    except OSError:
        return False
    return any(i.base_name.isdigit() for i in infos)


def read_lineage(checkpoint: str) -> Lineage | None:
    """The checkpoint's record, or None when it has none (new, or written by an older changelake)."""
    from pyarrow import fs as pafs

    fs, root = filesystem(checkpoint)
    path = f"{root}/{RECORD}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        return Lineage.from_json(json.loads(f.read().decode()), f"{checkpoint}/{RECORD}")


def write_lineage(checkpoint: str, lineage: Lineage) -> None:
    fs, root = filesystem(checkpoint)
    fs.create_dir(f"{root}/changelake", recursive=True)
    with fs.open_output_stream(f"{root}/{RECORD}") as f:
        f.write(json.dumps(lineage.to_json(), indent=1).encode())
