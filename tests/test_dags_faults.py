"""The Airflow layer under the faults of issue 22: no deletion from a dry run or an unpause, coverage confirmed per
source before its expiry, a run stopped under its Spark job leaving no job running and no committed backup
unrecorded, no repository made by mistake. Real parts: `airflow dags test` on a migrated SQLite database, real
limestone sources, real spark-submit jobs, faketime. A failed walvault command failing the Spark task that ran it
(that task shown failed, walvault's own last lines in its log, no record task run): the first run of test_dags'
test_backup_from_the_form_and_on_schedule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from conftest import (REPO, copy_limestone_fixture, faketime_env, last_run, require_limestone, run_cli, tree_snapshot,
                      walvault_command)
from devenv import environment, migrate
from forked_airflow import airflow
from walcore.limestone.layout import exclusive_lock

pytestmark = [require_limestone]
DAYS_AGO = "-40d"  # older than the 30-day window: what an anchor taken then covers may expire now


def _aged(src: Path, repo: Path) -> dict:
    """rotate, archive and snapshot the source as if 40 days ago (faketime): its snapshot anchors the window."""
    for args in (["rotate", src], ["archive", src, "--repo", repo]):
        proc = subprocess.run([*walvault_command(), *map(str, args)], capture_output=True, text=True, timeout=120,
                              env=faketime_env(DAYS_AGO))
        assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([*walvault_command(), "snapshot", str(src), "--repo", str(repo), "--json"],
                          capture_output=True, text=True, timeout=120, env=faketime_env(DAYS_AGO))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def faults_env(tmp_path_factory):
    """Two limestone sources of two instances (`good`, `bad`), each archived and snapshotted 40 days ago, so that
    the 30-day window's expiry would delete their archived log; one stored object of `bad`'s anchor flipped. The
    repository exists already (repository.create: false)."""
    from walcore.repository import Repository

    root = tmp_path_factory.mktemp("dag-faults")
    good = copy_limestone_fixture("20-random-small", root / "sources", "good")
    bad = copy_limestone_fixture("01-clean", root / "sources", "bad")
    repo = root / "repo"
    Repository(str(repo), create=True)
    snapshots = {"good": _aged(good, repo), "bad": _aged(bad, repo)}
    anchor = Repository(str(repo)).load_backup("limestone", snapshots["bad"]["source"]["instance"],
                                               snapshots["bad"]["id"]).manifest
    damaged = repo / anchor.files[0].stored
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    config = root / "walvault.yaml"
    config.write_text(f"""
sources:
  - {{name: good, family: limestone, path: {good}}}
  - {{name: bad, family: limestone, path: {bad}}}
retention: {{days: 30}}
""")
    env = environment(root / "home", config=config, repository=str(repo), work_dir=root / "work")
    migrate(env)
    return {"env": env, "repo": repo, "root": root, "config": config, "snapshots": snapshots, "good": good,
            "instances": {k: v["source"]["instance"] for k, v in snapshots.items()}, "damaged": damaged}


def _source_tree(repo: Path, instance: str) -> dict:
    return tree_snapshot(repo / "limestone" / instance)


# -- retention: the decision, the order, the confirmed sources only


def _dag_run(run_type: str, due: datetime, started: datetime, events: tuple = ()):
    """A DagRun as a task's context carries it (the Task SDK's own model); `events`: (source DAG, when) of the asset
    events it consumed, each of a stored snapshot, or (source DAG, when, metadata)."""
    from airflow.sdk.api.datamodels._generated import AssetEventDagRunReference, DagRun

    consumed = [AssetEventDagRunReference(
        asset={"name": "walvault://walvault_repo/good/snapshot", "uri": "walvault://walvault_repo/good/snapshot",
               "extra": {}}, source_task_id=None, source_dag_id=dag_id, source_run_id=None,
        source_map_index=None, source_aliases=[], timestamp=when, extra=extra)
        for dag_id, when, extra in (e if len(e) == 3 else (*e, {"id": "20260101-021000S"}) for e in events)]
    return DagRun(dag_id="walvault_retention", run_id=f"{run_type}__{due.isoformat()}", logical_date=due,
                  data_interval_start=due, data_interval_end=due, run_after=due, start_date=started, end_date=None,
                  run_type=run_type, state="running", consumed_asset_events=consumed, partition_key=None)


def test_only_an_on_time_scheduled_run_or_an_unticked_manual_one_deletes():
    from airflow.sdk.exceptions import AirflowFailException

    from walvault_provider.operators.walvault import late_minutes, retention_applies

    due = datetime(2026, 1, 1, 4, 0, tzinfo=timezone.utc)
    on_time, late = due + timedelta(minutes=2), due + timedelta(days=300, minutes=7)
    assert retention_applies(_dag_run("scheduled", due, on_time), "True", 30) == \
        (True, "a scheduled run on time: applied")
    # the catch-up Airflow creates at once on unpause (catchup=False still runs the latest interval)
    applies, why = retention_applies(_dag_run("scheduled", due, late), "True", 30)
    assert not applies
    assert why == f"a catch-up run started {300 * 1440 + 7} minutes late: plan only; the next on-time run applies"
    assert retention_applies(_dag_run("scheduled", due, due + timedelta(minutes=31)), "False", 30)[0] is False
    assert retention_applies(_dag_run("scheduled", due, due + timedelta(minutes=29)), "False", 30)[0] is True
    assert retention_applies(_dag_run("manual", due, late), "True", 30) == \
        (False, "a manual run with dry_run ticked: plan only")
    assert retention_applies(_dag_run("manual", due, late), "False", 30)[0] is True
    assert retention_applies(_dag_run("backfill", due, on_time), "False", 30)[0] is False
    with pytest.raises(AirflowFailException, match="neither true nor false"):
        retention_applies(_dag_run("manual", due, on_time), "flase", 30)
    # the backup DAG's catch-up: skipped, a manual run never late
    assert round(late_minutes(_dag_run("scheduled", due, late), 30)) == 300 * 1440 + 7
    assert late_minutes(_dag_run("scheduled", due, on_time), 30) is None
    assert late_minutes(_dag_run("manual", due, late), 30) is None


def test_only_the_days_first_run_after_a_new_snapshot_deletes():
    """An asset-triggered run, the normal path now: it deletes when walvault_snapshot's events triggered it, it
    started within late_after_minutes of the newest, and no other run applied retention today (the day record).
    A second run of the day, a late one, one triggered by an event made by hand only plan; dry_run is not read."""
    from walvault_provider.operators.walvault import retention_applies

    snapshot_at = datetime(2026, 1, 1, 2, 10, tzinfo=timezone.utc)
    started = snapshot_at + timedelta(minutes=1)
    run = _dag_run("asset_triggered", started, started, events=[("walvault_snapshot", snapshot_at)])
    assert retention_applies(run, "True", 30) == (True, "the day's first run after a new snapshot: applied")
    assert retention_applies(run, "True", 30, applied_today="asset_triggered__earlier") == (
        False, "retention was applied today already (run asset_triggered__earlier): plan only; tomorrow's first "
               "snapshot (UTC) applies")
    late = _dag_run("asset_triggered", started, snapshot_at + timedelta(minutes=45),
                    events=[("walvault_snapshot", snapshot_at - timedelta(hours=5)), ("walvault_snapshot", snapshot_at)])
    assert retention_applies(late, "False", 30) == \
        (False, "a run started 45 minutes after its snapshot: plan only; the next snapshot's applies")
    by_hand = _dag_run("asset_triggered", started, started, events=[(None, snapshot_at)])
    assert retention_applies(by_hand, "False", 30) == (
        False, "a run triggered by no new snapshot (asset events walvault_snapshot did not make, made by hand, or of "
               "nothing new to fold): plan only")
    # walvault_snapshot's event of nothing new to fold (no snapshot id): a hand-made backup event may cause one
    nothing_new = _dag_run("asset_triggered", started, started,
                           events=[("walvault_snapshot", snapshot_at, {"id": None})])
    assert retention_applies(nothing_new, "False", 30)[0] is False
    assert retention_applies(_dag_run("asset_triggered", started, started), "False", 30)[0] is False
    # a deliberate manual apply is not bound by the day record
    assert retention_applies(_dag_run("manual", started, started), "False", 30, applied_today="x")[0] is True


def test_a_snapshot_run_follows_only_the_backups_walvault_backup_made():
    """An asset event made by hand (the REST API, the Assets view) on a backup asset snapshots nothing: it would
    otherwise start a snapshot run whose event starts retention."""
    from walvault_provider.assets import triggering_sources

    at = datetime(2026, 1, 1, 1, 30, tzinfo=timezone.utc)
    assert triggering_sources(_dag_run("asset_triggered", at, at, events=[("walvault_backup", at)])) == {"good"}
    assert triggering_sources(_dag_run("asset_triggered", at, at, events=[(None, at)])) == set()
    assert triggering_sources(_dag_run("manual", at, at)) is None


@pytest.mark.parametrize("confirmed", [None, {}, {"family": "limestone"}, "{{ nothing }}"])
def test_an_expiry_whose_confirmation_did_not_arrive_fails_before_any_work(confirmed):
    from airflow.sdk.exceptions import AirflowFailException
    from walvault_provider.operators.walvault import WalvaultExpireOperator

    operator = WalvaultExpireOperator(task_id="expire_x", confirmed=confirmed, config_path="/nonexistent.yaml")
    with pytest.raises(AirflowFailException, match="no confirmation to expire by"):
        operator.execute({})


def test_the_retention_dag_confirms_each_source_before_its_expiry(faults_env, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("WALVAULT_CONFIG", str(faults_env["config"]))
    bag = DagBag(dag_folder=str(REPO / "dags" / "walvault_retention.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["walvault_retention"]
    for name in ("good", "bad"):
        assert dag.get_task(f"expire_{name}").upstream_task_ids == {f"confirm_{name}"}
        assert dag.get_task(f"confirm_{name}").upstream_task_ids == set()


def test_the_forms_days_and_as_of_preview_and_a_run_that_applies_refuses_them(faults_env):
    """A preview (dry_run ticked) under another window as of another instant plans by them; the same with dry_run
    unticked fails at once, deleting nothing. Runs before the test that applies."""
    env, repo = faults_env["env"], faults_env["repo"]
    before = tree_snapshot(repo)
    as_of = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 86400))
    proc = airflow(env, "dags", "test", "walvault_retention", "--conf", json.dumps({"days": 7, "as_of": as_of}))
    log = proc.stdout + proc.stderr
    assert f"policy: keep every point of the last 7 days, as of {as_of}" in log, log[-4000:]
    assert "a manual run with dry_run ticked: plan only" in log and "plan only: " in log
    assert tree_snapshot(repo) == before
    _run, note, _xcoms = last_run(env, "walvault_retention")
    expired = next(line for line in note.splitlines() if line.startswith("- expire_good: limestone "))
    assert " (plan only), kept " in expired and "; anchor " in expired, note

    proc = airflow(env, "dags", "test", "walvault_retention", "--conf", json.dumps({"dry_run": False, "days": 7}))
    log = proc.stdout + proc.stderr
    assert "DagRun failed" in log, log[-4000:]
    assert ("days are for previews (plan only), and this run would apply (a manual run with dry_run unticked: "
            "applied): nothing expired") in log, log[-4000:]
    assert tree_snapshot(repo) == before, "a run that would apply with the preview's fields deleted something"
    _run, note, _xcoms = last_run(env, "walvault_retention")
    assert "- FAILED confirm_good: AirflowFailException: days are for previews" in note, note


def test_a_manual_dry_run_deletes_nothing_and_only_confirmed_sources_expire(faults_env):
    env, repo, instances = faults_env["env"], faults_env["repo"], faults_env["instances"]
    before = tree_snapshot(repo)
    proc = airflow(env, "dags", "test", "walvault_retention")  # the form's default: dry_run ticked
    log = proc.stdout + proc.stderr
    assert tree_snapshot(repo) == before, "a dry run deleted something\n" + log[-4000:]
    assert "a manual run with dry_run ticked: plan only" in log, log[-4000:]
    assert "plan only: 5 to delete, nothing was changed" in log, "good's plan, as the CLI says it"
    assert "covered by " in log and "keep " in log, "each deletion's and each kept file's reason"
    assert f"NOT CONFIRMED: the anchor {faults_env['snapshots']['bad']['id']} is not intact" in log
    assert "DagRun failed" in log, "a source whose coverage cannot be confirmed fails the run"
    _run, note, _xcoms = last_run(env, "walvault_retention")  # per source: what would go, what is kept and why
    assert f"- expire_good: limestone {instances['good']}: would delete 5 (plan only), kept " in note, note
    assert (f"- FAILED confirm_bad: AirflowFailException: bad: the anchor {faults_env['snapshots']['bad']['id']} "
            "is not intact") in note, note

    bad_before = _source_tree(repo, instances["bad"])
    with exclusive_lock(faults_env["good"]):  # a running limestone holds its directory: confirmed from the repository
        proc = airflow(env, "dags", "test", "walvault_retention", "--conf", json.dumps({"dry_run": False}))
    log = proc.stdout + proc.stderr
    assert "a manual run with dry_run unticked: applied" in log and "5 deleted" in log, log[-4000:]
    good_archive = sorted(p.name for p in (repo / "limestone" / instances["good"] / "archive").iterdir())
    assert not [n for n in good_archive if n.startswith(("pwal_", "epoch.")) and n.endswith(".zst")], \
        "good's covered log expired"
    assert any(n.endswith(".zst") for n in good_archive), "what retention does not delete stays"
    assert _source_tree(repo, instances["bad"]) == bad_before, "the unconfirmed source is not expired"
    assert "DagRun failed" in log


def test_a_snapshot_triggered_run_deletes_at_most_once_a_day(faults_env):
    """After the manual apply above took today for good, today's snapshot-triggered run only plans; tomorrow's
    first one applies (writing the day record in good's snapshot asset), its second only plans; a run an event
    made by hand triggered never applies."""
    from datetime import datetime, timedelta, timezone

    from asset_runs import asset_triggered_test

    env, good = faults_env["env"], "walvault://walvault_repo/good/snapshot"

    def run(made_by: str, at=None) -> str:
        proc = asset_triggered_test(env, "walvault_retention", [good], made_by=made_by, at=at)
        log = proc.stdout + proc.stderr
        assert "asset-triggered run asset_triggered__" in log and "starting task_id=expire_good" in log, log[-4000:]
        return log

    assert "walvault expire (retention was applied today already (run manual__" in run("walvault_snapshot")
    assert "walvault expire (a run triggered by no new snapshot (asset events walvault_snapshot did not make, " \
           "made by hand, or of nothing new to fold): plan only)" in run("hand")
    tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
    assert "walvault expire (the day's first run after a new snapshot: applied)" in run("walvault_snapshot", tomorrow)
    log = run("walvault_snapshot", tomorrow + timedelta(minutes=5))
    first = "asset_triggered__" + tomorrow.isoformat()[:10]
    assert f"walvault expire (retention was applied today already (run {first}" in log, log[-4000:]


# -- the teardown: a run stopped under its job


def _spark_job(plan_arg: str, log: Path) -> subprocess.Popen:
    from spark_jobs.submit import spark_submit
    from walvault_provider.spark import application

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable}
    with open(log, "wb") as out:
        return subprocess.Popen([spark_submit(), "--master", "local[1]", "--name", "walvault-backup",
                                 application("backup"), plan_arg], stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)


def test_the_teardown_stops_a_running_job_before_its_directory_goes_and_records_a_committed_backup(
        tmp_path, monkeypatch, capsys):
    """Two jobs of one run, as spark-submit runs them: one backed up its source (but no task read its result),
    the other waits for its source's lease, held here. The teardown stops the waiting job's whole tree, records
    the committed backup, removes the directories, and fails (the run was stopped under a job)."""
    import psutil

    from walcore.family import plan_for
    from walcore.repository import Repository
    from walvault_provider.spark import StoppedJobs, clean_up, work_dir, write_plan

    monkeypatch.setenv("WALVAULT_WORK_DIR", str(tmp_path / "work"))
    repo = tmp_path / "repo"
    done_src = copy_limestone_fixture("20-random-small", tmp_path / "sources", "done")
    waiting_src = copy_limestone_fixture("01-clean", tmp_path / "sources", "waiting")
    run_id = "manual__2026-01-01T00:00:00+00:00"
    plans = {name: write_plan(work_dir(run_id, f"backup-{name}"),
                              {"job": "backup", "sources": [str(src)], "repo": str(repo),
                               "options": {"type": "full", "json": True, "wait": 3600.0}})
             for name, src in (("done", done_src), ("waiting", waiting_src))}
    held = Repository(str(repo), create=True).lease("limestone", plan_for(waiting_src).instance, "test")
    with held:
        waiting = _spark_job(plans["waiting"], tmp_path / "waiting.log")
        try:
            done = _spark_job(plans["done"], tmp_path / "done.log")
            assert done.wait(300) == 0, (tmp_path / "done.log").read_text()[-3000:]
            deadline = time.monotonic() + 120  # until the waiting job's Python driver runs (it waits on the lease)
            while not any("python" in p.name() for p in psutil.Process(waiting.pid).children(recursive=True)):
                assert waiting.poll() is None and time.monotonic() < deadline, \
                    (tmp_path / "waiting.log").read_text()[-3000:]
                time.sleep(0.5)
            tree = [waiting.pid, *(p.pid for p in psutil.Process(waiting.pid).children(recursive=True))]
            with pytest.raises(StoppedJobs, match="were still running"):
                clean_up(run_id)
            assert waiting.wait(5) is not None
            assert not [pid for pid in tree if psutil.pid_exists(pid)
                        and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], "the job's tree is stopped"
            assert list((tmp_path / "work").iterdir()) == []
        finally:
            if waiting.poll() is None:
                os.killpg(waiting.pid, 9)
                waiting.wait()
    listed = json.loads(run_cli("backups", "--repo", repo, "--json").stdout)["backups"]
    assert [b["source"] for b in listed] == [plan_for(done_src).instance], "the stopped job committed nothing"
    # recorded (the log; XCom `committed` in a task) from what the job left, read before its directory went
    assert f"walvault backup {listed[0]['id']} of limestone {listed[0]['source']} ({done_src}) was committed " \
        "by this run" in capsys.readouterr().out


def test_repository_create_is_false_unless_the_configuration_says_so(tmp_path, monkeypatch):
    from walvault_provider.config import ConfigError, parse
    from walvault_provider.hooks.walvault import RepositoryMissing, WalvaultRepoHook

    source = {"name": "s", "family": "limestone", "path": "s"}
    assert parse({"sources": [source]}, tmp_path / "c.yaml").repository_create is False
    assert parse({"sources": [source], "repository": {"create": True}}, tmp_path / "c.yaml").repository_create
    with pytest.raises(ConfigError, match="repository.create: 'yes' is neither true nor false"):
        parse({"sources": [source], "repository": {"create": "yes"}}, tmp_path / "c.yaml")
    assert parse({"sources": [source], "schedules": {"late_after_minutes": 5}}, tmp_path / "c.yaml") \
        .late_after_minutes == 5
    with pytest.raises(ConfigError, match="schedules.late_after_minutes"):
        parse({"sources": [source], "schedules": {"late_after_minutes": 0}}, tmp_path / "c.yaml")
    typo = tmp_path / "bakups"
    monkeypatch.setenv("AIRFLOW_CONN_WALVAULT_REPO", json.dumps({"conn_type": "walvault_repo",
                                                                 "extra": {"url": str(typo)}}))
    with pytest.raises(RepositoryMissing, match=r"holds no walvault repository: create it with `walvault init "
                                                r"--repo .*bakups`"):
        WalvaultRepoHook().repository()
    assert not typo.exists(), "a mistyped path did not become a repository"
    WalvaultRepoHook().repository(create=True)
    assert (typo / "walvault.repo").exists()
