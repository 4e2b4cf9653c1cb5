"""SparkRunner: walcore's units of work as Spark tasks, one task per unit."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from walcore.runner import WorkFailed, capture


def _in_driver_cwd(func: Callable, cwd: str) -> Callable:
    """`func` run from the driver's working directory, so that relative paths mean on every executor what they
    mean to the driver (the sources are on a path every executor sees); a Failure instead of an exception."""
    run = capture(func)

    def in_cwd(item):
        if os.path.isdir(cwd):
            os.chdir(cwd)
        return run(item)

    return in_cwd


def job_error(e: Exception) -> WorkFailed:
    """The cause of a failed Spark job in a line or two (the Python error of the task, when there was one)."""
    text = str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    python = [line for line in lines if line.split(":", 1)[0].endswith(("Error", "Exception")) and "py4j" not in line
              and not line.startswith(("org.apache", "java.", "Caused by"))]
    return WorkFailed("the Spark job failed: " + (python[-1] if python else lines[0] if lines else type(e).__name__))


class SparkRunner:
    name = "spark"

    def __init__(self, spark):
        self.spark = spark
        self.sc = spark.sparkContext

    @property
    def parallelism(self) -> int:
        return max(1, self.sc.defaultParallelism)

    def map(self, func: Callable, items: Iterable, *, threads: bool = False) -> Iterator[tuple[object, object]]:
        """(item, func(item)) for every item, each item a Spark task; results come back in the order given (the
        caller gives the biggest first, and Spark starts tasks in partition order). Only the results travel to the
        driver: one per unit, never the bytes read."""
        items = list(items)
        if not items:
            return
        task = _in_driver_cwd(func, os.getcwd())
        rdd = self.sc.parallelize(list(enumerate(items)), len(items))
        try:
            results = rdd.map(lambda pair: (pair[0], task(pair[1]))).collect()
        except Exception as e:  # py4j's error: a lost executor, a killed job
            raise job_error(e) from None
        for index, result in results:
            yield items[index], result

    def state_rows(self, pwal_paths: list[Path], durable_epoch: int, covered: set[str], *,
                   parquet=None) -> Iterator[tuple[int, bytes, bytes]]:
        from .state import state_rows

        try:
            rows = state_rows(self, pwal_paths, durable_epoch, covered, parquet=parquet)
        except Exception as e:  # py4j's error
            raise job_error(e) from None
        return _job_errors(rows)


def _job_errors(rows: Iterator) -> Iterator:
    """The rows, a failure of the Spark job that yields them said as its cause (a WorkFailed)."""
    try:
        yield from rows
    except Exception as e:  # py4j's error
        raise job_error(e) from None
