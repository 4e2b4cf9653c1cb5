"""The snapshot command: a verified snapshot in the repository that covers the log up to a recorded position, so
that retention can prove what it may delete.

It is stored as a backup of type `snapshot` (id `YYYYMMDD-HHMMSSS`): the same manifest, lease, verification,
`verify --repo` and restore as every backup, and a base for point-in-time restores. Each family builds its own
(walcore.family):

- Tarantool: the newest checkpoint — its `.snap` and the vinyl files it needs, no xlog (`--connect` first asks
  the running instance for `box.snapshot()`). It covers every xlog whose last row its vclock reaches.
- limestone: a compacted file in limestone's own format folded from the archive (walcore.limestone.snapshot). It
  covers exactly the files it folded: limestone decides coverage by those names.
"""

from __future__ import annotations

from pathlib import Path

from ..backup_common import BackupResult
from ..family import family_of
from ..repository import Repository


def snapshot(source: Path, repo: Repository, *, connect: str | None = None, level: int = 3, runner=None,
             progress: bool = False, wait: float = 0.0) -> BackupResult:
    source = Path(source)
    return family_of(source).snapshot(source, repo, connect=connect, level=level, runner=runner, progress=progress,
                                      wait=wait)
