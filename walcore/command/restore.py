"""The restore command: a backup (with its parent chain) materialized in the family's native layout.

The files are written into a hidden sibling of the target, `.<target>.walvault-restore`, each checked
against its recorded hashes before it is kept; the sibling is renamed to the target only when everything is
there. An interrupted restore leaves that sibling: run again, and the files already there whose hash
matches are kept (only when it holds this same restore; one left by another backup or point is
discarded). A target that exists and is not empty is refused. The restore itself is walcore.restore_set's (the
drill restores through it too); this command checks the target first.

Point in time (`--to`): Tarantool — the newest backup whose snapshot is at or before the point, the xlogs
after it (from every backup of the instance and the archive), the one holding the point cut after the last
whole transaction at or before it; limestone — the backup's files with the durable epoch set to the point.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..findings import Refused
from ..repository import Repository
from ..restore_set import RestoreResult, restore_into


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
    return restore_into(repo, backup_id, target, to, progress)
