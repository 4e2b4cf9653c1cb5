"""Airflow on one machine for walvault's scripts, tests and benchmarks (no part of the provider): the environment
its commands run with, the metadata database, the UI's processes, and the Tarantool of the embedded defaults.

scripts/pipeline.py (the README's main job), scripts/ui.py (the UI on 127.0.0.1), bench/airflow_pipeline.py and
the tests import it as `devenv` (scripts/ on sys.path). The UI is three processes, api-server, scheduler and
dag-processor, all on 127.0.0.1, and not `airflow standalone`, whose log servers bind every interface. Importing
this module starts nothing and imports no Airflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.cluster import free_port
from spark_jobs.submit import stop_tree
from walcore.fsutil import write_atomic

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
ADMIN = "admin"
TARANTOOL_USER = "walvault"
_TARANTOOL_LUA = Path(__file__).with_name("tarantool_local.lua")


def environment(home: Path, *, config: Path, repository: str, work_dir: Path, spark_master: str = "local[2]",
                connections: dict[str, dict] | None = None, database: str | None = None,
                api_port: int = 8080) -> dict[str, str]:
    """The environment every airflow command of one deployment shares: AIRFLOW_HOME, this checkout's DAGs and
    plugins, the walvault configuration, and the connections (walvault_repo on `repository`, spark_default on
    `spark_master`, and `connections`: id -> the connection as JSON) as AIRFLOW_CONN_ variables. `database`: a
    SQLAlchemy URL (PostgreSQL); SQLite in AIRFLOW_HOME without it."""
    conns = {"walvault_repo": {"conn_type": "walvault_repo", "extra": {"url": repository}},
             # the URI form spark://local[2] silently means yarn: JSON only
             "spark_default": {"conn_type": "spark", "host": spark_master}, **(connections or {})}
    # nothing of another Airflow (its database, config file, connections) may leak in from the caller's shell
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")},
           "AIRFLOW_HOME": str(home),
           "AIRFLOW__CORE__DAGS_FOLDER": str(CHECKOUT / "dags"),
           "AIRFLOW__CORE__PLUGINS_FOLDER": str(CHECKOUT / "plugins"),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__API__HOST": "127.0.0.1",
           "AIRFLOW__API__PORT": str(api_port),
           # the scheduler's tasks reach the api-server here; the default assumes port 8080
           "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN}:admin",
           "AIRFLOW__CORE__TEST_CONNECTION": "Enabled",  # the connection form's Test button
           "WALVAULT_CONFIG": str(config),
           "WALVAULT_WORK_DIR": str(work_dir),
           "SPARK_LOCAL_IP": "127.0.0.1",
           "PYSPARK_PYTHON": sys.executable,
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if database:
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = database
        env["AIRFLOW__CORE__EXECUTOR"] = "LocalExecutor"
    for conn_id, conn in conns.items():
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(conn)
    return env


def airflow(env: dict[str, str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run `airflow ARGS`; its output (Airflow logs to stdout too) is returned, not shown. It runs in a session of
    its own, stopped with everything under it (a task's spark-submit and JVM) on a timeout or when the caller is
    stopped: subprocess.run would kill the airflow process alone."""
    proc = subprocess.Popen([str(BIN / "airflow"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        stop_tree(proc.pid)
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def migrate(env: dict[str, str]) -> None:
    """Create or upgrade the metadata database (needed before `airflow dags test` and the UI). With
    WALVAULT_AIRFLOW_DB_TEMPLATE (a directory; the tests set it) a new SQLite database is a copy of the one migrated
    there once, under a lock, for every process of one test run: what `airflow db migrate` writes into a new
    database depends on the Airflow installed alone, and each migration costs an Airflow start-up."""
    database = Path(env["AIRFLOW_HOME"]) / "airflow.db"
    template = env.get("WALVAULT_AIRFLOW_DB_TEMPLATE")
    if template and "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN" not in env and not database.exists():
        database.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_migrated_template(env, Path(template)), database)
        return
    proc = airflow(env, "db", "migrate", timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{_tail(proc.stdout + proc.stderr)}")


def _migrated_template(env: dict[str, str], template: Path) -> Path:
    """template/airflow.db, migrated by the first caller (in a home of its own) while the others wait."""
    import fcntl

    made = template / "airflow.db"
    template.mkdir(parents=True, exist_ok=True)
    with open(template / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not made.exists():
            home = template / "home"
            migrate({**env, "AIRFLOW_HOME": str(home), "WALVAULT_AIRFLOW_DB_TEMPLATE": ""})
            os.replace(home / "airflow.db", made)
    return made


@dataclass
class UI:
    """The api-server, scheduler and dag-processor of one AIRFLOW_HOME; their logs in `log_dir`."""
    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['AIRFLOW__API__PORT']}"

    def start(self, timeout: float = 180) -> UI:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        commands = {"api-server": ["api-server", "--host", "127.0.0.1", "--port", self.env["AIRFLOW__API__PORT"]],
                    # its log server would listen on every interface: the api-server reads the logs from files
                    "scheduler": ["scheduler", "--skip-serve-logs"],
                    "dag-processor": ["dag-processor"]}
        for name, args in commands.items():
            with open(self.log_dir / f"{name}.log", "ab") as log:
                self.processes[name] = subprocess.Popen([str(BIN / "airflow"), *args], env=self.env, stdout=log,
                                                        stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float) -> None:
        """Until the api-server answers and reports the scheduler and the dag-processor healthy."""
        deadline, last = time.monotonic() + timeout, "no answer"
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"airflow {name} exited {proc.returncode}:\n"
                                       f"{_tail((self.log_dir / f'{name}.log').read_text(errors='replace'))}")
            try:
                with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5) as r:
                    health = json.load(r)
                states = {k: (v or {}).get("status") for k, v in health.items()}
                if all(states.get(k) == "healthy" for k in ("metadatabase", "scheduler", "dag_processor")):
                    return
                last = json.dumps(states)
            except (OSError, ValueError) as e:
                last = str(e)
            time.sleep(1)
        raise TimeoutError(f"the Airflow UI at {self.url} was not healthy after {timeout:.0f} s ({last}); "
                           f"logs in {self.log_dir}")

    def stop(self) -> None:
        """The three processes and every process under them: a running task is in a process group of its own (its
        spark-submit, JVM and Python driver with it), and what a leader that exited left is in the leader's."""
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        stop_tree(*(proc.pid for proc in self.processes.values()), timeout=30)
        for proc in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self.processes.clear()

    def admin_password(self) -> str:
        """The simple auth manager writes the admin's password here on the api-server's first start."""
        path = Path(self.env["AIRFLOW_HOME"]) / "simple_auth_manager_passwords.json.generated"
        return json.loads(path.read_text())[ADMIN]


@dataclass
class LocalTarantool:
    """A real Tarantool on 127.0.0.1 serving a data dir (memtx, vinyl and the WAL all in it), with a user that may
    run backups; each start commits `rows` more rows. Its password is kept beside the data dir (mode 0600) and
    reaches walvault only through the Airflow connection `connection()` gives."""
    data_dir: Path
    port: int = 0
    process: subprocess.Popen | None = None

    @property
    def secret_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.password"

    def password(self) -> str:
        if not self.secret_file.exists():
            self.data_dir.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.secret_file, [secrets.token_urlsafe(18).encode()], mode=0o600)
        return self.secret_file.read_text().strip()

    def holder(self) -> int | None:
        """The pid of a Tarantool of ours already serving the data dir (left by a run that was killed)."""
        import psutil

        # Tarantool rewrites its command line ("tarantool_local.lua <running>"); box.cfg made the data dir its cwd
        for p in psutil.process_iter(["cmdline", "cwd"]):
            if _TARANTOOL_LUA.name in " ".join(p.info["cmdline"] or []) and p.info["cwd"] == str(self.data_dir.resolve()):
                return p.pid
        return None

    def start(self, rows: int = 20000, timeout: float = 60) -> LocalTarantool:
        binary = shutil.which("tarantool")
        if binary is None:
            raise RuntimeError("tarantool is not installed (scripts/setup installs Debian's)")
        if (pid := self.holder()) is not None:
            raise RuntimeError(f"a tarantool (pid {pid}) already serves {self.data_dir}, left by an earlier run: "
                               f"stop it (kill {pid}) and run again")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        env = {**os.environ, "WALVAULT_TARANTOOL_PASSWORD": self.password()}
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")
        with log:
            self.process = subprocess.Popen(
                [binary, str(_TARANTOOL_LUA), str(self.data_dir), str(self.port), TARANTOOL_USER, str(rows)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the script opens its port once its rows are written
            if self.process.poll() is not None:
                raise RuntimeError(f"tarantool exited {self.process.returncode}; see {log.name}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"tarantool did not listen on 127.0.0.1:{self.port} within {timeout:.0f} s")

    def connection(self) -> dict:
        return {"conn_type": "tarantool", "host": "127.0.0.1", "port": self.port, "login": TARANTOOL_USER,
                "password": self.password()}

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])
