"""Mirrors in a streaming query of their own: a mirror never waits for a slow operator graph.

A pipeline with views and mirrored tables runs, with ``pipeline.mirrors: own_query`` (experimental), two
Spark streaming queries in one session, each reading the topics it needs:

=============  ========================================  ===============================================
query          writes                                    checkpoint
=============  ========================================  ===============================================
mirrors        the mirrored tables (and routed ones),    ``<checkpoint>/mirrors``
               every dead letter of their sources
graph          the graph tables, the operators'          ``<checkpoint>`` (the operators' state)
               rejected and late rows, the dead
               letters of sources only the graph reads
=============  ========================================  ===============================================

Each query commits on its own cadence: a mirrored change is in its table after the mirrors' next batch,
whatever the graph's batch costs (docs/benchmarks.md, "Mirrors in their own query"). Exactly-once holds
per query as for one: a table is written by one query only, keyed by that query's (generation, batch id)
(``connectors.commits``), and each query checks its own tables against its own checkpoint at start
(``service.lifecycle.prepare(writes=...)``). The dead letters of the mirrors' query carry their own
Delta app ids (``dead-letters.mirrors``, ``dead-letter-topic.mirrors``), as its batch ids are its own.

A source that both is mirrored and feeds the graph is read by both queries: its records, dead letters
and truncates are accounted by the mirrors' query only (the graph's processor gets it in
``accounted_elsewhere``).

When the mode is decided::

    checkpoint            <checkpoint>/mirrors      runs
    new                   -                         two queries (own_query), one (with_graph)
    existing              present                   two queries, whatever pipeline.mirrors says (logged)
    existing              absent                    one query, whatever pipeline.mirrors says (logged): the
                                                    checkpoint was created with the mirrors in the graph's query
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from changelake.errors import ConfigError
from changelake.service.config import ChangelakeConfig

log = logging.getLogger(__name__)

#: the mirrors' query's checkpoint, under the pipeline's
MIRRORS_DIR = "mirrors"
#: the suffix of the mirrors' query's dead-letter app ids
MIRRORS_APP = ".mirrors"


@dataclass(frozen=True)
class Split:
    """The two queries' configurations: ``mirrors`` (no views) and ``graph`` (the views, their sources
    unmirrored); ``elsewhere``: the graph's sources that the mirrors' query accounts for."""

    mirrors: ChangelakeConfig
    graph: ChangelakeConfig
    elsewhere: frozenset[str]


def mirror_checkpoint(config: ChangelakeConfig) -> str:
    return config.pipeline.checkpoint.rstrip("/") + "/" + MIRRORS_DIR


def split(config: ChangelakeConfig, *, rebuild_views: bool = False) -> Split | None:
    """The pipeline's two queries (module docstring), or None when it runs as one."""
    from changelake.service.lifecycle import has_offsets, path_exists
    from changelake.service.views import pipeline_from_config

    graph_tables = {t.name for t in config.tables if t.from_ is not None}
    mirrored = [s for s in config.sources if s.table is not None or s.route is not None]
    if not graph_tables or not mirrored:
        return None
    checkpoint = config.pipeline.checkpoint
    wanted = config.pipeline.mirrors == "own_query"
    if has_offsets(checkpoint):         # an existing checkpoint keeps the mode it was created with
        apart = path_exists(mirror_checkpoint(config))
        if apart != wanted:
            log.warning("checkpoint %s was created with the mirrors %s: they stay there (pipeline.mirrors: %s "
                        "applies to a new checkpoint)", checkpoint, "in a query of their own" if apart else
                        "in the operator graph's query", config.pipeline.mirrors)
        wanted = apart
    if not wanted:
        return None
    if rebuild_views:
        raise ConfigError("--rebuild-views rebuilds the views from the mirrored tables at the graph's offsets, but "
                          "with pipeline.mirrors: own_query the mirrors run at their own offsets; move the checkpoint "
                          "away instead (a new checkpoint recomputes the views from the topics)")
    plan = pipeline_from_config(config).plan()
    read = {n.source for n in plan.sources}
    pipeline = config.pipeline
    mirrors = config.model_copy(update={
        "pipeline": pipeline.model_copy(update={"checkpoint": mirror_checkpoint(config)}),
        "sources": mirrored, "views": [],
        "tables": [t for t in config.tables if t.name not in graph_tables]})
    graph = config.model_copy(update={
        "sources": [s.model_copy(update={"table": None, "route": None}) for s in config.sources if s.name in read],
        "tables": [t for t in config.tables if t.name in graph_tables]})
    return Split(mirrors=mirrors, graph=graph, elsewhere=frozenset(s.name for s in mirrored if s.name in read))


def query_checkpoint(config: ChangelakeConfig, table: str) -> str:
    """The checkpoint of the query that writes ``table`` (as the pipeline runs now)."""
    found = split(config)
    if found is not None and any(t.name == table for t in found.mirrors.tables):
        return found.mirrors.pipeline.checkpoint
    return config.pipeline.checkpoint
