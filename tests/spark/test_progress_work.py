"""What /livez reads of a running batch (changelake.spark.progress.work_done): it moves while the batch's
tasks finish and its stages start, and stays the same while a task hangs."""

from __future__ import annotations

import threading
import time

import pytest

from changelake.spark.progress import work_done

pytestmark = pytest.mark.spark


def _run_in_background(job) -> threading.Thread:
    thread = threading.Thread(target=job, daemon=True)
    thread.start()
    return thread


def _samples(spark, thread: threading.Thread, *, every_s: float) -> list:
    seen = []
    while thread.is_alive():
        seen.append(work_done(spark))
        time.sleep(every_s)
    return seen


def test_the_work_of_a_running_job_moves_as_its_tasks_finish_and_not_while_a_task_hangs(spark):
    def slow(seconds):
        def fn(batches):
            import time as t
            for b in batches:
                t.sleep(seconds)
                yield b
        return fn

    schema = "id long"
    # eight tasks of 1.5 s on two slots: tasks finish one after another
    moving = _run_in_background(lambda: spark.range(0, 8, numPartitions=8).mapInPandas(slow(1.5), schema).collect())
    seen = [s for s in _samples(spark, moving, every_s=0.5) if s]
    assert len(set(seen)) >= 3, seen
    # one task that sleeps (a hung read): nothing moves between the samples taken while it runs
    hung = _run_in_background(lambda: spark.range(0, 1, numPartitions=1).mapInPandas(slow(20), schema).collect())
    time.sleep(8)                       # the stage has started and its one task is running
    during = [work_done(spark) for _ in range(4) if not time.sleep(2)]
    hung.join()
    assert during[0] and len(set(during)) == 1, during
