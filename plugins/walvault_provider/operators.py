"""walvault's operators: thin Airflow tasks over walcore's commands (walcore does the work; these read the
configuration and the repository connection, log a readable summary as the last lines, and return what the
next task or the UI needs as XCom).

Importing this module has no side effects: the configuration is read and walcore is imported when a task runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator


class WalvaultSparkSubmitOperator(SparkSubmitOperator):
    """SparkSubmitOperator with its connection templated, so that a run's params choose the Spark master
    (`conn_id="{{ params.spark }}"`)."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "_conn_id")


def flag(value, name: str) -> bool:
    """A templated yes/no ("{{ params.dry_run }}" renders "True"): anything but true or false is refused, so that a
    typo never means "delete" or "do not verify"."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"{name}: {value!r} is neither true nor false")
    return text == "true"


LEASE_WAIT = 3600.0  # how long a snapshot, an expiry or a backup waits for a lease another command holds


def scheduled_backup_type(repo, source_path, full_every_days: float, now: float | None = None) -> str:
    """What a scheduled backup of a source is: full when it has no full backup finished within `full_every_days`
    (so that a chain stays short and a restore never needs more than that many days of incrementals), else an
    incremental on the newest."""
    import time

    from walcore.repository import stamp_seconds

    fulls = [stamp_seconds(m.finished) for m in repo.backups_of(source_path) if m.type == "full"]
    now = time.time() if now is None else now
    return "incremental" if fulls and now - max(fulls) < full_every_days * 86400 else "full"


class _WalvaultOperator(BaseOperator):
    template_fields: Sequence[str] = ("config_path",)

    def __init__(self, *, config_path: str | None = None, repo_conn_id: str | None = None, **kwargs):
        super().__init__(**kwargs)
        self.config_path = config_path
        self.repo_conn_id = repo_conn_id

    def load_config(self):
        from .config import load

        return load(self.config_path)

    def repository(self, config, *, create: bool = False):
        from .hooks import WalvaultRepoHook

        return WalvaultRepoHook(self.repo_conn_id or config.repository_connection).repository(create=create)

    def summary(self, title: str, lines: list[str]) -> None:
        """What people read: the task log ends with this."""
        self.log.info("%s\n%s", title, "\n".join(f"  {line}" for line in lines) or "  (nothing)")


class WalvaultArchiveOperator(_WalvaultOperator):
    """Rotate each configured limestone source whose active pwal files hold `rotate_min_bytes` (every non-empty
    channel, with limestone's own names; never a directory a running limestone holds), then archive the sealed
    files of every source. A re-run of the same interval finds nothing new. Returns {"new": [paths archived now],
    "counts": {...}, "problems": [...]}: the new files are what the Spark verify job checks next. A problem (a
    source missing or refused, a damaged or conflicting file) never stops the other sources' archive; it fails the
    task at its end, or with `fail_on_problems=False` is only returned (the DAG fails its run after the verify)."""

    def __init__(self, *, fail_on_problems: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.fail_on_problems = fail_on_problems

    def execute(self, context):
        from pathlib import Path

        from walcore.command.archive import archive
        from walcore.command.rotate import rotate
        from walcore.limestone.layout import LiveError

        config = self.load_config()
        repo = self.repository(config, create=True)
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
                renamed = rotate(source.path, min_bytes=1).renamed
            except LiveError as e:  # a running limestone holds it: its online backup rotates
                lines.append(f"{source.name}: not rotated: {e}")
                continue
            except (RuntimeError, OSError) as e:  # refused (damage, a name taken) or unreadable: said, not skipped
                problems.append(f"{source.name}: cannot rotate: {e}")
                continue
            lines.append(f"{source.name}: rotated {len(renamed)} files ({active:,} active bytes)")
        result = archive([s.path for s in config.sources if s.path.is_dir()], repo)
        counts = {k: len(v) for k, v in result.to_json().items()}
        lines += [f"archived {counts['stored']} files, {counts['already']} already, {counts['expired']} expired "
                  f"before, {counts['not_sealed']} not sealed"]
        problems += [f"REFUSED {r['path']}: {r['findings'][0]['message'] if r['findings'] else ''}"
                     for r in result.refused]
        problems += [f"CONFLICT {c['path']}: kept as {c['kept_as']}" for c in result.conflicts]
        self.summary(f"walvault archive into {repo.display}", lines + problems)
        if problems and self.fail_on_problems:
            raise RuntimeError(f"{len(problems)} problems (listed above); the other sources were archived")
        return {"new": result.stored, "counts": counts, "problems": problems}


class WalvaultVerifyOperator(_WalvaultOperator):
    """Verify one backup (`backup_id`), or every backup, in the repository (walvault verify --repo): every stored
    object's size and SHA-256 and every link of its chain. Findings fail the task, each named in the summary.
    `enabled` (templated, e.g. "{{ params.verify }}"): false skips the task."""

    template_fields: Sequence[str] = ("config_path", "backup_id", "enabled")

    def __init__(self, *, backup_id: str | None = None, enabled: bool | str = True, **kwargs):
        super().__init__(**kwargs)
        self.backup_id = backup_id
        self.enabled = enabled

    def execute(self, context):
        from airflow.sdk.exceptions import AirflowSkipException

        from walcore.command.repo_verify import verify_repository

        if not flag(self.enabled, "enabled"):
            raise AirflowSkipException("verify after: unticked")
        repo = self.repository(self.load_config())
        report = verify_repository(repo, self.backup_id)
        lines = [f"backup {b['id']}: {b['status']}" for b in report.backups]
        lines += [f"  {f['code']}: {f.get('file', '')} {f['message']}" for b in report.backups for f in b["findings"]]
        lines.append(f"{report.objects} objects, {report.bytes:,} bytes read")
        self.summary(f"walvault verify --repo {repo.display} {self.backup_id or '(every backup)'}", lines)
        if not report.intact:
            raise RuntimeError(f"{self.backup_id or 'the repository'} does not verify: see the findings above")
        return {"id": self.backup_id, "intact": True, "objects": report.objects, "bytes": report.bytes}


class _SourceOperator(_WalvaultOperator):
    """An operator on one configured source."""

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
    limestone source whose archive has not moved) is not a failure: the snapshot that covers it is named."""

    def execute(self, context):
        from walcore.command.snapshot import NothingNew, snapshot

        from .hooks import tarantool_uri

        config = self.load_config()
        source = config.source(self.source)
        repo = self.repository(config, create=True)
        connect = tarantool_uri(source.connection) if source.connection else None
        try:
            result = snapshot(source.path, repo, connect=connect, wait=LEASE_WAIT)
        except NothingNew as e:
            self.summary(f"walvault snapshot of {source.name}", [str(e)])
            return {"id": None, "note": str(e)}
        m = result.manifest
        covers = m.checks.get("snapshot", {})
        self.summary(f"walvault snapshot of {source.name}", [
            f"snapshot {m.id} ({m.family} {m.instance}): {len(m.files)} files, {m.bytes:,} bytes",
            f"covers the log up to {m.position}" + (f", folding {len(covers.get('folded', []))} pwal files"
                                                    if m.family == "limestone" else "")])
        return {"id": m.id, "position": m.position, "family": m.family, "instance": m.instance}


class WalvaultExpireOperator(_WalvaultOperator):
    """Retention under the configured recovery window (walvault expire): with `dry_run` the plan only. Returns
    the JSON of `walvault expire --json`; the log ends with what was (or would be) deleted and why."""

    template_fields: Sequence[str] = ("config_path", "dry_run", "days")

    def __init__(self, *, dry_run: bool | str = True, days: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.dry_run = dry_run
        self.days = days

    def execute(self, context):
        from walcore.command.expire import check_days, expire

        config = self.load_config()
        repo = self.repository(config)
        dry_run = flag(self.dry_run, "dry_run")
        days = check_days(self.days if self.days not in (None, "", "None") else config.retention_days)
        result = expire(repo, days, apply=not dry_run, wait=LEASE_WAIT)
        lines = []
        for s in result.sources:
            anchor = s.anchor
            lines.append(f"{s.family} {s.instance}: " + (f"anchor {anchor['name']} at {anchor['position']}"
                                                          if anchor else "UNCOVERED: nothing of it is deleted"))
            lines += [f"  {'deleted' if n < s.deleted else 'would delete' if dry_run else 'delete'} {i.path}: "
                      f"{i.reason}" for n, i in enumerate(s.delete)]
            lines.append(f"  keeps {len(s.keep)}" + (f"; STOPPED: {s.stopped}" if s.stopped else ""))
        lines.append(f"{'plan only (dry run): nothing deleted' if dry_run else f'{result.deleted} deleted'}"
                     + (f"; audit log {result.audit}" if result.audit else ""))
        self.summary(f"walvault expire: keep every point of the last {days} days", lines)
        if any(s.stopped for s in result.sources):
            raise RuntimeError("; ".join(f"{s.instance}: {s.stopped}" for s in result.sources if s.stopped))
        return result.to_json()


class WalvaultDrillOperator(_SourceOperator):
    """Restore the newest backup of one configured source into a scratch directory and prove it (walvault drill):
    every hash; Tarantool started on it at the recorded vclock where installed; limestone's checks and recorded
    counts. The verdict is recorded beside the backup, so `walvault backups` marks one whose drill failed."""

    def execute(self, context):
        from walcore.command.drill import drill

        config = self.load_config()
        source = config.source(self.source)
        repo = self.repository(config)
        backups = [m for m in repo.backups_of(source.path) if m.type != "snapshot"]
        if not backups:
            raise RuntimeError(f"{source.name}: no backup of {source.path.resolve()} in {repo.display} to drill")
        newest = max(backups, key=lambda m: (m.finished, m.id))
        result = drill(repo, newest.id)
        self.summary(f"walvault drill of {source.name}: backup {result.backup} {result.status.upper()}",
                     result.checks + ([f"PROBLEM: {result.problem}"] if result.problem else []))
        if result.status != "ok":
            raise RuntimeError(f"the drill of backup {result.backup} failed: {result.problem}")
        return result.to_json()
