# changelake — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml jvm/pom.xml jvm/jvm.lock | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast bench install clean config-reference

$(STAMP): pyproject.toml jvm/pom.xml jvm/jvm.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m changelake.jvm_deps install   # jvm/pom.xml's jars into .jvm/ (docs/operations.md, "JVM dependencies")
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

## Mirror a simulated inventory database: embedded Kafka -> Spark -> Delta, then verify.
## (Spark's JVM class archive is written in the background after it: `changelake jvm-archive`.)
demo: $(STAMP)
	$(VENV)/bin/changelake demo --workdir demo-output

## Every test tier (unit, spark, kafka, integration), and every benchmark in bench/ in its --quick
## mode as a smoke run (tests/bench/test_bench_smoke.py; full-size benchmarks run from bench/).
test: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider

## Only the tests that need neither a JVM nor a broker.
test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m "unit"

## Regenerate docs/configuration.md and the chart's pipeline schema (values.schema.json) from the
## config model (changelake/service/config.py); tests/service/test_config_reference.py checks both.
config-reference: $(STAMP)
	$(PY) -m changelake.service.config_reference --write

bench: $(STAMP)
	$(PY) bench/mirror.py

clean:
	rm -rf $(VENV) .jvm demo-output .pytest_cache
