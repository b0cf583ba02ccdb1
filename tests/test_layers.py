"""The package's floors: leaves on the ground, no import that climbs, pyspark only in the Spark wing.

    ground      changelog, errors, types, metrics, durations, key_changes, log_values, jvm_deps, ipc  (import
                nothing of ours but the ground)
    formats     decoders
    connectors  the Delta sink (delta-rs), dead letters, lookup sources, the embedded and the local Kafka broker
    operators   the kernels (may use connectors' lookup sources)
    plan        the graph, planner, explain, the in-process runner
    spark       everything that imports pyspark
    service     config, CLI, pipeline assembly

Each floor imports only floors listed below it; formats, operators, plan, the delta-rs sink and the
service's config import and work with pyspark absent.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "changelake"
GROUND = {"changelog", "errors", "types", "metrics", "durations", "key_changes", "log_values", "jvm_deps", "ipc",
          "__init__",
          "__version__"}
MAY_IMPORT = {
    "ground": GROUND,
    "formats": GROUND,
    "connectors": GROUND,
    "operators": GROUND | {"connectors"},
    "plan": GROUND | {"formats", "connectors", "operators"},
    "spark": GROUND | {"formats", "connectors", "operators", "plan"},
    "service": GROUND | {"formats", "connectors", "operators", "plan", "spark"},
}


def _floor(path: Path) -> str:
    top = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    return "ground" if top in GROUND else top


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, also those inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            if node.module == "changelake":     # from changelake import metrics
                out.extend((node.lineno, f"changelake.{a.name}") for a in node.names)
    return out


def test_no_import_climbs_a_floor():
    climbing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        floor = _floor(path)
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] != "changelake" or len(parts) < 2:
                continue
            target = parts[1]
            if target == floor or (floor == "ground" and target in GROUND):
                continue
            if target not in MAY_IMPORT[floor]:
                climbing.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({floor}) imports {module}")
    assert not climbing, "imports that climb a floor:\n" + "\n".join(climbing)


def test_pyspark_is_imported_only_in_the_spark_wing():
    outside = [f"{path.relative_to(PACKAGE.parent)}:{line}"
               for path in sorted(PACKAGE.rglob("*.py")) if _floor(path) not in ("spark", "service")
               for line, module in _imports(path) if module.split(".")[0] in ("pyspark", "py4j")]
    assert not outside, f"pyspark imported outside changelake/spark: {outside}"


def test_the_lower_floors_work_with_pyspark_absent(tmp_path):
    """Decode a message, run a graph in-process into a delta-rs table, load a config: with any import of
    pyspark failing."""
    script = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("pyspark", "py4j"):
                    raise ImportError(f"blocked: {{name}}")
        sys.meta_path.insert(0, Block())

        import pyarrow as pa
        from changelake.connectors.delta_sink import TableSpec, open_sink
        from changelake.formats import make_decoder
        from changelake.plan.graph import Pipeline
        from changelake.plan.local import LocalRunner
        from changelake.plan.physical import sink_changes
        from changelake.service.config import ChangelakeConfig
        from changelake.service.views import pipeline_from_config
        from changelake.types import arrow_schema
        import changelake.spark          # the wing's face imports no pyspark either

        decoder = make_decoder("debezium-json", columns=arrow_schema({{"id": "bigint", "cat": "string"}}))
        rec = pa.table({{"topic": ["t"], "partition": pa.array([0], pa.int32()), "offset": pa.array([0], pa.int64()),
                        "timestamp": pa.array([None], pa.timestamp("ms")), "key": pa.array([None], pa.binary()),
                        "value": [b'{{"op":"c","after":{{"id":1,"cat":"a"}},"source":{{}}}}']}})
        rows = decoder.decode(rec.cast(decoder.input_schema) if hasattr(decoder, "input_schema") else rec).rows
        assert rows.num_rows == 1, rows

        p = Pipeline()
        p.source("s", columns={{"id": "bigint", "cat": "string"}}, primary_key=["id"])
        p.stream("s").group_by("cat").agg(n="count(*)").to_table("by_cat", primary_key=["cat"])
        plan = p.plan()
        out = LocalRunner(plan).step({{"s": rows}})
        sink = open_sink(TableSpec(name="by_cat", path={str(tmp_path / "t")!r}, primary_key=("cat",)), pipeline_id="x")
        sink.apply(sink_changes(out["by_cat"], primary_key=["cat"], batch_id=0), batch_id=0)
        import os
        assert os.listdir(os.path.join({str(tmp_path / "t")!r}, "_delta_log")), "no Delta commit"

        cfg = ChangelakeConfig.model_validate({{"pipeline": {{"id": "x", "checkpoint": {str(tmp_path / "c")!r}}},
            "kafka": {{"bootstrap_servers": "localhost:1"}}, "storage": {{"root": {str(tmp_path)!r}}},
            "sources": [{{"name": "s", "topics": ["t"], "format": "debezium-json", "table": "s",
                          "columns": {{"id": "bigint"}}}}],
            "tables": [{{"name": "s", "primary_key": ["id"]}}]}})
        pipeline_from_config(cfg)
        assert not any(m.split(".")[0] == "pyspark" for m in sys.modules)
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
