"""The pipeline's configuration file and the repository hook (plugins/walvault_provider).

The configuration is read at DAG parse time: one small YAML file, no database, no network, and no Airflow
import; every error names the key at fault; secrets are refused. The hook reads a real Airflow connection (from
the environment, as Airflow resolves `AIRFLOW_CONN_*`) and opens the repository it names, a path or S3 on
loopback. Airflow's CLI listing the provider and testing its connections: test_dags.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, S3_CREDENTIALS, new_repository, require_tarantool, run_cli
from walvault_provider.config import DEFAULT_TASK_TIMEOUTS, ConfigError, Stream, config_path, load

SHIPPED = REPO / "dags" / "walvault.yaml"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "walvault.yaml"
    path.write_text(text)
    return path


GOOD = """
sources:
  - {name: tt1, family: tarantool, path: data/tt1, connection: tt1_live, stream: {segment_seconds: 2}}
  - {name: tt2, family: tarantool, path: data/tt2, stream: {connection: tt2_repl}}
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
    tt1, tt2, ls1 = config.sources
    assert tt1.path == tmp_path / "data/tt1" and tt1.connection == "tt1_live"
    assert tt1.stream == Stream("tt1_live", 2.0) and tt2.stream == Stream("tt2_repl", 1.0) and ls1.stream is None, \
        "a stream follows the source's connection unless it names its own"
    assert ls1.path == Path("/srv/ls1") and ls1.rotate_min_bytes == 1024
    assert config.retention_days == 7 and config.full_every_days == 1.5
    assert config.spark_connections == ("spark_local", "spark_cluster") and config.spark_connection == "spark_local"
    assert config.schedules["archive"] == "*/5 * * * *" and config.schedules["backup"] is None
    assert config.schedules["retention"] == "on snapshot" and config.schedules["restore_drill"] == "0 5 * * 0", \
        "unset schedules keep their defaults"
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
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {snapshot: '0 2 * * *'}", "schedules.snapshot"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {retention: '@daily'}", "schedules.retention"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {retention: on backup}", "schedules.retention"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nrepository: {connection: 'a b'}", "repository.connection"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connection: spark_default}", "spark.connection"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nbackup: {full_every_days: 0}", "backup.full_every_days"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nbackup: {full_every: 7}", "backup.full_every"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connections: []}", "spark.connections"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nspark: {connections: [s, s]}", "spark.connections[1]"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nrepository: {connection: r, password: hunter2}",
     "repository.password"),
    ("sources: [{name: a, family: tarantool, path: /x, aws_secret_access_key: k}]", "sources[0].aws_secret_access_key"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {retries: -1}", "runs.retries"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {retry: 3}", "runs.retry"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {owner: ''}", "runs.owner"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {lease_wait_minutes: soon}", "runs.lease_wait_minutes"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {task_timeout_minutes: {bakup: 5}}",
     "runs.task_timeout_minutes.bakup"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nruns: {run_timeout_minutes: {backup: 0}}",
     "runs.run_timeout_minutes.backup"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nfreshness: {max_backup_age_hours: 0}",
     "freshness.max_backup_age_hours"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nfreshness: {max_archive_lag_minutes: soon}",
     "freshness.max_archive_lag_minutes"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nfreshness: {remind_every_hours: -1}",
     "freshness.remind_every_hours"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nfreshness: {max_backup_age: 26}", "freshness.max_backup_age"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nmetrics: {textfile: /srv/walvault.txt}", "metrics.textfile"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nmetrics: {path: /srv/walvault.prom}", "metrics.path"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nschedules: {status: every ten minutes}", "schedules.status"),
    ("sources: [{name: a, family: limestone, path: /x, stream: {}}]", "sources[0].stream"),
    ("sources: [{name: a, family: tarantool, path: /x, stream: {}}]", "sources[0].stream"),
    ("sources: [{name: a, family: tarantool, path: /x, connection: c, stream: true}]", "sources[0].stream"),
    ("sources: [{name: a, family: tarantool, path: /x, connection: c, stream: {segment_seconds: 0}}]",
     "sources[0].stream.segment_seconds"),
    ("sources: [{name: a, family: tarantool, path: /x, connection: c, stream: {colour: red}}]",
     "sources[0].stream.colour"),
    ("sources: [{name: a, family: tarantool, path: /x, stream: {connection: 'a b'}}]", "sources[0].stream.connection"),
    ("sources: [{name: a, family: tarantool, path: /x}]\nfreshness: {max_stream_lag_seconds: 0}",
     "freshness.max_stream_lag_seconds"),
    ("sources: [{name: a, family: tarantool, path: /x}]\ncopy_to: 'a b'", "copy_to"),
    ("sources: [{name: a, family: tarantool, path: /x, copy_to: [dr]}]", "sources[0].copy_to"),
    ("sources: [{name: a, family: tarantool, path: /x}]\ncopy_to: walvault_repo", "copy_to"),
    ("sources: [{name: a, family: tarantool, path: /x, copy_to: r}]\nrepository: {connection: r}", "sources[0].copy_to"),
])
def test_every_error_names_its_key(tmp_path, text, key):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        load(path)
    assert f"{path}: {key}:" in str(e.value)
    assert "hunter2" not in str(e.value)


def test_copy_to_names_the_second_repository_of_every_source_or_of_one(tmp_path):
    config = load(_write(tmp_path, "sources:\n  - {name: a, family: tarantool, path: /x}\n"
                                   "  - {name: b, family: tarantool, path: /y, copy_to: dr_b}\ncopy_to: dr"))
    assert [(s.name, s.copy_to) for s in config.sources] == [("a", "dr"), ("b", "dr_b")]
    assert load(_write(tmp_path, "sources: [{name: a, family: tarantool, path: /x}]")).sources[0].copy_to is None


def test_a_cron_for_snapshot_or_retention_says_in_one_line_that_they_follow_the_data(tmp_path):
    """An existing configuration's staggered crons (02:00, 04:00) are refused, saying what to write instead; null
    (triggered only) and the data-following values load."""
    path = _write(tmp_path, "sources: [{name: a, family: tarantool, path: /x}]\nschedules: {retention: '0 4 * * *'}")
    with pytest.raises(ConfigError) as e:
        load(path)
    assert str(e.value) == (f"{path}: schedules.retention: '0 4 * * *': walvault_retention follows the data, not the "
                            "clock: write 'on snapshot' (the default), or null for triggered only")
    config = load(_write(tmp_path, "sources: [{name: a, family: tarantool, path: /x}]\n"
                                   "schedules: {snapshot: on backup, retention: null}"))
    assert config.schedules["snapshot"] == "on backup" and config.schedules["retention"] is None


def test_runs_give_every_task_an_owner_retries_with_back_off_and_timeouts(tmp_path):
    """The `runs` section: what each DAG's default_args and dagrun_timeout are, its defaults, and an override per
    DAG leaving the other DAGs' defaults."""
    from datetime import timedelta

    config = load(_write(tmp_path, GOOD))
    assert config.runs.default_args("backup") == {
        "owner": "walvault", "retries": 3, "retry_delay": timedelta(minutes=5), "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30), "execution_timeout": timedelta(hours=6)}
    assert config.runs.dagrun_timeout("backup") == timedelta(hours=12) and config.runs.lease_wait == 300
    runs = load(_write(tmp_path, GOOD + "runs: {owner: dba, retries: 0, lease_wait_minutes: 1, "
                                        "task_timeout_minutes: {archive: 10}, run_timeout_minutes: {drill: 1}}"
                       .replace("drill", "restore_drill"))).runs
    assert runs.default_args("archive")["owner"] == "dba" and runs.default_args("archive")["retries"] == 0
    assert runs.default_args("archive")["execution_timeout"] == timedelta(minutes=10)
    assert runs.default_args("backup")["execution_timeout"] == timedelta(hours=6), "the other DAGs keep theirs"
    assert runs.dagrun_timeout("restore_drill") == timedelta(minutes=1) and runs.lease_wait == 60


def test_verdicts_fail_at_once_and_passing_causes_are_retried():
    """What a task raises decides whether Airflow retries it: a walvault verdict (a refusal for what was found,
    damage, a configuration that cannot be used) is AirflowFailException; a lease held, a repository or a
    Tarantool out of reach, or a source that could not be checked goes up as it is (retried). The Spark task
    says it from the command's exit code and last line."""
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    from walcore.findings import Refused
    from walcore.repository import ObjectDamaged
    from walcore.repository.lease import LeaseBusy
    from walcore.tarantool.live import LiveError
    from walvault_provider.config import ConfigError
    from walvault_provider.operators.spark import job_failure
    from walvault_provider.operators.walvault import verdicts

    for verdict in (Refused("the set would not restore"), ObjectDamaged("objects/ab: sha256 differs"),
                    ConfigError("walvault.yaml: sources: missing")):
        with pytest.raises(AirflowFailException, match=str(verdict).split(":")[0]):
            with verdicts():
                raise verdict
    for passing in (LeaseBusy("held"), LiveError("127.0.0.1:3301: cannot connect"), OSError("unreachable"),
                    Refused("cannot read pwal_0001", status="cannot_check")):
        with pytest.raises(type(passing)):
            with verdicts():
                raise passing
    refusal = job_failure("walvault", 1, "walvault: not backed up: pwal_0001 is repairable")
    assert isinstance(refusal, AirflowFailException) and str(refusal).startswith("walvault exited 1: ")
    held = job_failure("walvault", 1, "walvault: not backed up: locks/limestone-x.lease is held by backup (pid 7 "
                                      "on h, expires in 60 s): another backup or expiry of this source is running")
    unreachable = job_failure("backup", 2, "walvault: not backed up: s3://b/repo: cannot reach the repository")
    assert type(held) is AirflowException and type(unreachable) is AirflowException


def test_a_held_lease_reads_as_the_spark_task_expects(tmp_path):
    """The Spark task tells a held lease from a refusal by the command's last line: walcore's own message."""
    from airflow.sdk.exceptions import AirflowFailException

    from walcore.repository import Repository
    from walcore.repository.lease import LeaseBusy
    from walvault_provider.operators.spark import job_failure

    repo = Repository(str(tmp_path / "repo"), create=True)
    with repo.lease("limestone", "x", "backup"):
        with pytest.raises(LeaseBusy) as held:
            with repo.lease("limestone", "x", "expire", wait=0):
                pass
    assert not isinstance(job_failure("walvault", 1, f"walvault: not backed up: {held.value}"), AirflowFailException)


def test_unreadable_or_not_yaml(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not YAML"):
        load(_write(tmp_path, "sources: [unclosed"))
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"sources: [{name: caf\xe9, family: tarantool, path: x}]\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load(latin1)


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


def test_the_hook_opens_an_encrypted_repository_with_the_connections_passphrase(monkeypatch, tmp_path):
    """The key is the connection's extra `passphrase` (masked by Airflow): it reaches walvault as WALVAULT_KEY, for
    the commands the task runs, never in the storage options or a request."""
    from walcore.repository import Repository
    from walvault_provider.hooks.walvault import WalvaultRepoHook

    key = "Jv3 the connection's passphrase Lp5"
    monkeypatch.setenv("WALVAULT_KEY", key)
    Repository.init(str(tmp_path / "repo"), encrypt=True)
    monkeypatch.delenv("WALVAULT_KEY")
    url = str(tmp_path / "repo")
    _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": url, "passphrase": "Jv3 wrong Lp5"}})
    ok, message = WalvaultRepoHook().test_connection()
    assert not ok and "does not open" in message and "Jv3" not in message
    _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": url, "passphrase": key}})
    assert WalvaultRepoHook().repository().encrypted
    assert "passphrase" not in repr(WalvaultRepoHook().target()) and WalvaultRepoHook().target().options == {}
    assert os.environ["WALVAULT_KEY"] == key


def test_one_connections_passphrase_does_not_reach_the_next_connection_the_process_opens(monkeypatch, tmp_path):
    """`airflow dags test` runs every task in one process: the passphrase the hook put in the environment for one
    connection (a copy's encrypted destination) must not become the key of a plain repository opened next (another
    source's copy_to), which would refuse it; a key the environment held before the hook comes back."""
    from walcore.repository import Repository, RepositoryError
    from walcore.repository.encrypted import TO_KEY_ENV
    from walvault_provider.hooks.walvault import WalvaultRepoHook, without_connection_keys

    key = "Jv3 the connection's passphrase Lp5"
    monkeypatch.delenv("WALVAULT_KEY", raising=False)
    monkeypatch.delenv(TO_KEY_ENV, raising=False)
    sealed, plain = str(tmp_path / "sealed"), str(tmp_path / "plain")
    Repository.init(sealed, encrypt=True, key=key)
    Repository.init(plain)
    _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": sealed, "passphrase": key}}, "sealed")
    _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": plain}}, "plain")
    for env in ("WALVAULT_KEY", TO_KEY_ENV):
        assert WalvaultRepoHook("sealed").opened(key_env=env)[1].encrypted
        assert os.environ[env] == key
        assert not WalvaultRepoHook("plain").opened(key_env=env)[1].encrypted
        assert env not in os.environ
    monkeypatch.setenv("WALVAULT_KEY", "given to the worker")
    with pytest.raises(RepositoryError, match="a key was given"):
        WalvaultRepoHook("plain").opened()
    assert os.environ["WALVAULT_KEY"] == "given to the worker"
    # a connection's passphrase over the worker's key: spark-submit gets the worker's, and so does the next
    # connection without one
    assert WalvaultRepoHook("sealed").opened()[1].encrypted and os.environ["WALVAULT_KEY"] == key
    with without_connection_keys():
        assert os.environ["WALVAULT_KEY"] == "given to the worker"
    assert os.environ["WALVAULT_KEY"] == key
    with pytest.raises(RepositoryError, match="a key was given"):
        WalvaultRepoHook("plain").opened()
    assert os.environ["WALVAULT_KEY"] == "given to the worker"


def test_the_hook_takes_storage_options_as_json_text(monkeypatch, tmp_path):
    """The UI's form may keep the options as the JSON text typed in: read as the mapping it says; anything else is
    refused, naming the connection."""
    from airflow.sdk.exceptions import AirflowException

    from walvault_provider.hooks.walvault import WalvaultRepoHook

    _connection(monkeypatch, {"conn_type": "walvault_repo",
                              "extra": {"url": str(tmp_path), "options": '{"auto_mkdir": true}'}})
    assert WalvaultRepoHook().target().options == {"auto_mkdir": True}
    for bad in ('{"auto_mkdir": tru', "[1, 2]"):
        _connection(monkeypatch, {"conn_type": "walvault_repo", "extra": {"url": str(tmp_path), "options": bad}})
        with pytest.raises(AirflowException, match="connection 'walvault_repo': extra 'options' is not"):
            WalvaultRepoHook().target()


def test_the_dags_carry_owner_retries_timeouts_descriptions_and_tags(tmp_path, monkeypatch):
    """Every task of every DAG has the configured owner, retries with back-off and an execution_timeout; every DAG
    a description, tags (walvault, its own, the sources' families) and a dagrun_timeout; each operator its doc."""
    from datetime import timedelta

    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("WALVAULT_CONFIG", str(_write(tmp_path, GOOD + "runs: {owner: dba, retries: 2, "
                                                                    "task_timeout_minutes: {backup: 90}}")))
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert len(bag.dags) == 6
    for dag in bag.dags.values():
        short = dag.dag_id.removeprefix("walvault_")
        assert dag.description and dag.doc_md, dag.dag_id
        assert {"walvault", short.replace("_", "-"), "tarantool", "limestone"} <= set(dag.tags), dag.tags
        assert dag.dagrun_timeout and dag.dagrun_timeout > timedelta(0), dag.dag_id
        for t in dag.tasks:
            assert (t.owner, t.retries, t.retry_exponential_backoff) == ("dba", 2, 2.0), t.task_id
            assert t.execution_timeout == (timedelta(minutes=90) if short == "backup" else
                                           timedelta(minutes=DEFAULT_TASK_TIMEOUTS[short])), t.task_id
            if t.task_type.startswith("Walvault"):
                assert t.doc_md == type(t).__doc__, t.task_id


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


def test_the_connection_forms_are_what_the_ui_shows():
    """The forms Airflow's UI draws from get_provider_info(): valid to its schema of field behaviours; the
    repository's url and options as fields of their own, S3's keys as login and password, the host and port
    hidden; a Tarantool's host, port, user and password, the extra hidden."""
    import jsonschema

    import airflow
    from walvault_provider import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "customized_form_field_behaviours.schema.json").read_text())
    forms = {c["connection-type"]: c for c in get_provider_info()["connection-types"]}
    for form in forms.values():
        behaviour = form["ui-field-behaviour"]
        jsonschema.validate({"hidden_fields": behaviour["hidden-fields"], "relabeling": behaviour["relabeling"],
                             "placeholders": behaviour.get("placeholders", {})}, schema)
    repo, tarantool = forms["walvault_repo"], forms["tarantool"]
    assert set(repo["conn-fields"]) == {"url", "options"}
    assert {"host", "port"} <= set(repo["ui-field-behaviour"]["hidden-fields"])
    assert repo["ui-field-behaviour"]["relabeling"] == {"login": "S3 access key id",
                                                        "password": "S3 secret access key"}
    assert not {"host", "port", "login", "password"} & set(tarantool["ui-field-behaviour"]["hidden-fields"])


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


def test_a_tarantool_connection_without_a_password_sends_none_not_the_word(monkeypatch):
    from types import SimpleNamespace

    from walvault_provider.hooks.tarantool import TarantoolHook

    conn = SimpleNamespace(login="backup", password=None, host="127.0.0.1", port=None)
    monkeypatch.setattr(TarantoolHook, "get_connection", classmethod(lambda cls, conn_id: conn))
    assert TarantoolHook("tt").uri() == "backup:@127.0.0.1:3301"
    conn.password = "s3cret"
    assert TarantoolHook("tt").uri() == "backup:s3cret@127.0.0.1:3301"
