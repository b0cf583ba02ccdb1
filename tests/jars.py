"""A test that needs a JVM jar set (or a database server, or a test package) skips, naming the install, where the set is absent, and fails instead
when ``CHANGELAKE_JVM_DEPS_REQUIRED=1`` (set by ``.ci/run``): there every set is installed, so a missing
one is a broken install, not a machine without Maven."""

from __future__ import annotations

import os

import pytest

from changelake import jvm_deps


def required() -> bool:
    return os.environ.get(jvm_deps.REQUIRED_ENV, "") not in ("", "0")


def unavailable(why: str | None) -> None:
    """Skip (or, where every set is required, fail) with ``why`` when it is not None."""
    if not why:
        return
    if required():
        pytest.fail(f"{why} ({jvm_deps.REQUIRED_ENV}=1: every JVM set, database server and test package must be installed)")
    pytest.skip(why)


def need(*names: str) -> None:
    """The test needs the jar sets ``names``."""
    for name in names:
        unavailable(jvm_deps.missing(name))
