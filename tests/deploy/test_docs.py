"""docs/operations.md documents every chart value, and values.yaml documents every value."""

from __future__ import annotations

import re

import pytest
import yaml

from deploy_support import CHART, DOCS, documented_values

pytestmark = pytest.mark.unit

VALUES_TEXT = (CHART / "values.yaml").read_text()
VALUES = yaml.safe_load(VALUES_TEXT)
DOC = DOCS.read_text()


def _doc_table_paths() -> dict[str, str]:
    section = DOC.split("## Configure", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.*?) \|", section, flags=re.M)
    return dict(rows)


def _lookup(path: str) -> object:
    node: object = VALUES
    for key in path.split("."):
        assert isinstance(node, dict) and key in node, f"{path} is not in values.yaml"
        node = node[key]
    return node


def test_every_top_level_value_is_in_the_doc() -> None:
    for key in VALUES:
        assert f"`{key}" in DOC, f"docs/operations.md does not mention the value {key}"


def test_every_value_has_a_doc_comment() -> None:
    _, undocumented = documented_values(VALUES_TEXT)
    assert undocumented == [], f"values.yaml keys without a '# --' comment: {undocumented}"


def test_doc_comment_checker_finds_a_missing_comment() -> None:
    _, undocumented = documented_values("a:\n  # -- fine\n  b: 1\n  c: 2\n# -- whole map\nd:\n  e: 1\n")
    assert undocumented == ["a.c"]


def test_values_table_matches_values_yaml() -> None:
    documented, _ = documented_values(VALUES_TEXT)
    table = _doc_table_paths()
    assert sorted(table) == sorted(documented), "the Configure table and values.yaml list different values"
    for path, default in table.items():
        value = _lookup(path)
        if default.startswith("`") and not isinstance(value, dict):
            assert yaml.safe_load(default.strip("`")) == value, f"{path}: doc says {default}, values.yaml says {value!r}"
