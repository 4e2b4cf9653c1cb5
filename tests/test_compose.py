"""docker-compose.yml, the production deployment: Airflow 3 on PostgreSQL and a Spark standalone cluster.

No Docker engine runs here. Debian's docker-compose 1.29 (`/usr/bin/docker-compose`, installed by scripts/setup)
validates the file without a daemon and renders it (`config`): anchors merged, variables interpolated, paths
made absolute. The tests check that rendering against what the DAGs need, derived from the walvault
configuration the deployment mounts (deploy/walvault.yaml): every connection it names is defined where tasks
run, and resolves as Airflow resolves it; every source path and the repository are on volumes mounted at the
same path in the scheduler (which runs every task: LocalExecutor) and in both Spark workers (whose executors read
the sources and write the repository); the Spark connection names the master's service and port; every Airflow
process shares one PostgreSQL database and one set of secrets.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest
import yaml

from conftest import REPO

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
AIRFLOW_ROLES = ("api-server", "scheduler", "dag-processor", "triggerer")
SPARK_MASTER_CLASS = "org.apache.spark.deploy.master.Master"
SPARK_WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
DEFAULT_SPARK_PORT = 7077  # what the master listens on without --port
DEFAULT_API_PORT = 8080  # what `airflow api-server` listens on without --port

# What an operator's .env holds: every variable the file requires (`${NAME:?...}`) must be here, with a value of
# its real shape (a connection URI, a directory), so that the rendered file can be checked as it would run.
OPERATOR_ENV = {
    "POSTGRES_PASSWORD": "pg-test-secret-4711",
    "AIRFLOW_FERNET_KEY": "dGVzdC1mZXJuZXQta2V5LW9mLTMyLWJ5dGVzLTEyMzQ=",
    "AIRFLOW_JWT_SECRET": "jwt-test-secret-0815",
    "AIRFLOW_SECRET_KEY": "api-test-secret-2342",
    "WALVAULT_SOURCES_DIR": "/srv/test-walvault/sources",
    "WALVAULT_REPOSITORY_DIR": "/srv/test-walvault/repository",
    "WALVAULT_TARANTOOL_MAIN": "tarantool://walvault:tt-test-secret@tarantool.test.internal:3301",
    "WALVAULT_ADMIN_PASSWORD": "admin-test-secret-1312",
}
REQUIRED = sorted(set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):?\?", COMPOSE.read_text())))
SECRET_NAME = re.compile(r"(PASSWORD|SECRET|_KEY)$")  # POSTGRES_PASSWORD, ..._JWT_SECRET, ..._FERNET_KEY


def docker_compose() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail("docker-compose is not installed: run scripts/setup (Debian: apt-get install -y "
                    "--no-install-recommends docker-compose); it validates docker-compose.yml without a Docker engine")
    return found


def run_compose(*args: str, env: dict[str, str], compose_file: Path = COMPOSE, tmp: Path) -> subprocess.CompletedProcess:
    """`docker-compose -f FILE ARGS` with exactly `env` (no .env file of the checkout, no variable of this shell),
    relative paths resolved against the checkout whatever file is given."""
    empty_env_file = tmp / "empty.env"
    empty_env_file.write_text("")
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), **env}
    return subprocess.run([docker_compose(), "--env-file", str(empty_env_file), "--project-directory", str(REPO),
                           "-f", str(compose_file), *args], capture_output=True, text=True, env=clean,
                          stdin=subprocess.DEVNULL, timeout=120)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict:
    missing = [name for name in REQUIRED if name not in OPERATOR_ENV]
    assert not missing, f"docker-compose.yml requires {missing}: add them to OPERATOR_ENV with realistic values"
    proc = run_compose("config", env=OPERATOR_ENV, tmp=tmp_path_factory.mktemp("compose"))
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


# --- what the rendered file holds, by role (found from the commands, not the service names) --------------------

def _command(service: dict) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(c) for c in command]


def airflow_role(service: dict) -> str | None:
    """The `airflow <role>` a service runs through the image's entrypoint (which runs `airflow ARGS`)."""
    command = _command(service)
    if service.get("entrypoint") or not command:
        return None
    if command[0] == "airflow":
        command = command[1:]
    return command[0] if command and command[0] in AIRFLOW_ROLES else None


def services_by_role(rendered: dict) -> dict[str, list[str]]:
    roles: dict[str, list[str]] = {}
    for name, service in rendered["services"].items():
        command = _command(service)
        role = airflow_role(service)
        if role is None and SPARK_MASTER_CLASS in command:
            role = "spark-master"
        elif role is None and SPARK_WORKER_CLASS in command:
            role = "spark-worker"
        elif role is None and "airflow db migrate" in " ".join(command):
            role = "airflow-init"
        elif role is None and str(service.get("image", "")).split(":")[0].split("/")[-1] == "postgres":
            role = "postgres"
        if role:
            roles.setdefault(role, []).append(name)
    return roles


def one(rendered: dict, role: str) -> str:
    names = services_by_role(rendered).get(role, [])
    assert len(names) == 1, f"expected one {role} service, found {names}"
    return names[0]


def env_of(rendered: dict, name: str) -> dict[str, str]:
    env = rendered["services"][name].get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


@dataclass(frozen=True)
class Mount:
    source: str  # a named volume, or an absolute host path
    target: str
    read_only: bool

    @property
    def bind(self) -> bool:
        return self.source.startswith("/")


def mounts_of(rendered: dict, name: str) -> list[Mount]:
    mounts = []
    for item in rendered["services"][name].get("volumes") or []:
        if isinstance(item, dict):
            mounts.append(Mount(str(item.get("source", "")), item["target"], bool(item.get("read_only"))))
            continue
        parts = item.split(":")
        if len(parts) == 1:
            mounts.append(Mount("", parts[0], False))  # an anonymous volume: nothing another service sees
        else:
            mode = parts[2] if len(parts) > 2 else "rw"
            mounts.append(Mount(parts[0], parts[1], "ro" in mode.split(",")))
    return mounts


def mount_holding(rendered: dict, name: str, path: str) -> Mount | None:
    """The mount `path` lies on in service `name` (the deepest one), or None: the container's own filesystem."""
    found = [m for m in mounts_of(rendered, name) if PurePosixPath(path).is_relative_to(m.target)]
    return max(found, key=lambda m: len(PurePosixPath(m.target).parts), default=None)


def spark_workers(rendered: dict) -> list[str]:
    return services_by_role(rendered).get("spark-worker", [])


def task_runners(rendered: dict) -> list[str]:
    """The services that run tasks: with LocalExecutor, the scheduler."""
    return [name for name in services_by_role(rendered).get("scheduler", [])
            if env_of(rendered, name).get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor"]


def airflow_services(rendered: dict) -> list[str]:
    roles = services_by_role(rendered)
    return [name for role in (*AIRFLOW_ROLES, "airflow-init") for name in roles.get(role, [])]


def walvault_config(rendered: dict, name: str):
    """The walvault configuration service `name` reads: the host file mounted where WALVAULT_CONFIG points."""
    from walvault_provider.config import load

    path = env_of(rendered, name).get("WALVAULT_CONFIG")
    assert path, f"{name}: WALVAULT_CONFIG is not set (the DAGs would read dags/walvault.yaml, the embedded default)"
    mount = next((m for m in mounts_of(rendered, name) if m.target == path), None)
    assert mount is not None and mount.bind, f"{name}: WALVAULT_CONFIG={path} is not a file mounted from the host"
    assert Path(mount.source).is_file(), f"{name}: {mount.source}, mounted at {path}, is not a file"
    return load(Path(mount.source))


def spark_connection_ids(config) -> tuple[str, ...]:
    return tuple(getattr(config, "spark_connections", None) or (config.spark_connection,))


@pytest.fixture
def service_environment(monkeypatch):
    """Make a service's AIRFLOW_CONN_* variables this process's, so that Airflow resolves them here as there."""
    def apply(env: dict[str, str]) -> None:
        for key in [k for k in os.environ if k.startswith("AIRFLOW_CONN_")]:
            monkeypatch.delenv(key)
        for key, value in env.items():
            if key.startswith("AIRFLOW_CONN_"):
                monkeypatch.setenv(key, value)
    return apply


# --- validation -----------------------------------------------------------------------------------------------

def test_docker_compose_validates_the_file(tmp_path):
    proc = run_compose("config", "-q", env=OPERATOR_ENV, tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_the_validation_refuses_a_broken_copy(tmp_path):
    """The same check refuses a copy with an unknown service key, while the unchanged copy passes: the validation
    above proves something."""
    raw = yaml.safe_load(COMPOSE.read_text())
    intact, broken = tmp_path / "intact.yml", tmp_path / "broken.yml"
    intact.write_text(yaml.safe_dump(raw, sort_keys=False))
    first = next(iter(raw["services"]))
    raw["services"][first]["colour"] = "red"
    broken.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert run_compose("config", "-q", env=OPERATOR_ENV, compose_file=intact, tmp=tmp_path).returncode == 0
    proc = run_compose("config", "-q", env=OPERATOR_ENV, compose_file=broken, tmp=tmp_path)
    assert proc.returncode != 0 and "colour" in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", REQUIRED)
def test_a_missing_secret_or_path_is_refused_not_defaulted(name, tmp_path):
    env = {k: v for k, v in OPERATOR_ENV.items() if k != name}
    proc = run_compose("config", "-q", env=env, tmp=tmp_path)
    assert proc.returncode != 0 and name in proc.stderr, proc.stderr


def test_secrets_come_from_the_operator_not_the_file(rendered):
    """Every secret-looking variable of every service carries a value the operator provided."""
    provided = [v for k, v in OPERATOR_ENV.items() if SECRET_NAME.search(k) or "://" in v]
    assert REQUIRED and provided
    for name in rendered["services"]:
        for key, value in env_of(rendered, name).items():
            if SECRET_NAME.search(key):
                assert any(p in value for p in provided), f"{name}: {key} is not from the operator's environment"
        url = env_of(rendered, name).get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN")
        if url:
            assert OPERATOR_ENV["POSTGRES_PASSWORD"] in url, f"{name}: the database password is in the file"


# --- the services ---------------------------------------------------------------------------------------------

def test_airflow_postgres_and_a_spark_master_with_two_workers(rendered):
    roles = services_by_role(rendered)
    for role in (*AIRFLOW_ROLES, "airflow-init", "postgres", "spark-master"):
        assert len(roles.get(role, [])) == 1, f"expected one {role} service: {roles}"
    assert len(roles.get("spark-worker", [])) == 2, f"expected two Spark workers: {roles}"


def test_airflow_runs_on_postgresql_with_local_executor_and_shared_secrets(rendered):
    from sqlalchemy.engine import make_url

    postgres = one(rendered, "postgres")
    pg_env = env_of(rendered, postgres)
    shared = {}
    for name in airflow_services(rendered):
        env = env_of(rendered, name)
        url = make_url(env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite://"))
        assert url.get_backend_name() == "postgresql", f"{name}: not on PostgreSQL ({url!r})"
        assert url.host == postgres and (url.port or 5432) == 5432, f"{name}: {url!r} is not the {postgres} service"
        assert url.username == pg_env.get("POSTGRES_USER", "postgres")
        assert url.password == pg_env["POSTGRES_PASSWORD"]
        assert url.database == pg_env.get("POSTGRES_DB", url.username)
        assert env.get("AIRFLOW__CORE__EXECUTOR") == "LocalExecutor", name
        for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY",
                    "AIRFLOW__CORE__FERNET_KEY", "AIRFLOW__CORE__EXECUTION_API_SERVER_URL"):
            assert env.get(key), f"{name}: {key} is not set (each process would make up its own)"
            shared.setdefault(key, set()).add(env[key])
    assert all(len(values) == 1 for values in shared.values()), f"Airflow processes disagree: {shared}"


def test_tasks_reach_the_api_servers_execution_api(rendered):
    api = one(rendered, "api-server")
    command = _command(rendered["services"][api])
    port = int(command[command.index("--port") + 1]) if "--port" in command else DEFAULT_API_PORT
    url = urlsplit(env_of(rendered, one(rendered, "scheduler"))["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (url.hostname, url.port or 80, url.path) == (api, port, "/execution/")


def test_startup_order_migration_first_and_health_checks(rendered):
    services = rendered["services"]
    init, postgres = one(rendered, "airflow-init"), one(rendered, "postgres")
    assert services[init].get("depends_on", {}).get(postgres, {}).get("condition") == "service_healthy"
    for name in airflow_services(rendered):
        if name != init:
            condition = (services[name].get("depends_on") or {}).get(init, {}).get("condition")
            assert condition == "service_completed_successfully", f"{name} does not wait for {init}"
    for name in (postgres, one(rendered, "api-server")):
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in services.items():  # `up` refuses to wait for a health no check reports
        for dependency, how in (service.get("depends_on") or {}).items():
            if how.get("condition") == "service_healthy":
                assert services[dependency].get("healthcheck", {}).get("test"), \
                    f"{name} waits for {dependency} to be healthy, which has no healthcheck"


# --- who reaches the UI ----------------------------------------------------------------------------------------

def published(rendered: dict, name: str) -> list[tuple[str, int]]:
    """(host address, host port) of each port service `name` publishes; "" for every interface."""
    found = []
    for item in rendered["services"][name].get("ports") or []:
        if isinstance(item, dict):
            found.append((str(item.get("host_ip", "")), int(item["published"])))
            continue
        parts = str(item).split("/")[0].split(":")
        found.append((parts[0] if len(parts) == 3 else "", int(parts[-2] if len(parts) > 1 else parts[0])))
    return found


def test_every_port_is_published_on_loopback_unless_walvault_ui_bind_says_otherwise(rendered, tmp_path):
    """The UI (and Spark's) listen on the host's 127.0.0.1 by default: reaching them from elsewhere is a choice the
    operator makes (WALVAULT_UI_BIND), not what `up` does."""
    api = one(rendered, "api-server")
    for name in rendered["services"]:
        for address, _port in published(rendered, name):
            assert address == "127.0.0.1", f"{name} publishes a port on {address or 'every interface'}"
    assert [port for _, port in published(rendered, api)] == [DEFAULT_API_PORT]
    proc = run_compose("config", env={**OPERATOR_ENV, "WALVAULT_UI_BIND": "0.0.0.0", "AIRFLOW_API_PORT": "8443"},
                       tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr
    told = yaml.safe_load(proc.stdout)
    assert published(told, api) == [("0.0.0.0", 8443)]
    assert published(told, one(told, "spark-master")) == published(rendered, one(rendered, "spark-master"))


FAB_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"


def test_logins_are_the_fab_auth_managers_with_an_admin_from_the_operators_environment(rendered):
    """No development login ships: every Airflow process uses the FAB auth manager (users in the metadata
    database), which the lock installs in the image; the simple auth manager's users and passwords file are gone;
    airflow-init creates the admin from the operator's WALVAULT_ADMIN_* after migrating the database."""
    import importlib

    lock = (REPO / "requirements.lock").read_text()
    assert re.search(r"^apache-airflow-providers-fab==\S+$", lock, re.M), "the image would lack the FAB provider"
    module, name = FAB_AUTH_MANAGER.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name)
    for service in airflow_services(rendered):
        env = env_of(rendered, service)
        assert env.get("AIRFLOW__CORE__AUTH_MANAGER") == FAB_AUTH_MANAGER, service
        assert not [k for k in env if "SIMPLE_AUTH_MANAGER" in k], f"{service}: simple auth manager settings"
    init = one(rendered, "airflow-init")
    env, script = env_of(rendered, init), " ".join(_command(rendered["services"][init]))
    assert env["WALVAULT_ADMIN_PASSWORD"] == OPERATOR_ENV["WALVAULT_ADMIN_PASSWORD"]
    assert env["WALVAULT_ADMIN_USER"] == "admin"
    assert script.index("airflow db migrate") < script.index("airflow users create --role Admin")
    api = env_of(rendered, one(rendered, "api-server"))
    assert api.get("AIRFLOW__CORE__TEST_CONNECTION") == "Enabled", "the connection form's Test button is off"
    repository = mount_holding(rendered, one(rendered, "api-server"), "/data/repository")
    assert repository is not None and repository.read_only, "the Test button reads the repository, read-only"


def test_the_init_migrates_and_creates_the_admin_once(rendered, tmp_path):
    """airflow-init's own script, run here on SQLite with its paths under a temporary directory: the FAB auth
    manager's tables are made and the admin exists with the Admin role; a second start keeps it and succeeds."""
    init = one(rendered, "airflow-init")
    script = _command(rendered["services"][init])[-1].replace("$$", "$").replace("/data/", f"{tmp_path}/data/")
    for directory in ("repository", "work"):
        (tmp_path / "data" / directory).mkdir(parents=True)
    bin_dir = Path(sys.executable).parent
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}, **env_of(rendered, init),
           "AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags"),
           "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
           "AIRFLOW__CORE__EXECUTOR": "LocalExecutor", "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for attempt in ("first", "second"):
        proc = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{attempt} start: {(proc.stdout + proc.stderr)[-3000:]}"
    assert "admin already exists" in proc.stdout, proc.stdout[-2000:]
    # the users and their roles, as `airflow users list` reads them; and the operator's password logs the admin
    # in, as the UI's login form checks it, another does not (one process: each Airflow start-up takes seconds)
    check = ("import json, sys\n"
             "from airflow.providers.fab.auth_manager.cli_commands.utils import get_application_builder\n"
             "with get_application_builder() as appbuilder, appbuilder.app.test_request_context():\n"
             "    print(json.dumps([[u.username, [r.name for r in u.roles]] for u in appbuilder.sm.get_all_users()]))\n"
             "    print([appbuilder.sm.auth_user_db('admin', p) is not None for p in sys.argv[1:]])\n")
    proc = subprocess.run([sys.executable, "-c", check, OPERATOR_ENV["WALVAULT_ADMIN_PASSWORD"], "admin"], env=env,
                          capture_output=True, text=True, timeout=300)
    # Airflow logs to stdout too: each answer is a line of its own
    lines = proc.stdout.splitlines()
    users = json.loads(next((ln for ln in lines if ln.startswith("[[")), "null"))
    assert users == [["admin", ["Admin"]]], proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "[True, False]" in lines, proc.stdout[-2000:] + proc.stderr[-2000:]


# --- what the DAGs need ---------------------------------------------------------------------------------------

def test_every_connection_the_configuration_names_is_defined_where_tasks_run(rendered, service_environment):
    from airflow.secrets.environment_variables import EnvironmentVariablesBackend

    runners = task_runners(rendered)
    assert runners, "no service runs tasks (a scheduler with LocalExecutor)"
    for name in runners:
        config = walvault_config(rendered, name)
        ids = {config.repository_connection, *spark_connection_ids(config)}
        ids |= {s.connection for s in config.sources if s.connection}
        env = env_of(rendered, name)
        service_environment(env)
        for conn_id in sorted(ids):
            assert f"AIRFLOW_CONN_{conn_id.upper()}" in env, f"{name}: connection {conn_id!r} is not defined"
            try:
                conn = EnvironmentVariablesBackend().get_connection(conn_id)
            except ValueError as e:
                pytest.fail(f"{name}: AIRFLOW_CONN_{conn_id.upper()} does not parse as a connection: {e}")
            assert conn is not None, f"{name}: AIRFLOW_CONN_{conn_id.upper()} does not parse as a connection"
            assert not conn.password or conn.password in " ".join(OPERATOR_ENV.values()), \
                f"{name}: the password of {conn_id!r} is written in the file, not taken from the operator's .env"
        for source in config.sources:
            if source.connection:
                conn = EnvironmentVariablesBackend().get_connection(source.connection)
                assert conn.host, f"{name}: {source.connection!r} (source {source.name}) names no host"


def test_the_spark_connection_submits_to_the_masters_service_and_port(rendered, service_environment):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    master = one(rendered, "spark-master")
    command = _command(rendered["services"][master])
    port = int(command[command.index("--port") + 1]) if "--port" in command else DEFAULT_SPARK_PORT
    if "--host" in command:
        assert command[command.index("--host") + 1] == master, "the master binds a name other than its service's"
    for name in task_runners(rendered):
        service_environment(env_of(rendered, name))
        for conn_id in spark_connection_ids(walvault_config(rendered, name)):
            # As the SparkSubmitOperator resolves it (a URI spark://host:port can silently become `yarn`).
            url = SparkSubmitHook(conn_id=conn_id)._connection["master"]
            parts = urlsplit(url)
            assert (parts.scheme, parts.hostname, parts.port) == ("spark", master, port), \
                f"{name}: {conn_id} submits to {url!r}, not to the {master} service on port {port}"
    for worker in spark_workers(rendered):
        urls = [c for c in _command(rendered["services"][worker]) if c.startswith("spark://")]
        assert [(p.scheme, p.hostname, p.port) for p in map(urlsplit, urls)] == [("spark", master, port)], \
            f"{worker} does not join {master}:{port}: {urls}"


def test_executors_and_the_driver_reach_each_other_by_service_name(rendered):
    """Client mode: the driver runs in the scheduler's container, executors on the workers connect back to it and
    the driver fetches from them; each side must advertise a name the network resolves (its service name), and
    both must run the same Python (the image's, with walvault)."""
    services = rendered["services"]
    pythons = set()
    for name in task_runners(rendered):
        env = env_of(rendered, name)
        advertised = env.get("SPARK_LOCAL_HOSTNAME") or services[name].get("hostname")
        assert advertised == name, (f"{name}: the Spark driver advertises {advertised!r}, not its service name "
                                    "(a container id no worker resolves)")
        assert env.get("SPARK_LOCAL_IP") not in ("127.0.0.1", "localhost"), f"{name}: the driver binds loopback"
        pythons.add(env.get("PYSPARK_PYTHON"))
    for worker in spark_workers(rendered):
        command = _command(services[worker])
        assert "--host" in command and command[command.index("--host") + 1] == worker, \
            f"{worker}: the worker does not advertise its service name"
        pythons.add(env_of(rendered, worker).get("PYSPARK_PYTHON"))
    assert len(pythons) == 1 and PurePosixPath(next(iter(pythons)) or "").is_absolute(), \
        f"the driver and the executors run different or unset Pythons: {pythons}"
    images = {(services[n].get("image"), json.dumps(services[n].get("build"), sort_keys=True))
              for n in (*task_runners(rendered), *spark_workers(rendered), one(rendered, "spark-master"))}
    assert len(images) == 1, f"the scheduler and the Spark services do not run one image: {images}"


def test_sources_and_repository_are_on_the_same_volumes_in_the_scheduler_and_both_workers(
        rendered, service_environment):
    from walvault_provider.hooks.walvault import WalvaultRepoHook

    runners, workers = task_runners(rendered), spark_workers(rendered)
    assert runners and len(workers) == 2
    for runner in runners:
        config = walvault_config(rendered, runner)
        service_environment(env_of(rendered, runner))
        repo_url = WalvaultRepoHook(config.repository_connection).target().url
        scheme = urlsplit(repo_url).scheme
        paths = {f"source {s.name}": str(s.path) for s in config.sources}
        if scheme in ("", "file"):
            paths["the repository"] = urlsplit(repo_url).path
        else:
            assert scheme == "s3", f"repository {repo_url!r}: neither a path nor S3"
        for what, path in paths.items():
            assert PurePosixPath(path).is_absolute(), f"{what}: {path} is not an absolute container path"
            held = {name: mount_holding(rendered, name, path) for name in (runner, *workers)}
            assert all(m is not None and m.source for m in held.values()), \
                f"{what} ({path}) is not on a volume in every one of {sorted(held)}: {held}"
            assert len({(m.source, m.target) for m in held.values()}) == 1, \
                f"{what} ({path}) is on different volumes or paths: {held}"
            assert not held[runner].read_only, f"{what} ({path}) is read-only in {runner}"
            if what == "the repository":
                assert not any(m.read_only for m in held.values()), f"the repository is read-only somewhere: {held}"


def test_the_work_directory_of_a_run_is_a_volume_of_the_scheduler(rendered):
    for name in task_runners(rendered):
        work = env_of(rendered, name).get("WALVAULT_WORK_DIR")
        assert work, f"{name}: WALVAULT_WORK_DIR is not set (plans would go to the container's /tmp)"
        mount = mount_holding(rendered, name, work)
        assert mount is not None and mount.source and not mount.read_only, f"{name}: {work} is not on a volume"


def test_walvault_config_is_mounted_in_every_airflow_process(rendered):
    for name in airflow_services(rendered):
        if name == one(rendered, "airflow-init"):
            continue
        config = walvault_config(rendered, name)
        assert config.sources, name


def test_the_dags_folder_is_mounted_in_every_airflow_process(rendered):
    dags = sorted(p.name for p in (REPO / "dags").glob("*.py"))
    assert dags
    for name in airflow_services(rendered):
        if name == one(rendered, "airflow-init"):
            continue
        folder = env_of(rendered, name).get("AIRFLOW__CORE__DAGS_FOLDER", "/opt/airflow/dags")
        mount = next((m for m in mounts_of(rendered, name) if m.target == folder), None)
        assert mount is not None and mount.bind, f"{name}: no host directory is mounted on the DAGs folder {folder}"
        assert Path(mount.source).resolve() == (REPO / "dags").resolve(), f"{name}: {mount.source} is not dags/"
        assert sorted(p.name for p in Path(mount.source).glob("*.py")) == dags


# --- the image ------------------------------------------------------------------------------------------------

def test_the_image_is_built_from_the_airflow_the_lock_pins_and_copies_what_pyproject_installs(rendered):
    services = rendered["services"]
    builds = {json.dumps(services[n].get("build"), sort_keys=True) for n in airflow_services(rendered)}
    assert len(builds) == 1, builds
    build = services[airflow_services(rendered)[0]]["build"]
    context = Path(build["context"])
    dockerfile = context / build.get("dockerfile", "Dockerfile")
    assert dockerfile.resolve() == DOCKERFILE.resolve()
    text = dockerfile.read_text()
    base = re.search(r"^FROM\s+apache/airflow:(?:slim-)?([0-9.]+)-python([0-9.]+)", text, re.M)
    assert base, "the image is not built from apache/airflow:<version>-python<version>"
    lock = (REPO / "requirements.lock").read_text()
    pinned = re.search(r"^apache-airflow==(\S+)$", lock, re.M)
    assert pinned and base.group(1) == pinned.group(1), \
        f"the image's Airflow {base.group(1)} is not the lock's {pinned and pinned.group(1)}"
    assert "--python-version " + base.group(2) in lock or f"python{base.group(2)}" in lock, \
        f"the lock was not compiled for the image's Python {base.group(2)}"

    copied = set()
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        words = [w for w in line.split() if not w.startswith("--")]
        copied |= {PurePosixPath(w) for w in words[:-1]}
    for path in copied:
        assert (context / path).exists(), f"the Dockerfile copies {path}, which is not in the build context"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {PurePosixPath("pyproject.toml"), PurePosixPath("requirements.lock")}
    readme = project["project"].get("readme")
    if readme:
        needed.add(PurePosixPath(readme if isinstance(readme, str) else readme["file"]))
    find = project["tool"]["setuptools"]["packages"]["find"]
    for where in find.get("where", ["."]):
        for pkg in (context / where).iterdir():
            if (pkg / "__init__.py").is_file() and any(re.fullmatch(p.replace("*", ".*"), pkg.name)
                                                       for p in find.get("include", ["*"])):
                needed.add(PurePosixPath(where) / pkg.name if where != "." else PurePosixPath(pkg.name))
    missing = [str(p) for p in sorted(needed) if not any(p == c or p.is_relative_to(c) for c in copied)]
    assert not missing, f"the image would lack {missing}, which pip install needs"


def test_the_stream_service_runs_a_streamer_per_streamed_source_with_its_password_from_the_environment(
        rendered, service_environment):
    """`walvault stream` as a service of its own profile, one streamer per streamed source of the configuration it
    mounts (walvault_provider.streams, as the service's environment resolves its connections): no command line
    names a password (argv is readable by every process of the host), each password comes from the operator's
    environment, the repository is the scheduler's volume at the same path, writable, the spools are on a volume
    (a restarted container goes on from its open segments), and a stop is SIGTERM with time to store them."""
    from walvault_provider.streams import children

    (name,) = [n for n, s in rendered["services"].items() if "walvault_provider.streams" in _command(s)]
    service = rendered["services"][name]
    command = _command(service)
    assert service["profiles"] == ["stream"]
    assert service["stop_signal"] == "SIGTERM" and service["restart"] == "unless-stopped"
    assert service["stop_grace_period"] == "60s"
    config = walvault_config(rendered, name)
    streamed = [s for s in config.sources if s.stream is not None]
    assert streamed, "the deployment's configuration streams no source"
    env = env_of(rendered, name)
    scheduler = env_of(rendered, one(rendered, "scheduler"))
    for conn_id in {config.repository_connection, *(s.stream.connection for s in streamed)}:
        key = f"AIRFLOW_CONN_{conn_id.upper()}"
        assert env.get(key) and env[key] == scheduler.get(key), f"{name}: {key} is not the scheduler's connection"
    spool_root = PurePosixPath(command[command.index("--spool-root") + 1])
    spool = mount_holding(rendered, name, str(spool_root))
    assert spool is not None and spool.source in rendered["volumes"] and not spool.read_only, service["volumes"]
    service_environment(env)
    found = children(config, Path(spool_root))
    assert [c.source for c in found] == [s.name for s in streamed]
    secrets = [v for k, v in OPERATOR_ENV.items() if SECRET_NAME.search(k) or "://" in v]
    secrets += [urlsplit(OPERATOR_ENV["WALVAULT_TARANTOOL_MAIN"]).password]
    for child in found:
        argv = child.argv
        assert not [word for word in argv + command if any(secret in word for secret in secrets)], argv
        tarantool = urlsplit(OPERATOR_ENV["WALVAULT_TARANTOOL_MAIN"])
        assert argv[argv.index("--connect") + 1] == f"{tarantool.username}@{tarantool.hostname}:{tarantool.port}"
        assert child.env["WALVAULT_PASSWORD"] == tarantool.password
        repo = argv[argv.index("--repo") + 1]
        held = mount_holding(rendered, name, repo)
        assert held is not None and not held.read_only, f"{name}: the repository {repo} is not on a volume"
        assert held == mount_holding(rendered, one(rendered, "scheduler"), repo), "not the scheduler's repository"
        assert mount_holding(rendered, name, argv[argv.index("--spool") + 1]) == spool
