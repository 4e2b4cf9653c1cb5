"""Failure and recovery mail (walvault_provider.notifications), received by a real SMTP server on 127.0.0.1
(aiosmtpd) through the SMTP provider and an Airflow connection holding the server's login and password.

A failed task's mail names the source, the DAG, the task and the cause in its subject and first lines: a real
operator of a real DAG file fails on a real repository, with the callback context Airflow builds. The backup DAG
run by `airflow dags test` to a failure (one mail), to success (one recovery mail) and to success again (none):
test_dags' test_backup_from_the_form_and_on_schedule, which uses this file's mailbox and mail checks."""

from __future__ import annotations

import email
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from email.message import EmailMessage
from email.policy import default as email_policy

import pytest

from conftest import REPO
from walvault_provider.config import ConfigError, load


SOURCES = "sources: [{name: tt, family: tarantool, path: /x}]\n"
LOGIN, PASSWORD = "walvault", "smtp-password-from-the-connection"


@dataclass
class Mailbox:
    """What the SMTP server on 127.0.0.1 received, and the address an Airflow connection names it by."""
    port: int
    messages: list[EmailMessage] = field(default_factory=list)
    logins: list[tuple[str, str]] = field(default_factory=list)

    def connection(self) -> str:
        """An SMTP connection as Airflow's SMTP provider reads it (`AIRFLOW_CONN_<ID>`), plain SMTP on loopback."""
        return json.dumps({"conn_type": "smtp", "host": "127.0.0.1", "port": self.port, "login": LOGIN,
                           "password": PASSWORD, "extra": {"disable_tls": True, "disable_ssl": True,
                                                           "retry_limit": 0, "timeout": 30}})


def body_lines(message: EmailMessage) -> list[str]:
    """The mail's text lines (the SMTP provider sends HTML: ours is one <pre> block)."""
    return message.get_body(("html",)).get_content().removeprefix("<pre>\n").splitlines()


def failure_mail(message: EmailMessage, source: str, dag: str, task: str, cause: str) -> list[str]:
    """The lines of a failed task's mail, its subject and first lines checked: they name the source, the DAG, the
    task (its first try) and the cause, which starts with `cause`."""
    assert message["Subject"].startswith(f"walvault: {dag} {task} failed for {source}: {cause}"), message["Subject"]
    lines = body_lines(message)
    assert lines[:3] == [f"Source: {source}", f"DAG: {dag}", f"Task: {task} (try 1)"]
    assert lines[3].startswith(f"Cause: {cause}"), lines[3]
    return lines


@pytest.fixture
def mailbox():
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    from spark_jobs.cluster import free_port

    box = Mailbox(free_port())

    class Collect:
        async def handle_DATA(self, server, session, envelope):
            box.messages.append(email.message_from_bytes(envelope.content, policy=email_policy))
            return "250 OK"

    def authenticate(server, session, envelope, mechanism, auth_data):
        box.logins.append((auth_data.login.decode(), auth_data.password.decode()))
        return AuthResult(success=True)

    # AUTH without TLS: loopback only, so that the test sees which credentials the connection gave
    server = Controller(Collect(), hostname="127.0.0.1", port=box.port, auth_require_tls=False,
                        authenticator=authenticate)
    server.start()
    yield box
    server.stop()


@pytest.mark.parametrize("text, key", [
    ("notify: {smtp: {to: [a@example.com]}, events: [failure, paged]}", "notify.events[1]"),
    ("notify: {smtp: {to: [a@example.com]}, events: []}", "notify.events"),
    ("notify: {smtp: {to: [a@example.com]}, on: [failure]}", "notify.on"),  # YAML reads `on` as true
    ("notify: {smtp: {to: []}}", "notify.smtp.to"),
    ("notify: {smtp: {to: ['a@example.com, b@example.com']}}", "notify.smtp.to[0]"),
    ("notify: {smtp: {to: [a@example.com, a@example.com]}}", "notify.smtp.to[1]"),
    ("notify: {smtp: {to: [a@example.com], from: nobody}}", "notify.smtp.from"),
    ("notify: {smtp: {to: [a@example.com], connection: 'a b'}}", "notify.smtp.connection"),
    ("notify: {smtp: {to: [a@example.com], host: mail.example.com}}", "notify.smtp.host"),
    ("notify: {smtp: {to: [a@example.com], password: hunter2}}", "notify.smtp.password"),
    ("notify: {slack: {channel: ops}}", "notify.slack"),
    ("notify: {events: [failure]}", "notify.smtp"),
])
def test_every_notify_error_names_its_key(tmp_path, text, key):
    path = tmp_path / "walvault.yaml"
    path.write_text(SOURCES + text)
    with pytest.raises(ConfigError) as e:
        load(path)
    assert f"{path}: {key}:" in str(e.value)
    assert "hunter2" not in str(e.value)


def test_notify_defaults_and_none_without_it(tmp_path):
    path = tmp_path / "walvault.yaml"
    path.write_text(SOURCES + "notify: {smtp: {to: [oncall@example.com]}}")
    notify = load(path).notify
    assert notify.to == ("oncall@example.com",) and notify.events == {"failure", "recovery"}
    assert notify.connection == "smtp_default" and notify.sender is None, "the SMTP provider's defaults"
    path.write_text(SOURCES)
    assert load(path).notify is None
    assert load(REPO / "dags" / "walvault.yaml").notify is None, "the embedded defaults send no mail"


def callback_context(dag, task_id: str) -> dict:
    """The context of a task's callback, built as Airflow builds it where it runs callbacks outside the task's
    process (airflow/dag_processing/processor.py): a Task SDK RuntimeTaskInstance of the real task, its
    get_template_context(). Hand-built here: the DagRun a server would send."""
    from airflow.sdk.api.datamodels._generated import DagRun, TIRunContext
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    now = datetime.now(timezone.utc)
    run_id = f"manual__{now.isoformat()}"
    dag_run = DagRun(dag_id=dag.dag_id, run_id=run_id, logical_date=now, data_interval_start=now,
                     data_interval_end=now, run_after=now, start_date=now, end_date=None, run_type="manual",
                     state="running", consumed_asset_events=[], partition_key=None)
    ti = RuntimeTaskInstance.model_construct(id=uuid.uuid4(), task_id=task_id, dag_id=dag.dag_id, run_id=run_id,
                                             try_number=1, map_index=-1, dag_version_id=uuid.uuid4(),
                                             task=dag.task_dict[task_id], max_tries=0,
                                             _ti_context_from_server=TIRunContext.model_construct(dag_run=dag_run,
                                                                                                  max_tries=0))
    return ti.get_template_context()


def test_a_failed_tasks_mail_names_the_source_dag_task_and_cause(mailbox, tmp_path, monkeypatch):
    """The restore drill DAG file, parsed by Airflow's DagBag with `notify` configured: its drill of `tt` fails
    for real (no backup in the repository), and the task's failure callback sends the mail."""
    from airflow.dag_processing.dagbag import DagBag

    config = tmp_path / "walvault.yaml"
    config.write_text(f"""
sources: [{{name: tt, family: tarantool, path: {tmp_path / "tt"}}}]
repository: {{create: true}}
notify: {{smtp: {{connection: smtp_oncall, from: walvault@example.com, to: [oncall@example.com, dba@example.com]}}}}
""")
    monkeypatch.setenv("WALVAULT_CONFIG", str(config))
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_ONCALL", mailbox.connection())
    monkeypatch.setenv("AIRFLOW_CONN_WALVAULT_REPO", json.dumps({"conn_type": "walvault_repo",
                                                                 "extra": {"url": str(tmp_path / "repo")}}))
    bag = DagBag(dag_folder=str(REPO / "dags" / "walvault_restore_drill.py"))
    assert not bag.import_errors
    dag = bag.dags["walvault_restore_drill"]
    task = dag.task_dict["drill_tt"]
    context = callback_context(dag, "drill_tt")
    with pytest.raises(Exception) as failed:
        task.execute(context)
    context["exception"] = failed.value  # what the task runner adds to a failed task's context
    for callback in task.on_failure_callback:  # as the task runner calls them
        callback(context)

    (message,) = mailbox.messages
    cause = f"AirflowFailException: tt: no backup of {tmp_path / 'tt'} in {tmp_path / 'repo'} to drill"
    subject = message["Subject"]  # the cause's first line, up to 160 characters of it
    assert subject.endswith("...") and f"walvault: walvault_restore_drill drill_tt failed for tt: {cause}".startswith(
        subject.removesuffix("...")) and "failed for tt: AirflowFailException: tt: no backup of " in subject, subject
    assert body_lines(message)[:4] == ["Source: tt", "DAG: walvault_restore_drill", "Task: drill_tt (try 1)",
                                       f"Cause: {cause}"]
    assert message["From"] == "walvault@example.com" and message["To"] == "oncall@example.com, dba@example.com"
    assert mailbox.logins == [(LOGIN, PASSWORD)], "the login and password are the connection's"
