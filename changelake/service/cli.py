"""The ``changelake`` command: run | demo | validate | status | explain | dlq | jvm-archive | version.

Every option can also be set through the environment variable shown in ``--help``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from changelake import __version__
from changelake.errors import ChangelakeError, ConfigError
from changelake.service.logs import LOG_FORMATS, LOG_LEVELS, configure_logging


class _EnvDefault(argparse.Action):
    """An option whose default comes from an environment variable (shown in --help)."""

    def __init__(self, option_strings: list[str], dest: str, envvar: str, default: object = None,
                 required: bool = False, help: str | None = None, **kwargs: object) -> None:  # noqa: A002
        if envvar in os.environ:
            default = os.environ[envvar]
            required = False
        help = f"{help or ''} [env: {envvar}]".strip()
        if default is not None:
            help += f" (default: {default})"
        super().__init__(option_strings, dest, default=default, required=required, help=help, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class _Version(argparse.Action):
    """``--version``: :func:`version_text` on one line (argparse's own action wraps it), then exit."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-c", "--config", action=_EnvDefault, envvar="CHANGELAKE_CONFIG", required=True,
                   help="pipeline YAML file")


def _dlq_filters(p: argparse.ArgumentParser) -> None:
    _config_option(p)
    for flag, what in (("--source", "of this source (sources[].name)"),
                       ("--reason", "with this reason (malformed, schema-mismatch, unrouted, ...)"),
                       ("--table", "meant for this table (e.g. one quarantined table of a routed source)"),
                       ("--topic", "read from this topic"), ("--partition", "read from this partition"),
                       ("--min-offset", "at or after this offset"), ("--max-offset", "at or before this offset"),
                       ("--since", "with a Kafka timestamp at or after this (ISO 8601 or epoch ms)"),
                       ("--until", "with a Kafka timestamp at or before this (ISO 8601 or epoch ms)")):
        name = flag[2:].upper().replace("-", "_")
        p.add_argument(flag, action=_EnvDefault, envvar=f"CHANGELAKE_DLQ_{name}", help=f"only dead letters {what}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="changelake", description=(
        "Kafka-to-lakehouse CDC: Debezium/Canal/Maxwell/OGG change topics -> Spark -> Delta Lake."))
    parser.add_argument("--log-level", action=_EnvDefault, envvar="CHANGELAKE_LOG_LEVEL", default=None,
                        type=str.upper, choices=LOG_LEVELS, metavar="LEVEL", help=", ".join(LOG_LEVELS))
    parser.add_argument("--log-format", action=_EnvDefault, envvar="CHANGELAKE_LOG_FORMAT", default=None,
                        type=str.lower, choices=LOG_FORMATS, metavar="FORMAT",
                        help="text, or json: one JSON object per line (ts, level, logger, msg, exception)")
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="print the versions of changelake, pyspark, delta-rs and the delta-spark jars, and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = _command(sub, "run", "run a pipeline until stopped (SIGTERM stops it after the current batch)",
                   "Starts Spark (local[2] unless the launcher or pipeline.master says otherwise), reads the "
                   "sources' topics from where the checkpoint stands, and upserts every micro-batch into the Delta "
                   "tables; /metrics, /healthz and /readyz are served on metrics.port. SIGTERM or Ctrl-C stops it "
                   "after the current batch. The pipeline file is validated first (see 'validate').")
    _config_option(run)
    run.add_argument("--available-now", action="store_true",
                     help="read what the topics hold now, then stop (catch-up / batch mode)")
    run.add_argument("--rebuild-views", action="store_true",
                     help="when the views changed since the checkpoint was created: rebuild them from the sources' "
                     "mirrored tables and continue from the checkpoint's offsets (the old checkpoint is kept at "
                     "<checkpoint>.gen<N>) instead of refusing to start")

    demo = _command(sub, "demo", "mirror a simulated inventory database through an embedded broker and verify",
                    "Starts a Kafka broker inside this process (librdkafka's mock cluster), writes the change "
                    "events of a simulated inventory database to it, runs a pipeline over them and checks the Delta "
                    "tables against the database. Needs nothing installed but changelake.")
    demo.add_argument("--workdir", action=_EnvDefault, envvar="CHANGELAKE_DEMO_WORKDIR", default="demo-output",
                      help="where the demo writes its Delta tables and checkpoints: a new or empty directory, "
                      "or one an earlier demo created (emptied first)")
    demo.add_argument("--changes", action=_EnvDefault, envvar="CHANGELAKE_DEMO_CHANGES", default="30000",
                      help="number of changes after the snapshot")
    demo.add_argument("--seed", action=_EnvDefault, envvar="CHANGELAKE_DEMO_SEED", default="7",
                      help="random seed of the simulated database")
    demo.add_argument("--metrics-port", action=_EnvDefault, envvar="CHANGELAKE_METRICS__PORT", default="9108",
                      help="port of /metrics, /healthz, /readyz (0 picks a free one)")

    val = _command(sub, "validate", "check a pipeline YAML; every error is listed with its path",
                   "Checks the pipeline file without Kafka or Spark: every field, the references between sections, "
                   "the views' SQL and columns, and kafka.properties as librdkafka itself reads them (unknown "
                   "names, invalid values, properties changelake sets itself). Each error names its YAML path and "
                   "file:line (or the environment variable it came from); credentials written in the file as plain "
                   "text are warnings. Exit status 2 when there are errors.")
    _config_option(val)
    val.add_argument("--json", action="store_true",
                     help="one JSON object: ok, errors, warnings, and the counts of sources, views and tables")

    st = _command(sub, "status", "lag per partition, last batch, Delta tables' versions and files, dead letters",
                  "Reads where the pipeline stands from outside the running process: the end offset of every "
                  "partition minus the offset committed to the pipeline's consumer group, the checkpoint's last "
                  "batch, each Delta table's version and files, and the dead letters by source and reason. Takes no "
                  "lock and writes nothing: safe beside a running pipeline.")
    _config_option(st)
    st.add_argument("--json", action="store_true", help="the same as one JSON object")

    exp = _command(sub, "explain", "print the pipeline's operator graph with changelog modes",
                   "Prints the physical plan as Flink's EXPLAIN CHANGELOG_MODE does: each operator with its "
                   "changelog mode (+I, -U, +U, -D), upsert key, state and the materializers the planner added.")
    _config_option(exp)

    dlq = _command(sub, "dlq", "dead letters: list, show, and replay them once their cause is fixed",
                   "Reads the dead letters (the Delta quarantine table or the dead-letter topics) with filters, "
                   "shows their raw key and value, and produces them again to the source's replay topic, once "
                   "each (docs/operations.md, 'Dead letters').")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="DLQ_COMMAND")
    lst = _command(dlq_sub, "list", "the dead letters, one line each (position, source, table, reason, ...)")
    _dlq_filters(lst)
    lst.add_argument("--limit", action=_EnvDefault, envvar="CHANGELAKE_DLQ_LIMIT", default="50",
                     help="lines shown (0: all); --json prints all")
    lst.add_argument("--json", action="store_true", help="a JSON array (no key/value bytes: see show)")
    show = _command(dlq_sub, "show", "every field of dead letters, key and value included")
    show.add_argument("position", nargs="?", help="topic/partition/offset, as list prints it (else: the filters)")
    _dlq_filters(show)
    show.add_argument("--json", action="store_true", help="a JSON array with key and value (text and base64)")
    rep = _command(dlq_sub, "replay", "produce dead letters again, to the source's replay topic that the "
                   "pipeline reads (once each)")
    _dlq_filters(rep)
    rep.add_argument("--force", action="store_true",
                     help="also send letters whose reason cannot succeed again (malformed, unknown-op)")
    rep.add_argument("--again", action="store_true", help="also send letters that were replayed before")
    rep.add_argument("--dry-run", action="store_true", help="count what would be replayed, send nothing")
    rep.add_argument("--json", action="store_true", help="the outcome as JSON")

    arc = _command(sub, "jvm-archive", "write the Spark JVM's class-data-sharing archive (a faster start): "
                   "runs the demo on a few changes once")
    arc.add_argument("--changes", action=_EnvDefault, envvar="CHANGELAKE_JVM_ARCHIVE_CHANGES", default="1500",
                     help="changes the demo run goes through")

    brk = _command(sub, "broker", "run a local Apache Kafka broker (KRaft) from the project's jars, to try "
                   "changelake", "Prints its bootstrap address; stops on Ctrl-C or SIGTERM.")
    brk.add_argument("--port", action=_EnvDefault, envvar="CHANGELAKE_BROKER_PORT", default="9092",
                     help="client port of the (first) node; 0 picks a free one")
    brk.add_argument("--nodes", action=_EnvDefault, envvar="CHANGELAKE_BROKER_NODES", default="1",
                     help="1, or 3: replication factor 3 and min.insync.replicas 2")
    brk.add_argument("--dir", action=_EnvDefault, envvar="CHANGELAKE_BROKER_DIR", default=None,
                     help="storage and logs, kept across runs (default: a temporary directory whose data is "
                     "removed on stop; its log is kept)")

    _command(sub, "version", "print the versions of changelake, pyspark, delta-rs and the delta-spark jars")
    return parser


def _command(sub: Any, name: str, summary: str, more: str = "") -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` opens with a description (the summary, and more when given)."""
    description = summary[:1].upper() + summary[1:] + "." + (" " + more if more else "")
    return sub.add_parser(name, help=summary, description=description)


def version_text() -> str:
    """``changelake X (pyspark Y, delta-rs (deltalake) Z, delta-spark jars W)``, from package metadata and
    jar names (imports neither pyspark nor deltalake)."""
    from importlib.metadata import PackageNotFoundError, version

    from changelake.spark.delta_jars import delta_spark_version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    jars = delta_spark_version()
    return (f"changelake {__version__} (pyspark {of('pyspark')}, delta-rs (deltalake) {of('deltalake')}, "
            + (f"delta-spark jars {jars})" if jars else "no delta-spark jars: the delta-rs engine writes)"))


def _state_lines() -> list[str]:
    """``state of <operator>: R rows, B bytes`` per stateful operator, as the last batch reported it
    (changelake_state_rows / _bytes)."""
    from changelake import metrics

    rows = {s.labels["operator"]: s.value for m in metrics.STATE_ROWS.collect() for s in m.samples}
    size = {s.labels["operator"]: s.value for m in metrics.STATE_BYTES.collect() for s in m.samples}
    return [f"state of {op}: {rows[op]:,.0f} rows, {size.get(op, 0):,.0f} bytes" for op in sorted(rows)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_level is not None and args.log_level not in LOG_LEVELS:    # the environment skips argparse's choices
        parser.error(f"CHANGELAKE_LOG_LEVEL: invalid level {args.log_level!r} (choose from {', '.join(LOG_LEVELS)})")
    if args.log_format is not None and args.log_format not in LOG_FORMATS:
        parser.error(f"CHANGELAKE_LOG_FORMAT: invalid format {args.log_format!r} (choose from "
                     f"{', '.join(LOG_FORMATS)})")
    configure_logging(args.log_level or "INFO", args.log_format or "text", whole_process=True)
    try:
        return _dispatch(args)
    except ChangelakeError as exc:
        print(f"changelake: {exc}", file=sys.stderr)
        return 2


def _load(args: argparse.Namespace) -> Any:
    """The pipeline YAML, and its ``logging`` section applied where no flag or variable set the value."""
    from changelake.service.config import load_config

    config = load_config(args.config)
    if config.logging.row_values:
        from changelake.log_values import ENV
        os.environ[ENV] = "1"       # before Spark starts: its local workers inherit it
    if args.log_level is None or args.log_format is None:
        configure_logging(args.log_level or config.logging.level, args.log_format or config.logging.format,
                          whole_process=True)
    return config


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(version_text())
        return 0
    if args.command == "validate":
        return _validate(args)
    if args.command == "status":
        from changelake.service.status import collect_status, format_status, status_json
        status = collect_status(_load(args))
        print(status_json(status) if args.json else format_status(status))
        return 0
    if args.command == "explain":
        from changelake.service.explain import explain
        print(explain(_load(args)))
        return 0
    if args.command == "dlq":
        return _dlq(args)
    if args.command == "run":
        from changelake.service.runner import PipelineRunner
        config = _load(args)
        result = PipelineRunner(config).run(available_now=True if args.available_now else None,
                                            rebuild_views=args.rebuild_views)
        print(f"stopped after {result.totals.records:,} records in {result.seconds:.1f} s "
              f"({result.records_per_second:,.0f} records/s){' (signal)' if result.stopped_by_signal else ''}")
        for line in _state_lines():
            print(line)
        if sys.stderr.isatty() and (config.pipeline.master or "local").startswith("local"):
            _archive_later()
        return 0
    if args.command == "demo":
        from changelake.service.demo import run_demo
        rc = run_demo(workdir=Path(args.workdir), changes=int(args.changes), seed=int(args.seed),
                      metrics_port=int(args.metrics_port), out=sys.stdout)
        if rc == 0:
            _archive_later()
        return rc
    if args.command == "jvm-archive":
        return _jvm_archive(args)
    if args.command == "broker":
        return _broker(args)
    raise AssertionError(args.command)


def _validate(args: argparse.Namespace) -> int:
    """Errors (exit 2) and warnings of a pipeline file, as text or (``--json``) one JSON object."""
    import json

    from changelake.service.config import check_config, problem_listing
    from changelake.service.views import graph_problems
    try:
        config, problems, origins = check_config(args.config)
    except ConfigError as exc:          # unreadable, or not YAML
        if not args.json:
            raise
        print(json.dumps({"file": args.config, "ok": False, "errors": [str(exc)], "warnings": []}, indent=2))
        return 2
    if config is not None:      # the planner's checks: columns, keys, join key types, expressions
        problems += [origins.problem(loc, message) for loc, message in graph_problems(config)]
        from changelake.spark.checkpoint import checkpoint_store_problem

        store = checkpoint_store_problem(config.pipeline.checkpoint, config.pipeline.spark_conf)
        if store:
            problems.append(origins.problem(("pipeline", "checkpoint"), store))
    if args.json:
        counts = {} if problems or config is None else {
            "sources": len(config.sources), "views": len(config.views), "tables": len(config.tables),
            "route_rules": sum(len(s.route) for s in config.sources if s.route)}
        print(json.dumps({"file": args.config, "ok": not problems, "errors": problems, "warnings": origins.warnings,
                          **counts}, indent=2))
        return 2 if problems else 0
    for warning in origins.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if problems:
        raise ConfigError(problem_listing(args.config, problems))
    routes = sum(len(s.route) for s in config.sources if s.route)
    print(f"{args.config}: ok ({len(config.sources)} source(s), {len(config.views)} view(s), "
          f"{len(config.tables)} table(s)" + (f", {routes} route rule(s) creating tables as they see them"
                                              if routes else "") + ")"
          + (f"; {len(origins.warnings)} warning(s)" if origins.warnings else ""))
    return 0


def _dlq(args: argparse.Namespace) -> int:
    from changelake.service import dlq

    def number(flag: str, text: str | None) -> int | None:
        if text is None:
            return None
        if not text.lstrip("-").isdigit():
            raise ConfigError(f"{flag} {text!r}: give a whole number")
        return int(text)

    where = dlq.Filters(source=args.source, reason=args.reason, table=args.table, topic=args.topic,
                        partition=number("--partition", args.partition),
                        min_offset=number("--min-offset", args.min_offset),
                        max_offset=number("--max-offset", args.max_offset), since=args.since, until=args.until)
    config = _load(args)
    if args.dlq_command == "list":
        letters = dlq.list_letters(config, where)
        print(dlq.as_json(letters, payload=False) if args.json else
              dlq.format_list(letters, limit=number("--limit", args.limit) or None))
        return 0
    if args.dlq_command == "show":
        if args.position:
            at = dlq.parse_position(args.position)
            where = dataclasses.replace(where, topic=at.topic, partition=at.partition, min_offset=at.min_offset,
                                        max_offset=at.max_offset)
        letters = dlq.list_letters(config, where)
        print(dlq.as_json(letters, payload=True) if args.json else dlq.format_show(letters))
        return 0 if letters or not args.position else 1
    result = dlq.replay(config, where, force=args.force, again=args.again, dry_run=args.dry_run)
    if args.json:
        print(dlq.result_json(result, dry_run=args.dry_run))
        return 0
    sent = sum(result.by_reason.values())
    print(f"{'would replay' if args.dry_run else 'replayed'} {sent} dead letter(s)"
          + (f" {result.by_reason} to {', '.join(sorted(result.topics))}" if sent else ""))
    if result.already_replayed:
        print(f"{result.already_replayed} already replayed, not sent again (--again sends them)")
    if result.refused:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(result.refused.items()))
        print(f"refused {sum(result.refused.values())} whose reason cannot succeed again ({refused}); "
              "--force sends malformed and unknown-op letters anyway; late and operator-error letters hold "
              "the decoded row, not the message, and are never sent")
    return 0


def _broker(args: argparse.Namespace) -> int:
    """``changelake broker``: a :class:`LocalKafka <changelake.connectors.kafka_broker.LocalKafka>` until
    Ctrl-C or SIGTERM (or until a node exits, which is an error: its log's end is printed)."""
    import signal
    import time

    from changelake.connectors.kafka_broker import LocalKafka

    nodes = int(args.nodes)
    if nodes not in (1, 3):
        raise ConfigError(f"--nodes {nodes}: choose 1 or 3")
    stop = []
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
    broker = LocalKafka(nodes=nodes, port=int(args.port), workdir=args.dir)
    try:
        broker.start()
        print(f"Apache Kafka (KRaft, {nodes} node{'s' * (nodes > 1)}) at {broker.bootstrap_servers}\n"
              f"  kafka.bootstrap_servers: {broker.bootstrap_servers}   (in a pipeline YAML)\n"
              f"  logs: {', '.join(str(f) for f in broker.log_files)}\n"
              "Ctrl-C or SIGTERM stops it.", flush=True)
        while not stop:
            exited = broker.exited_nodes()
            if exited:
                print(f"changelake broker: Kafka node {exited[0]} exited; see {broker.log_file(exited[0])}",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        broker.stop()
    print("Kafka stopped", flush=True)
    return 0


def _archive_later() -> None:
    """After a first successful run on this machine: write the JVM class archive in the background
    (changelake/spark/jvm_archive.py), so that later Spark starts are ~2 s faster; the first run did not
    wait for it."""
    from changelake.spark import jvm_archive

    log = jvm_archive.write_in_background([sys.executable, "-m", "changelake.service.cli", "jvm-archive"])
    if log is not None:
        print(f"writing Spark's JVM class archive in the background (about a minute; later Spark starts are "
              f"faster; log: {log}; {jvm_archive.ENV}=off turns it off)")


def _jvm_archive(args: argparse.Namespace) -> int:
    """Write the archive of changelake/spark/jvm_archive.py (in the child that ``write`` starts: the demo run
    whose JVM dumps it)."""
    import io

    from changelake.spark import jvm_archive
    changes = int(args.changes)
    child = os.environ.get(jvm_archive.CHILD_ENV)
    if child:           # the run whose JVM dumps the archive (jvm_archive.write starts it)
        from changelake.service.demo import run_demo
        out = io.StringIO()
        rc = run_demo(workdir=Path(child), changes=changes, metrics_port=0, out=out)
        jvm_archive.stop_jvm()
        if rc != 0:
            print(out.getvalue(), file=sys.stderr)
        return rc
    path = jvm_archive.archive_path()
    if path is None:
        print(f"changelake: {jvm_archive.ENV}=off: no JVM archive written", file=sys.stderr)
        return 2
    started = time.monotonic()
    print(f"writing the Spark JVM's class-data-sharing archive to {path} (a demo run on {changes:,} changes)")
    try:
        jvm_archive.write([sys.executable, "-m", "changelake.service.cli", "jvm-archive", "--changes", str(changes)],
                          path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"changelake: no JVM archive written: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {path} ({path.stat().st_size / 2**20:,.0f} MiB) in {time.monotonic() - started:.0f}s; "
          f"Spark sessions started here use it (set {jvm_archive.ENV}=off to turn it off)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
