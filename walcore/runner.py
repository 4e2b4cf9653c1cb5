"""Where the work of a command runs: this machine's cores, or (spark_jobs) the executors of a Spark cluster.

A command cuts its work into units — a file, a byte range of a big file, a stored object — and hands them to
a runner, which applies a pure function to each unit wherever it likes and gives the results back. walcore's
commands run the same code whatever the runner is: `LocalRunner` here, `spark_jobs.runner.SparkRunner` on a
cluster, so that `walvault ... --spark` prints what `walvault ...` prints.

A runner also builds the durable state of a limestone log (`state_rows`), since that is a reduction by key
rather than a map: in process here, by DataFrames on Spark.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


class WorkFailed(RuntimeError):
    """The runner itself failed (a lost executor, a job cancelled), not one unit's function: the message says why."""


class Failure:
    """An exception raised by a unit's function where it ran, carried back to be raised where the command runs
    (a runner on a cluster returns it rather than failing the task: Spark would retry a task that can only fail
    again, and lose the exception's type, which decides the exit code)."""

    def __init__(self, error: BaseException):
        self.error = error


def capture(func: Callable):
    """`func`, returning a Failure instead of raising (pickled with the unit's result)."""

    def run(item):
        try:
            return func(item)
        except Exception as e:  # noqa: BLE001 - carried back and raised again by the runner's caller
            return Failure(e)

    return run


class LocalRunner:
    """Units over this machine's cores: worker processes, or threads for work that releases the GIL."""

    name = "local"

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or os.cpu_count() or 1

    @property
    def parallelism(self) -> int:
        return self.jobs

    def map(self, func: Callable, items: Iterable, *, threads: bool = False) -> Iterator[tuple[object, object]]:
        """(item, func(item)) for every item, as each is done; the first error raised by func is raised here."""
        items = list(items)
        if self.jobs < 2 or len(items) < 2:
            for item in items:
                yield item, func(item)
            return
        if threads:
            from concurrent.futures import ThreadPoolExecutor as Pool
        else:
            from concurrent.futures import ProcessPoolExecutor as Pool  # costs 20 ms: only when used
        from concurrent.futures import as_completed

        with Pool(max_workers=min(self.jobs, len(items))) as pool:
            futures = {pool.submit(func, item): item for item in items}
            try:
                for future in as_completed(futures):
                    yield futures[future], future.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise

    def state_rows(self, pwal_paths: list[Path], durable_epoch: int, covered: set[str], *,
                   parquet=None) -> Iterator[tuple[int, bytes, bytes]]:
        """The live (storage_id, key, value) rows, sorted; written as Parquet too when a `parquet` output is given."""
        from .limestone.state import build_state

        rows = build_state(pwal_paths, durable_epoch, covered)
        if parquet is not None:
            parquet.finish([parquet.write_part(0, rows)])
        return iter(rows)


def run_all(runner, func: Callable, items: Iterable, *, threads: bool = False, done=None) -> dict:
    """Every item's result by item (items must be hashable); `done(item)` after each; raises a unit's error."""
    results = {}
    for item, result in runner.map(func, items, threads=threads):
        if isinstance(result, Failure):
            raise result.error
        results[item] = result
        if done is not None:
            done(item)
    return results


def registered(group: str, name: str):
    """What a package installed beside walcore registered as `name` in the entry point group `group`: how walcore
    reaches a runner it must not import (spark_jobs registers `spark` in walvault.runners). LookupError when none
    is installed."""
    from importlib.metadata import entry_points

    found = entry_points(group=group, name=name)
    if not found:
        raise LookupError(f"no {name} runner is installed (the entry point {name} of {group}: reinstall walvault, "
                          "scripts/setup)")
    return next(iter(found)).load()
