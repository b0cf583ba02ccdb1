"""Drives an operator kernel through a conformance case of the Flink operator corpus.

The corpus lives in ``shared/conformance/operators/<Operator>/*.json`` (see its
README): steps are inputs, actions and checks. Consecutive input steps of one side
are fed to the kernel as ONE batch, so every case also checks that a batch gives
the same output as row-at-a-time processing. ``snapshot_and_restore`` really
serializes the state to bytes and builds a new kernel from them.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from changelake.changelog import RowKind
from changelake.operators._rows import Changes

CORPUS_ENV = "CHANGELAKE_CONFORMANCE_DIR"

#: Test classes whose Java test concatenates the output of the instance before a restore with the
#: output after it for its final check (the case notes say so; e.g. RowTimeDeduplicateFunctionTest
#: does ``output.addAll(testHarness.getOutput())`` before restoring). Everywhere else a
#: non-consuming check sees only what the current instance emitted.
CONCATENATES_OUTPUT_ACROSS_RESTORE = frozenset({"RowTimeDeduplicateFunctionTest"})

_KIND_ORDER = {"+I": 0, "-U": 1, "+U": 2, "-D": 3}


def corpus_dir() -> Path:
    env = os.environ.get(CORPUS_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "conformance"


def case_params(operator: str, *, unverified: bool | None = False) -> list:
    """One ``pytest.param`` per case file of ``operator`` (id = file name without ``.json``).

    ``unverified``: False -> only verified cases, True -> only ``"unverified": true`` cases.
    If the corpus is missing, a single skipped param names the missing directory.
    """
    root = corpus_dir() / "operators" / operator
    if not root.is_dir():
        return [pytest.param(None, id=f"{operator}-corpus-missing", marks=pytest.mark.skip(
            reason=f"conformance corpus not found: {root} does not exist "
                   f"(set {CORPUS_ENV} to the directory holding operators/)"))]
    params = []
    for path in sorted(root.glob("*.json")):
        case = json.loads(path.read_text())
        if bool(case.get("unverified", False)) != bool(unverified):
            continue
        params.append(pytest.param(path, id=path.stem))
    return params


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


# ---- output representation ------------------------------------------------------------------------

def _norm(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_norm(x) for x in v]
    return v


def records(out: Changes) -> list[tuple]:
    return [("R", RowKind(k).short, _norm(r)) for k, r in zip(out.kinds, out.rows)]


def expected_items(expected: list[dict]) -> list[tuple]:
    items = []
    for e in expected:
        if "watermark" in e:
            items.append(("W", e["watermark"]))
        else:
            items.append(("R", e["kind"], list(e["row"])))
    return items


def _fmt(items: list[tuple]) -> str:
    return "\n".join(f"    watermark {i[1]}" if i[0] == "W" else f"    {i[1]} {json.dumps(i[2])}" for i in items) \
        or "    (nothing)"


def _sort_key(column: int):
    def key(item):
        value = item[2][column]
        return (_KIND_ORDER[item[1]], value is not None, value if value is not None else 0)
    return key


def compare(actual: list[tuple], expected: list[tuple], mode) -> str | None:
    """None if equal under ``mode``, else a message."""
    if mode == "exact":
        ok = actual == expected
    elif isinstance(mode, dict) and mode.get("mode") == "sorted_by_kind_then_column":
        col = mode["column"]
        wm_a = [(i, x) for i, x in enumerate(actual) if x[0] == "W"]
        wm_e = [(i, x) for i, x in enumerate(expected) if x[0] == "W"]
        rec_a = sorted([x for x in actual if x[0] == "R"], key=_sort_key(col))
        rec_e = sorted([x for x in expected if x[0] == "R"], key=_sort_key(col))
        ok = wm_a == wm_e and rec_a == rec_e and len(actual) == len(expected)
    elif isinstance(mode, dict) and mode.get("mode") == "multiset":
        canon = lambda xs: Counter(json.dumps(x) for x in xs)  # noqa: E731
        ok = canon(actual) == canon(expected)
    else:
        raise AssertionError(f"unknown compare mode {mode!r}")
    if ok:
        return None
    return f"compare={json.dumps(mode)}\n  expected:\n{_fmt(expected)}\n  actual:\n{_fmt(actual)}"


# ---- driving ----------------------------------------------------------------------------------------

class Driver:
    """How the runner talks to one operator under test; test modules subclass or configure it."""

    def process(self, side: str, batch: Changes, now: int) -> Changes:
        raise NotImplementedError

    def watermark(self, time: int, now: int) -> Changes:
        raise NotImplementedError

    def finish(self, now: int) -> Changes:
        raise NotImplementedError

    def snapshot_and_restore(self) -> None:
        raise NotImplementedError

    def feed_local_output_to_global(self, now: int) -> Changes:
        raise AssertionError("this operator has no two-phase mode")


@dataclass
class KernelDriver(Driver):
    """Single-input kernel: ``make()`` builds it, ``restore(bytes)`` rebuilds it from a snapshot."""

    make: Callable[[], Any]
    restore: Callable[[bytes], Any]
    kernel: Any = None
    side: str = "in"
    snapshots: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kernel = self.make()

    @classmethod
    def of(cls, kernel_cls, config) -> "KernelDriver":
        """Driver for ``kernel_cls(config)``, restored with ``kernel_cls.restore(config, data)``."""
        return cls(make=lambda: kernel_cls(config), restore=lambda data: kernel_cls.restore(config, data))

    def process(self, side, batch, now):
        assert side == self.side, f"unexpected input side {side!r}"
        return self.kernel.process(batch, now=now)

    def watermark(self, time, now):
        return self.kernel.on_watermark(time, now=now)

    def finish(self, now):
        return self.kernel.finish(now=now)

    def snapshot_and_restore(self):
        data = self.kernel.snapshot()
        assert isinstance(data, bytes)
        self.snapshots.append(len(data))
        self.kernel = self.restore(data)


def run_case(case: dict, driver: Driver, *,
             relaxed: Callable[[list, list], str | None] | None = None) -> None:
    """Run every step of ``case``; raises AssertionError at the first failing check.

    Like Flink's test harness there is one output queue per operator instance: a consuming
    check (``shouldEmit``) compares and clears it, a non-consuming one only compares.
    """
    now = 0
    queue: list[tuple] = []
    before_restore: list[tuple] = []
    concat = case.get("source", {}).get("test_class") in CONCATENATES_OUTPUT_ACROSS_RESTORE
    pending_side: str | None = None
    pending = Changes()

    def flush_inputs() -> None:
        nonlocal pending, pending_side
        if len(pending):
            queue.extend(records(driver.process(pending_side, pending, now)))
        pending, pending_side = Changes(), None

    for n, step in enumerate(case["steps"]):
        if "input" in step:
            inp = step["input"]
            if pending_side is not None and inp["side"] != pending_side:
                flush_inputs()
            pending_side = inp["side"]
            pending.emit(int(RowKind.from_short(inp["kind"])), inp["row"])
            continue
        flush_inputs()
        if "action" in step:
            action = step["action"]
            if action == "set_state_ttl_time":
                now = step["time"]
            elif action == "watermark":
                queue.extend(records(driver.watermark(step["time"], now)))
                queue.append(("W", step["time"]))
            elif action == "close":
                queue.extend(records(driver.finish(now)))
            elif action == "snapshot_and_restore":
                before_restore.extend(queue)
                queue = []
                driver.snapshot_and_restore()
            elif action == "feed_local_output_to_global":
                queue = records(driver.feed_local_output_to_global(now))
            else:
                raise AssertionError(f"step {n}: unknown action {action!r}")
            continue
        check = step["check"]
        actual = queue if (check["consume"] or not concat) else before_restore + queue
        if relaxed is not None:
            problem = relaxed(list(actual), expected_items(check["expected"]))
        else:
            problem = compare(list(actual), expected_items(check["expected"]), check["compare"])
        if problem:
            raise AssertionError(f"check at step {n} ({check.get('assert')}) failed: {problem}")
        if check["consume"]:
            queue = []


def run_case_or_xfail(case: dict, make_driver: Callable[[], Driver],
                      relaxations: list[tuple[str, Callable[[list, list], str | None]]]) -> None:
    """Run ``case`` with its own compare modes; if that fails, try each ``(reason, relaxed)``
    comparison in turn (each states one deliberate difference, strictest first). The first that
    passes every check turns the result into xfail with its reason, so the difference stays
    visible in the report; if none passes, the exact failure is raised."""
    try:
        run_case(case, make_driver())
    except AssertionError as exact_failure:
        for reason, relaxed in relaxations:
            try:
                run_case(case, make_driver(), relaxed=relaxed)
            except AssertionError:
                continue
            pytest.xfail(f"{reason} -- exact-order failure was: {str(exact_failure)[:2000]}")
        raise
