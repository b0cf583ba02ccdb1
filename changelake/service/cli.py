"""The ``changelake`` command: run | demo | validate | status | explain | dlq | version.

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
    parser.add_argument("--version", action="version", version=version_text(),
                        help="print the changelake, Spark and Delta versions and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a pipeline until stopped (SIGTERM stops it after the current batch)")
    _config_option(run)
    run.add_argument("--available-now", action="store_true",
                     help="read what the topics hold now, then stop (catch-up / batch mode)")
    run.add_argument("--rebuild-views", action="store_true",
                     help="when the views changed since the checkpoint was created: rebuild them from the sources' "
                     "mirrored tables and continue from the checkpoint's offsets (the old checkpoint is kept at "
                     "<checkpoint>.gen<N>) instead of refusing to start")

    demo = sub.add_parser("demo", help="mirror a simulated inventory database through an embedded broker and verify")
    demo.add_argument("--workdir", action=_EnvDefault, envvar="CHANGELAKE_DEMO_WORKDIR", default="demo-output",
                      help="where the demo writes its Delta tables and checkpoints: a new or empty directory, "
                      "or one an earlier demo created (emptied first)")
    demo.add_argument("--changes", action=_EnvDefault, envvar="CHANGELAKE_DEMO_CHANGES", default="30000",
                      help="number of changes after the snapshot")
    demo.add_argument("--seed", action=_EnvDefault, envvar="CHANGELAKE_DEMO_SEED", default="7",
                      help="random seed of the simulated database")
    demo.add_argument("--metrics-port", action=_EnvDefault, envvar="CHANGELAKE_METRICS__PORT", default="9108",
                      help="port of /metrics, /healthz, /readyz (0 picks a free one)")

    val = sub.add_parser("validate", help="check a pipeline YAML; every error is listed with its path")
    _config_option(val)

    st = sub.add_parser("status", help="lag per partition, last batch, Delta tables' versions and files, dead letters")
    _config_option(st)

    exp = sub.add_parser("explain", help="print the pipeline's operator graph with changelog modes")
    _config_option(exp)

    dlq = sub.add_parser("dlq", help="dead letters: list, show, and replay them once their cause is fixed")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="DLQ_COMMAND")
    lst = dlq_sub.add_parser("list", help="the dead letters, one line each (position, source, table, reason, ...)")
    _dlq_filters(lst)
    lst.add_argument("--limit", action=_EnvDefault, envvar="CHANGELAKE_DLQ_LIMIT", default="50",
                     help="lines shown (0: all); --json prints all")
    lst.add_argument("--json", action="store_true", help="a JSON array (no key/value bytes: see show)")
    show = dlq_sub.add_parser("show", help="every field of dead letters, key and value included")
    show.add_argument("position", nargs="?", help="topic/partition/offset, as list prints it (else: the filters)")
    _dlq_filters(show)
    show.add_argument("--json", action="store_true", help="a JSON array with key and value (text and base64)")
    rep = dlq_sub.add_parser("replay", help="produce dead letters again, to the source's replay topic that the "
                             "pipeline reads (once each)")
    _dlq_filters(rep)
    rep.add_argument("--force", action="store_true",
                     help="also send letters whose reason cannot succeed again (malformed, unknown-op)")
    rep.add_argument("--again", action="store_true", help="also send letters that were replayed before")
    rep.add_argument("--dry-run", action="store_true", help="count what would be replayed, send nothing")
    rep.add_argument("--json", action="store_true", help="the outcome as JSON")

    arc = sub.add_parser("jvm-archive", help="write the Spark JVM's class-data-sharing archive (a faster start): "
                         "runs the demo on a few changes once")
    arc.add_argument("--changes", action=_EnvDefault, envvar="CHANGELAKE_JVM_ARCHIVE_CHANGES", default="1500",
                     help="changes the demo run goes through")

    sub.add_parser("version", help="print the changelake, Spark and Delta versions")
    return parser


def version_text() -> str:
    """``changelake X (pyspark Y, deltalake Z)``, from package metadata (imports neither)."""
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return f"changelake {__version__} (pyspark {of('pyspark')}, deltalake {of('deltalake')})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_level is not None and args.log_level not in LOG_LEVELS:    # the environment skips argparse's choices
        parser.error(f"CHANGELAKE_LOG_LEVEL: invalid level {args.log_level!r} (choose from {', '.join(LOG_LEVELS)})")
    if args.log_format is not None and args.log_format not in LOG_FORMATS:
        parser.error(f"CHANGELAKE_LOG_FORMAT: invalid format {args.log_format!r} (choose from "
                     f"{', '.join(LOG_FORMATS)})")
    configure_logging(args.log_level or "INFO", args.log_format or "text")
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
        configure_logging(args.log_level or config.logging.level, args.log_format or config.logging.format)
    return config


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(version_text())
        return 0
    if args.command == "validate":
        from changelake.service.config import check_config, problem_listing
        from changelake.service.views import graph_problems
        config, problems, origins = check_config(args.config)
        if config is not None:      # the planner's checks: columns, keys, join key types, expressions
            problems += [origins.problem(loc, message) for loc, message in graph_problems(config)]
        if problems:
            raise ConfigError(problem_listing(args.config, problems))
        routes = sum(len(s.route) for s in config.sources if s.route)
        print(f"{args.config}: ok ({len(config.sources)} source(s), {len(config.views)} view(s), "
              f"{len(config.tables)} table(s)" + (f", {routes} route rule(s) creating tables as they see them"
                                                  if routes else "") + ")")
        return 0
    if args.command == "status":
        from changelake.service.status import collect_status, format_status
        print(format_status(collect_status(_load(args))))
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
        return 0
    if args.command == "demo":
        from changelake.service.demo import run_demo
        return run_demo(workdir=Path(args.workdir), changes=int(args.changes), seed=int(args.seed),
                        metrics_port=int(args.metrics_port), out=sys.stdout)
    if args.command == "jvm-archive":
        return _jvm_archive(args)
    raise AssertionError(args.command)


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
