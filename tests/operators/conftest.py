import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "unverified_corpus: conformance case whose Java test Flink's CI never runs (JUnit 5 skips "
        "overrides without @Test); run and reported on its own, lower confidence")


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/operators" in str(item.fspath).replace("\\\\", "/"):
            item.add_marker(pytest.mark.unit)
