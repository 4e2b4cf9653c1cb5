"""What the UI explains, decided without running a DAG: each run's note (walvault_provider.notes) from what its
tasks returned, warnings logged at WARNING and in the summary, one XCom value per task, the retention form's
preview fields refused by a run that applies, and operators that document their templated fields. The notes
written into a real run's row (the listener, through `airflow dags test`) are in test_dags.py and
test_dags_faults.py."""

from __future__ import annotations

import inspect
import logging
import re
from datetime import datetime, timedelta, timezone

import pytest

from conftest import REPO

BACKUP = {"id": "20261127-101500F", "type": "full", "family": "tarantool", "files": 4, "bytes": 123456,
          "position": "{1: 20}", "notes": ["the parent's newest xlog 00000000000000000020.xlog is gone from the "
                                            "source: the log between the backups is in the archive only"]}
EXPIRE = {"policy": {"days": 30}, "as_of": "2026-11-27T04:00:00Z", "applied": True, "deleted": 2, "audit": None,
          "warnings": [], "sources": [
              {"source": "ls-1", "family": "limestone", "anchor": {"name": "20261020-040000S"}, "identities": [],
               "delete": [{"path": "a"}, {"path": "b"}], "deleted": 2, "blocked": None, "stopped": None,
               "keep": [{"reason": "in the window"}, {"reason": "in the window"},
                        {"reason": "the anchor's own"}]}]}


def test_a_runs_note_says_what_each_task_did_by_source_with_its_warnings_and_failures():
    from walvault_provider.notes import TaskOutcome, run_note

    note = run_note("walvault_backup", "failed", [
        TaskOutcome("plan", None, "success", "@/work/plan.json"),
        TaskOutcome("backup_source.record", "tt", "success", BACKUP),
        TaskOutcome("backup_source.verify", "tt", "success", {"id": BACKUP["id"], "intact": True, "objects": 4,
                                                              "bytes": 123456}),
        TaskOutcome("backup_source.spark_backup", "ls", "failed", None,
                    "AirflowFailException: walvault exited 1: take a full backup first"),
        TaskOutcome("backup_source.record", "ls", "upstream_failed")])
    assert note.splitlines() == [
        "**walvault** walvault_backup: the run failed",
        "- backup_source.record [tt]: backup 20261127-101500F (full): 4 files, 123,456 bytes, position {1: 20}",
        f"- WARNING backup_source.record [tt]: {BACKUP['notes'][0]}",
        "- backup_source.verify [tt]: backup 20261127-101500F verified intact: 4 objects, 123,456 bytes",
        "- FAILED backup_source.spark_backup [ls]: AirflowFailException: walvault exited 1: take a full backup first"]

    note = run_note("walvault_retention", "success", [
        TaskOutcome("confirm_ls", None, "success", {"family": "limestone", "instance": "ls-1", "anchor": "x"}),
        TaskOutcome("expire_ls", None, "success", EXPIRE),
        TaskOutcome("confirm_tt", None, "skipped", None, "tt is not covered: nothing of it is expired"),
        TaskOutcome("expire_tt", None, "skipped")])
    assert "- expire_ls: limestone ls-1: deleted 2, kept 3 (2 in the window, 1 the anchor's own); anchor " \
           "20261020-040000S" in note.splitlines()
    assert note.splitlines()[-2:] == ["- skipped confirm_tt: tt is not covered: nothing of it is expired",
                                      "- skipped: expire_tt"]
    plan = {**EXPIRE, "applied": False, "warnings": ["the clock of this host is behind the repository"]}
    note = run_note("walvault_retention", "success", [TaskOutcome("expire_ls", None, "success", plan)])
    assert "would delete 2 (plan only), kept 3" in note
    assert "- WARNING expire_ls: the clock of this host is behind the repository" in note

    note = run_note("walvault_snapshot", "success", [
        TaskOutcome("snapshot_tt", None, "success", {"id": "20261127-020000S", "position": "{1: 20}",
                                                     "family": "tarantool", "instance": "i", "notes": []}),
        TaskOutcome("snapshot_ls", None, "success", {"id": None, "note": "nothing new to fold"})])
    assert "- snapshot_tt: snapshot 20261127-020000S, position {1: 20}" in note
    assert "- snapshot_ls: no new snapshot: nothing new to fold" in note
    note = run_note("walvault_restore_drill", "failed", [
        TaskOutcome("drill_ls", None, "failed", {"backup": "B", "status": "failed", "problem": "a count differs",
                                                 "family": "limestone", "instance": "i", "checks": []},
                    "AirflowFailException: the drill of backup B failed: a count differs")])
    assert "- drill_ls: drill of backup B: FAILED: a count differs" in note
    note = run_note("walvault_archive", "failed", [
        TaskOutcome("rotate_and_archive", None, "success", {"new": [], "problems": ["gone: /x is not a directory"],
                                                            "counts": {"stored": 3, "already": 1, "expired": 0,
                                                                       "not_sealed": 2, "refused": 0}}),
        TaskOutcome("report", None, "success", {"files": 3, "damaged": 0})])
    assert "- rotate_and_archive: archived 3 files, 1 already, 2 not sealed; 1 problems" in note
    assert "- rotate_and_archive: PROBLEM gone: /x is not a directory" in note
    assert "- report: Spark verified 3 files, 0 damaged" in note


def test_a_run_a_person_marked_says_so_not_that_it_succeeded():
    """The UI's "Mark run as success" keeps a failed task failed and calls the listener with "manually set": the
    note must not read as if the work succeeded."""
    from walvault_provider.notes import RunNotes, TaskOutcome, run_note

    failed = TaskOutcome("backup_source.spark_backup", "tt", "failed", None, "AirflowFailException: DAMAGED")
    note = run_note("walvault_backup", "success", [failed], marked=True)
    assert note.splitlines() == ["**walvault** walvault_backup: the run was marked succeeded by hand",
                                 "- FAILED backup_source.spark_backup [tt]: AirflowFailException: DAMAGED"]
    written = []
    notes = RunNotes()
    notes._write = lambda dag_run, msg: written.append(msg)
    notes.on_dag_run_success(dag_run=None, msg="Dag Run's state was manually set to `success`.")
    assert written == ["Dag Run's state was manually set to `success`."]


def test_a_result_of_another_shape_is_said_not_fatal():
    from walvault_provider.notes import TaskOutcome, run_note

    note = run_note("walvault_snapshot", "success", [TaskOutcome("snapshot_x", None, "success", {"id": "S"})])
    assert "- snapshot_x: (its result could not be read: KeyError: 'position')" in note


def test_the_note_keeps_what_a_person_wrote_replaces_its_own_and_fits_the_database():
    from walvault_provider.notes import HEADING, NOTE_CHARS, with_note

    ours = f"{HEADING} walvault_backup: the run succeeded\n- a line"
    assert with_note(None, ours) == ours
    assert with_note("asked by Ann for the audit", ours) == f"asked by Ann for the audit\n\n{ours}"
    again = with_note(with_note("asked by Ann", f"{HEADING} old"), ours)
    assert again == f"asked by Ann\n\n{ours}", "a re-run replaces the walvault part, keeps the person's"
    long = with_note(None, ours + "\n- x" * 600)
    assert len(long) == NOTE_CHARS and long.endswith("\n...")


def test_warnings_are_logged_at_warning_level_and_returned_as_summary_lines(caplog):
    from walvault_provider.notes import warnings_of
    from walvault_provider.operators.walvault import log_warnings

    assert warnings_of(BACKUP) == BACKUP["notes"] and warnings_of({"warnings": ["w"], "notes": []}) == ["w"]
    assert warnings_of(None) == [] and warnings_of("@plan") == []
    with caplog.at_level(logging.WARNING, logger="airflow.task"):
        lines = log_warnings(warnings_of(BACKUP))
    assert lines == [f"WARNING: {BACKUP['notes'][0]}"]
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"walvault: warning: {BACKUP['notes'][0]}")]


def test_an_operators_summary_leads_with_its_warnings(capsys):
    """As the task log shows them (Airflow's structlog console lines): the warning at its level, then the summary."""
    from walvault_provider.operators.walvault import WalvaultSnapshotOperator

    operator = WalvaultSnapshotOperator(task_id="snapshot_tt", source="tt")
    operator.summary("walvault snapshot of tt", ["snapshot S"], ["the parent's newest xlog is gone"])
    out = capsys.readouterr().out
    warned = out.index("[warning  ] walvault: warning: the parent's newest xlog is gone")
    assert out.index("[info     ] walvault snapshot of tt\n  WARNING: the parent's newest xlog is gone\n"
                     "  snapshot S") > warned, out


def _dag_run(run_type: str, started: datetime):
    from airflow.sdk.api.datamodels._generated import DagRun

    due = started - timedelta(minutes=2)
    return DagRun(dag_id="walvault_retention", run_id=f"{run_type}__{due.isoformat()}", logical_date=due,
                  data_interval_start=due, data_interval_end=due, run_after=due, start_date=started, end_date=None,
                  run_type=run_type, state="running", consumed_asset_events=[], partition_key=None)


def test_the_forms_days_and_as_of_only_preview():
    from airflow.sdk.exceptions import AirflowFailException

    from walvault_provider.config import load
    from walvault_provider.operators.walvault import retention_window

    config = load(REPO / "dags" / "walvault.yaml")
    now = datetime.now(timezone.utc)
    manual, scheduled = _dag_run("manual", now), _dag_run("scheduled", now)
    # what the form gives an empty field: "None"
    assert retention_window(manual, "True", "None", "None", config) == \
        (False, "a manual run with dry_run ticked: plan only", config.retention_days, None)
    assert retention_window(manual, "True", "7", "2026-11-01T04:00:00Z", config)[2:] == ("7", "2026-11-01T04:00:00Z")
    assert retention_window(scheduled, "True", None, "", config)[:3] == \
        (True, "a scheduled run on time: applied", config.retention_days)
    for run, dry_run, days, as_of, named in ((manual, "False", "7", "None", "days"),
                                             (scheduled, "True", "None", "2026-11-01T04:00:00Z", "as_of"),
                                             (manual, "False", 7, "2026-11-01T04:00:00Z", "days and as_of")):
        with pytest.raises(AirflowFailException) as refused:
            retention_window(run, dry_run, days, as_of, config)
        assert str(refused.value).startswith(f"{named} are for previews (plan only), and this run would apply")
        assert "nothing expired" in str(refused.value)
    with pytest.raises(AirflowFailException, match="as_of: 'yesterday' is not a time"):
        retention_window(manual, "True", "None", "yesterday", config)
    with pytest.raises(AirflowFailException, match="days: the window '0.5' is below one day"):
        retention_window(manual, "True", "0.5", "None", config)


def test_the_retention_form_offers_days_and_as_of_with_descriptions(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("WALVAULT_CONFIG", raising=False)
    bag = DagBag(dag_folder=str(REPO / "dags" / "walvault_retention.py"))
    assert not bag.import_errors, bag.import_errors
    params = bag.dags["walvault_retention"].params
    assert {"dry_run", "days", "as_of"} <= set(params)
    for name in ("days", "as_of"):
        param = params.get_param(name)
        assert param.value is None and param.description.startswith("preview only: "), name
        assert "refuses it" in param.description, name
    for task in bag.dags["walvault_retention"].tasks:
        assert (task.days, task.as_of, task.dry_run) == ("{{ params.days }}", "{{ params.as_of }}",
                                                         "{{ params.dry_run }}"), task.task_id


def test_every_task_returns_one_xcom_value(monkeypatch):
    """A TaskFlow task annotated `-> dict` would have its dict split into one XCom per key besides its value."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("WALVAULT_CONFIG", raising=False)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    tasks = [(dag.dag_id, t) for dag in bag.dags.values() for t in dag.tasks]
    assert any(t.task_id == "backup_source.record" for _, t in tasks)
    assert [(d, t.task_id) for d, t in tasks if getattr(t, "multiple_outputs", False)] == []


def test_each_operator_documents_itself_and_names_its_templated_fields():
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk import BaseOperator

    from walvault_provider.operators import spark, walvault

    operators = [cls for module in (walvault, spark) for cls in vars(module).values()
                 if inspect.isclass(cls) and issubclass(cls, BaseOperator) and cls.__module__ == module.__name__
                 and not cls.__name__.startswith("_")]
    assert len(operators) == 10
    for cls in operators:
        doc = inspect.getdoc(cls)
        assert "\nTemplated: " in doc, cls.__name__
        named = set(re.findall(r"`(\w+)`", doc.rsplit("\nTemplated: ", 1)[1]))
        own = set(cls.template_fields) - set(getattr(SparkSubmitOperator, "template_fields", ()) if
                                            issubclass(cls, SparkSubmitOperator) else ())
        assert own <= named, (cls.__name__, own - named)
    assert "SparkSubmitOperator's own fields" in spark.WalvaultSparkSubmitOperator.__doc__
