"""Mail when a task fails and when a DAG recovers, through Airflow's notifiers: the SMTP provider's SmtpNotifier
sends it, on the Airflow connection the configuration's `notify.smtp.connection` names (host, port, login,
password, TLS), so that no secret is in the configuration file. `dag_callbacks(config, default_args)` is what a DAG
file passes to `@dag`: its default_args alone when the configuration has no `notify`.

- failure: each failed task (its on_failure_callback: after its last try, so a retry sends nothing), one mail
  whose subject and first lines name the source, the DAG, the task and the cause (the exception's message);
  none for an exception whose `mail` is False (a freshness alert already mailed: operators/walvault.py);
- recovery: a DAG run that succeeded after the DAG's previous run failed (the DAG's on_success_callback), one mail.

Importing this module has no side effects: the SMTP provider is imported when a mail is sent.
"""

from __future__ import annotations

from html import escape

from airflow.sdk import BaseNotifier

SUBJECT_CAUSE_CHARS = 160  # the subject holds the cause's first line up to this; the body holds all of it


def dag_callbacks(config, default_args: dict) -> dict:
    """The `@dag` keyword arguments `default_args` (the DAG's own, config.runs) with the mail `config.notify` asks
    for: every task's on_failure_callback (in default_args) for `failure`, the DAG's on_success_callback for
    `recovery`."""
    notify = config.notify
    kwargs: dict = {"default_args": dict(default_args)}
    if notify is None:
        return kwargs
    if "failure" in notify.events:
        kwargs["default_args"]["on_failure_callback"] = WalvaultMailNotifier("failure", notify)
    if "recovery" in notify.events:
        kwargs["on_success_callback"] = WalvaultMailNotifier("recovery", notify)
    return kwargs


class WalvaultMailNotifier(BaseNotifier):
    """One mail per call of `event` (`failure`: a task's failure callback; `recovery`: a DAG's success callback,
    which sends nothing unless the DAG's previous run failed), to `notify.to` through the SMTP provider."""

    def __init__(self, event: str, notify):
        super().__init__()
        self.event = event
        self.settings = notify  # walvault_provider.config.Notify: where the mail goes

    def render_template_fields(self, context, jinja_env=None) -> None:
        """Nothing to render: the mail is built from the context, not templated. BaseNotifier would ask the context's
        DAG for its template environment first, which the serialized DAG `airflow dags test` gives DAG callbacks
        lacks (apache/airflow#64649)."""

    def notify(self, context) -> None:
        if self.event == "failure" and getattr(context.get("exception"), "mail", True) is False:
            return
        message = failure_message(context) if self.event == "failure" else recovery_message(context)
        if message is None:
            return
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        subject, lines = message
        SmtpNotifier(to=list(self.settings.to), from_email=self.settings.sender,
                     smtp_conn_id=self.settings.connection, subject=subject,
                     html_content=html_lines(lines)).notify(context)


def html_lines(lines: list[str]) -> str:
    """The body as the SMTP provider sends it (HTML), each line a line of the mail as read in plain text too."""
    return "<pre>\n" + "\n".join(escape(line) for line in lines) + "\n</pre>\n"


def source_of(context) -> str | None:
    """The configured source a task works for: a per-source operator's `source`, else a mapped task's label (the
    Spark jobs' mapped tasks are labelled by their plan, which the backup DAG names by source); None for a task of
    the whole run (a plan, an archive of every source, a teardown)."""
    return getattr(context["task"], "source", None) or getattr(context["ti"], "rendered_map_index", None) or None


def failure_message(context) -> tuple[str, list[str]]:
    """(subject, lines) of a failed task's mail: the source, the DAG, the task and the cause first."""
    ti = context["ti"]
    source = source_of(context)
    task = ti.task_id + (f"[{ti.map_index}]" if ti.map_index is not None and ti.map_index >= 0 else "")
    error = context.get("exception")
    if isinstance(error, BaseException):
        cause = f"{type(error).__name__}: {error}"
    else:  # a task stopped or lost without raising: Airflow gives a message, or nothing
        cause = str(error) if error else "the task failed without an exception (stopped or lost): see its log"
    first, *more = cause.strip().splitlines() or [cause]  # a header holds one line: a newline would end it
    short = first if len(first) <= SUBJECT_CAUSE_CHARS else first[:SUBJECT_CAUSE_CHARS - 3] + "..."
    subject = f"walvault: {ti.dag_id} {task} failed{f' for {source}' if source else ''}: {short}"
    lines = [f"Source: {source or 'none in particular (a task of the whole run)'}",
             f"DAG: {ti.dag_id}",
             f"Task: {task} (try {ti.try_number})",
             f"Cause: {first}",
             *more,
             "",
             f"Run: {ti.run_id}",
             f"Log: {ti.log_url}"]
    return subject, lines


def recovery_message(context) -> tuple[str, list[str]] | None:
    """(subject, lines) of a DAG's recovery mail, or None when the DAG's previous run did not fail."""
    previous = previous_run(context)
    if previous is None or previous.state != "failed":
        return None
    dag_id, run_id = context["dag"].dag_id, context["run_id"]
    subject = f"walvault: {dag_id} recovered: {run_id} succeeded after {previous.run_id} failed"
    lines = [f"DAG: {dag_id}",
             f"Run: {run_id} succeeded",
             f"Previous run: {previous.run_id} failed"]
    return subject, lines


def previous_run(context):
    """The DAG's run before this one (by logical date, as Airflow orders runs: its run_id and state), or None
    (none, or this run has no logical date, or no task of it ran). Where Airflow runs DAG callbacks (the DAG
    processor) it is asked of the Task SDK's supervisor; `airflow dags test` runs them in its own process, which
    has no supervisor but the metadata database, and there the Execution API's own query answers it."""
    from airflow.sdk.execution_time import task_runner

    ti, dag_run = context.get("ti"), context.get("dag_run")
    if ti is None or dag_run is None or dag_run.logical_date is None:
        return None
    if hasattr(task_runner, "SUPERVISOR_COMMS"):
        return ti.get_previous_dagrun()
    from airflow.api_fastapi.execution_api.routes.dag_runs import get_previous_dagrun
    from airflow.utils.session import create_session

    with create_session() as session:
        return get_previous_dagrun(dag_run.dag_id, dag_run.logical_date, session)
