"""The DAGs, run by `airflow dags test` against a real metadata database (SQLite), real sources of both
families (a data dir written by real Tarantool, a real limestone fixture) and a repository on a local path; the
Spark verify job runs on local[2] through SparkSubmitOperator. What is checked is in the repository and in
the task logs, not only the exit code. One AIRFLOW_HOME, and so one loaded Airflow (tests/forked_airflow.py),
serves the whole file: a test with a repository, configuration or connections of its own gives them in its
command's environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import tarantool_real as tr
from asset_runs import asset_triggered_test
from conftest import (REPO, TARANTOOL_FIXTURES, airflow_sources, asset_events, copy_limestone_fixture, copy_tree,
                      last_run, new_repository, require_limestone, require_shared, require_tarantool, run_cli,
                      run_cli_at, run_main)
from devenv import environment, migrate
from forked_airflow import airflow
from test_notify import LOGIN, PASSWORD, body_lines, failure_mail, mailbox  # noqa: F401  (mailbox: a fixture)
from walcore.limestone.epoch import DURABLE_EPOCH, RECORD

pytestmark = [require_tarantool, require_limestone]
DAY, HOUR = 86400, 3600
# Every DAG of dags/: each is run by `airflow dags test` in this file, which parses its file as the CLI does (an
# import error fails that run)
DAG_IDS = ("walvault_archive", "walvault_backup", "walvault_snapshot", "walvault_retention", "walvault_restore_drill",
           "walvault_status")


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """An AIRFLOW_HOME with a migrated SQLite database, the DAGs and plugins of this checkout, the configuration
    naming two fresh sources and two Spark connections, and the connections (walvault_repo, spark_default on
    local[2]) in the environment (spark_cluster: the test that starts the cluster sets it). The package metadata an
    install of this checkout writes is first on PYTHONPATH: Airflow finds the provider as it finds an installed one,
    through its `apache_airflow_provider` entry point (test_airflow_lists_the_provider_and_tests_its_connections)."""
    root = tmp_path_factory.mktemp("airflow")
    tt, ls, config = airflow_sources(root)
    repo = root / "repo"
    env = environment(root / "home", config=config, repository=str(repo), work_dir=root / "work")
    env["PYTHONPATH"] = os.pathsep.join(map(str, (_installed_metadata(root / "site"), REPO, REPO / "plugins")))
    migrate(env)
    return {"env": env, "repo": repo, "tt": tt, "ls": ls, "root": root}


def _installed_metadata(site: Path) -> Path:
    """The package metadata an install of this checkout writes (setuptools' egg_info, from pyproject.toml: its entry
    points included), in `site`."""
    site.mkdir()
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(site)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return site


def _dags_test(env, dag_id, *conf):
    proc = airflow(env, "dags", "test", dag_id, *conf)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "Traceback" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout + proc.stderr


def _asset(source: str, kind: str) -> str:
    return f"walvault://walvault_repo/{source}/{kind}"


def _files(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_dags_follow_the_data(airflow_env, monkeypatch):
    """walvault_snapshot runs on any source's backup asset, walvault_retention on any snapshot asset (its expire
    tasks' inlets: where the day record is kept), the drill stays weekly; the provider's `walvault` URI scheme
    refuses a URI that names no source and kind."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk import Asset, AssetAny
    from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

    from walvault_provider.assets import BACKUPS_ALIAS

    monkeypatch.setenv("WALVAULT_CONFIG", airflow_env["env"]["WALVAULT_CONFIG"])
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    assert set(bag.dags) == set(DAG_IDS), "every DAG file's DAG"
    snapshot, retention = bag.dags["walvault_snapshot"], bag.dags["walvault_retention"]
    for dag, kind in ((snapshot, "backup"), (retention, "snapshot")):
        assert isinstance(dag.timetable, AssetTriggeredTimetable)
        assert dag.timetable.asset_condition == AssetAny(Asset(_asset("tt", kind), group="walvault"),
                                                         Asset(_asset("ls", kind), group="walvault"))
    assert bag.dags["walvault_backup"].get_task("backup_source.publish").outlets == [BACKUPS_ALIAS]
    assert [a.uri for a in snapshot.get_task("snapshot_ls").outlets] == [_asset("ls", "snapshot")]
    assert [a.uri for a in retention.get_task("expire_tt").inlets] == [_asset("tt", "snapshot")]
    assert bag.dags["walvault_restore_drill"].timetable.expression == "0 5 * * 0"
    with pytest.raises(ValueError, match=re.escape("a walvault asset URI is walvault://REPOSITORY/SOURCE/backup|")):
        Asset("walvault://walvault_repo/tt")


def test_airflow_lists_the_provider_and_tests_its_connections(airflow_env, tmp_path):
    """`airflow providers list` names walvault; its two connection types have their forms (the repository's url
    and options as extra fields, S3's keys as login and password; a Tarantool's host, port, user and password);
    `airflow connections test` answers through each hook: a repository that is there, a running Tarantool over
    iproto, and a wrong password refused, saying why."""
    from devenv import LocalTarantool

    repo = new_repository(tmp_path / "repo")
    tt = LocalTarantool(tmp_path / "tt").start(rows=10)
    try:
        live = tt.connection()
        env = {**airflow_env["env"],
               "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo", "extra": {"url": str(repo)}}),
               "AIRFLOW_CONN_TT_LIVE": json.dumps(live),
               "AIRFLOW_CONN_TT_WRONG": json.dumps({**live, "password": "not-its-password"})}
        assert env["AIRFLOW__CORE__TEST_CONNECTION"] == "Enabled"

        def listing(*args) -> list[dict]:
            proc = airflow(env, *args, "--output", "json")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            # Airflow logs to stdout too: the listing is the line holding the JSON array
            return json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("[{")))

        (provider,) = [p for p in listing("providers", "list") if p["package_name"] == "walvault"]
        assert provider["description"].startswith("Verify, back up and retain")
        hooks = {h["connection_type"]: h for h in listing("providers", "hooks")}
        assert hooks["walvault_repo"]["class"] == "walvault_provider.hooks.walvault.WalvaultRepoHook"
        assert hooks["tarantool"]["class"] == "walvault_provider.hooks.tarantool.TarantoolHook"
        assert {"walvault_repo", "tarantool"} <= {b["field_behaviours"] for b in listing("providers", "behaviours")}
        widgets = {w["connection_parameter_name"] for w in listing("providers", "widgets")}
        assert {"extra__walvault_repo__url", "extra__walvault_repo__options"} <= widgets

        for conn_id in ("walvault_repo", "tt_live"):
            proc = airflow(env, "connections", "test", conn_id)
            assert proc.returncode == 0 and "Connection success!" in proc.stdout, proc.stdout + proc.stderr
        proc = airflow(env, "connections", "test", "tt_wrong")
        assert proc.returncode == 1 and "Connection failed!" in proc.stdout, proc.stdout + proc.stderr
        assert f"127.0.0.1:{tt.port}" in proc.stdout and "not-its-password" not in proc.stdout + proc.stderr
    finally:
        tt.stop()


def test_archive_snapshot_and_retention_dry_run(airflow_env, tmp_path):
    """The first archive run's configuration names a third source whose directory is gone: the run fails, naming
    it, after the other two are archived and verified by Spark, and its teardown removes the run's work directory.
    The same interval again, without it, succeeds and archives nothing new; then a snapshot and a retention dry
    run."""
    env, repo = airflow_env["env"], airflow_env["repo"]
    config = tmp_path / "walvault.yaml"
    config.write_text(Path(env["WALVAULT_CONFIG"]).read_text().replace(
        "sources:\n", f"sources:\n  - {{name: gone, family: limestone, path: {tmp_path / 'gone'}}}\n", 1))
    proc = airflow({**env, "WALVAULT_CONFIG": str(config), "WALVAULT_WORK_DIR": str(tmp_path / "work")},
                   "dags", "test", "walvault_archive")
    log = proc.stdout + proc.stderr
    assert "DagRun failed" in log and f"gone: {tmp_path / 'gone'} is not a directory" in log, log[-3000:]
    assert "walvault archive into" in log and "files verified by Spark, 0 damaged" in log, \
        "what was archived was verified before the run failed\n" + log[-6000:]
    assert list((tmp_path / "work").iterdir()) == [], "the teardown removed the run's work directory"
    summaries = [json.loads(p.read_text()) for p in repo.glob("reports/verify/*/summary.json")]
    assert len(summaries) == 1, "the Spark verify job keeps its report in the repository"
    # what archive scanned is proved by its hash, not scanned again (limestone's files, which have no ledger, are)
    import pyarrow.parquet as pq

    (report_dir,) = repo.glob("reports/verify/*")
    checked = {r["path"]: r["checked_by"] for r in pq.read_table(report_dir / "files.parquet").to_pylist()}
    tarantool_checked = {c for p, c in checked.items() if not Path(p).is_relative_to(airflow_env["ls"])}
    assert tarantool_checked == {"ledger"} and "scan" in checked.values(), summaries[0]["checked_by"]
    rotated = list(airflow_env["ls"].glob("pwal_????.*"))
    assert rotated, "the limestone source was rotated under limestone's names"
    archived = {p.name.removesuffix(".zst.json") for p in repo.rglob("archive/**/*.zst.json")}
    assert {p.name for p in rotated} <= archived
    assert any(n.endswith(".xlog") for n in archived) and any(n.endswith(".snap") for n in archived)
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if "reports" not in p.parts)
    log = _dags_test(env, "walvault_archive")  # the same interval again, the gone source not configured: nothing new
    assert "archived 0 files" in log and "nothing new was archived" in log
    after = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if "reports" not in p.parts)
    assert before == after
    log = _dags_test(env, "walvault_snapshot")
    backups = json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
    assert sorted(b["family"] for b in backups if b["type"] == "snapshot") == ["limestone", "tarantool"]
    assert all(b["status"] == "ok" for b in backups)
    # a manual run snapshots every source; each snapshot updates its source's asset, saying what it made
    events = asset_events(env)
    made = {b["family"]: b for b in backups if b["type"] == "snapshot"}
    for source, family in (("tt", "tarantool"), ("ls", "limestone")):
        (event,) = events[_asset(source, "snapshot")]
        assert event["dag"] == "walvault_snapshot" and event["source"] == source, event
        assert (event["id"], event["position"]) == (made[family]["id"], made[family]["position"]), event
        assert event["bytes"] > 0 and event["files"] > 0
    tree = sorted((p.relative_to(repo).as_posix(), p.stat().st_size) for p in repo.rglob("*") if p.is_file())
    log = _dags_test(env, "walvault_retention")
    # snapshots taken now anchor nothing of a 30-day window: each source's confirm says so, and its expiry is skipped
    assert "walvault expire: confirm the coverage of tt" in log and "confirm the coverage of ls" in log
    assert log.count("UNCOVERED: no verified snapshot at or before the window's start") == 2
    assert "starting task_id=expire_" not in log
    assert sorted((p.relative_to(repo).as_posix(), p.stat().st_size) for p in repo.rglob("*") if p.is_file()) == tree


def test_backup_from_the_form_and_on_schedule(airflow_env, mailbox):
    """Manual runs with the form's params (source, type, verify), `notify` configured (mail through a real SMTP
    server on 127.0.0.1). First an incremental of ls with no full under it: walvault refuses, and the source's
    Spark task is the one that fails (its log ending with walvault's own lines, the record task never run, no asset
    updated, the plan with the repository's options gone), one mail naming it. Then ls's full backup, whose
    configuration names a second repository (`copy_to`): its backup, verified, is copied there, and the DAG's
    previous run failed (one recovery mail). Then a full and an incremental of tt: successes after a success, no
    mail."""
    env, repo, root = airflow_env["env"], airflow_env["repo"], airflow_env["root"]
    reports = set(repo.glob("reports/verify/*/summary.json"))
    notifying = root / "walvault-notify.yaml"
    notifying.write_text(Path(env["WALVAULT_CONFIG"]).read_text() + "notify: {smtp: {connection: smtp_oncall, "
                         "from: walvault@example.com, to: [oncall@example.com]}}\n")
    mailing = {**env, "WALVAULT_CONFIG": str(notifying), "AIRFLOW_CONN_SMTP_ONCALL": mailbox.connection()}
    config, second = root / "walvault-copy-to.yaml", new_repository(root / "second")
    config.write_text(notifying.read_text() + "copy_to: walvault_repo_copy\n")
    copying = {**mailing, "WALVAULT_CONFIG": str(config),
               "AIRFLOW_CONN_WALVAULT_REPO_COPY": json.dumps({"conn_type": "walvault_repo",
                                                              "extra": {"url": str(second)}})}

    before = asset_events(env)
    failed = airflow(mailing, "dags", "test", "walvault_backup", "--conf",
                     json.dumps({"source": "ls", "type": "incremental", "verify": True}))
    log = failed.stdout + failed.stderr
    assert "DagRun failed" in log, log[-4000:]
    task = log[log.index("[DAG TEST] starting task_id=backup_source.spark_backup"):
               log.index("[DAG TEST] end task task_id=backup_source.spark_backup")]
    assert "new_state=failed" in task, "the Spark task is the one shown failed\n" + task[-4000:]
    assert "AirflowFailException: walvault exited 1:" in task, task[-4000:]
    assert "take a full backup first" in task.split("its last lines:")[-1], "the log's last lines: walvault's own"
    assert "starting task_id=backup_source.record" not in log, "nothing recorded a backup that was not made"
    assert asset_events(env) == before, "a failed backup updates no asset"
    assert not list((root / "work").rglob("plan.json"))
    _run, note, _xcoms = last_run(env, "walvault_backup")  # the run's note: the failed task, by source, and why
    assert note.startswith("**walvault** walvault_backup: the run failed"), note
    noted = next(line for line in note.splitlines() if line.startswith("- FAILED backup_source.spark_backup [ls]: "))
    assert "AirflowFailException: walvault exited 1:" in noted and "take a full backup first" in noted, note
    (message,) = mailbox.messages
    lines = failure_mail(message, "ls", "walvault_backup", "backup_source.spark_backup[0]",
                         "AirflowFailException: walvault exited 1: ")
    assert "full backup" in lines[3]
    failed_run = next(line for line in lines if line.startswith("Run: ")).removeprefix("Run: ")

    log = _dags_test(copying, "walvault_backup", "--conf",
                     json.dumps({"source": "ls", "type": "full", "verify": True}))
    assert "walvault verify --repo" in log and ": ok" in log
    assert f"--to {second} (connection walvault_repo_copy)" in log and "copied backup " in log, log[-6000:]
    assert "DagRun Finished" in log and "state=success" in log, log[-3000:]
    assert len(mailbox.messages) == 2, log[-6000:]
    message = mailbox.messages[1]
    assert message["Subject"].startswith("walvault: walvault_backup recovered: ")
    assert message["Subject"].endswith(f"succeeded after {failed_run} failed")
    assert body_lines(message)[0] == "DAG: walvault_backup"
    assert mailbox.logins == [(LOGIN, PASSWORD)] * 2, "the login and password are the connection's"
    (backup,) = [b for b in json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
                 if (b["family"], b["type"]) == ("limestone", "full")]
    assert [c["to"] for c in backup["copies"]] == [str(second.resolve())]
    (copied,) = json.loads(run_cli("backups", "--repo", second, "--json").stdout)["backups"]
    assert (copied["id"], copied["status"], copied["position"]) == (backup["id"], "ok", backup["position"])
    assert run_cli("verify", "--repo", second).returncode == 0
    for where, name in ((repo, "from-first"), (second, "from-second")):
        assert run_cli("restore", backup["id"], root / name, "--repo", where).returncode == 0
    assert _files(root / "from-second") == _files(root / "from-first")
    kept = [json.loads(p.read_text()) for p in set(repo.glob("reports/verify/*/summary.json")) - reports]
    assert [s["verdict"] for s in kept] == ["INTACT"], "the verify task keeps its report, as the CLI does"
    # the run's note says what it did, by source; each task's result is one XCom value, not split into keys
    _run, note, xcoms = last_run(env, "walvault_backup")
    assert note and note.startswith("**walvault** walvault_backup: the run succeeded"), note
    recorded = next(line for line in note.splitlines() if line.startswith("- backup_source.record [ls]: backup "))
    assert " (full): " in recorded and " files, " in recorded and " bytes, position " in recorded, note
    assert "- backup_source.verify [ls]: backup " in note and " verified intact: " in note, note
    assert {k for t, _m, k in xcoms if t != "clean_up"} == {"return_value"}, xcoms
    assert {(t, k) for t, _m, k in xcoms} >= {("backup_source.record", "return_value"), ("clean_up", "committed"),
                                              ("clean_up", "return_value")}, xcoms
    assert len(xcoms) == len(set(xcoms)), xcoms
    tr.write_more(airflow_env["tt"], rows=200, snapshot=False, seed=4)
    _dags_test(mailing, "walvault_backup", "--conf", json.dumps({"source": "tt", "type": "full", "verify": True}))
    _dags_test(mailing, "walvault_backup", "--conf", json.dumps({"source": "tt", "type": "incremental",
                                                                  "verify": False}))
    assert len(mailbox.messages) == 2, "a success after a success sends nothing"
    backups = [b for b in json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
               if b["type"] != "snapshot"]
    kinds = sorted((b["family"], b["type"]) for b in backups)
    assert kinds == [("limestone", "full"), ("tarantool", "full"), ("tarantool", "incremental")]
    assert all(b["status"] == "ok" for b in backups)
    # each backup, recorded and verified, updated its own source's asset only, with what it is as metadata
    events = asset_events(env)
    for source, family in (("ls", "limestone"), ("tt", "tarantool")):
        made = sorted((b for b in backups if b["family"] == family), key=lambda b: b["id"])
        assert [(e["dag"], e["source"], e["id"], e["type"], e["position"]) for e in events[_asset(source, "backup")]] \
            == [("walvault_backup", source, b["id"], b["type"], b["position"]) for b in made]
        assert all(e["bytes"] > 0 for e in events[_asset(source, "backup")])
    report = json.loads(run_cli("verify", "--repo", repo, "--json").stdout)
    assert report["intact"]
    restored = airflow_env["root"] / "restored"
    latest_tt = max((b for b in backups if b["family"] == "tarantool"), key=lambda b: b["id"])
    assert run_cli("restore", latest_tt["id"], restored, "--repo", repo).returncode == 0
    assert tr.dump_data_dir(restored) == tr.dump_data_dir(airflow_env["tt"])
    assert not list((airflow_env["root"] / "work").rglob("plan.json")), "plan files (with options) are removed"


def test_an_asset_triggered_snapshot_snapshots_only_the_sources_whose_backups_triggered_it(airflow_env):
    """The run the scheduler makes when ls's backup asset updates: ls is snapshotted, tt skipped, saying why; only
    ls's snapshot asset updates."""
    env = airflow_env["env"]
    before = asset_events(env)
    proc = asset_triggered_test(env, "walvault_snapshot", [_asset("ls", "backup")])
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "asset-triggered run asset_triggered__" in log, log[-6000:]
    assert "walvault snapshot of ls" in log and "walvault snapshot of tt" not in log, log[-6000:]
    assert "tt: no new backup among the events that triggered this run (ls): not snapshotted" in log, log[-6000:]
    after = asset_events(env)
    assert len(after[_asset("ls", "snapshot")]) == len(before[_asset("ls", "snapshot")]) + 1
    assert after[_asset("tt", "snapshot")] == before[_asset("tt", "snapshot")]


def test_a_spark_master_that_is_not_a_connection_fails_the_plan_task_unsubmitted(airflow_env, tmp_path):
    """A Spark master that is not a configured connection fails the plan task, naming it, instead of being
    submitted to yarn. (A failed backup's cause, note, assets, plan and mail: the first run of
    test_backup_from_the_form_and_on_schedule.)"""
    env = {**airflow_env["env"], "WALVAULT_WORK_DIR": str(tmp_path / "work"),
           "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo",
                                                     "extra": {"url": str(tmp_path / "empty-repo")}})}
    proc = airflow(env, "dags", "test", "walvault_backup", "--conf",
                   json.dumps({"source": "ls", "type": "full", "verify": True, "spark": "spark_cluster"}))
    log = proc.stdout + proc.stderr
    assert "spark_cluster" in log and "isn't defined" in log, log[-3000:]
    assert "spark-submit" not in log, "nothing was submitted"


def test_the_restore_drill_proves_the_newest_backups(airflow_env):
    env, repo = airflow_env["env"], airflow_env["repo"]
    new_repository(repo)  # a no-op when an earlier DAG run made it
    for source in (airflow_env["tt"], airflow_env["ls"]):
        assert run_cli("backup", source, "--repo", repo).returncode == 0
    log = _dags_test(env, "walvault_restore_drill")
    assert "tarantool started on it at the recorded vclock" in log and "limestone's checks pass" in log
    listed = json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
    drilled = [b for b in listed if b.get("drill")]
    assert sorted(b["family"] for b in drilled) == ["limestone", "tarantool"]
    assert all(b["drill"]["status"] == "ok" for b in drilled)


def test_a_backup_from_the_form_on_a_standalone_cluster_into_an_encrypted_repository(airflow_env, tmp_path,
                                                                                      monkeypatch):
    """The form's Spark master: spark_cluster, a real standalone master and two workers on 127.0.0.1. The
    repository is encrypted, its passphrase in the connection only: the Spark job gets it in its plan file, not from
    the environment (spark-submit's has none, nor have the cluster's processes); the verify task after it, in the
    task's process, from the connection."""
    from spark_jobs.cluster import standalone_cluster

    repo, key = tmp_path / "sealed", "the connection's passphrase"
    monkeypatch.setenv("WALVAULT_KEY", key)
    assert run_main("init", "--repo", str(repo), "--encrypt").returncode == 0
    monkeypatch.delenv("WALVAULT_KEY")
    with standalone_cluster(tmp_path, workers=2, cores=1) as master:
        env = {**airflow_env["env"],
               "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps({"conn_type": "spark", "host": master}),
               "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo",
                                                         "extra": {"url": str(repo), "passphrase": key}})}
        log = _dags_test(env, "walvault_backup", "--conf", json.dumps({"source": "ls", "type": "full",
                                                                       "verify": True, "spark": "spark_cluster"}))
        registered = (tmp_path / "master.log").read_text(errors="replace")
    assert f"--master {master}" in log, "the job was submitted to the cluster's master"
    assert "Registering app walvault-backup" in registered
    assert key not in log, "the passphrase is masked"
    recorded = log[log.index("walvault backup "):].split()[2]
    assert run_main("backups", "--repo", str(repo)).returncode == 2, "the repository is encrypted"
    monkeypatch.setenv("WALVAULT_KEY", key)
    listed = {b["id"]: b for b in json.loads(run_main("backups", "--repo", str(repo), "--json").stdout)["backups"]}
    assert listed[recorded]["family"] == "limestone" and listed[recorded]["status"] == "ok"
    assert run_main("restore", recorded, str(tmp_path / "restored"), "--repo", str(repo)).returncode == 0
    restored, source = _files(tmp_path / "restored"), _files(airflow_env["ls"])
    assert len(restored) == listed[recorded]["files"] and {n: source.get(n) for n in restored} == restored


@require_shared
def test_a_stale_source_fails_its_check_and_mails_once_and_its_recovery_mails(airflow_env, mailbox, tmp_path):
    """walvault_status on a real repository made from the shared fixtures (a Tarantool data dir archived, and backed
    up two days ago under faketime; a limestone directory rotated, archived and snapshotted now): the stale source's
    check fails with the alert as its cause and one mail naming it, the fresh source's passes, and the textfile,
    which prometheus_client's parser reads, is written. A run still stale sends no mail; the run after a new backup
    sends the recovery mail; an archive lagging its source alerts. In this file's AIRFLOW_HOME (its loaded Airflow):
    its own configuration, repository and work directory."""
    tt = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "tt")
    ls = copy_limestone_fixture("20-random-small", tmp_path, "ls")
    repo = new_repository(tmp_path / "repo")
    assert run_main("archive", tt, "--repo", repo).returncode == 0
    old = run_cli_at(time.time() - 2 * DAY, "backup", tt, "--repo", repo)  # finished two days ago
    assert old.returncode == 0, old.stderr
    assert run_main("rotate", ls).returncode == 0
    assert run_main("archive", ls, "--repo", repo).returncode == 0
    assert run_main("snapshot", ls, "--repo", repo).returncode == 0
    textfile = tmp_path / "textfile" / "walvault.prom"
    textfile.parent.mkdir()
    config = tmp_path / "walvault.yaml"
    config.write_text(f"""
sources:
  - {{name: tt, family: tarantool, path: {tt}}}
  - {{name: ls, family: limestone, path: {ls}}}
metrics: {{textfile: {textfile}}}
notify: {{smtp: {{connection: smtp_oncall, from: walvault@example.com, to: [oncall@example.com]}}}}
""")
    env = {**airflow_env["env"], "WALVAULT_CONFIG": str(config), "WALVAULT_WORK_DIR": str(tmp_path / "work"),
           "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo", "extra": {"url": str(repo)}}),
           "AIRFLOW_CONN_SMTP_ONCALL": mailbox.connection()}

    def status_run(failed: bool) -> str:
        proc = airflow(env, "dags", "test", "walvault_status")
        log = proc.stdout + proc.stderr
        assert ("DagRun failed" in log) == failed, log[-4000:]
        assert failed or "Traceback" not in log, log[-4000:]
        return log

    log = status_run(failed=True)
    assert "walvault freshness of tt: STALE" in log and "walvault freshness of ls: fresh" in log, log[-4000:]
    assert f"written to {textfile}" in log
    (message,) = mailbox.messages
    lines = failure_mail(message, "tt", "walvault_status", "freshness_tt",
                         "FreshnessAlert: no verified backup of tt for 26 hours: the newest, ")
    assert "finished 2d00h ago" in lines[3], lines[3]
    families = {f.name: f for f in text_string_to_metric_families(textfile.read_text())}
    ages = {s.labels["family"]: s.value for s in families["walvault_last_backup_age_seconds"].samples}
    assert 2 * DAY <= ages["tarantool"] < 2 * DAY + HOUR and ages["limestone"] < HOUR
    assert {s.labels["source"]: s.value for s in families["walvault_source_ok"].samples} == {
        str(tt.resolve()): 0.0, str(ls.resolve()): 1.0}
    assert [p.name for p in textfile.parent.iterdir()] == ["walvault.prom"], "written whole: no temporary left"

    log = status_run(failed=True)  # still stale, ten minutes later: failed, but mailed 4 hours later only
    assert "stale since the check of" in log and len(mailbox.messages) == 1, log[-4000:]

    assert run_main("backup", tt, "--repo", repo).returncode == 0
    status_run(failed=False)
    assert len(mailbox.messages) == 2
    assert mailbox.messages[1]["Subject"].startswith("walvault: walvault_status recovered: ")

    # The limestone source goes on past its archive: epoch 45, written two hours after the archived rotation.
    rotated = max(float(p.name.split(".")[1]) / 1000 for p in ls.glob("epoch.*"))
    (ls / "epoch").write_bytes(RECORD.pack(DURABLE_EPOCH, 45))
    os.utime(ls / "epoch", (rotated + 2 * HOUR, rotated + 2 * HOUR))
    log = status_run(failed=True)
    assert len(mailbox.messages) == 3, log[-4000:]
    failure_mail(mailbox.messages[2], "ls", "walvault_status", "freshness_ls",
                 "FreshnessAlert: archive of ls behind by more than 60 minutes: 2h00m behind")
    assert "walvault freshness of tt: fresh" in log
