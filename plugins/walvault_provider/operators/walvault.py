"""walvault's operators: thin Airflow tasks over walcore's commands (walcore does the work; these read the
configuration and the repository connection, build the request the command line builds (walcore.requests) and
run it with walcore.frontend.outcome, log a readable summary as the last lines, and return what the next task or
the UI needs as XCom).

Importing this module has no side effects: the configuration is read and walcore is imported when a task runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from ..config import Runs
from ..notes import REASON_KEY


def flag(value, name: str) -> bool:
    """A templated yes/no ("{{ params.dry_run }}" renders "True"): anything but true or false is refused, so that a
    typo never means "delete" or "do not verify"."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise AirflowFailException(f"{name}: {value!r} is neither true nor false")
    return text == "true"


def _run_kind(dag_run) -> str:
    """"manual", "scheduled", "backfill", ...: the run type's value, whichever enum of Airflow's carries it."""
    return str(getattr(dag_run.run_type, "value", dag_run.run_type))


def late_minutes(dag_run, tolerance_minutes: float) -> float | None:
    """How many minutes after its time a scheduled run started, when that is more than `tolerance_minutes`: a
    catch-up (the latest interval, created at once on unpause, or after the scheduler was down); None for a
    run on time and for any run not scheduled."""
    from datetime import datetime, timezone

    if _run_kind(dag_run) != "scheduled":
        return None
    due = dag_run.data_interval_end or dag_run.run_after
    started = dag_run.start_date or datetime.now(timezone.utc)
    late = (started - due).total_seconds() / 60
    return late if late > tolerance_minutes else None


def retention_applies(dag_run, dry_run, tolerance_minutes: float) -> tuple[bool, str]:
    """Whether a retention run deletes, and why: a manual run with `dry_run` unticked, or a scheduled run on time.
    Anything else plans only: a manual dry run, a scheduled run that started late (a catch-up at unpause: so that
    unpausing, or a dry-run trigger with "unpause on trigger" ticked, never deletes), a backfill."""
    kind = _run_kind(dag_run)
    if kind == "manual":
        dry = flag(dry_run, "dry_run")
        return not dry, "a manual run with dry_run " + ("ticked: plan only" if dry else "unticked: applied")
    if kind == "scheduled":
        late = late_minutes(dag_run, tolerance_minutes)
        if late is None:
            return True, "a scheduled run on time: applied"
        return False, f"a catch-up run started {late:.0f} minutes late: plan only; the next on-time run applies"
    return False, f"a {kind} run: plan only (a scheduled run on time, or a manual one with dry_run unticked, applies)"


def _given(value) -> bool:
    """Whether a templated optional value was given: an empty form field renders "None" or nothing."""
    return value not in (None, "", "None")


def retention_window(dag_run, dry_run, days, as_of, config) -> tuple[bool, str, float | str, str | None]:
    """(apply, why, days, as_of) of a retention task: whether it deletes and why (retention_applies()), and the
    window it judges, the configured `retention.days` as of now, or a preview's `days` and `as_of` (a window
    other than the configured one, the plan as of another instant). A preview only plans: a run that would apply
    and is given either fails at once, so that nothing is ever deleted by a window nobody configured."""
    from walcore.requests import as_of_time
    from walcore.retention import check_days

    apply, why = retention_applies(dag_run, dry_run, config.late_after_minutes)
    preview = [name for name, value in (("days", days), ("as_of", as_of)) if _given(value)]
    if apply and preview:
        raise AirflowFailException(f"{' and '.join(preview)} are for previews (plan only), and this run would "
                                   f"apply ({why}): nothing expired; tick dry_run to preview, or clear them to apply")
    if _given(as_of) and as_of_time(str(as_of)) is None:
        raise AirflowFailException(f"as_of: {as_of!r} is not a time (ISO 8601 UTC, e.g. 2026-11-01T04:00:00Z)")
    if _given(days):
        try:
            check_days(days)
        except ValueError as e:
            raise AirflowFailException(f"days: {e}") from None
    return apply, why, days if _given(days) else config.retention_days, str(as_of) if _given(as_of) else None


def scheduled_backup_type(repo, source_path, full_every_days: float, now: float | None = None) -> str:
    """What a scheduled backup of a source is: full when it has no full backup finished within `full_every_days`
    (so that a chain stays short and a restore never needs more than that many days of incrementals), else an
    incremental on the newest."""
    import time

    from walcore.repository import stamp_seconds

    fulls = [stamp_seconds(m.finished) for m in repo.backups_of(source_path) if m.type == "full"]
    now = time.time() if now is None else now
    return "incremental" if fulls and now - max(fulls) < full_every_days * 86400 else "full"


@contextmanager
def verdicts() -> Iterator[None]:
    """walcore's verdicts fail the task at once (AirflowFailException: a retry would find the same): a refusal
    for what was found, a damaged stored object or manifest, an unsafe name, a configuration that cannot be used.
    Anything else (a lease held, the repository or a running Tarantool unreachable, a source that could not be
    checked) goes up as it is, and is retried as the DAG's default_args say."""
    from walcore.findings import Refused
    from walcore.repository import ObjectDamaged
    from walcore.repository.manifest import ManifestError
    from walcore.repository.storage import UnsafeName

    from ..config import ConfigError

    try:
        yield
    except Refused as e:
        if e.status == "cannot_check":
            raise
        raise AirflowFailException(str(e)) from e
    except (ObjectDamaged, ManifestError, UnsafeName, ConfigError) as e:
        raise AirflowFailException(f"{type(e).__name__}: {e}") from e


@contextmanager
def reason_kept(context) -> Iterator[None]:
    """Why a task failed (its exception, as its log's last line says it) or was skipped (the skip's message) kept as
    its XCom `reason`, where its run's note (walvault_provider.notes) reads it: the scheduler, which writes the
    note, never sees the exception. Nothing is kept without a task instance (an operator called outside a run), and
    failing to keep it never hides the failure itself."""
    try:
        yield
    except Exception as e:
        if context.get("ti") is not None:
            reason = str(e) if isinstance(e, AirflowSkipException) else f"{type(e).__name__}: {e}"
            try:
                context["ti"].xcom_push(key=REASON_KEY, value=reason)
            except Exception as lost:  # noqa: BLE001 - the task's own exception is what goes up
                import logging

                logging.getLogger("airflow.task").warning("the reason was not kept for the run's note: %s", lost)
        raise


def log_warnings(warnings: list[str], log=None) -> list[str]:
    """Each warning a walcore result carries logged at WARNING level (the UI's log view marks it) and returned as a
    summary line, so that a warning is never only inside a returned value."""
    import logging

    log = log or logging.getLogger("airflow.task")
    for warning in warnings:
        log.warning("walvault: warning: %s", warning)
    return [f"WARNING: {w}" for w in warnings]


def with_provider_defaults(operator: type, kwargs: dict) -> dict:
    """An operator's keyword arguments with walvault's defaults where neither the call nor the DAG's default_args
    (which Airflow hands each __init__ merged) name them: the owner `walvault`, and the class's docstring as the
    task's documentation in the UI."""
    defaults = kwargs.get("default_args") or {}
    for key, value in (("owner", Runs.owner), ("doc_md", operator.__doc__)):
        if key not in kwargs and key not in defaults:
            kwargs[key] = value
    return kwargs


class _WalvaultOperator(BaseOperator):
    """A walvault task (with_provider_defaults: its owner, its documentation). `work` is the task's work; a verdict
    fails it without a retry (verdicts())."""

    template_fields: Sequence[str] = ("config_path",)

    def __init__(self, *, config_path: str | None = None, repo_conn_id: str | None = None, **kwargs):
        super().__init__(**with_provider_defaults(type(self), kwargs))
        self.config_path = config_path
        self.repo_conn_id = repo_conn_id

    def execute(self, context):
        with reason_kept(context), verdicts():
            return self.work(context)

    def work(self, context):
        raise NotImplementedError

    def load_config(self):
        from ..config import load

        return load(self.config_path)

    def repository(self, config):
        """The repository, and what names it in a request (walcore.requests: `repo`, `repo_options`); created where
        there is none only when the configuration says `repository.create`."""
        from ..hooks.walvault import WalvaultRepoHook

        target, repo = WalvaultRepoHook(self.repo_conn_id or config.repository_connection).opened(
            create=config.repository_create)
        return repo, {"repo": target.url, "repo_options": target.options}

    def summary(self, title: str, lines: list[str], warnings: list[str] = ()) -> None:
        """What people read: the task log ends with this, its warnings first (each also logged at WARNING)."""
        lines = [*log_warnings(list(warnings), self.log), *lines]
        self.log.info("%s\n%s", title, "\n".join(f"  {line}" for line in lines) or "  (nothing)")


class WalvaultArchiveOperator(_WalvaultOperator):
    """Rotate each configured limestone source whose active pwal files hold `rotate_min_bytes` (every non-empty
    channel, with limestone's own names; never a directory a running limestone holds), then archive the sealed
    files of every source. A re-run of the same interval finds nothing new. Returns {"new": [paths archived now],
    "counts": {...}, "problems": [...]}: the new files are what the Spark verify job checks next. A problem (a
    source missing or refused, a damaged or conflicting file) never stops the other sources' archive; it fails the
    task at its end, or with `fail_on_problems=False` is only returned (the DAG fails its run after the verify).

    Templated: `config_path`."""

    def __init__(self, *, fail_on_problems: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.fail_on_problems = fail_on_problems

    def work(self, context):
        from pathlib import Path

        from walcore.frontend import outcome
        from walcore.limestone.layout import LiveError
        from walcore.requests import ArchiveRequest, RotateRequest
        from walcore.runner import LocalRunner

        config = self.load_config()
        repo, names_repo = self.repository(config)
        lines, problems = [], []
        for source in config.sources:
            if not source.path.is_dir():
                problems.append(f"{source.name}: {source.path} is not a directory")
                continue
            if source.family != "limestone":
                continue
            active = sum(p.stat().st_size for p in Path(source.path).glob("pwal_????"))
            if active < source.rotate_min_bytes:
                lines.append(f"{source.name}: {active:,} active bytes, below {source.rotate_min_bytes:,}: not rotated")
                continue
            try:
                renamed = outcome(RotateRequest(dir=source.path, min_bytes=1), LocalRunner()).renamed
            except LiveError as e:  # a running limestone holds it: its online backup rotates
                lines.append(f"{source.name}: not rotated: {e}")
                continue
            except (RuntimeError, OSError) as e:  # refused (damage, a name taken) or unreadable: said, not skipped
                problems.append(f"{source.name}: cannot rotate: {e}")
                continue
            lines.append(f"{source.name}: rotated {len(renamed)} files ({active:,} active bytes)")
        result = outcome(ArchiveRequest(paths=[s.path for s in config.sources if s.path.is_dir()], progress=False,
                                        **names_repo), LocalRunner())
        counts = {k: len(v) for k, v in result.to_json().items()}
        lines += [f"archived {counts['stored']} files, {counts['already']} already, {counts['expired']} expired "
                  f"before, {counts['not_sealed']} not sealed"]
        problems += [f"REFUSED {r['path']}: {r['findings'][0]['message'] if r['findings'] else ''}"
                     for r in result.refused]
        problems += [f"CONFLICT {c['path']}: kept as {c['kept_as']}" for c in result.conflicts]
        self.summary(f"walvault archive into {repo.display}", lines + problems)
        if problems and self.fail_on_problems:
            raise AirflowFailException(f"{len(problems)} problems (listed above); the other sources were archived")
        return {"new": result.stored, "counts": counts, "problems": problems}


class WalvaultVerifyOperator(_WalvaultOperator):
    """Verify one backup (`backup_id`: its id, or a backup's record as XCom, e.g. the backup DAG's `record` result,
    whose `id` it takes), or every backup, in the repository (walvault verify --repo): every stored object's size and
    SHA-256 and every link of its chain. Findings fail the task, each named in the summary.
    `enabled` (e.g. "{{ params.verify }}"): false skips the task. Its report is kept in the repository, as the CLI
    keeps it.

    Templated: `config_path`, `backup_id`, `enabled`."""

    template_fields: Sequence[str] = ("config_path", "backup_id", "enabled")

    def __init__(self, *, backup_id: str | dict | None = None, enabled: bool | str = True, **kwargs):
        super().__init__(**kwargs)
        self.backup_id = backup_id
        self.enabled = enabled

    def work(self, context):
        from walcore.frontend import outcome
        from walcore.requests import VerifyRequest
        from walcore.runner import LocalRunner

        if not flag(self.enabled, "enabled"):
            raise AirflowSkipException("verify after: unticked")
        if isinstance(self.backup_id, dict):  # a backup's record, one XCom value
            self.backup_id = self.backup_id["id"]
        repo, names_repo = self.repository(self.load_config())
        # its report is kept in the repository as the CLI keeps it (the log says where)
        report = outcome(VerifyRequest(backup=self.backup_id, **names_repo), LocalRunner())
        lines = [f"backup {b['id']}: {b['status']}" for b in report.backups]
        lines += [f"  {f['code']}: {f.get('file', '')} {f['message']}" for b in report.backups for f in b["findings"]]
        lines += [f"repository: {f['code']}: {f['message']}" for f in report.repository["findings"]]
        lines.append(f"{report.objects} objects, {report.bytes:,} bytes read")
        self.summary(f"walvault verify --repo {repo.display} {self.backup_id or '(every backup)'}", lines)
        if not report.intact:
            raise AirflowFailException(f"{self.backup_id or 'the repository'} does not verify: see the findings above")
        return {"id": self.backup_id, "intact": True, "objects": report.objects, "bytes": report.bytes}


class _SourceOperator(_WalvaultOperator):
    """An operator on one configured source (templated: `config_path`, `source`)."""

    template_fields: Sequence[str] = ("config_path", "source")

    def __init__(self, *, source: str, **kwargs):
        super().__init__(**kwargs)
        self.source = source

    @classmethod
    def per_source(cls, config, prefix: str, **kwargs) -> list:
        """One task per configured source, named `<prefix>_<source name>`."""
        return [cls(task_id=f"{prefix}_{s.name}", source=s.name, **kwargs) for s in config.sources]


class WalvaultSnapshotOperator(_SourceOperator):
    """Store and verify a covering snapshot of one configured source (walvault snapshot). Nothing new to fold (a
    limestone source whose archive has not moved) is not a failure: the snapshot that covers it is named. A lease
    another command holds is waited for `runs.lease_wait_minutes`, then the task fails to be retried.

    Templated: `config_path`, `source`."""

    def work(self, context):
        from walcore.backup_common import NothingNew
        from walcore.frontend import outcome
        from walcore.requests import SnapshotRequest
        from walcore.runner import LocalRunner

        from ..hooks.tarantool import TarantoolHook

        config = self.load_config()
        source = config.source(self.source)
        names_repo = self.repository(config)[1]
        connect = TarantoolHook(source.connection).uri() if source.connection else None
        request = SnapshotRequest(source=source.path, connect=connect, wait=config.runs.lease_wait, progress=False,
                                  **names_repo)
        try:
            result = outcome(request, LocalRunner())
        except NothingNew as e:
            self.summary(f"walvault snapshot of {source.name}", [str(e)])
            return {"id": None, "note": str(e)}
        m = result.manifest
        covers = m.checks.get("snapshot", {})
        self.summary(f"walvault snapshot of {source.name}", [
            f"snapshot {m.id} ({m.family} {m.instance}): {len(m.files)} files, {m.bytes:,} bytes",
            f"covers the log up to {m.position}" + (f", folding {len(covers.get('folded', []))} pwal files"
                                                    if m.family == "limestone" else "")], result.notes)
        return {"id": m.id, "position": m.position, "family": m.family, "instance": m.instance,
                "notes": result.notes}


class WalvaultConfirmOperator(_SourceOperator):
    """Confirm one configured source's coverage before its expiry: its anchor (the verified snapshot retention
    relies on) found, and its stored bytes re-hashed against its manifest (walvault expire's own check). Logs
    the source's plan as `walvault expire` says it (why it is uncovered, what goes and why, what is kept and
    why). Uncovered: the task is skipped, so its expiry is too; an anchor that does not re-hash fails it.
    Returns {"family", "instance", "anchor"}: what the expiry after it is restricted to. `dry_run`, `days` and
    `as_of` as its expiry takes them (retention_window(): a preview's window, refused by a run that applies).

    Templated: `config_path`, `source`, `dry_run`, `days`, `as_of`."""

    template_fields: Sequence[str] = ("config_path", "source", "dry_run", "days", "as_of")

    def __init__(self, *, dry_run: bool | str = True, days: float | str | None = None, as_of: str | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.dry_run = dry_run
        self.days = days
        self.as_of = as_of

    def work(self, context):
        from walcore.command.expire import confirm, render_source
        from walcore.requests import as_of_time

        config = self.load_config()
        days, as_of = retention_window(context["dag_run"], self.dry_run, self.days, self.as_of, config)[2:]
        source = config.source(self.source)
        repo = self.repository(config)[0]
        title = f"walvault expire: confirm the coverage of {source.name} ({source.path})"
        # The repository says which instance the source's backups are filed under: the source itself is not read
        # (a running limestone holds its directory; the worker may not see it).
        where = str(source.path.resolve())
        backups = repo.backups_of(source.path)
        if not backups:
            self.summary(title, [f"no backup of {where} in {repo.display}"])
            raise AirflowSkipException(f"{source.name} is not covered: nothing of it is expired")
        newest = max(backups, key=lambda m: (m.finished, m.id))
        plan, damaged = confirm(repo, newest.family, newest.instance, days, as_of_time(as_of) if as_of else None)
        # The instance's plan shows the anchor of its newest source; this source's own is the one confirmed.
        anchor = next((i["anchor"] for i in plan.identities if i["path"] == where), None)
        if anchor is None:
            self.summary(title, render_source(plan))
            raise AirflowSkipException(f"{source.name} is not covered: nothing of it is expired")
        if damaged:
            self.summary(title, [*render_source(plan), f"NOT CONFIRMED: the anchor {anchor['name']} is not "
                                 f"intact: {damaged}"])
            raise AirflowFailException(f"{source.name}: the anchor {anchor['name']} is not intact ({damaged}); "
                               "nothing of the source is expired")
        self.summary(title, [*render_source(plan), f"confirmed: the anchor {anchor['name']} re-hashed intact "
                             f"({len(plan.anchor_files)} objects)"])
        return {"family": plan.family, "instance": plan.instance, "anchor": anchor["name"]}


EVERY_SOURCE = "every source"  # WalvaultExpireOperator's scope when no confirmation restricts it


class WalvaultExpireOperator(_WalvaultOperator):
    """Retention under the configured recovery window (walvault expire), of the source `confirmed` names (the
    result of its WalvaultConfirmOperator) or, without it, of every source in the repository. Deletes only
    when retention_applies() says so (a manual run with `dry_run` unticked, a scheduled run on time), else
    plans. Returns the JSON of `walvault expire --json`; the log ends with what was (or would be) deleted and
    why, as the CLI says it. A source whose expiry stopped (a lease held past `runs.lease_wait_minutes`, the
    repository failing) fails the task to be retried.

    `days` and `as_of` (the plan as of that instant) are for previews: retention_window() fails a run that would
    apply with them.

    Templated: `config_path`, `dry_run`, `days`, `as_of`, `confirmed` (an XComArg: the task runs after it)."""

    template_fields: Sequence[str] = ("config_path", "dry_run", "days", "as_of", "confirmed")

    def __init__(self, *, dry_run: bool | str = True, days: float | str | None = None, as_of: str | None = None,
                 confirmed=EVERY_SOURCE, **kwargs):
        super().__init__(**kwargs)
        self.dry_run = dry_run
        self.days = days
        self.as_of = as_of
        self.confirmed = confirmed

    def work(self, context):
        from walcore.command.expire import render
        from walcore.frontend import outcome
        from walcore.requests import ExpireRequest
        from walcore.runner import LocalRunner

        only = None
        if self.confirmed != EVERY_SOURCE:
            if not isinstance(self.confirmed, dict) or not {"family", "instance"} <= self.confirmed.keys():
                # fail closed: a confirmation that did not arrive never widens the expiry to every source
                raise AirflowFailException(f"no confirmation to expire by (got {self.confirmed!r}): nothing expired")
            only = {(self.confirmed["family"], self.confirmed["instance"])}
        config = self.load_config()
        names_repo = self.repository(config)[1]
        apply, why, days, as_of = retention_window(context["dag_run"], self.dry_run, self.days, self.as_of, config)
        result = outcome(ExpireRequest(days=days, as_of=as_of, apply=apply, wait=config.runs.lease_wait, only=only,
                                       **names_repo), LocalRunner())
        self.summary(f"walvault expire ({why})",
                     render(result, "a manual run with dry_run unticked, or a scheduled run on time, applies it"),
                     result.warnings)
        if any(s.stopped for s in result.sources):  # a lease held, the repository failing: retried
            raise AirflowException("; ".join(f"{s.instance}: {s.stopped}" for s in result.sources if s.stopped))
        return result.to_json()


class WalvaultDrillOperator(_SourceOperator):
    """Restore the newest backup of one configured source into a scratch directory and prove it (walvault drill):
    every hash; Tarantool started on it at the recorded vclock where installed; limestone's checks and recorded
    counts. The verdict is recorded beside the backup, so `walvault backups` marks one whose drill failed.

    Templated: `config_path`, `source`."""

    def work(self, context):
        from walcore.frontend import outcome
        from walcore.requests import DrillRequest
        from walcore.runner import LocalRunner

        config = self.load_config()
        source = config.source(self.source)
        repo, names_repo = self.repository(config)
        backups = [m for m in repo.backups_of(source.path) if m.type != "snapshot"]
        if not backups:
            raise AirflowFailException(f"{source.name}: no backup of {source.path.resolve()} in {repo.display} to "
                                       "drill")
        newest = max(backups, key=lambda m: (m.finished, m.id))
        result = outcome(DrillRequest(backup=newest.id, **names_repo), LocalRunner())
        self.summary(f"walvault drill of {source.name}: backup {result.backup} {result.status.upper()}",
                     result.checks + ([f"PROBLEM: {result.problem}"] if result.problem else []))
        if result.status != "ok":  # the verdict is still the task's value: the run's note says it
            context["ti"].xcom_push(key="return_value", value=result.to_json())
            raise AirflowFailException(f"the drill of backup {result.backup} failed: {result.problem}")
        return result.to_json()
