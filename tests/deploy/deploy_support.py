"""Helpers shared by the deployment-artefact tests (Dockerfile, Helm chart, alerts, dashboard).

Kept free of pytest fixtures so each test module can call them directly;
conftest.py wraps the expensive ones.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "changelake"
RULES = REPO / "deploy" / "prometheus" / "rules.yaml"
RULES_TEST = REPO / "deploy" / "prometheus" / "rules_test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "changelake.json"
DOCS = REPO / "docs" / "operations.md"
DOCKERFILE = REPO / "Dockerfile"

RELEASE = "inv"
NAMESPACE = "cdc"


# --- exported metric names ----------------------------------------------------------

def exported_metric_names() -> set[str]:
    """Every sample name the service's registry can expose, read from the registry itself."""
    from changelake.metrics import REGISTRY

    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("", "_sum", "_count"),
        "gauge": ("",),
        "untyped": ("",),
        "info": ("_info",),
    }
    names: set[str] = set()
    for family in REGISTRY.collect():
        for suffix in suffixes[family.type]:
            names.add(family.name + suffix)
    return names


# --- PromQL -----------------------------------------------------------------------------

_PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "offset", "bool", "inf", "nan", "atan2",
}


def promql_metric_names(expr: str) -> set[str]:
    """Names of the series an expression selects (not functions, labels or keywords).

    Removes string literals, label matchers ``{...}``, range/subquery brackets
    ``[...]`` and the label lists of ``by``/``without``/``on``/``ignoring``/
    ``group_left``/``group_right``; what is left that is an identifier not
    followed by ``(`` is a metric name.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    text = re.sub(r"\{[^{}]*\}", " ", text)
    text = re.sub(r"\[[^\[\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][A-Za-z0-9_:]*)\b(?!\s*\()", text):
        word = match.group(1)
        if word.lower() in _PROMQL_KEYWORDS:
            continue
        names.add(word)
    return names


# --- Helm -----------------------------------------------------------------------------------

def split_manifests(rendered: dict[str, str]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(rendered):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(rendered[path]):
            if doc:
                doc.setdefault("__template__", path)
                docs.append(doc)
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected exactly one {kind}, got {len(found)}"
    return found[0]


def strip_meta(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "__template__"}


# --- promtool -------------------------------------------------------------------------------

def promtool() -> str | None:
    return shutil.which("promtool")


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    tool = promtool()
    assert tool is not None
    return subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=120)


# --- values.yaml documentation --------------------------------------------------------------

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_.-]*):(?P<rest>.*)$")


def documented_values(values_yaml: str) -> tuple[list[str], list[str]]:
    """Parse values.yaml the way helm-docs does.

    Returns (documented, undocumented): dotted paths of keys that carry a
    ``# --`` comment, and of leaf keys that are covered neither by their own
    ``# --`` comment nor by one on an ancestor.
    """
    documented: list[str] = []
    undocumented: list[str] = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, covered)
    comment_block: list[str] = []
    lines = values_yaml.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("#"):
            comment_block.append(stripped)
            continue
        if not stripped:
            comment_block = []
            continue
        match = _KEY.match(line)
        if not match or stripped.startswith("-"):
            comment_block = []
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k, _ in stack] + [match.group("key")])
        own = any(c.startswith("# --") for c in comment_block)
        covered = own or (bool(stack) and stack[-1][2])
        if own:
            documented.append(path)
        rest = match.group("rest").split(" #")[0].strip()
        nxt = next((l for l in lines[i + 1:] if l.strip() and not l.strip().startswith("#")), "")
        has_children = rest == "" and (len(nxt) - len(nxt.lstrip(" "))) > indent
        if not has_children and not covered:
            undocumented.append(path)
        stack.append((indent, match.group("key"), covered))
        comment_block = []
    return documented, undocumented


# --- Dockerfile -----------------------------------------------------------------------------

def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and heredocs skipped."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.rstrip().endswith("\\") and i < len(lines):
            nxt = lines[i]
            i += 1
            if nxt.lstrip().startswith("#"):
                continue
            line = line.rstrip()[:-1] + " " + nxt.strip()
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            end = heredoc.group(1)
            while i < len(lines) and lines[i].strip() != end:
                i += 1
            i += 1
        word, _, args = line.strip().partition(" ")
        out.append((word.upper(), args.strip()))
    return out


def dockerfile_stages(text: str) -> dict[str, list[tuple[str, str]]]:
    """Instructions per named stage; the global ARGs before the first FROM under ''."""
    stages: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for word, args in dockerfile_instructions(text):
        if word == "FROM":
            parts = args.split()
            current = parts[parts.index("AS") + 1] if "AS" in parts else f"stage{len(stages)}"
            stages[current] = []
        stages[current].append((word, args))
    return stages


def arg_defaults(instructions: list[tuple[str, str]]) -> dict[str, str]:
    out = {}
    for word, args in instructions:
        if word == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            out[name.strip()] = value.strip().strip('"')
    return out


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether Docker's .dockerignore rules (last match wins, ! re-includes) exclude path."""
    import fnmatch

    excluded = False
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        regex = fnmatch.translate(pattern).replace(".*", "[^/]*").replace("[^/]*[^/]*", ".*")
        candidates = [path] + [str(Path(*Path(path).parts[:n])) for n in range(1, len(Path(path).parts))]
        if pattern == "**" or any(re.fullmatch(regex, c) for c in candidates):
            excluded = not negate
    return excluded
