"""The Dockerfile stays consistent with pyproject.toml, the service and the Helm chart.

No Docker engine runs here, so the image is not built; these tests read the
Dockerfile and check every fact it shares with the rest of the repository.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from deploy_support import (
    CHART, DOCKERFILE, REPO, arg_defaults, dockerfile_stages, dockerignore_excludes, one,
)

pytestmark = pytest.mark.unit

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
STAGES = dockerfile_stages(DOCKERFILE.read_text())
CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def _pins() -> dict[str, str]:
    pins = {}
    for dep in PYPROJECT["project"]["dependencies"]:
        req = Requirement(dep)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            pins[req.name.lower()] = exact[0]
    return pins


def _args(stage: str) -> dict[str, str]:
    return {**arg_defaults(STAGES[""]), **arg_defaults(STAGES[stage])}


def _last(stage: str, word: str) -> str:
    found = [args for w, args in STAGES[stage] if w == word]
    assert found, f"stage {stage} has no {word}"
    return found[-1]


def _runtime_env() -> dict[str, str]:
    """The runtime stage's (last) ENV instruction, as name -> value."""
    return dict(part.partition("=")[::2] for part in _last("runtime", "ENV").split())


def test_stages() -> None:
    assert {"jvm", "jars", "builder", "runtime", "spark"} <= set(STAGES)
    assert list(STAGES)[-2:] == ["runtime", "spark"], "runtime must be followed only by the spark variant"


def test_python_version_satisfies_requires_python() -> None:
    version = arg_defaults(STAGES[""])["PYTHON_VERSION"]
    assert Version(version) in SpecifierSet(PYPROJECT["project"]["requires-python"])
    for stage in ("builder", "runtime"):
        assert _last(stage, "FROM").startswith("python:${PYTHON_VERSION}-"), stage


def test_the_image_installs_the_pinned_spark_sets_where_its_sessions_look() -> None:
    """The jvm stage installs the Spark sets (delta, spark-kafka) from the one pinned list (jvm/pom.xml, checked
    against jvm/jvm.lock; a set it cannot resolve fails the build) into the home that the runtime's
    CHANGELAKE_JVM_DEPS_HOME names, with the lock beside them (an installed package has no jvm/ directory); the
    runtime copies them and puts delta's on Spark's own classpath. The chart's SparkApplication names the same
    paths (tests/deploy/test_chart.py)."""
    from changelake import jvm_deps

    install = " ".join(args for w, args in STAGES["jvm"] if w == "RUN" and "jvm_deps install" in args)
    assert f"python -m changelake.jvm_deps install {' '.join(jvm_deps.IMAGE_SETS)}" in install
    assert f"CHANGELAKE_JVM_DEPS_HOME={jvm_deps.IMAGE_HOME}" in install and "CHANGELAKE_JVM_DEPS_REQUIRED=1" in install
    assert f"cp jvm/jvm.lock {jvm_deps.IMAGE_HOME}/jvm.lock" in install
    copied = [args.split() for w, args in STAGES["jvm"] if w == "COPY"]
    assert ["jvm", "./jvm"] in copied and ["changelake", "./changelake"] in copied
    env = _runtime_env()
    assert env["CHANGELAKE_JVM_DEPS_HOME"] == jvm_deps.IMAGE_HOME
    assert ["--from=jvm", jvm_deps.IMAGE_HOME, jvm_deps.IMAGE_HOME] in [a.split() for w, a in STAGES["runtime"]
                                                                       if w == "COPY"]
    links = " ".join(args for w, args in STAGES["runtime"] if w == "RUN")
    assert f'ln -s {jvm_deps.IMAGE_HOME}/delta/*.jar "${{SPARK_HOME}}/jars/"' in links
    assert not any("delta" in args for w, args in STAGES["jars"] if w == "RUN"), "delta comes from the pinned set"


def test_pyspark_pin_satisfies_delta_spark() -> None:
    import importlib.metadata as md

    try:
        installed = md.version("delta-spark")
    except md.PackageNotFoundError:
        pytest.fail("delta-spark is not installed (a dependency in pyproject.toml): run `make install`")
    if installed != _pins()["delta-spark"]:
        pytest.fail(f"installed delta-spark {installed} differs from the pin {_pins()['delta-spark']}: "
                    "the image and the venv would run different versions; run `make install`")
    reqs = [Requirement(r) for r in md.requires("delta-spark") or []]
    pyspark = next(r for r in reqs if r.name == "pyspark")
    assert Version(_pins()["pyspark"]) in pyspark.specifier


def _installed_pyspark_jars() -> list[str]:
    import importlib.metadata as md
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        pytest.fail("pyspark is not installed (a dependency in pyproject.toml): run `make install`")
    if md.version("pyspark") != _pins()["pyspark"]:
        pytest.fail(f"installed pyspark {md.version('pyspark')} differs from the pin {_pins()['pyspark']}: "
                    "the image and the venv would run different versions; run `make install`")
    return [p.name for p in (Path(spec.origin).parent / "jars").glob("*.jar")]


def test_hadoop_aws_matches_pyspark_hadoop_client() -> None:
    hadoop = [re.fullmatch(r"hadoop-client-api-(.+)\.jar", j) for j in _installed_pyspark_jars()]
    (version,) = {m.group(1) for m in hadoop if m}
    assert _args("jars")["HADOOP_VERSION"] == version


def test_jars_land_in_pyspark_jars_dir() -> None:
    copies = [args for w, args in STAGES["runtime"] if w == "COPY" and "--from=jars" in args]
    assert copies and copies[0].split()[-1] == "${SPARK_HOME}/jars/"
    env = " ".join(args for w, args in STAGES["runtime"] if w == "ENV")
    assert "SPARK_HOME=/opt/venv/lib/python${PYTHON_VERSION}/site-packages/pyspark" in env


def test_installs_the_pinned_dependencies_from_pyproject() -> None:
    text = DOCKERFILE.read_text()
    assert 'tomllib.load(f)["project"]["dependencies"]' in text
    runs = " ".join(args for w, args in STAGES["builder"] if w == "RUN")
    assert "pip install -r /tmp/requirements.txt" in runs
    assert "pip install --no-deps ." in runs


def _exec_form(args: str) -> list[str]:
    return json.loads(args)


def test_entrypoint_is_a_project_script() -> None:
    entrypoint = _exec_form(_last("runtime", "ENTRYPOINT"))
    assert entrypoint == ["changelake"]
    assert entrypoint[0] in PYPROJECT["project"]["scripts"]


def test_spark_starts_its_python_processes_through_the_project_script() -> None:
    """Spark's Python processes run ``changelake-worker-python`` (pyspark imported compiled, not from
    Spark's zip: changelake/spark/worker_python.py), a script the builder's ``pip install`` puts in the
    venv the runtime stage copies; so do the JVM's own Python calls (``PYSPARK_DRIVER_PYTHON``: the lookup of
    Python data sources), through the same script, which runs any other command line as the venv's Python."""
    env = _runtime_env()
    workers = Path(env["PYSPARK_PYTHON"])
    assert workers.name in PYPROJECT["project"]["scripts"]
    assert workers.name == "changelake-worker-python"
    assert str(workers.parent) == env["VIRTUAL_ENV"] + "/bin"
    assert env["PYSPARK_DRIVER_PYTHON"] == env["PYSPARK_PYTHON"]
    copies = [args.split() for w, args in STAGES["runtime"] if w == "COPY"]
    assert ["--from=builder", env["VIRTUAL_ENV"], env["VIRTUAL_ENV"]] in copies


def test_cmd_runs_the_config_the_chart_mounts(render: Any) -> None:
    cmd = _exec_form(_last("runtime", "CMD"))
    sts = one(render({}), "StatefulSet")
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert cmd == container["args"] == ["run", "-c", "/etc/changelake/pipeline.yaml"]


def test_runs_as_the_non_root_user_the_chart_expects() -> None:
    user = _last("runtime", "USER").split(":")[0]
    assert user not in {"root", "0"}
    assert int(user) == CHART_VALUES["statefulset"]["podSecurityContext"]["runAsUser"]


def test_healthcheck_hits_healthz_on_the_chart_metrics_port() -> None:
    health = _last("runtime", "HEALTHCHECK")
    assert "/healthz" in health
    port = _args("runtime")["METRICS_PORT"]
    assert int(port) == CHART_VALUES["metrics"]["port"]
    assert f"'CHANGELAKE_METRICS__PORT', '{port}'" in health
    env = " ".join(args for w, args in STAGES["runtime"] if w == "ENV")
    assert "CHANGELAKE_METRICS__PORT=${METRICS_PORT}" in env
    assert _last("runtime", "EXPOSE") == "${METRICS_PORT}"


def test_service_serves_the_healthcheck_path() -> None:
    sources = [p for p in (REPO / "changelake" / "service").glob("*.py")]
    serving = [p for p in sources if re.search(r"[\"']/healthz[\"']", p.read_text())]
    assert serving, "no module of changelake/service serves /healthz, which the image's HEALTHCHECK requests"
    assert any(re.search(r"[\"']/readyz[\"']", p.read_text()) for p in serving)
    assert any("9108" in p.read_text() for p in sources), "the service's default metrics port should be 9108"


def test_spark_target_carries_the_driver_main_the_chart_names(render: Any) -> None:
    app = one(render({"statefulset": {"enabled": False}, "persistence": {"enabled": False},
                      "sparkApplication": {"enabled": True},
                      "pipeline": {"pipeline": {"checkpoint": "s3a://lake/cp"}, "storage": {"root": "s3a://lake"}}}),
               "SparkApplication")
    main = app["spec"]["pyFiles"].removeprefix("local://")
    copies = [args.split() for w, args in STAGES["spark"] if w == "COPY"]
    destinations = {c[-1]: c[-2] for c in copies}
    assert main in destinations
    assert (REPO / destinations[main]).is_file()
    assert _exec_form(_last("spark", "ENTRYPOINT")) == ["spark-entrypoint"]


def test_copied_sources_exist_and_are_not_dockerignored() -> None:
    patterns = (REPO / ".dockerignore").read_text().splitlines()
    for stage, instructions in STAGES.items():
        for word, args in instructions:
            if word != "COPY" or "--from=" in args:
                continue
            sources = [a for a in args.split()[:-1] if not a.startswith("--")]
            for source in sources:
                if source == "README.md" and not (REPO / source).exists():
                    continue  # written on the main branch; the build context there has it
                assert (REPO / source).exists(), f"{stage}: COPY {source} does not exist"
                assert not dockerignore_excludes(patterns, source.rstrip("/")), f"{stage}: {source} is dockerignored"
    assert dockerignore_excludes(patterns, "tests/deploy/test_chart.py")
    assert dockerignore_excludes(patterns, "changelake/__pycache__/x.pyc")


def _tool(name: str) -> str:
    import shutil
    import sys

    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip(f"{name} not found on PATH or next to the Python interpreter (pip install {name}-py)")
    return found


def test_hadolint_accepts_the_dockerfile() -> None:
    import subprocess

    result = subprocess.run([_tool("hadolint"), "--config", str(REPO / ".hadolint.yaml"), str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_accepts_the_image_scripts() -> None:
    import subprocess

    scripts = sorted(str(p) for p in (REPO / "docker").glob("*.sh"))
    assert scripts
    result = subprocess.run([_tool("shellcheck"), *scripts], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_image_sets_the_allocators_a_session_started_here_sets() -> None:
    """Under spark-submit (the chart's SparkApplication) the driver JVM starts before changelake's code and
    executors start in pods of their own: the image gives every process the arena cap and Arrow's allocator that a
    session started by ``changelake run`` gives its JVM and workers (changelake/spark/session.py)."""
    from changelake.spark.session import ARROW_POOL, MALLOC_ARENAS

    env = _runtime_env()
    assert env[MALLOC_ARENAS[0]] == MALLOC_ARENAS[1]
    assert env[ARROW_POOL[0]] == ARROW_POOL[1]


def test_the_image_writes_the_jvm_class_archive_where_its_sessions_look_for_it() -> None:
    """The runtime stage writes Spark's class archive (changelake/spark/jvm_archive.py) after Spark's jars are in
    place (the JVM checks the archive against them) to the path ``CHANGELAKE_JVM_ARCHIVE`` names, readable by the
    non-root user; a build where it cannot be written goes on without it."""
    env = _runtime_env()
    archive = env["CHANGELAKE_JVM_ARCHIVE"]
    steps = STAGES["runtime"]
    writes = [i for i, (w, args) in enumerate(steps) if w == "RUN" and "changelake jvm-archive" in args]
    assert len(writes) == 1
    jars = [i for i, (w, args) in enumerate(steps) if w == "COPY" and "/jars/" in args]
    assert jars and jars[-1] < writes[0]
    assert f"mkdir -p {Path(archive).parent}" in steps[writes[0]][1]
    assert "||" in steps[writes[0]][1]                  # no archive: the image still builds
    users = [i for i, (w, _) in enumerate(steps) if w == "USER"]
    assert writes[0] < users[-1]                         # written as root, into a directory the user only reads
