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
