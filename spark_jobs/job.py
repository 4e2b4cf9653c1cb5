"""What every job does: read its plan, start Spark, run the plan's request with a SparkRunner, as the command line
runs it on this machine's cores."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path


def run(spark, job: str, plan: dict) -> int:
    """Run a plan's command on a Spark session; with an `output` dir, leave there what it prints (`stdout`,
    `stderr`), for a backup it committed `committed.json` ({"id", "family", "instance", "path"}), and
    `result.json` ({"exit"}), written last. Returns the command's exit code."""
    from . import plan as plans

    request = plans.request(plan, job)
    output = plan.get("output")
    if not output:
        return _run(request, spark)
    # as the command's own streams: a file name that is not UTF-8 prints escaped
    with open(os.path.join(output, "stdout"), "w", encoding="utf-8", errors="backslashreplace") as out, \
            open(os.path.join(output, "stderr"), "w", encoding="utf-8", errors="backslashreplace") as err, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _run(request, spark)
    from walcore.fsutil import write_atomic

    if job == "backup" and code == 0 and request.json:
        # the backup its manifest committed, for whoever cleans up after a run stopped before it read the result
        printed = json.loads(Path(output, "stdout").read_text())
        write_atomic(Path(output) / "committed.json", [json.dumps(
            {"id": printed["id"], "family": printed["family"], "instance": printed["source"]["instance"],
             "path": printed["source"]["path"]}).encode()])
    write_atomic(Path(output) / "result.json", [json.dumps({"exit": code}).encode()])
    return code


def _run(request, spark) -> int:
    import dataclasses

    from walcore.frontend import EXIT_CANNOT_CHECK, refused, run
    from walcore.requests import connect_with_password

    from .runner import SparkRunner

    if (code := refused(request)) is not None:
        return code
    if getattr(request, "connect", None):
        try:
            request = dataclasses.replace(request, connect=connect_with_password(request.connect, None))
        except ValueError as e:
            print(f"walvault: {e}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
    return run(request, SparkRunner(spark))


def main(job: str, argv: list[str] | None = None) -> None:
    from .plan import PlanError, load, request

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: spark-submit spark_jobs/{job}.py PLAN_JSON|@PLAN_FILE", file=sys.stderr)
        sys.exit(2)
    try:
        plan = load(argv[0])
        request(plan, job)  # a bad plan is refused before Spark starts
        if plan.get("repo_key") and not argv[0].startswith("@"):
            raise PlanError("repo_key: only in a plan file (a command line is seen by every user of the machine)")
    except (PlanError, OSError) as e:
        print(f"walvault {job} job: bad plan: {e}", file=sys.stderr)
        sys.exit(2)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(f"walvault-{job}").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if key := plan.pop("repo_key", None):
        from walcore.repository.encrypted import KEY_ENV

        # where the command opening the repository takes it, in this driver only: set after the JVM started, the
        # executors never hold the passphrase (their tasks carry the repository's unwrapped keys)
        os.environ[KEY_ENV] = key
    try:
        code = run(spark, job, plan)
    finally:
        spark.stop()
    if argv[0].startswith("@") and plan.get("output"):
        # done with: a caller's plan file may hold credentials (kept until now, so that a retry can read it)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(argv[0][1:])
    # With an output dir the command's exit code is in result.json, and the job itself succeeded: its caller reads
    # the result and reports the command's verdict and cause (Airflow: the task after the Spark one).
    sys.exit(0 if plan.get("output") else code)
