"""`airflow ARGS` for the tests, each command in a process forked from one that has Airflow loaded: devenv.airflow's
result, without the start-up every `airflow` process pays (importing Airflow, its CLI and the providers, and
building the in-process execution API that `airflow dags test` runs tasks through: some 15 s of each run on two
loaded cores). What runs is Airflow's own CLI, `airflow.__main__.main`, in a fresh process of its own session, on
the caller's environment. Import it as `from forked_airflow import airflow` (tests/ is on sys.path).

One loaded process at a time (some 600 MB), for the AIRFLOW_HOME of the latest command (a test file's tests share
one): a command in another home closes it and loads one there. Airflow reads its configuration when it is imported,
so a command whose AIRFLOW__ settings differ from those its loaded process started with runs as devenv.airflow runs
it, in a process of its own.
"""

from __future__ import annotations

import atexit
import json
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import devenv
from spark_jobs.submit import stop_tree

# The loaded process: reads one request a line on stdin ({"args", "env", "prelude", "out", "err"}), forks, answers
# the child's pid, then its exit code, a line each on the protocol descriptor (stdout before the process's own
# output goes to its log).
_LOADER = r"""
import asyncio, gc, json, os, sys

protocol = os.fdopen(os.dup(1), "w", buffering=1)
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
os.dup2(log, 1)
os.dup2(log, 2)

import airflow.__main__
from airflow.cli import cli_parser
from airflow.configuration import write_default_airflow_configuration_if_needed
from airflow.sdk.execution_time.supervisor import in_process_api_server

write_default_airflow_configuration_if_needed()  # as the home's first `airflow` does: its secrets, for every child
cli_parser.get_parser()


# The execution API's routes for every API version, which cadwyn builds on the app's first request (most of
# `airflow dags test`'s start-up): built here once for every child, on an event loop of this thread's, gone after
# (the app's own loop and thread start in the child).
async def first_request(app):
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    await app({"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
               "path": "/", "raw_path": b"/", "query_string": b"", "root_path": "", "headers": [],
               "server": ("in-process.invalid.", 80), "client": ("127.0.0.1", 0)}, receive, send)


asyncio.run(first_request(in_process_api_server().app))
import airflow.providers.apache.spark.operators.spark_submit  # noqa: F401  what the DAGs import
import walvault_provider.operators.walvault  # noqa: F401
import walvault_provider.operators.spark  # noqa: F401

# Everything loaded so far stays put: no collection in a child touches it, which would copy every page it is on
# (a child took some 15 s to exit without this).
gc.freeze()

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        protocol.close()
        for fd, path in ((1, request["out"]), (2, request["err"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.environ.clear()
        os.environ.update(request["env"])
        from airflow import settings

        if settings.engine is not None:  # the loaded process's pooled connections are not the child's to use
            settings.engine.dispose(close=False)
        sys.argv = ["airflow", *request["args"]]
        exec(request["prelude"], {"__name__": "__forked__"})
        sys.exit(airflow.__main__.main())  # the `airflow` entry point's call: an exception ends the child as it would
    print(pid, file=protocol)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), file=protocol)
"""

_loaded: _Loaded | None = None


class _Loaded:
    def __init__(self, env: dict[str, str]):
        self.env = env
        self.log = Path(tempfile.mkstemp(prefix="walvault-forked-airflow-", suffix=".log")[1])
        self.process = subprocess.Popen([sys.executable, "-c", _LOADER, str(self.log)], env=env, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    def serves(self, env: dict[str, str]) -> bool:
        def settings(e: dict[str, str]) -> dict[str, str]:
            return {k: v for k, v in e.items() if k == "AIRFLOW_HOME" or k.startswith("AIRFLOW__")}

        return self.process.poll() is None and settings(env) == settings(self.env)

    def _line(self, deadline: float) -> str:
        while not select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if time.monotonic() >= deadline:
                raise TimeoutError
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the loaded airflow process exited {self.process.wait()}:\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}")
        return line

    def run(self, env: dict[str, str], args: tuple[str, ...], prelude: str, timeout: float):
        with tempfile.TemporaryDirectory(prefix="walvault-forked-airflow-") as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"args": list(args), "env": env, "prelude": prelude, "out": str(out), "err": str(err)}
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            deadline = time.monotonic() + timeout
            pid = None
            try:
                pid = int(self._line(deadline))
                code = int(self._line(deadline))
            except BaseException:  # a timeout, the caller stopped: the command with everything under it
                if pid is not None:
                    stop_tree(pid)
                self.close()
                raise
            return subprocess.CompletedProcess(["airflow", *args], code, out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def close(self) -> None:
        if not self.process.stdin.closed:
            self.process.stdin.close()  # the end of its requests: it exits
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            stop_tree(self.process.pid)
            self.process.wait()
        self.process.stdout.close()
        self.log.unlink(missing_ok=True)


def airflow(env: dict[str, str], *args: str, prelude: str = "", timeout: float = 1800) -> subprocess.CompletedProcess:
    """devenv.airflow's `airflow ARGS` on `env`, forked from the loaded process of env's AIRFLOW_HOME. `prelude`:
    Python run in the command's process before Airflow's CLI (what it patches in Airflow)."""
    global _loaded
    if _loaded is None or _loaded.process.poll() is not None or _loaded.env["AIRFLOW_HOME"] != env["AIRFLOW_HOME"]:
        _close()
        _loaded = _Loaded(env)
    if not _loaded.serves(env):
        if prelude:
            raise ValueError("a prelude needs the loaded process of the same Airflow settings")
        return devenv.airflow(env, *args, timeout=timeout)
    return _loaded.run(env, args, prelude, timeout)


@atexit.register
def _close() -> None:
    if _loaded is not None:
        _loaded.close()
