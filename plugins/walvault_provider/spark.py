"""Submitting walvault's Spark jobs from Airflow: the plan file a job reads, and what it left behind.

A job's plan (spark_jobs/plan.py) goes to a file in a work directory shared by the tasks of a run (beside
the scheduler here; a shared volume in docker-compose), so that no path list or repository option is on a
command line; the job leaves its stdout, stderr and exit code in the plan's `output` directory, which the
next task reads and reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowNotFoundException

from walcore.fsutil import write_atomic

WORK_ENV = "WALVAULT_WORK_DIR"
COMMITTED = "committed.json"  # a backup job's: the backup it committed (spark_jobs/job.py)


def application(job: str) -> str:
    """The path of a job's application file (spark_jobs/<job>.py), found without importing it."""
    from importlib.util import find_spec

    spec = find_spec("spark_jobs")
    return str(Path(next(iter(spec.submodule_search_locations))) / f"{job}.py")


def _work_base() -> Path:
    """`$WALVAULT_WORK_DIR` (default `$AIRFLOW_HOME/walvault-work`): this user's, writable by no one else, since
    another user able to put a plan there could make a job back up what they like into a repository of theirs."""
    home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")
    base = Path(os.environ.get(WORK_ENV) or home / "walvault-work")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    if base.stat().st_uid != os.getuid() or base.stat().st_mode & 0o022:
        raise PermissionError(f"{base} ({WORK_ENV}) must be this user's and writable by no one else")
    return base


def _run_prefix(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id) + "--"


def work_dir(run_id: str, task: str) -> Path:
    """A task's directory in the work directory, shared by the tasks of a run."""
    path = _work_base() / f"{_run_prefix(run_id)}{task}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def plan_name(run_id: str, plan_arg: str) -> str:
    """The name the DAG gave a plan (`plan_arg` is `@<plan file>`): its work directory's, less the run's prefix."""
    return Path(plan_arg.removeprefix("@")).parent.name.removeprefix(_run_prefix(run_id))


def stop_jobs(run_id: str, timeout: float = 5) -> list[int]:
    """Stop every process of a run's jobs still running (a run marked failed or stopped leaves them behind):
    each process whose command line or environment names one of the run's work directories (spark-submit and
    its JVM are given the plan; a Python driver too), with every process under it (SIGTERM, then SIGKILL after
    `timeout` seconds). Returns the pids of the processes found."""
    import psutil

    from spark_jobs.submit import stop_tree

    mark = str(_work_base() / _run_prefix(run_id))
    found = []
    for p in psutil.process_iter(["cmdline", "environ"]):  # another user's environ reads as None
        if p.pid == os.getpid():
            continue
        words = [*(p.info["cmdline"] or []), *(p.info["environ"] or {}).values()]
        if any(mark in word for word in words):
            found.append(p.pid)
    stop_tree(*found, timeout=timeout)
    return found


def committed(run_id: str) -> list[dict]:
    """The backups a run's jobs committed (what each job left in output/committed.json right after its backup's
    manifest was written), whether or not a task after the job recorded them."""
    found = []
    for path in sorted(_work_base().glob(f"{_run_prefix(run_id)}*/output/{COMMITTED}")):
        found.append(json.loads(path.read_text()))
    return found


class StoppedJobs(AirflowFailException):
    """A run's teardown found jobs of the run still running and stopped them: the run was stopped under them (not
    retried: a retry would find nothing to stop and turn the teardown green)."""


def clean_up(run_id: str, ti=None) -> dict:
    """What a run's teardown does, whatever happened, in this order: its jobs still running stopped (stop_jobs),
    the backups they committed recorded (the log, and XCom `committed` of `ti`), then the run's directories
    removed (a plan a job never read included): a directory goes only once nothing runs in it. Returns {"stopped":
    pids, "committed": backups, "removed": names}; StoppedJobs (after all that) when it had to stop a job."""
    import shutil

    stopped = stop_jobs(run_id)
    backups = committed(run_id)
    for b in backups:
        print(f"walvault backup {b['id']} of {b['family']} {b['instance']} ({b['path']}) was committed by this run")
    if ti is not None:
        ti.xcom_push(key="committed", value=backups)
    removed = []
    for path in _work_base().glob(f"{_run_prefix(run_id)}*"):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    if stopped:
        raise StoppedJobs(f"{len(stopped)} processes of this run's Spark jobs were still running (the run was "
                          f"marked failed or stopped while they ran) and were stopped before their work directory "
                          f"was removed; {len(backups)} backups were committed (listed above)")
    return {"stopped": stopped, "committed": backups, "removed": removed}


def check_connection(conn_id: str) -> None:
    """The Spark connection must exist and be of type spark: a missing one would silently mean master yarn. Either
    fault is the configuration's, which no retry mends (AirflowFailException)."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException as e:
        raise AirflowFailException(str(e)) from None
    if conn.conn_type != "spark":
        raise AirflowFailException(f"the Spark connection {conn_id!r} is of type {conn.conn_type!r}, not spark")


def _output(directory: Path) -> Path:
    return directory / "output"


def write_plan(directory: Path, plan: dict) -> str:
    """Write the plan (with its output directory) and return the job's argument, `@<plan file>`."""
    output = _output(directory)
    output.mkdir(exist_ok=True)
    for stale in ("stdout", "stderr", "result.json", COMMITTED):  # a re-run of the task must not read the last run's
        (output / stale).unlink(missing_ok=True)
    path = directory / "plan.json"
    write_atomic(path, [json.dumps({**plan, "output": str(output)}).encode()], mode=0o600)  # it may hold secrets
    return f"@{path}"


def job_result(plan_arg: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) the job's command left in the output dir beside its plan (the job removed the
    plan once its result was written); AirflowException when it left no exit code (the job died)."""
    output = _output(Path(plan_arg.removeprefix("@")).parent)
    result = output / "result.json"
    if not result.exists():
        raise AirflowException(f"the Spark job left no result in {output}: it did not finish (see the submit task's "
                               "log)")
    code = json.loads(result.read_text())["exit"]
    return code, (output / "stdout").read_text(), (output / "stderr").read_text()
