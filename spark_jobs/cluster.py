"""A real Spark standalone cluster on 127.0.0.1 from the pip package alone (it ships no start-master.sh): a
master and one-or-more workers, for trying the jobs, the tests and the benchmarks.

    with standalone_cluster(scratch, workers=2, cores=1) as master:   # "spark://127.0.0.1:<port>"
        ...
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def standalone_cluster(scratch: Path, *, workers: int = 1, cores: int = 2, memory: str = "1g",
                       timeout: float = 120.0) -> Iterator[str]:
    """Start a master and `workers` workers (each `cores` cores, `memory`), logs and work dirs under `scratch`;
    yield the master's URL once every worker has registered; stop them all (their process groups) after."""
    spark_class = str(Path(sys.executable).parent / "spark-class")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(scratch / "work"),
           "SPARK_LOG_DIR": str(scratch / "logs")}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    port = free_port()
    procs, logs = [], []

    def start(args: list[str], log: Path) -> None:
        logs.append(open(log, "wb"))
        procs.append(subprocess.Popen([spark_class, *args], stdout=logs[-1], stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))

    try:
        start(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
               "--webui-port", str(free_port())], scratch / "master.log")
        worker_logs = [scratch / f"worker-{i}.log" for i in range(workers)]
        for log in worker_logs:
            start(["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores),
                   "--memory", memory, "--webui-port", str(free_port()), f"spark://127.0.0.1:{port}"], log)
        deadline = time.monotonic() + timeout
        while not all(b"Successfully registered with master" in log.read_bytes() for log in worker_logs):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the standalone cluster did not start: "
                                   + worker_logs[0].read_text(errors="replace")[-2000:])
            time.sleep(0.3)
        yield f"spark://127.0.0.1:{port}"
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for log in logs:
            log.close()
