from __future__ import annotations

import subprocess
import sys

import pytest

from changelake.service.cli import build_parser, main

pytestmark = pytest.mark.unit

GOOD = """
pipeline: {id: inv, checkpoint: /tmp/ckpt}
kafka: {bootstrap_servers: "localhost:9092"}
sources: [{name: p, topics: [a.b.products], table: products}]
tables: [{name: products, primary_key: [id]}]
"""


def test_help_shows_the_environment_variable_of_every_option():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    for name, sub in [("changelake", parser), *subparsers.items()]:
        for action in sub._actions:
            if action.option_strings and action.dest not in ("help",) and action.nargs != 0:
                assert "[env: CHANGELAKE_" in (action.help or ""), f"{name} {action.option_strings}"


def test_validate_exits_non_zero_and_lists_errors(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD.replace("primary_key: [id]", "primary_key: []").replace("id: inv", "id: 'a b'"))
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tables.0.primary_key" in err and "pipeline.id" in err
    path.write_text(GOOD)
    assert main(["validate", "-c", str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_config_path_can_come_from_the_environment(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "validate"], capture_output=True,
                         text=True, env={"CHANGELAKE_CONFIG": str(path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr


def test_explain_shows_source_decode_and_sink_with_modes(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    assert main(["explain", "-c", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Sink(table=[products]" in out and "Decode(format=[debezium-json], source=[p]" in out
    assert "changelogMode=[+I,-U,+U,-D]" in out


def test_version(capsys):
    assert main(["version"]) == 0
    assert "pyspark 4.2.0" in capsys.readouterr().out


def test_version_option_prints_the_version_and_exits_zero():
    from changelake import __version__

    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"changelake {__version__} (pyspark 4.2.0, delta-rs (deltalake) ")
    assert out.stdout.count("\n") == 1


def test_version_names_the_delta_spark_jars_when_spark_has_them(tmp_path, monkeypatch, capsys):
    from changelake.service.cli import version_text

    monkeypatch.setenv("SPARK_HOME", str(tmp_path))
    (tmp_path / "jars").mkdir()
    if "delta-spark jars " not in version_text():       # this venv's pyspark has none
        assert "no delta-spark jars" in version_text()
    (tmp_path / "jars" / "delta-spark_2.13-4.4.1.jar").write_bytes(b"")
    assert "delta-spark jars 4.4.1)" in version_text()


@pytest.mark.parametrize("how", ["option", "environment"])
def test_an_unknown_log_level_is_rejected(tmp_path, how):
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    argv = ["--log-level", "FOO"] if how == "option" else []
    env = {"PATH": "/usr/bin:/bin", **({"CHANGELAKE_LOG_LEVEL": "FOO"} if how == "environment" else {})}
    out = subprocess.run([sys.executable, "-m", "changelake.service.cli", *argv, "validate", "-c", str(path)],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 2
    assert "FOO" in out.stderr and "DEBUG, INFO, WARNING, ERROR" in out.stderr.replace("'", "")
    assert main(["--log-level", "warning", "validate", "-c", str(path)]) == 0


def test_demo_refuses_a_directory_it_did_not_create(tmp_path):
    from changelake.errors import ConfigError
    from changelake.service.demo import WORKDIR_MARKER, prepare_workdir

    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    with pytest.raises(ConfigError, match="was not created by 'changelake demo'"):
        prepare_workdir(mine)
    assert (mine / "chapter1.tex").read_text() == "years of work"
    assert main(["demo", "--workdir", str(mine)]) == 2           # the CLI stops before starting anything
    assert (mine / "chapter1.tex").exists()
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        prepare_workdir(a_file)

    fresh = prepare_workdir(tmp_path / "new" / "demo")          # created, with its marker
    assert (fresh / WORKDIR_MARKER).is_file()
    (fresh / "lake").mkdir()
    again = prepare_workdir(fresh)                                # a demo directory is emptied and reused
    assert again == fresh and sorted(p.name for p in fresh.iterdir()) == [WORKDIR_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert (prepare_workdir(empty) / WORKDIR_MARKER).is_file()   # an empty directory is taken


def _log_line(capsys) -> str:
    import logging

    capsys.readouterr()
    logging.getLogger("changelake.test").warning("hello %s", "ä")
    return capsys.readouterr().err.strip()


def test_the_yaml_logging_section_sets_json_logs_unless_a_flag_or_variable_says_otherwise(tmp_path, capsys,
                                                                                          monkeypatch):
    import json

    monkeypatch.delenv("CHANGELAKE_LOG_FORMAT", raising=False)
    monkeypatch.delenv("CHANGELAKE_LOG_LEVEL", raising=False)
    path = tmp_path / "p.yaml"
    path.write_text(GOOD + "logging: {format: json, level: warning}\n")
    try:
        assert main(["explain", "-c", str(path)]) == 0
        line = json.loads(_log_line(capsys))
        assert (line["level"], line["logger"], line["msg"]) == ("WARNING", "changelake.test", "hello ä")
        import logging
        assert logging.getLogger().level == logging.WARNING

        assert main(["--log-format", "text", "explain", "-c", str(path)]) == 0       # the flag wins
        assert _log_line(capsys).endswith("WARNING changelake.test: hello ä")
        monkeypatch.setenv("CHANGELAKE_LOG_FORMAT", "text")                          # so does the variable
        assert main(["explain", "-c", str(path)]) == 0
        assert _log_line(capsys).endswith("WARNING changelake.test: hello ä")

        path.write_text(GOOD + "logging: {format: xml}\n")
        assert main(["validate", "-c", str(path)]) == 2
        assert "logging.format" in capsys.readouterr().err
    finally:
        from changelake.service.logs import configure_logging
        configure_logging("INFO", "text")


def test_the_yaml_logging_row_values_turns_row_values_on_for_the_process(tmp_path, monkeypatch):
    from changelake.log_values import ENV, row_values_in_logs, shown_row

    monkeypatch.setenv(ENV, "")         # (restored after the test, though the command sets it)
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    assert main(["explain", "-c", str(path)]) == 0
    assert not row_values_in_logs() and "secret" not in shown_row((1, "secret"))
    path.write_text(GOOD + "logging: {row_values: true}\n")
    assert main(["explain", "-c", str(path)]) == 0
    assert row_values_in_logs() and "secret" in shown_row((1, "secret"))


def test_every_subcommand_help_opens_with_a_description():
    import argparse

    def commands(parser: argparse.ArgumentParser, path: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"{path} {name}", sub
                    yield from commands(sub, f"{path} {name}")

    found = dict(commands(build_parser(), "changelake"))
    assert {"changelake run", "changelake validate", "changelake status", "changelake dlq replay"} <= set(found)
    for name, sub in found.items():
        assert sub.description and len(sub.description) > 20, name
        assert sub.description in sub.format_help().replace("\n", " ") or \
            sub.description.split(".")[0] in sub.format_help().replace("\n", " "), name

