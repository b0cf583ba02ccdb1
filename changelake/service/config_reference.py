"""The pipeline configuration's reference, generated from its model (:mod:`changelake.service.config`):

* ``docs/configuration.md``: every section and key with its type, default and description;
* the ``pipeline`` subtree of the Helm chart's ``values.schema.json``: the model's JSON schema, made
  self-contained (no ``$ref``), with ``<key>_file`` siblings and ``${VAR}`` references allowed where
  the loader allows them, so that ``helm install``/``template``/``lint`` reject a broken pipeline.

``python -m changelake.service.config_reference --write`` (``make config-reference``) regenerates
both; ``--check`` exits 1 when either is stale (tests/service/test_config_reference.py does the same).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import types
import typing
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticUndefined

from changelake.service.config import ENV_PREFIX, ChangelakeConfig

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"
CHART_SCHEMA = ROOT / "helm" / "changelake" / "values.schema.json"

#: a string that the loader replaces with an environment variable's value: allowed for any scalar
_ENV_REFERENCE = {"type": "string", "pattern": r"\$\{[A-Za-z_][A-Za-z0-9_]*(:-[^}]*)?\}"}


# --- the JSON schema -----------------------------------------------------------------------------

def pipeline_schema() -> dict[str, Any]:
    """The JSON schema of a pipeline YAML, self-contained, for the chart's ``pipeline`` value."""
    raw = ChangelakeConfig.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[1]])
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        out = {k: walk(v) for k, v in node.items() if k != "title"}
        if out.get("type") == "object" and out.get("additionalProperties") is False:
            # any string value may come from a file instead: ``sasl.password_file: /run/secrets/pw``
            out["patternProperties"] = {"_file$": {"type": "string"}}
        if out.get("type") in ("integer", "number", "boolean"):
            described = {k: out.pop(k) for k in ("description", "default") if k in out}
            out = {"anyOf": [out, dict(_ENV_REFERENCE)], **described}
        return out

    schema = walk(raw)
    schema.pop("description", None)
    schema["description"] = ("The pipeline configuration (docs/configuration.md), rendered into pipeline.yaml; "
                             "generated from changelake's config model")
    return schema


def chart_schema(current: dict[str, Any]) -> dict[str, Any]:
    """The chart's values schema with its ``pipeline`` property replaced by :func:`pipeline_schema`."""
    out = copy.deepcopy(current)
    out["properties"]["pipeline"] = pipeline_schema()
    return out


def _chart_schema_text() -> str:
    return json.dumps(chart_schema(json.loads(CHART_SCHEMA.read_text())), indent=2) + "\n"


# --- the Markdown reference ----------------------------------------------------------------------

_SECTION_ORDER = list(ChangelakeConfig.model_fields)


def _members(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _members(a)]
    return [annotation]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    found = []
    for m in _members(annotation):
        if isinstance(m, type) and issubclass(m, BaseModel):
            found.append(m)
        elif typing.get_origin(m) in (list, dict):
            for arg in typing.get_args(m):
                found.extend(_models_in(arg))
    return found


def _type_text(annotation: Any, paths: dict[type, str]) -> str:
    parts = []
    for m in _members(annotation):
        origin = typing.get_origin(m)
        if m is type(None):
            continue
        if origin is typing.Literal:
            parts.append(" \\| ".join(f"`{v}`" for v in typing.get_args(m)))
        elif origin is list:
            parts.append(f"list of {_type_text(typing.get_args(m)[0], paths)}")
        elif origin is dict:
            key, value = typing.get_args(m)
            parts.append(f"map of {_type_text(key, paths)} to {_type_text(value, paths)}")
        elif isinstance(m, type) and issubclass(m, BaseModel):
            parts.append(f"[{m.__name__}](#{_anchor(paths[m])})")
        elif m is SecretStr:
            parts.append("secret string")
        elif m is Any:
            parts.append("any")
        else:
            parts.append({str: "string", int: "integer", float: "number", bool: "boolean",
                          datetime: "timestamp (ISO 8601)"}.get(m, str(m)))
    return " or ".join(parts)


def _default_text(field: Any) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if value is None or value is PydanticUndefined:
        return "-"
    if isinstance(value, BaseModel):
        return "(its defaults)"
    if value in ({}, []):
        return "empty"
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _constraints(field: Any) -> str:
    bits = []
    for m in field.metadata:
        for name, label in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="), ("min_length", "at least"),
                            ("pattern", "matches")):
            value = getattr(m, name, None)
            if value is not None:
                bits.append(f"{label} `{value}`" if name != "min_length" else f"at least {value} item(s)")
    return "; ".join(bits)


def _anchor(path: str) -> str:
    return "".join(c for c in path.lower().replace(" ", "-") if c.isalnum() or c in "-_")


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """(YAML path, model) of every section, depth first in declaration order."""
    out: list[tuple[str, type[BaseModel]]] = []
    seen: set[type] = set()

    def visit(path: str, model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((path, model))
        for name, field in model.model_fields.items():
            key = field.alias or name
            for child in _models_in(field.annotation):
                # a list or map of the model, not a union that also allows a list or a map of something else
                many = any(typing.get_origin(m) is list and child in _models_in(m) for m in _members(field.annotation))
                mapped = any(typing.get_origin(m) is dict and child in _models_in(m)
                             for m in _members(field.annotation))
                visit(f"{path}.{key}" + ("[]" if many else ".<name>" if mapped else ""), child)

    for name in _SECTION_ORDER:
        field = ChangelakeConfig.model_fields[name]
        for model in _models_in(field.annotation):
            many = any(typing.get_origin(m) is list for m in _members(field.annotation))
            visit(name + ("[]" if many else ""), model)
    return out


def reference_markdown() -> str:
    sections = _sections()
    paths = {model: path for path, model in sections}
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from changelake/service/config.py by `make config-reference`; do not edit by hand. -->",
        "",
        "A pipeline is one YAML file (`changelake validate -c pipeline.yaml` checks it; the Helm chart renders",
        "the `pipeline` value into it and checks it against the same model's JSON schema). Besides the file:",
        "",
        f"* every key can be overridden by an environment variable `{ENV_PREFIX}<SECTION>__<KEY>[__<KEY>...]`;",
        f"  an item of a list section is named by its `name` or index (`{ENV_PREFIX}SOURCES__orders__FORMAT`),",
        "  a librdkafka property under `kafka.properties` with `_` for `.`; an override that names nothing fails;",
        "* `${VAR}` (or `${VAR:-default}`) inside a value is replaced by the environment variable's value;",
        "* any string value `x` can instead be read from a file with `x_file: /path` (or `x_FILE`; Kubernetes",
        f"  secret mounts), also through the environment: `{ENV_PREFIX}KAFKA__PROPERTIES__SASL_PASSWORD_FILE=/path`",
        "  sets `sasl.password` to the file's content.",
        "",
        "Secret strings are never printed: `validate`, `explain` and the logs show `**********`. A credential",
        "written in the file itself (`sasl.password`, `ssl.key.password`, `sasl.oauthbearer.client.secret`, an",
        "object-store secret key, a registry's `basic-auth.user-info`) is a warning of `validate` and at start.",
        "`kafka.properties` are checked by librdkafka itself (unknown names, invalid values, with \"did you",
        "mean\"); the properties changelake sets (`group.id`, `enable.auto.commit`, `auto.offset.reset`,",
        "`isolation.level`, ...) are refused, each with the reason and what to set instead.",
        "",
        "| section | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in ChangelakeConfig.model_fields.items():
        lines.append(f"| `{name}` | {_type_text(field.annotation, paths)} | {_default_text(field)} | "
                     f"{_describe(field)} |")
    for path, model in sections:
        lines += ["", f"## {path}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("A base class", "Usage docs")) and model.__module__ == ChangelakeConfig.__module__:
            lines += [" ".join(doc.split()), ""]
        lines += ["| key | type | default | description |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            lines.append(f"| `{field.alias or name}` | {_type_text(field.annotation, paths)} | {_default_text(field)} "
                         f"| {_describe(field)} |")
    return "\n".join(lines) + "\n"


def _describe(field: Any) -> str:
    text = " ".join((field.description or "").split()).replace("|", "\\|")
    limits = _constraints(field)
    return "; ".join(t for t in (text, limits) if t)


# --- command line ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate docs/configuration.md and the chart schema")
    mode.add_argument("--check", action="store_true", help="exit 1 when either is not what the model generates")
    args = parser.parse_args(argv)
    wanted = {DOC: reference_markdown(), CHART_SCHEMA: _chart_schema_text()}
    stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
    if args.write:
        for path in stale:
            path.write_text(wanted[path])
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    for path in stale:
        print(f"{path.relative_to(ROOT)} is stale: run `make config-reference`", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
