"""The pipeline's configuration file and the repository hook (plugins/walvault_provider).

The configuration is read at DAG parse time: one small YAML file, no database, no network, and no Airflow
import; every error names the key at fault; secrets are refused. The hook reads a real Airflow connection (from
the environment, as Airflow resolves `AIRFLOW_CONN_*`) and opens the repository it names, a path or S3 on
loopback.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, S3_CREDENTIALS, new_repository, require_tarantool, run_cli
from walvault_provider.config import ConfigError, config_path, load

SHIPPED = REPO / "dags" / "walvault.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "walvault.yaml"
    path.write_text(text)
    return path


GOOD = """
sources:
  - {name: tt1, family: tarantool, path: data/tt1, connection: tt1_live}
  - {name: ls1, family: limestone, path: /srv/ls1, rotate_min_bytes: 1024}
retention: {days: 7}
backup: {full_every_days: 1.5}
schedules: {archive: "*/5 * * * *", backup: null}
spark: {connections: [spark_local, spark_cluster]}
"""


def test_the_shipped_configuration_loads_with_a_30_day_window():
    config = load(SHIPPED)
    assert config.retention_days == 30 and config.repository_connection == "walvault_repo"
    assert {s.family for s in config.sources} == {"tarantool", "limestone"}
    assert all(s.path.is_absolute() and s.path.is_relative_to(REPO) for s in config.sources)
    assert config.schedules["archive"] == "*/15 * * * *" and config.spark_connection == "spark_default"


def test_paths_defaults_and_the_environment_variable(tmp_path, monkeypatch):
    path = _write(tmp_path, GOOD)
    config = load(path)
    tt1, ls1 = config.sources
    assert tt1.path == tmp_path / "data/tt1" and tt1.connection == "tt1_live"
    assert ls1.path == Path("/srv/ls1") and ls1.rotate_min_bytes == 1024
    assert config.retention_days == 7 and config.full_every_days == 1.5
    assert config.spark_connections == ("spark_local", "spark_cluster") and config.spark_connection == "spark_local"
    assert config.schedules["archive"] == "*/5 * * * *" and config.schedules["backup"] is None
    assert config.schedules["retention"] == "0 4 * * *", "unset schedules keep their defaults"
    assert config.source("ls1") is ls1
    with pytest.raises(ConfigError, match="no source named 'nope'"):
        config.source("nope")
    monkeypatch.delenv("WALVAULT_CONFIG", raising=False)
    assert config_path() == SHIPPED
    monkeypatch.setenv("WALVAULT_CONFIG", str(path))
    assert config_path() == path and load().sources == config.sources


@pytest.mark.parametrize("text, key", [
    ("[1, 2]", "(top)"),
    ("sources: []", "sources"),
    ("sourcez: []", "sourcez"),
    ("sources: [{name: a, family: mysql, path: /x}]", "sources[0].family"),
    ("sources: [{name: 'a b', family: tarantool, path: /x}]", "sources[0].name"),
    ("sources: [{name: a.b, family: tarantool, path: /x}]", "sources[0].name"),
    ("sources: [{name: a, family: tarantool, path: /x}, {name: a, family: limestone, path: /y}]", "sources[1].name"),
    ("sources: [{name: a, family: tarantool}]", "sources[0].path"),
    ("sources: [{name: a, family: limestone, path: /x, connection: c}]", "sources[0].connection"),
    ("sources: [{name: a, family: tarantool, path: /x, rotate_min_bytes: 5}]", "sources[0].rotate_min_bytes"),
    ("sources: [{name: a, family: limestone, path: /x, rotate_min_bytes: 0}]", "sources[0].rotate_min_bytes"),
    ("sources: [{name: a, family: tarantool, path: /x, colour: red}]", "sources[0].colour"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nretention: {days: 0}", "retention.days"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nretention: {days: thirty}", "retention.days"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {archive: every minute}", "schedules.archive"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {hourly: '@daily'}", "schedules.hourly"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {archive: '61 * * * *'}", "schedules.archive"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nrepository: {connection: 'a b'}", "repository.connection"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connection: spark_default}", "spark.connection"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nbackup: {full_every_days: 0}", "backup.full_every_days"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nbackup: {full_every: 7}", "backup.full_every"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connections: []}", "spark.connections"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connections: [s, s]}", "spark.connections[1]"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nrepository: {connection: r, password: hunter2}",
     "repository.password"),
    ("sources: [{name: a, family: tarantool, path: /x, aws_secret_access_key: k}]", "sources[0].aws_secret_access_key"),
])
def test_every_error_names_its_key(tmp_path, text, key):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(path)
    assert f"{path}: {key}:" in str(e.value)
    assert "hunter2" not in str(e.value)


def test_unreadable_or_not_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not YAML"):
        load(_write(tmp_path, "sources: [unclosed"))


def test_reading_it_imports_no_airflow_and_touches_no_network(tmp_path):
    """What a DAG file does at parse time: import the module and load the file."""
    path = _write(tmp_path, GOOD)
    code = ("import socket, sys\n"
            "def refuse(*a, **k): raise AssertionError('network at parse time')\n"
            "socket.socket.connect = refuse\n"
            "from walvault_provider.config import load\n"
            f"load({str(path)!r})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'sqlalchemy', 'pyspark')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the repository hook


def _connection(monkeypatch, conn: dict, conn_id: str = "walvault_repo") -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_the_hook_opens_a_local_repository(monkeypatch, tmp_path):
    from airflow.sdk.exceptions import AirflowException

    from walvault_provider.hooks.walvault import WalvaultRepoHook

    _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": str(tmp_path / "repo")}})
    hook = WalvaultRepoHook()
    ok, message = hook.test_connection()
    assert not ok and "holds no walvault repository: create it with `walvault init --repo" in message
    repo = hook.repository(create=True)
    assert (tmp_path / "repo" / "walvault.repo").is_file() and repo.sources() == []
    assert hook.test_connection() == (True, f"walvault repository {tmp_path / 'repo'} (format 1)")
    assert hook.target().url == str(tmp_path / "repo") and hook.target().options == {}
    _connection(monkeypatch, {"conn_type": "walvault_repo", "host": str(tmp_path / "other")}, "by_host")
    assert WalvaultRepoHook("by_host").target().url == str(tmp_path / "other")
    _connection(monkeypatch, {"conn_type": "walvault_repo"}, "empty")
    with pytest.raises(AirflowException, match="'empty': no repository"):
        WalvaultRepoHook("empty").target()


def test_the_hook_keeps_s3_credentials_in_the_connection(monkeypatch, s3_endpoint, tmp_path):
    import s3fs

    from walvault_provider.hooks.walvault import WalvaultRepoHook

    for key in S3_CREDENTIALS:  # only the connection may supply them here
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    key, secret = S3_CREDENTIALS["AWS_ACCESS_KEY_ID"], S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
    bucket = f"walvault-hook-{tmp_path.name[-12:].lower().replace('_', '-')}"
    s3fs.S3FileSystem(endpoint_url=s3_endpoint, key=key, secret=secret).mkdir(bucket)
    _connection(monkeypatch, {"conn_type": "walvault_repo", "login": key, "password": secret,
                              "extra": {"url": f"s3://{bucket}/repo", "options": {"endpoint_url": s3_endpoint}}})
    hook = WalvaultRepoHook()
    repo = hook.repository(create=True)
    repo.set_policy(30)
    assert repo.policy()["days"] == 30
    target = hook.target()
    assert target.url == f"s3://{bucket}/repo"
    assert target.options == {"endpoint_url": s3_endpoint, "key": key, "secret": secret}
    # a repository opened with those options alone (what a Spark job's plan carries) is the same one
    from walcore.repository import Repository

    assert Repository(target.url, target.options).policy()["days"] == 30


def test_the_provider_describes_itself_as_airflow_providers_do():
    """get_provider_info() is valid against Airflow's own schema, and every module and class it names imports."""
    import importlib

    import airflow
    import jsonschema

    from walvault_provider import get_provider_info

    info = get_provider_info()
    jsonschema.validate(info, json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text()))
    for kind in ("hooks", "operators"):
        for entry in info[kind]:
            for module in entry["python-modules"]:
                importlib.import_module(module)
    for conn in info["connection-types"]:
        module, name = conn["hook-class-name"].rsplit(".", 1)
        assert getattr(importlib.import_module(module), name).conn_type == conn["connection-type"]


def test_a_spark_plan_is_private_from_its_first_byte(tmp_path, monkeypatch):
    # The plan holds the repository's options, credentials included: mode 0600 as soon as it exists, even with a
    # permissive umask, in a work directory only this user can enter (the job removes the plan once read:
    # test_spark_jobs); the result is read from the output dir beside it.
    import os
    import stat

    from walvault_provider.spark import job_result, work_dir, write_plan

    monkeypatch.setenv("WALVAULT_WORK_DIR", str(tmp_path / "work"))
    task_dir = work_dir("manual__2026-01-01T00:00:00+00:00", "backup-tt")
    assert task_dir.parent == tmp_path / "work" and ":" not in task_dir.name and "+" not in task_dir.name
    assert stat.S_IMODE(task_dir.stat().st_mode) == 0o700 == stat.S_IMODE(task_dir.parent.stat().st_mode)
    (tmp_path / "work").chmod(0o777)
    with pytest.raises(PermissionError, match="WALVAULT_WORK_DIR"):
        work_dir("run", "task")

    task_dir.chmod(0o755)
    old = os.umask(0)
    try:
        arg = write_plan(task_dir, {"job": "verify", "repo_options": {"secret": "hunter2"}})
    finally:
        os.umask(old)
    plan = task_dir / "plan.json"
    assert arg == f"@{plan}" and stat.S_IMODE(plan.stat().st_mode) == 0o600
    assert sorted(p.name for p in task_dir.iterdir()) == ["output", "plan.json"], "no temporary file is left"
    (task_dir / "output" / "result.json").write_text('{"exit": 0}')
    (task_dir / "output" / "stdout").write_text("{}")
    (task_dir / "output" / "stderr").write_text("")
    assert job_result(arg) == (0, "{}", "")


@require_tarantool
def test_the_local_tarantool_serves_its_data_dir_once(tmp_path):
    """The embedded defaults' Tarantool (scripts/pipeline.py, scripts/ui.py): on 127.0.0.1 with a password kept
    0600 beside its data dir; one left running by a killed run is named, not started over."""
    import socket
    import stat

    from devenv import LocalTarantool

    first = LocalTarantool(tmp_path / "tt").start(rows=100)
    try:
        assert stat.S_IMODE(first.secret_file.stat().st_mode) == 0o600
        socket.create_connection(("127.0.0.1", first.port), timeout=5).close()
        assert first.connection()["password"] == first.password() and first.connection()["port"] == first.port
        with pytest.raises(RuntimeError, match=f"pid {first.process.pid}.*already serves"):
            LocalTarantool(tmp_path / "tt").start(rows=100)
    finally:
        first.stop()
    assert first.process is None and LocalTarantool(tmp_path / "tt").holder() is None
    assert list((tmp_path / "tt").glob("*.xlog")), "its rows are in the data dir's WAL"


def test_a_scheduled_backup_is_full_once_the_newest_full_is_old(tmp_path):
    """walvault_backup on schedule: full for a source with no full backup or one older than full_every_days,
    else incremental; by the source's path, whatever other sources the repository holds."""
    from walcore.repository import Repository, stamp_seconds
    from walvault_provider.operators.walvault import scheduled_backup_type

    source = REPO / "samples" / "tarantool" / "many-xlogs"
    repo_path = new_repository(tmp_path / "repo")
    assert run_cli("backup", source, "--repo", repo_path, "--json").returncode == 0
    repo = Repository(str(repo_path))
    (full,) = [r.manifest for r in repo.backups()]
    finished = stamp_seconds(full.finished)
    assert scheduled_backup_type(repo, source, 7, now=finished + 6.9 * 86400) == "incremental"
    assert scheduled_backup_type(repo, source, 7, now=finished + 7 * 86400) == "full"
    assert scheduled_backup_type(repo, REPO / "samples" / "tarantool" / "features", 7, now=finished) == "full"
