"""The ``changelake`` command: run | demo | validate | status | explain | dlq | version.

Every option can also be set through the environment variable shown in ``--help``.
"""

from __future__ import annotations

import argparse
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

    dlq = sub.add_parser("dlq", help="dead letters: replay quarantined messages once their cause is fixed")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="DLQ_COMMAND")
    rep = dlq_sub.add_parser("replay", help="produce quarantined messages again to their topic (once each)")
    _config_option(rep)
    rep.add_argument("--source", action=_EnvDefault, envvar="CHANGELAKE_DLQ_SOURCE",
                     help="only dead letters of this source")
    rep.add_argument("--reason", action=_EnvDefault, envvar="CHANGELAKE_DLQ_REASON",
                     help="only dead letters with this reason (malformed, schema-mismatch, ...)")
    rep.add_argument("--table", action=_EnvDefault, envvar="CHANGELAKE_DLQ_TABLE",
                     help="only dead letters meant for this table (e.g. one quarantined table of a routed source)")
    rep.add_argument("--to-topic", action=_EnvDefault, envvar="CHANGELAKE_DLQ_TO_TOPIC",
                     help="produce to this topic instead of each message's own")
    rep.add_argument("--dry-run", action="store_true", help="count what would be replayed, send nothing")

    arc = sub.add_parser("jvm-archive", help="write the Spark JVM's class-data-sharing archive (a faster start): "
                         "runs the demo on a few changes once")
    arc.add_argument("--changes", action=_EnvDefault, envvar="CHANGELAKE_JVM_ARCHIVE_CHANGES", default="1500",
                     help="changes the demo run goes through")

    brk = sub.add_parser("broker", help="run a local Apache Kafka broker (KRaft) from the project's jars, to try "
                         "changelake; prints its bootstrap address, stops on Ctrl-C or SIGTERM")
    brk.add_argument("--port", action=_EnvDefault, envvar="CHANGELAKE_BROKER_PORT", default="9092",
                     help="client port of the (first) node; 0 picks a free one")
    brk.add_argument("--nodes", action=_EnvDefault, envvar="CHANGELAKE_BROKER_NODES", default="1",
                     help="1, or 3: replication factor 3 and min.insync.replicas 2")
    brk.add_argument("--dir", action=_EnvDefault, envvar="CHANGELAKE_BROKER_DIR", default=None,
                     help="storage and logs, kept across runs (default: a temporary directory whose data is "
                     "removed on stop; its log is kept)")

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
        from changelake.service.dlq import replay
        result = replay(_load(args), source=args.source, reason=args.reason, table=args.table,
                        to_topic=args.to_topic, dry_run=args.dry_run)
        if args.dry_run:
            print(f"would replay {sum(result.remaining_by_reason.values())} dead letter(s) "
                  f"{result.remaining_by_reason}; {result.already_replayed} already replayed")
        else:
            print(f"replayed {result.replayed} dead letter(s); {result.already_replayed} already replayed before")
        return 0
    if args.command == "run":
        from changelake.service.runner import PipelineRunner
        config = _load(args)
        result = PipelineRunner(config).run(available_now=True if args.available_now else None)
        print(f"stopped after {result.totals.records:,} records in {result.seconds:.1f} s "
              f"({result.records_per_second:,.0f} records/s){' (signal)' if result.stopped_by_signal else ''}")
        return 0
    if args.command == "demo":
        from changelake.service.demo import run_demo
        return run_demo(workdir=Path(args.workdir), changes=int(args.changes), seed=int(args.seed),
                        metrics_port=int(args.metrics_port), out=sys.stdout)
    if args.command == "jvm-archive":
        return _jvm_archive(args)
    if args.command == "broker":
        return _broker(args)
    raise AssertionError(args.command)


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
