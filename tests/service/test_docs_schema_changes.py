"""The schema-change examples of docs/pipelines.md and docs/formats.md are the code's behaviour."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from changelake.service.config import parse_config

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _section(doc: str, heading: str) -> list[tuple[str, str]]:
    text = (DOCS / doc).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + 1)
    return re.findall(r"```(\w*)\n(.*?)```", text[start:] if end < 0 else text[start:end], flags=re.DOTALL)


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs", "exec"), {})
    return out.getvalue()


@pytest.mark.parametrize("doc", ["pipelines.md", "formats.md"])
def test_the_example_prints_what_the_doc_shows(doc):
    blocks = _section(doc, "## Schema changes")
    code = next(body for lang, body in blocks if lang == "python")
    shown = next(body for lang, body in blocks if lang == "")
    assert _run(code).strip().splitlines() == shown.strip().splitlines()


def test_the_yaml_example_sets_each_tables_behaviour():
    body = next(body for lang, body in _section("pipelines.md", "## Schema changes") if lang == "yaml")
    config = parse_config("pipeline: {id: docs, checkpoint: /tmp/ckpt}\nkafka: {bootstrap_servers: 'k:9092'}\n"
                          + body, environ={})
    assert config.schema_change_of("orders") == "evolve"
    assert config.schema_change_of("items") == "try_evolve"
    assert config.sources[1].schema_change == "lenient"
