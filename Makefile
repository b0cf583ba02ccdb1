# changelake — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
#: the demo's install: the package and its runtime dependencies (the demo runs the embedded broker and
#: delta-rs: no test tools, no JVM jars)
RUN_STAMP := $(VENV)/.installed-run-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
#: everything `make test` needs on top: the test extra and jvm/pom.xml's jars (docs/operations.md, "JVM dependencies")
STAMP     := $(VENV)/.installed-all-$(shell cat pyproject.toml jvm/pom.xml jvm/jvm.lock | cksum | cut -d' ' -f1)

#: make test's pytest processes (pytest-xdist), each with its own Spark session and Kafka broker; a test
#: file stays in one process. `make test TEST_WORKERS=` runs the suite in one process.
TEST_WORKERS ?= -n 2 --dist loadfile

.PHONY: demo test test-fast test-delta-spark bench install clean config-reference

# --prefer-binary: a wheel rather than a newer sdist to build (pyspark itself only comes as an sdist).
# compileall: an editable install is not compiled (pip compiles a wheel's modules); where PYTHONDONTWRITEBYTECODE
# is set, every process, each of Spark's Python workers too, would compile changelake's modules from source again.
$(RUN_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --prefer-binary -e .
	$(PY) -m compileall -q changelake >/dev/null
	rm -f $(VENV)/.installed-run-*
	touch $(RUN_STAMP)

# the test extra's requirements alone: `pip install -e '.[test]'` would build the editable package again
$(STAMP): $(RUN_STAMP) jvm/pom.xml jvm/jvm.lock
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["test"]))' > $(VENV)/test-requirements.txt
	$(PY) -m pip install --quiet --prefer-binary -r $(VENV)/test-requirements.txt
	$(PY) -m changelake.jvm_deps install   # jvm/pom.xml's jars into .jvm/ (docs/operations.md, "JVM dependencies")
	rm -f $(VENV)/.installed-all-*
	touch $(STAMP)

install: $(STAMP)

## Mirror a simulated inventory database: embedded Kafka -> Spark -> Delta, then verify.
## (Spark's JVM class archive is written in the background after it: `changelake jvm-archive`.)
## Installs only what the demo runs; `make test` / `make install` add the test tools and the JVM jars.
demo: $(RUN_STAMP)
	$(VENV)/bin/changelake demo --workdir demo-output

## Every test tier (unit, spark, kafka, integration), and every benchmark in bench/ in its --quick
## mode as a smoke run (tests/bench/test_bench_smoke.py; full-size benchmarks run from bench/).
test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider $(TEST_WORKERS)

## Only the tests that need neither a JVM nor a broker.
test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m "unit"

## The whole sink suite on delta-spark as well (make test runs it on delta-rs and delta-rs-frames, and
## delta-spark through the suites around a batch and the pipeline tests; this adds ~9 minutes).
test-delta-spark: install
	CHANGELAKE_TEST_DELTA_SPARK_SUITE=1 $(PY) -m pytest -p no:cacheprovider tests/sink tests/integration/test_cross_engine.py

## Regenerate docs/configuration.md and the chart's pipeline schema (values.schema.json) from the
## config model (changelake/service/config.py); tests/service/test_config_reference.py checks both.
config-reference: $(STAMP)
	$(PY) -m changelake.service.config_reference --write

bench: $(STAMP)
	$(PY) bench/mirror.py

clean:
	rm -rf $(VENV) .jvm demo-output .pytest_cache
