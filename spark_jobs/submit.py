"""`walvault ... --spark MASTER`: the command submitted as a Spark job with `spark-submit`, and what the job
printed, printed here (the same text or JSON, the same exit code). Nothing here imports pyspark."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

EXIT_CANNOT_CHECK = 2


def spark_submit() -> str:
    """The venv's spark-submit (beside this Python), else the one on PATH."""
    here = Path(sys.executable).parent / "spark-submit"
    return str(here) if here.exists() else shutil.which("spark-submit") or "spark-submit"


def job_file(job: str) -> str:
    return str(Path(__file__).with_name(f"{job}.py"))


def submit(job: str, plan: dict, master: str, *, show_log: bool = False) -> int:
    """Run a job to its end; print what its command printed; its exit code (2 when the job could not run).

    The plan goes to a file of this process's own scratch directory (mode 0600: storage options may hold
    secrets), removed at the end; a killed walvault's is removed by the next submission. Stopping walvault
    (SIGINT, SIGTERM, SIGHUP) stops the job: spark-submit, its JVM and its Python driver, one process group."""
    from walcore.fsutil import owned_tempdir, write_atomic

    output = str(owned_tempdir("walvault-spark-"))
    try:
        plan_path = os.path.join(output, "plan.json")
        write_atomic(Path(plan_path), [json.dumps({**plan, "job": job, "output": output}).encode()], mode=0o600)
        env = {**os.environ}
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        cmd = [spark_submit(), "--master", master, "--name", f"walvault-{job}",
               "--conf", f"spark.ui.showConsoleProgress={'true' if show_log else 'false'}"]
        cmd += [job_file(job), "@" + plan_path]
        log_path = os.path.join(output, "spark.log")
        with open(log_path, "wb") as log:
            returncode = _run_job(cmd, env, log, show_log)
        result = os.path.join(output, "result.json")
        for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            path = os.path.join(output, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="backslashreplace") as f:
                    shutil.copyfileobj(f, stream)
        sys.stdout.flush()
        sys.stderr.flush()
        if not os.path.exists(result):
            with open(log_path, encoding="utf-8", errors="backslashreplace") as f:
                tail = [line.rstrip() for line in f.readlines()[-15:]]
            print(f"walvault: the Spark {job} job on {master} ended with exit code {returncode} before its "
                  "command finished; the end of its log:", file=sys.stderr)
            for line in tail:
                print(f"  {line}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
        with open(result, encoding="utf-8") as f:
            return int(json.load(f)["exit"])
    finally:
        shutil.rmtree(output, ignore_errors=True)


def _run_job(cmd: list[str], env: dict, log, show_log: bool) -> int:
    """spark-submit as a child that goes with walvault: in walvault's process group (a signal to the group reaches
    the whole job), stopped with its children when walvault is stopped (SIGINT, SIGTERM, SIGHUP), and killed by
    the kernel when walvault dies (its JVM then, and its Python driver, whose calls to the JVM fail)."""
    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=None if show_log else subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        try:
            return proc.wait()
        finally:
            if proc.poll() is None:  # interrupted: the job goes too
                stop_tree(proc.pid)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the parent dies (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def stop_tree(*pids: int, timeout: float = 10) -> None:
    """Processes and all their descendants: SIGTERM, then SIGKILL for what is left after `timeout` seconds."""
    import psutil

    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(pid)
            procs += [root, *root.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def submit_request(request, master: str) -> int:
    """`walvault ... --spark MASTER`: the request as its job on `master` (registered as the `spark` runner of the
    entry point group walvault.runners, where walcore finds it)."""
    from .plan import of_request

    job, plan = of_request(request)
    return submit(job, plan, master, show_log=bool(getattr(request, "progress", None)))
