"""The drill command: a backup restored into a scratch directory and proven, its verdict recorded beside it.

Proof, beyond the restore's own check of every file's hashes (the family's prove_restore):
- Tarantool: a real `tarantool` (where installed) starts on the restore and reaches the recorded vclock;
- limestone: the restore verifies ok, with the recorded durable epoch and durable entry counts.
The verdict goes to `<backup dir>/drill.json` (repository/verdicts.py) and `walvault backups` shows it: a backup
whose last drill failed is marked, and not counted on to restore until a drill passes again.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from ..family import family_named
from ..findings import Refused
from ..fsutil import owned_tempdir
from ..repository import Repository, utc_now, walvault_version
from ..repository.verdicts import DRILL_NAME, write_verdict
from ..restore_set import restore_into


@dataclass
class DrillResult:
    backup: str
    family: str
    instance: str
    status: str  # ok | failed
    checks: list[str] = field(default_factory=list)  # what was proven
    problem: str | None = None
    time: str = field(default_factory=utc_now)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def drill(repo: Repository, backup_id: str) -> DrillResult:
    """Restore the backup into a scratch directory (a killed drill's is removed by the next), prove it, record the
    verdict."""
    found = repo.find(backup_id)
    m = found.manifest
    result = DrillResult(m.id, m.family, m.instance, "ok")
    work = owned_tempdir("walvault-drill-")
    try:
        target = work / "restore"
        try:
            restored = restore_into(repo, m.id, target)
            result.checks.append(f"restored {restored.files} files, {restored.bytes:,} bytes, every hash checked")
            result.checks.append(family_named(m.family).prove_restore(m, target, work))
        except (Refused, OSError, ValueError) as e:
            result.status, result.problem = "failed", str(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_verdict(repo, m.family, m.instance, m.id, DRILL_NAME,
                  {**result.to_json(), "by": f"walvault {walvault_version()}"})
    return result
