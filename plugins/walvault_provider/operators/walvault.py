"""walvault's operators: thin Airflow tasks over walcore's commands (walcore does the work; these read the
configuration and the repository connection, build the request the command line builds (walcore.requests) and
run it with walcore.frontend.outcome, log a readable summary as the last lines, and return what the next task or
the UI needs as XCom).

Importing this module has no side effects: the configuration is read and walcore is imported when a task runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from airflow.sdk import Asset, BaseOperator
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
    if _run_kind(dag_run) != "scheduled":
        return None
    due = dag_run.data_interval_end or dag_run.run_after
    late = (_started(dag_run) - due).total_seconds() / 60
    return late if late > tolerance_minutes else None


def _started(dag_run):
    from datetime import datetime, timezone

    return dag_run.start_date or datetime.now(timezone.utc)


SNAPSHOT_DAG = "walvault_snapshot"  # the DAG whose asset events trigger a retention run that may delete


def retention_applies(dag_run, dry_run, tolerance_minutes: float, applied_today: str | None = None
                      ) -> tuple[bool, str]:
    """Whether a retention run deletes, and why: a manual run with `dry_run` unticked, a scheduled run on time, or
    the day's run triggered by a new snapshot: an asset-triggered run whose events walvault_snapshot made of a
    snapshot it stored, started within `tolerance_minutes` of the newest, when no other run applied retention today
    (`applied_today`: the run that did, from the day record). Anything else plans only: a manual dry run, a
    scheduled run that started late (a catch-up at unpause: so that unpausing, or a dry-run trigger with "unpause
    on trigger" ticked, never deletes), a second asset-triggered run of the day, one triggered by an asset event
    made by hand or of nothing new, a backfill."""
    kind = _run_kind(dag_run)
    if kind == "asset_triggered":
        # a new snapshot: an event walvault_snapshot made of a snapshot it stored (not one of "nothing new to fold")
        made = [e.timestamp for e in dag_run.consumed_asset_events
                if e.source_dag_id == SNAPSHOT_DAG and (e.extra or {}).get("id")]
        if not made:
            return False, (f"a run triggered by no new snapshot (asset events {SNAPSHOT_DAG} did not make, made by "
                           "hand, or of nothing new to fold): plan only")
        late = (_started(dag_run) - max(made)).total_seconds() / 60
        if late > tolerance_minutes:
            return False, f"a run started {late:.0f} minutes after its snapshot: plan only; the next snapshot's applies"
        if applied_today is not None:
            return False, (f"retention was applied today already (run {applied_today}): plan only; tomorrow's "
                           "first snapshot (UTC) applies")
        return True, "the day's first run after a new snapshot: applied"
    if kind == "manual":
        dry = flag(dry_run, "dry_run")
        return not dry, "a manual run with dry_run " + ("ticked: plan only" if dry else "unticked: applied")
    if kind == "scheduled":
        late = late_minutes(dag_run, tolerance_minutes)
        if late is None:
            return True, "a scheduled run on time: applied"
        return False, f"a catch-up run started {late:.0f} minutes late: plan only; the next on-time run applies"
    return False, (f"a {kind} run: plan only (a manual run with dry_run unticked, or the day's first run after a "
                   "new snapshot, applies)")


def _given(value) -> bool:
    """Whether a templated optional value was given: an empty form field renders "None" or nothing."""
    return value not in (None, "", "None")


def retention_window(dag_run, dry_run, days, as_of, config, applied_today: str | None = None
                     ) -> tuple[bool, str, float | str, str | None]:
    """(apply, why, days, as_of) of a retention task: whether it deletes and why (retention_applies(),
    `applied_today` its day record), and the window it judges, the configured `retention.days` as of now, or a
    preview's `days` and `as_of` (a window other than the configured one, the plan as of another instant). A
    preview only plans: a run that would apply and is given either fails at once, so that nothing is ever deleted
    by a window nobody configured."""
    from walcore.requests import as_of_time
    from walcore.retention import check_days

    apply, why = retention_applies(dag_run, dry_run, config.late_after_minutes, applied_today)
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
    files of every source. A streamed source's sealed files are archived too, its stream live or not
    (streamed_lines() says why), and nothing is forced on it: its log says whether its streamer is live. A re-run
    of the same interval finds nothing new. Returns {"new": [paths archived now], "counts": {...}, "problems":
    [...]}: the new files are what the Spark verify job checks next. A problem (a
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
        lines, problems = streamed_lines(repo, config.sources), []
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
        problems += [f"DIFFERS {d['segment']}, row {d['row']}: {d['message']}" for d in result.differs]
        self.summary(f"walvault archive into {repo.display}", lines + problems)
        if problems and self.fail_on_problems:
            raise AirflowFailException(f"{len(problems)} problems (listed above); the other sources were archived")
        return {"new": result.stored, "counts": counts, "problems": problems}


def streamed_lines(repo, sources) -> list[str]:
    """What the archive log says of each streamed source. Its stream holds its commits to the second; the archive
    still stores the xlogs Tarantool sealed, which the stream does not make redundant: they hold the rows of local
    spaces (never replicated) and supersede the segments of their range. The archive forces no seal of a Tarantool
    (no rotation, no checkpoint), so a live stream leaves it nothing to skip; a dead one leaves the source's RPO
    to its checkpoints until it is live again."""
    from walcore.family import family_named
    from walcore.retention import iso

    lines = []
    for source in sources:
        if source.stream is None:
            continue
        instance = family_named(source.family).source_instance(source.path) if source.path.is_dir() else None
        holder = repo.stream_holder(source.family, instance) if instance is not None else None
        if holder is None:
            lines.append(f"{source.name}: streamed, but no live walvault stream renews its lease: only what the "
                         "instance sealed is archived")
        else:
            lines.append(f"{source.name}: streamed by {holder.get('host')} (pid {holder.get('pid')}, its lease "
                         f"renewed {iso(holder.get('taken'))}): nothing forced; the sealed files archived still hold "
                         "its local spaces' rows and supersede its segments")
    return lines


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


class WalvaultCopyOperator(_WalvaultOperator):
    """Copy one backup (`backup_id`: a backup's record as XCom, e.g. the backup DAG's `record` result) with its parent
    chain into the second repository its source's `copy_to` names (an Airflow connection, as the repository's; a
    repository `walvault init` made): walvault copy. A source with no `copy_to` skips the task. Anything not copied
    fails it without a retry (a verdict), each named in the summary; the destination's lease held, or a repository
    unreachable, fails it to be retried.

    Templated: `config_path`, `backup_id`."""

    template_fields: Sequence[str] = ("config_path", "backup_id")

    def __init__(self, *, backup_id: dict, **kwargs):
        super().__init__(**kwargs)
        self.backup_id = backup_id

    def work(self, context):
        from walcore.frontend import outcome
        from walcore.repository.encrypted import TO_KEY_ENV
        from walcore.requests import CopyRequest
        from walcore.runner import LocalRunner

        from ..hooks.walvault import WalvaultRepoHook

        config = self.load_config()
        record = self.backup_id
        source = next((s for s in config.sources if str(s.path.resolve()) == record["source"]["path"]), None)
        if source is None or source.copy_to is None:
            raise AirflowSkipException(f"no second repository configured (copy_to) for {record['source']['path']}")
        repo, names_repo = self.repository(config)
        target, destination = WalvaultRepoHook(source.copy_to).opened(key_env=TO_KEY_ENV)
        result = outcome(CopyRequest(from_repo=names_repo["repo"], from_options=names_repo["repo_options"],
                                     to_repo=target.url, to_options=target.options, backups=[record["id"]]),
                         LocalRunner())
        lines = [f"copied backup {backup_id}" for backup_id in result.copied]
        lines += [f"already there: backup {backup_id}" for backup_id in result.already]
        lines += [f"NOT COPIED: {f.get('backup') or f.get('file')}: {f['message']}" for f in result.findings]
        lines.append(f"{result.objects} objects, {result.bytes:,} bytes copied and verified")
        self.summary(f"walvault copy {record['id']} --from {repo.display} --to {destination.display} (connection "
                     f"{source.copy_to})", lines, result.warnings)
        if not result.ok:
            raise AirflowFailException(f"backup {record['id']} was not copied to {destination.display}: see the "
                                       "findings above")
        return {"id": record["id"], "to": destination.display, "copied": result.copied, "already": result.already}


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
    another command holds is waited for `runs.lease_wait_minutes`, then the task fails to be retried. In a run that
    assets triggered, a source whose backup asset is not among the triggering events is skipped. The task's outlets
    (its source's snapshot asset) get the snapshot's id, position and bytes as the event's metadata.

    Templated: `config_path`, `source`."""

    def work(self, context):
        from walcore.backup_common import NothingNew
        from walcore.frontend import outcome
        from walcore.requests import SnapshotRequest
        from walcore.runner import LocalRunner

        from ..assets import triggering_sources
        from ..hooks.tarantool import TarantoolHook

        triggered = triggering_sources(context["dag_run"])
        if triggered is not None and self.source not in triggered:
            raise AirflowSkipException(f"{self.source}: no new backup among the events that triggered this run "
                                       f"({', '.join(sorted(triggered)) or 'none of walvault'}): not snapshotted")
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
            self.describe_outlets(context, {"source": source.name, "id": None, "note": str(e)})
            return {"id": None, "note": str(e)}
        m = result.manifest
        covers = m.checks.get("snapshot", {})
        self.summary(f"walvault snapshot of {source.name}", [
            f"snapshot {m.id} ({m.family} {m.instance}): {len(m.files)} files, {m.bytes:,} bytes",
            f"covers the log up to {m.position}" + (f", folding {len(covers.get('folded', []))} pwal files"
                                                    if m.family == "limestone" else "")], result.notes)
        self.describe_outlets(context, {"source": source.name, "id": m.id, "position": m.position,
                                        "bytes": m.bytes, "files": len(m.files)})
        return {"id": m.id, "position": m.position, "family": m.family, "instance": m.instance,
                "notes": result.notes}

    def describe_outlets(self, context, metadata: dict) -> None:
        """The asset events of the task's outlets say what it made (Airflow sends them when the task succeeds)."""
        for asset in self.outlets:
            context["outlet_events"][asset].extra = metadata


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
DAY_RECORD = "walvault_retention_applied"  # the key of the day record: {"day": "YYYY-MM-DD" (UTC), "run_id"}


class WalvaultExpireOperator(_WalvaultOperator):
    """Retention under the configured recovery window (walvault expire), of the source `confirmed` names (the
    result of its WalvaultConfirmOperator) or, without it, of every source in the repository. Deletes only
    when retention_applies() says so (a manual run with `dry_run` unticked, a scheduled run on time, the day's
    run after a new snapshot), else plans. The day record, which makes a snapshot-triggered run delete at most
    once a day, is kept in the state store of the task's inlet (its source's snapshot asset): every run that
    deletes writes it (the UTC day and its run id) before it deletes; without an inlet, no asset-triggered run
    deletes. Returns the JSON of `walvault expire --json`; the log ends with what was (or would be) deleted and
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
        dag_run = context["dag_run"]
        day = _started(dag_run).strftime("%Y-%m-%d")
        record = next((context["asset_state_store"][a] for a in self.inlets if isinstance(a, Asset)), None)
        applied = record.get(DAY_RECORD) if record is not None else {"day": day, "run_id": "(no day record)"}
        applied_today = applied["run_id"] if applied and applied["day"] == day and \
            applied["run_id"] != dag_run.run_id else None
        apply, why, days, as_of = retention_window(dag_run, self.dry_run, self.days, self.as_of, config,
                                                   applied_today)
        if apply and record is not None:  # before a deletion: a run failing midway still took the day
            record.set(DAY_RECORD, {"day": day, "run_id": dag_run.run_id})
        result = outcome(ExpireRequest(days=days, as_of=as_of, apply=apply, wait=config.runs.lease_wait, only=only,
                                       **names_repo), LocalRunner())
        self.summary(f"walvault expire ({why})",
                     render(result, "a manual run with dry_run unticked, or the day's first run after a new "
                                    "snapshot, applies it"),
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


# -- walvault_status: the textfile and the freshness checks. A check runs every few minutes, so a stale source
# fails run after run; its failure mail goes out when the source turns stale or gets a new alert, and again every
# `freshness.remind_every_hours` while it stays so: the runs in between fail without mail (FreshnessAlert.mail).
# Each check keeps its alert state as the XCom `freshness_alert`, read by the next run's check of the source.

ALERT_KEY = "freshness_alert"  # a check's alert state, for the next run's check of its source


class FreshnessAlert(AirflowFailException):
    """A source is stale: the check fails at once (a retry would find the same). `mail` False: the alert was
    mailed and its reminder is not due, so the failure callback sends nothing."""

    def __init__(self, message: str, *, mail: bool):
        super().__init__(message)
        self.mail = mail


class WalvaultStatusOperator(_WalvaultOperator):
    """Take the status of every source of the repository (walvault status, with the `freshness` thresholds) and
    write its Prometheus exposition, whole, to the `metrics.textfile` the configuration names (none: no file).
    The log ends with `walvault status`'s text. Returns the status as `walvault status --json` says it: what each
    source's freshness check judges.

    Templated: `config_path`."""

    def work(self, context):
        from walcore.command.status import exposition, write_textfile
        from walcore.frontend import outcome, status_lines
        from walcore.requests import StatusRequest
        from walcore.runner import LocalRunner

        config = self.load_config()
        repo, names_repo = self.repository(config)
        result = outcome(StatusRequest(max_backup_age=config.freshness.max_backup_age_hours,
                                       max_archive_lag=config.freshness.max_archive_lag_minutes, **names_repo),
                         LocalRunner())
        lines = status_lines(result)
        if config.textfile is not None:
            if not config.textfile.parent.is_dir():
                raise AirflowFailException(f"metrics.textfile: {config.textfile}: its directory does not exist")
            write_textfile(config.textfile, exposition(result))
            lines.append(f"written to {config.textfile}")
        self.summary(f"walvault status --repo {repo.display}", lines, result.warnings)
        return result.to_json()


class WalvaultFreshnessOperator(_SourceOperator):
    """Whether one configured source is fresh, by `status` (the WalvaultStatusOperator's result): its newest backup
    that restores (neither its last drill nor its last verification failed) is at most
    `freshness.max_backup_age_hours` old, and where its directory is on this host, the archive lags it by at most
    `freshness.max_archive_lag_minutes`, and a streamed source's streamer is live and lags it by at most
    `freshness.max_stream_lag_seconds` (judge() says how). Stale: the
    task fails with the alerts as its cause (FreshnessAlert, mailed as `remind_every_hours` says). The source's
    other problems (its window, its last drill) are logged, not alerted: their DAGs say them.

    Templated: `config_path`, `source`, `status` (an XComArg: the task runs after it)."""

    template_fields: Sequence[str] = ("config_path", "source", "status")

    def __init__(self, *, status, **kwargs):
        super().__init__(**kwargs)
        self.status = status

    def work(self, context):
        import time

        config = self.load_config()
        source = config.source(self.source)
        alerts, lines = judge(source.name, source.path, self.status, config.freshness,
                              streamed=source.stream is not None)
        ti = context["ti"]
        # the newest run's before this one (a fresh check keeps its state too: a later alert is new)
        previous = ti.xcom_pull(task_ids=self.task_id, key=ALERT_KEY, include_prior_dates=True, map_indexes=-1)
        state = alert_state(previous, sorted(alerts), time.time(), config.freshness.remind_every_hours)
        ti.xcom_push(key=ALERT_KEY, value=state)
        self.summary(f"walvault freshness of {source.name}: {'STALE' if alerts else 'fresh'}",
                     [f"ALERT: {a}" for a in alerts.values()] + lines)
        if alerts:
            raise FreshnessAlert("; ".join(alerts.values()) + stale_since(state),
                                 mail=state["mailed"] == state["now"])
        return {"source": source.name, "fresh": True}


def judge(name: str, path, status: dict, freshness, *, streamed: bool = False) -> tuple[dict[str, str], list[str]]:
    """({"backup", "archive" and/or "stream": the alert}, the lines that say why) of the configured source `name` at
    `path`, by a status result's JSON; `streamed`: the configuration streams it (its streamer must be live, and
    where its directory is on this host, lag it by at most `freshness.max_stream_lag_seconds`). The source is its
    directory, whichever host recorded its backups (a Spark worker) or its archive: its newest backup of them all,
    and the archive that reaches furthest; of the instance the directory holds now where it is on this host (a
    re-created database's fresh history does not hide the stale one, nor the other way round). A directory not on
    this host recorded as several instances is an alert: which history is its own cannot be told."""
    from pathlib import Path

    from walcore.command.status import CLOCK_SLACK, duration
    from walcore.repository import stamp_seconds

    where = str(Path(path).resolve())
    entries = [s for s in status["sources"] if s["path"] == where]
    hours, minutes = freshness.max_backup_age_hours, freshness.max_archive_lag_minutes
    alerts, lines = {}, []
    held = {s["source"].get("instance") for s in entries if s["source"]} - {None}
    recorded = sorted({s["instance"] for s in entries})
    if len(held) == 1:
        (instance,) = held
        others = [i for i in recorded if i != instance]
        entries = [s for s in entries if s["instance"] == instance]
        if others:
            lines.append(f"judged as instance {instance}, which the directory holds now; also recorded at its path: "
                         + ", ".join(others))
    elif len(recorded) > 1:
        alerts["identity"] = (f"{name} ({where}) is recorded as {len(recorded)} instances ({', '.join(recorded)}) "
                              "and is not on this host: which history is its own cannot be told")
    newest = max((s["backup"] for s in entries if s["backup"]), key=lambda b: b["finished"], default=None)
    if newest is None:
        what = f"of instance {next(iter(held))}, which the directory holds now, " if held and recorded else ""
        alerts["backup"] = f"no verified backup of {name} for {hours:g} hours: none {what}in the repository restores"
    else:
        age = stamp_seconds(status["time"]) - stamp_seconds(newest["finished"])
        lines.append(f"backup {newest['id']} ({newest['type']}), finished {newest['finished']}, "
                     f"{duration(max(age, 0))} old (alert after {hours:g} hours)")
        if age < -CLOCK_SLACK:
            alerts["backup"] = (f"no verified backup of {name} can be judged fresh: the newest, {newest['id']}, "
                                f"finished {duration(-age)} in the future ({newest['finished']}): a clock is wrong")
        elif age > hours * 3600:
            alerts["backup"] = (f"no verified backup of {name} for {hours:g} hours: the newest, {newest['id']}, "
                                f"finished {duration(age)} ago")
    judged = [s for s in entries if s["archive_lag_seconds"] is not None]
    furthest = min(judged, key=lambda s: s["archive_lag_seconds"], default=None)
    if furthest is not None:
        lag = furthest["archive_lag_seconds"]
        lines.append(f"archive lags the source by {duration(lag)} (alert after {minutes:g} minutes)")
        if lag > minutes * 60:
            alerts["archive"] = (f"archive of {name} behind by more than {minutes:g} minutes: {duration(lag)} "
                                 f"behind (it reaches {furthest['archive']['position']}, the source "
                                 f"{furthest['source']['position']})")
    elif held and not entries or any(s["source"] for s in entries) and not any(s["archive"] for s in entries):
        alerts["archive"] = f"archive of {name} behind by more than {minutes:g} minutes: nothing of it is archived"
    else:
        lines.append("archive lag not judged: the directory is not on this host, or its log does not say its time")
    if streamed:
        _judge_stream(name, [s["stream"] for s in entries if s["stream"]], freshness.max_stream_lag_seconds, alerts,
                      lines)
    # what the other DAGs alert on, for the whole picture
    lines += [f"also: the recovery window of {s['window']['days']:g} days is not covered" for s in entries
              if s["window"] and not s["window"]["covered"]]
    lines += [f"also: the last drill (of backup {s['drill']['backup']}) failed: {s['drill']['problem']}"
              for s in entries if s["drill"] and s["drill"]["status"] != "ok"]
    lines += [f"also: the last verification of backup {d['backup']} found it damaged: {d['problem']}"
              for s in entries if s.get("verification") for d in s["verification"]["damaged"]]
    return alerts, lines


def _judge_stream(name: str, streams: list[dict], limit: float, alerts: dict, lines: list[str]) -> None:
    """A streamed source's alert: no live streamer (its lease not renewed: the newest segment's age cannot tell a
    dead streamer from an idle source), or a live one lagging its directory by more than `limit` seconds."""
    from walcore.command.status import duration

    live = next((t for t in streams if t["alive"]), None)
    if live is None:
        newest = max((t["last_commit"] for t in streams if t["last_commit"]), default=None)
        alerts["stream"] = (f"stream of {name} is down: no live walvault stream renews its lease; "
                            + (f"its newest stored commit is of {newest}" if newest else "none of it is stored"))
        return
    lines.append(f"stream live (its lease renewed {live['lease_renewed']}), {live['segments']} segments stored")
    lag = live["lag_seconds"]
    if lag is None:
        lines.append("stream lag not judged: the directory is not on this host, or its log does not say its time")
        return
    lines.append(f"stream lags the source by {duration(lag)} (alert after {limit:g} seconds)")
    if lag > limit:
        alerts["stream"] = (f"stream of {name} behind by more than {limit:g} seconds: {duration(lag)} behind (it "
                            f"reaches {live['position']})")


def alert_state(previous: dict | None, kinds: list[str], now: float, remind_every_hours: float) -> dict:
    """What a check keeps for the next one, `previous` being what the last one kept (None: there was none): the
    alerts' `kinds` (none: fresh), since when the source is stale, when it was last mailed, and `now`. Mailed now
    (`mailed` == `now`): the source was fresh before, or it has an alert of a new kind, or it was last mailed
    `remind_every_hours` ago."""
    if not kinds:
        return {"kinds": [], "since": None, "mailed": None, "now": now}
    stale_before = bool(previous and previous["kinds"])
    if not stale_before or not set(kinds) <= set(previous["kinds"]) \
            or now - previous["mailed"] >= remind_every_hours * 3600:
        mailed = now
    else:
        mailed = previous["mailed"]
    return {"kinds": kinds, "since": previous["since"] if stale_before else now, "mailed": mailed, "now": now}


def stale_since(state: dict) -> str:
    """What a failure's cause adds when the source was stale at the check before this one too."""
    from walcore.command.status import duration
    from walcore.retention import iso

    stale = state["now"] - state["since"]
    return f" (stale since the check of {iso(state['since'])}, {duration(stale)} ago)" if stale > 0 else ""
