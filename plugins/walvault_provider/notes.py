"""Each walvault DAG run's note: what the run did, where the UI shows a run first (its note, on the grid and the
run's page). Per source: a backup's id, files, bytes and position; a snapshot's id and position; retention's
deletions, what it kept and why; a drill's verdict; the archive's counts and problems; every warning a task found;
every task that failed, named by its source.

Airflow 3.3 gives task code no call that sets its run's note (the Task SDK's supervisor and the Execution API have
none: apache/airflow#64890), and a DAG's callbacks run in the DAG processor, where the database is closed to them
too. The public REST API's PATCH of a run sets it, but needs the api-server and a user's credentials, and `airflow
dags test` has neither. A DagRun listener (an Airflow plugin: plugins/walvault_plugin.py) needs nothing: Airflow
calls it where a run's end is decided, in the scheduler or in `airflow dags test`'s own loop, with the run's
database row, in the transaction that records its state. RunNotes writes the note there, from what the run's tasks
returned (their XCom `return_value`), how they ended, and why a task failed or was skipped (the reason a walvault
task keeps as its XCom `reason`: the scheduler never sees a task's exception); a note a person wrote (or the
trigger gave) is kept above it.

Importing this module has no side effects; of Airflow it imports only the listeners' hook marker.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow.listeners import hookimpl

NOTE_CHARS = 1000  # the dag_run_note table's content is a VARCHAR(1000)
HEADING = "**walvault**"  # begins the part of a note this module writes: a re-run replaces that part only
TAG = "walvault"  # the tag of the DAGs whose runs get a note
REASON_KEY = "reason"  # the XCom of a walvault task that failed or was skipped: why, as its exception says it
ENDED = {"success": "succeeded", "failed": "failed"}
MARKED = "manually set"  # in the listener's msg when a person set the run's state (the UI's "Mark run as ...")


@dataclass
class TaskOutcome:
    """One task instance of a run as its note says it: its id, its label (a mapped task's source), how it ended,
    what it returned (its XCom return_value; None when it returned nothing), and why it failed or was skipped."""
    task_id: str
    label: str | None
    state: str | None
    value: Any = None
    reason: str | None = None  # why it failed or was skipped (XCom REASON_KEY)

    @property
    def name(self) -> str:
        return self.task_id + (f" [{self.label}]" if self.label else "")


def warnings_of(result) -> list[str]:
    """What a walcore result warns of: an expiry's `warnings` (a clock behind the repository), a backup's or a
    snapshot's `notes` (the parent's newest xlog gone from the source, a manifest naming no instance)."""
    if not isinstance(result, dict):
        return []
    return [*(result.get("warnings") or []), *(result.get("notes") or [])]


def _backup(v: dict) -> list[str]:
    return [f"backup {v['id']} ({v['type']}): {v['files']} files, {v['bytes']:,} bytes, position {v['position']}"]


def _snapshot(v: dict) -> list[str]:
    if v.get("id") is None:
        return [f"no new snapshot: {v.get('note')}"]
    return [f"snapshot {v['id']}, position {v['position']}"]


def _expire(v: dict) -> list[str]:
    lines = []
    for s in v["sources"]:
        anchor = s["anchor"]
        why = f"anchor {anchor['name']}" if anchor else "uncovered: nothing deleted"
        kept = ", ".join(f"{n} {reason}" for reason, n in Counter(k["reason"] for k in s["keep"]).most_common())
        gone = f"deleted {s['deleted']}" if v["applied"] else f"would delete {len(s['delete'])} (plan only)"
        lines.append(f"{s['family']} {s['source']}: {gone}, kept {len(s['keep'])}"
                     + (f" ({kept})" if kept else "") + f"; {why}"
                     + (f"; blocked: {s['blocked']}" if s["blocked"] else "")
                     + (f"; STOPPED: {s['stopped']}" if s["stopped"] else ""))
    return lines


def _drill(v: dict) -> list[str]:
    return [f"drill of backup {v['backup']}: {v['status'].upper()}" + (f": {v['problem']}" if v.get("problem") else "")]


def _archive(v: dict) -> list[str]:
    c = v["counts"]
    return [f"archived {c['stored']} files, {c['already']} already, {c['not_sealed']} not sealed; "
            f"{len(v['problems'])} problems", *(f"PROBLEM {p}" for p in v["problems"])]


def _verified(v: dict) -> list[str]:
    return [f"Spark verified {v['files']} files, {v['damaged']} damaged"]


def _verify(v: dict) -> list[str]:
    return [f"backup {v['id']} verified intact: {v['objects']} objects, {v['bytes']:,} bytes"]


# What each walvault task's result says, by its task id without its group and source (`backup_source.record`,
# `snapshot_tt`, ...: the names the DAGs give them). A task not named here adds its warnings and its failure only.
EXPLAIN: dict[str, Callable[[dict], list[str]]] = {
    "record": _backup, "snapshot": _snapshot, "expire": _expire, "drill": _drill, "rotate_and_archive": _archive,
    "report": _verified, "verify": _verify}


def _kind(task_id: str) -> str:
    tail = task_id.rpartition(".")[2]
    return tail if tail in EXPLAIN else tail.split("_")[0]


def run_note(dag_id: str, state: str, tasks: list[TaskOutcome], marked: bool = False) -> str:
    """The note of a finished run: a heading (the DAG, how the run ended; `marked`: a person set its state, so its
    tasks' outcomes, not the heading, say what the work did), then a line per thing done, warning, task
    that failed or was skipped and why, each named by its task and source; last, the tasks skipped after those."""
    ended = ENDED.get(state, state)
    lines = [f"{HEADING} {dag_id}: the run " + (f"was marked {ended} by hand" if marked else ended)]
    for t in tasks:
        name = t.name
        explain = EXPLAIN.get(_kind(t.task_id))
        if explain is not None and isinstance(t.value, dict):
            try:
                lines += [f"- {name}: {line}" for line in explain(t.value)]
            except (KeyError, TypeError, ValueError) as e:  # a result of another shape: said, never fatal
                lines.append(f"- {name}: (its result could not be read: {type(e).__name__}: {e})")
        lines += [f"- WARNING {name}: {w}" for w in warnings_of(t.value)]
        if t.state == "failed":
            lines.append(f"- FAILED {name}: {t.reason or 'see its log'}")
        elif t.state == "skipped" and t.reason:
            lines.append(f"- skipped {name}: {t.reason}")
    skipped = [t.name for t in tasks if t.state == "skipped" and not t.reason]
    if skipped:
        lines.append("- skipped: " + ", ".join(skipped))
    return "\n".join(lines)


def with_note(existing: str | None, note: str) -> str:
    """The run's note with `note` as its walvault part: what a person wrote kept above it, an earlier walvault part
    (a run cleared and run again) replaced; cut to what the database holds."""
    kept = (existing or "").split(HEADING, 1)[0].rstrip()
    text = f"{kept}\n\n{note}" if kept else note
    return text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS - 4] + "\n..."


class RunNotes:
    """The DagRun listener writing a walvault run's note when it ends (succeeded or failed, a timeout included).
    Registered by the `walvault` Airflow plugin. Never fails the caller: Airflow logs a listener's error."""

    def _write(self, dag_run, msg: str) -> None:
        from sqlalchemy import select
        from sqlalchemy.orm import object_session

        from airflow import settings
        from airflow.models.dag import DagTag
        from airflow.models.xcom import XComModel

        # The scheduler hands the run in its session, which records the note with the run's state; `airflow dags
        # test` hands it detached from its session (the thread's), which commits what is merged into it.
        run, session = dag_run, object_session(dag_run)
        if session is None:
            session = settings.Session()
            run = session.merge(dag_run)
        tagged = session.scalar(select(DagTag.name).where(DagTag.dag_id == dag_run.dag_id, DagTag.name == TAG))
        if tagged is None:
            return
        xcoms = {(x.key, x.task_id, x.map_index): XComModel.deserialize_value(x) for x in session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id))}
        tis = sorted(dag_run.get_task_instances(session=session),
                     key=lambda ti: (ti.start_date is None, ti.start_date or 0, ti.task_id, ti.map_index))
        # a mapped group's task without a label of its own (the verify after a backup: its index) takes its group's
        labels = {(ti.task_id.rpartition(".")[0], ti.map_index): ti.rendered_map_index for ti in tis
                  if ti.map_index >= 0 and ti.rendered_map_index not in (None, "", str(ti.map_index))}
        tasks = [TaskOutcome(ti.task_id, labels.get((ti.task_id.rpartition(".")[0], ti.map_index), str(ti.map_index))
                             if ti.map_index >= 0 else None,
                             str(getattr(ti.state, "value", ti.state)),
                             xcoms.get(("return_value", ti.task_id, ti.map_index)),
                             xcoms.get((REASON_KEY, ti.task_id, ti.map_index)))
                 for ti in tis]
        state = str(getattr(dag_run.state, "value", dag_run.state))
        run.note = with_note(run.note, run_note(dag_run.dag_id, state, tasks, marked=MARKED in (msg or "")))

    @hookimpl
    def on_dag_run_success(self, dag_run, msg: str) -> None:
        self._write(dag_run, msg)

    @hookimpl
    def on_dag_run_failed(self, dag_run, msg: str) -> None:
        self._write(dag_run, msg)
