"""The restore command: a backup (with its parent chain) materialized in the family's native layout.

The files are written into a hidden sibling of the target, `.<target>.walvault-restore`, each checked
against its recorded hashes before it is kept; the sibling is renamed to the target only when everything is
there. An interrupted restore leaves that sibling: run again, and the files already there whose hash
matches are kept (only when it holds this same restore; one left by another backup or point is
discarded). A target that exists and is not empty is refused.

Point in time (`--to`): Tarantool — the newest backup whose snapshot is at or before the point, the xlogs
after it (from every backup of the instance and the archive), the one holding the point cut after the last
whole transaction at or before it; limestone — the backup's files with the durable epoch set to the point.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Refused
from ..fsutil import file_sha256, fsync_dir
from ..repository import ObjectDamaged, Repository, RepositoryError
from ..repository.manifest import BackupManifest, FileEntry
from ..repository.storage import check_name
from .backup import Progress


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


STAGING_MARK = ".walvault-restore.json"  # in the staging directory: which restore it holds (removed at the end)


def _staging(target: Path) -> Path:
    return target.parent / f".{target.name}.walvault-restore"



def _inside(root: Path, name: str) -> Path:
    check_name(name)
    path = root / name
    real_root = os.path.realpath(root)
    if not os.path.realpath(path).startswith(real_root + os.sep):
        raise Refused(f"the manifest names {name!r}, which leads out of the restore directory", "damaged")
    return path


def _layout_name(manifest: BackupManifest, entry: FileEntry) -> str:
    """Where a file goes: its source name; a limestone blob kept flat goes to blob/dir_NN/ as limestone reads it."""
    if manifest.family == "limestone" and entry.kind == "blob" and "/" not in entry.name:
        blob_id = int(entry.name.split(".")[0], 16)
        return f"blob/dir_{blob_id % 100:02d}/{entry.name}"
    return entry.name


def materialize(repo: Repository, entries: list[tuple[str, FileEntry]], root: Path, progress: Progress) -> int:
    """Write each (name, entry) under root from the repository, checked; returns how many were there already."""
    reused = 0
    for name, entry in entries:
        path = _inside(root, name)
        if path.is_file() and path.stat().st_size == entry.size and file_sha256(path) == entry.sha256:
            reused += 1
            progress.advance(entry.size)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".walvault-part")
        try:
            with open(part, "wb") as f:
                for chunk in repo.read_object(entry.stored, size=entry.size, sha256=entry.sha256,
                                              stored_sha256=entry.stored_sha256):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        progress.advance(entry.size)
    return reused


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, _names in os.walk(root):
        fsync_dir(Path(dirpath))


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


def _reuse_staging(staging: Path, mark: dict) -> list[str]:
    """Create the staging directory, or reuse what an interrupted run of this same restore left there. One left
    by another restore (another backup or point, or no mark) is discarded: its files must not join this one."""
    notes = []
    if staging.is_dir():
        try:
            same = json.loads((staging / STAGING_MARK).read_text()) == mark
        except (OSError, ValueError):
            same = False
        if not same:
            shutil.rmtree(staging)
            notes.append(f"{staging} was left by an interrupted restore of something else: discarded")
    staging.mkdir(exist_ok=True)
    mark_path = staging / STAGING_MARK
    if not mark_path.exists():
        with open(mark_path, "w") as f:
            json.dump(mark, f)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(staging)
    return notes


def _components_taken_as_zero(to: str, manifest: BackupManifest, point_info: dict) -> list[str]:
    """A vclock point that leaves out a component the log has stops before that component's first row: say so."""
    from ..tarantool.pitr import parse_point

    point = parse_point(to)
    if point.vclock is None:
        return []
    has = {int(c) for vclock in (point_info.get("vclock") or {}, manifest.position.get("vclock") or {})
           for c, lsn in vclock.items() if lsn}
    return [f"the point names no component {c}: taken as 0, so the restore stops before its first row"
            + (" (component 0 counts local-space rows)" if c == 0 else "") for c in sorted(has - set(point.vclock))]


def restore(repo: Repository, backup_id: str, target: Path, *, to: str | None = None,
            progress: bool = False) -> RestoreResult:
    target = Path(target)
    if target.is_symlink():  # a dangling one would fail only at the final rename, after all the work
        raise Refused(f"{target} is a symbolic link: give the directory to restore into itself", "cannot_check")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise Refused(f"{target} exists and is not an empty directory: nothing was written", "refused")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"{target.parent}: no such directory")
    if repo.storage.caps.local_paths and target.resolve().is_relative_to(os.path.realpath(repo.storage.root)):
        raise Refused(f"{target} is inside the repository {repo.display}: restore somewhere else", "cannot_check")
    record = _find(repo, backup_id)
    pin = repo.restore_pin(record.family, record.instance)  # an expiry leaves this source alone meanwhile
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
    staging = _staging(target)
    notes = _reuse_staging(staging, {"backup": manifest.id, "instance": manifest.instance, "to": to})
    notes += [f"the manifest's main file was not used: {record.problem}"] if record.problem else []
    if backup_id == "latest":  # say so when a newer backup of the source was passed over because it cannot be used
        notes += [f"backup {r.id} is newer but cannot be used ({r.problem}): restored {manifest.id}"
                  for r in repo.backups() if r.manifest is None and r.complete and r.id > manifest.id
                  and (r.family, r.instance) == (record.family, record.instance)]
    point_info = None
    try:
        if to is None:
            entries = [(_layout_name(manifest, e), e) for e in manifest.files]
            tracker = Progress(len(entries), sum(e.size for _, e in entries), progress, "restored")
            reused = materialize(repo, entries, staging, tracker)
            if manifest.family == "tarantool" and manifest.type == "snapshot":
                from .restore_pitr import wal_dir_of

                (staging / wal_dir_of(manifest)).mkdir(parents=True, exist_ok=True)  # Tarantool needs it there
        elif manifest.family == "tarantool":
            from .restore_pitr import tarantool_point

            reused, point_info, entries = tarantool_point(repo, manifest, to, staging, progress)
            notes += _components_taken_as_zero(to, manifest, point_info)
        else:
            from .restore_pitr import limestone_point

            reused, point_info, entries = limestone_point(repo, manifest, to, staging, progress)
        (staging / STAGING_MARK).unlink()
        _fsync_tree(staging)
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
