"""`walvault ... --spark MASTER`: the command submitted as a Spark job with `spark-submit`, and what the job
printed, printed here (the same text or JSON, the same exit code). Nothing here imports pyspark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

EXIT_CANNOT_CHECK = 2


def spark_submit() -> str:
    """The venv's spark-submit (beside this Python), else the one on PATH."""
    here = Path(sys.executable).parent / "spark-submit"
    return str(here) if here.exists() else shutil.which("spark-submit") or "spark-submit"


def job_file(job: str) -> str:
    return str(Path(__file__).with_name(f"{job}.py"))


def submit(job: str, plan: dict, master: str, *, show_log: bool = False, conf: dict | None = None) -> int:
    """Run a job to its end; print what its command printed; its exit code (2 when the job could not run)."""
    output = tempfile.mkdtemp(prefix=f"walvault-{job}-")
    try:
        plan_path = os.path.join(output, "plan.json")
        fd = os.open(plan_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # it may hold storage secrets
        with os.fdopen(fd, "w") as f:
            json.dump({**plan, "job": job, "output": output}, f)
        env = {**os.environ}
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        cmd = [spark_submit(), "--master", master, "--name", f"walvault-{job}",
               "--conf", f"spark.ui.showConsoleProgress={'true' if show_log else 'false'}"]
        for key, value in (conf or {}).items():
            cmd += ["--conf", f"{key}={value}"]
        cmd += [job_file(job), "@" + plan_path]
        log_path = os.path.join(output, "spark.log")
        with open(log_path, "wb") as log:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                  stderr=None if show_log else subprocess.STDOUT, env=env)
        result = os.path.join(output, "result.json")
        for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            path = os.path.join(output, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="backslashreplace") as f:
                    shutil.copyfileobj(f, stream)
        stream_flush()
        if not os.path.exists(result):
            with open(log_path, encoding="utf-8", errors="backslashreplace") as f:
                tail = [line.rstrip() for line in f.readlines()[-15:]]
            print(f"walvault: the Spark {job} job on {master} ended with exit code {proc.returncode} before its "
                  "command finished; the end of its log:", file=sys.stderr)
            for line in tail:
                print(f"  {line}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
        with open(result, encoding="utf-8") as f:
            return int(json.load(f)["exit"])
    finally:
        shutil.rmtree(output, ignore_errors=True)


def stream_flush() -> None:
    sys.stdout.flush()
    sys.stderr.flush()


def submit_command(args) -> int:
    from .plan import from_args

    job, plan = from_args(args)
    return submit(job, plan, args.spark, show_log=bool(getattr(args, "progress", None)))
