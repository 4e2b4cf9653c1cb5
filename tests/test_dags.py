"""The DAGs, run by `airflow dags test` against a real metadata database (SQLite), real sources of both
families (a data dir written by real Tarantool, a real limestone fixture) and a repository on a local path; the
Spark verify job runs on local[2] through SparkSubmitOperator. What is checked is in the repository and in
the task logs, not only the exit code."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import tarantool_real as tr
from asset_runs import asset_triggered_test
from conftest import (REPO, airflow_sources, asset_events, last_run, new_repository, require_limestone,
                      require_tarantool, run_cli, run_main)
from devenv import environment, migrate
from forked_airflow import airflow

pytestmark = [require_tarantool, require_limestone]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    """An AIRFLOW_HOME with a migrated SQLite database, the DAGs and plugins of this checkout, the configuration
    naming two fresh sources and two Spark connections, and the connections (walvault_repo, spark_default on
    local[2]) in the environment (spark_cluster: the test that starts the cluster sets it)."""
    root = tmp_path_factory.mktemp("airflow")
    tt, ls, config = airflow_sources(root)
    repo = root / "repo"
    env = environment(root / "home", config=config, repository=str(repo), work_dir=root / "work")
    migrate(env)
    return {"env": env, "repo": repo, "tt": tt, "ls": ls, "root": root}


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


def test_the_dags_import_without_errors(airflow_env):
    proc = airflow(airflow_env["env"], "dags", "list-import-errors", "--local")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = airflow(airflow_env["env"], "dags", "list", "--local", "--output", "json")
    # Airflow logs to stdout too: the listing is the line holding the JSON array
    ids = {d["dag_id"] for d in json.loads(next(ln for ln in listed.stdout.splitlines() if ln.startswith("[{")))}
    assert {"walvault_archive", "walvault_backup", "walvault_snapshot", "walvault_retention", "walvault_status"} <= ids


def test_archive_snapshot_and_retention_dry_run(airflow_env):
    env, repo = airflow_env["env"], airflow_env["repo"]
    log = _dags_test(env, "walvault_archive")
    assert "walvault archive into" in log and "files verified by Spark, 0 damaged" in log
    summaries = [json.loads(p.read_text()) for p in repo.glob("reports/verify/*/summary.json")]
    assert len(summaries) == 1, "the Spark verify job keeps its report in the repository"
    rotated = list(airflow_env["ls"].glob("pwal_????.*"))
    assert rotated, "the limestone source was rotated under limestone's names"
    archived = {p.name.removesuffix(".zst.json") for p in repo.rglob("archive/**/*.zst.json")}
    assert {p.name for p in rotated} <= archived
    assert any(n.endswith(".xlog") for n in archived) and any(n.endswith(".snap") for n in archived)
    before = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if "reports" not in p.parts)
    log = _dags_test(env, "walvault_archive")  # the same interval again: nothing new
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


def test_backup_from_the_form_and_on_schedule(airflow_env):
    """A manual run with the form's params (source, type, verify), then an incremental of it. The first run's
    configuration names a second repository (`copy_to`): its backup, verified, is copied there."""
    env, repo, root = airflow_env["env"], airflow_env["repo"], airflow_env["root"]
    reports = set(repo.glob("reports/verify/*/summary.json"))
    config, second = root / "walvault-copy-to.yaml", new_repository(root / "second")
    config.write_text(Path(env["WALVAULT_CONFIG"]).read_text() + "copy_to: walvault_repo_copy\n")
    copying = {**env, "WALVAULT_CONFIG": str(config),
               "AIRFLOW_CONN_WALVAULT_REPO_COPY": json.dumps({"conn_type": "walvault_repo",
                                                              "extra": {"url": str(second)}})}
    log = _dags_test(copying, "walvault_backup", "--conf",
                     json.dumps({"source": "ls", "type": "full", "verify": True}))
    assert "walvault verify --repo" in log and ": ok" in log
    assert f"--to {second} (connection walvault_repo_copy)" in log and "copied backup " in log, log[-6000:]
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
    _dags_test(env, "walvault_backup", "--conf", json.dumps({"source": "tt", "type": "full", "verify": True}))
    _dags_test(env, "walvault_backup", "--conf", json.dumps({"source": "tt", "type": "incremental",
                                                              "verify": False}))
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
    submitted to yarn. (A failed backup's cause, note, assets and plan: test_notify's failed run.)"""
    env = {**airflow_env["env"], "WALVAULT_WORK_DIR": str(tmp_path / "work"),
           "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo",
                                                     "extra": {"url": str(tmp_path / "empty-repo")}})}
    proc = airflow(env, "dags", "test", "walvault_backup", "--conf",
                   json.dumps({"source": "ls", "type": "full", "verify": True, "spark": "spark_cluster"}))
    log = proc.stdout + proc.stderr
    assert "spark_cluster" in log and "isn't defined" in log, log[-3000:]
    assert "spark-submit" not in log, "nothing was submitted"


def test_a_missing_source_fails_the_archive_run_after_the_others_are_archived_and_verified(airflow_env, tmp_path):
    config = tmp_path / "walvault.yaml"
    config.write_text(f"""
sources:
  - {{name: tt, family: tarantool, path: {airflow_env["tt"]}}}
  - {{name: gone, family: limestone, path: {tmp_path / "gone"}}}
repository: {{create: true}}
""")
    repo = tmp_path / "repo"
    env = {**airflow_env["env"], "WALVAULT_CONFIG": str(config), "WALVAULT_WORK_DIR": str(tmp_path / "work"),
           "AIRFLOW_CONN_WALVAULT_REPO": json.dumps({"conn_type": "walvault_repo", "extra": {"url": str(repo)}})}
    proc = airflow(env, "dags", "test", "walvault_archive")
    log = proc.stdout + proc.stderr
    assert "DagRun failed" in log and f"gone: {tmp_path / 'gone'} is not a directory" in log, log[-3000:]
    archived = [p for p in repo.rglob("*.xlog.zst") if "archive" in p.parts]
    assert archived, "the other source was archived\n" + log[-6000:]
    assert "files verified by Spark, 0 damaged" in log, "and what was archived was verified before the run failed"
    assert list((tmp_path / "work").iterdir()) == [], "the teardown removed the run's work directory"


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
