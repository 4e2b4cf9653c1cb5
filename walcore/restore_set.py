"""A backup (with its parent chain) restored into a directory, whole or to a point in time: staged in a hidden
sibling of the target and renamed to it only when every file is there and checked (the restore command, which
checks its target first, and the drill, which restores into a scratch directory, stand on it)."""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .backup_common import Progress
from .family import family_named
from .findings import Refused
from .fsutil import fsync_dir
from .repository import ObjectDamaged, Repository, RepositoryError
from .repository.materialize import STAGING_MARK, fsync_tree, materialize, reuse_staging, staging_dir


@dataclass
class RestoreResult:
    backup: str
    target: str
    files: int
    bytes: int
    reused: int = 0  # files an interrupted run had written already
    point: dict | None = None  # what a point-in-time restore reached
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _find(repo: Repository, backup_id: str):
    """The backup to restore; a backup that exists but cannot be used (its manifest unreadable or unsafe, or
    an interrupted backup's leftovers) is refused as damaged (exit 1), not as a repository that cannot be read."""
    try:
        return repo.find(backup_id)
    except RepositoryError:
        unusable = [r for r in repo.backups() if r.id == backup_id and r.manifest is None]
        if len(unusable) == 1:
            raise Refused(f"backup {backup_id} cannot be restored: {unusable[0].problem}", "damaged") from None
        raise


def restore_into(repo: Repository, backup_id: str, target: Path, to: str | None = None,
                 progress: bool = False) -> RestoreResult:
    """Restore the backup into `target` (absent, or an empty directory, beside which its staging goes), with the
    source pinned meanwhile: an expiry leaves it alone."""
    record = _find(repo, backup_id)
    pin = repo.restore_pin(record.family, record.instance)
    try:
        return _restore(repo, record, backup_id, target, to, progress)
    finally:
        if pin is not None:
            pin.release()


def _restore(repo: Repository, record, backup_id: str, target: Path, to: str | None,
             progress: bool) -> RestoreResult:
    manifest = record.manifest
    chain = repo.chain(manifest)
    ids = {m.id for m in chain}
    for entry in manifest.files:
        if entry.reference is not None and entry.reference not in ids:
            raise Refused(f"{entry.name} refers to backup {entry.reference}, which is not in the chain of "
                          f"{manifest.id}", "damaged")
    staging = staging_dir(target)
    notes = reuse_staging(staging, {"backup": manifest.id, "instance": manifest.instance, "to": to})
    notes += [f"the manifest's main file was not used: {record.problem}"] if record.problem else []
    if backup_id == "latest":  # say so when a newer backup of the source was passed over because it cannot be used
        notes += [f"backup {r.id} is newer but cannot be used ({r.problem}): restored {manifest.id}"
                  for r in repo.backups() if r.manifest is None and r.complete and r.id > manifest.id
                  and (r.family, r.instance) == (record.family, record.instance)]
    point_info = None
    family = family_named(manifest.family)
    try:
        if to is None:
            entries = [(family.restored_name(e), e) for e in manifest.files]
            tracker = Progress(len(entries), sum(e.size for _, e in entries), progress, "restored")
            reused = materialize(repo, entries, staging, tracker)
            family.finish_restore(manifest, staging)
        else:
            reused, point_info, entries, point_notes = family.point_restore(repo, manifest, to, staging, progress)
            notes += point_notes
        (staging / STAGING_MARK).unlink()
        fsync_tree(staging)
        if target.exists():
            target.rmdir()
        os.rename(staging, target)
        fsync_dir(target.parent)
    except (ObjectDamaged, Refused, RepositoryError) as e:
        # A failure we can name: nothing half-written stays (an interrupted process leaves the staging to resume).
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, ObjectDamaged):
            raise Refused(f"backup {manifest.id} cannot be restored: {e}", "damaged") from None
        raise
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise  # as an interruption: the staging stays, for the next run to resume
        # A full filesystem: what was written would only keep it full.
        shutil.rmtree(staging, ignore_errors=True)
        raise Refused(f"{target}: {e.strerror}{f' writing {e.filename}' if e.filename else ''}: the partial "
                      f"restore {staging} was removed; nothing was restored", "cannot_check") from None
    return RestoreResult(manifest.id, str(target), len(entries), sum(e.size for _, e in entries), reused,
                         point_info, notes)
