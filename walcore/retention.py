"""What retention judges a source's recovery window by, shared by the commands that judge it (expire deletes by
it, status reports it): the repository's policy, which backups restore, and the anchor of a window.

The anchor of a window is the verified snapshot reaching furthest in the log (by vclock or epoch) among those
taken at or before the window's start, of the restorable backups of one source: a `walvault snapshot`, or the
snapshot a Tarantool backup holds. A source with none is uncovered: not every point of its window restores.
"""

from __future__ import annotations

import math
import time

from .family import Family
from .repository import STAMP, Repository, RepositoryError
from .repository.manifest import BackupManifest
from .repository.verdicts import failed_verdict

DAY = 86400.0
MAX_DAYS = 36500  # a century: a window past it is a typo, not a policy


def check_days(value) -> float:
    """A recovery window in days: a number from 1 to MAX_DAYS (ValueError naming what is wrong)."""
    try:
        days = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"the window {value!r} is not a number of days") from None
    if isinstance(value, bool) or not math.isfinite(days):
        raise ValueError(f"the window {value!r} is not a finite number of days")
    if days < 1:
        raise ValueError(f"the window {value!r} is below one day: it would expire what was just written")
    if days > MAX_DAYS:
        raise ValueError(f"the window {value!r} is over {MAX_DAYS} days")
    return int(days) if days.is_integer() else days


def iso(seconds: float | None) -> str | None:
    return None if seconds is None else time.strftime(STAMP, time.gmtime(seconds))


def stored_policy(repo: Repository) -> tuple[dict | None, str | None]:
    """The policy stored in the repository (None: none) and, when its main file is damaged and the copy was
    read, a warning naming the damaged file and how to restore both; ManifestError when neither file is good."""
    loaded = repo.load_policy()
    if loaded is None:
        return None, None
    if loaded.problem is None:
        return loaded.obj, None
    return loaded.obj, (f"{loaded.problem}; the policy was read from {loaded.used}: set it again to restore both "
                        f"files: walvault policy --repo {repo.display} --days {loaded.obj.get('days')}")


def restorable_backups(repo: Repository, family: str, instance: str,
                       manifests: list[BackupManifest]) -> dict[str, bool]:
    """Whether each backup of a source restores, by id: its parent chain reads, every object its manifest names is
    there, and no last verdict on it or on a backup of its chain failed (repository/verdicts.py: a failed drill, a
    verification that found damage)."""
    stored = set(repo.storage.list(f"{repo.source_dir(family, instance)}/backups"))
    failed: dict[str, bool] = {}

    def judged_failed(m: BackupManifest) -> bool:
        if m.id not in failed:
            failed[m.id] = failed_verdict(repo, m.family, m.instance, m.id) is not None
        return failed[m.id]

    def restorable(m: BackupManifest) -> bool:
        try:
            chain = repo.chain(m)
        except RepositoryError:
            return False
        return all(e.stored in stored for e in m.files) and not any(judged_failed(c) for c in chain)

    return {m.id: restorable(m) for m in manifests}


def window_anchor(fam: Family, manifests: list[BackupManifest], window_start: float) -> BackupManifest | None:
    """The anchor among restorable `manifests` of one source for a window starting at `window_start` (None:
    the window is uncovered)."""
    candidates = []
    for m in manifests:
        snap = fam.snapshot_of(m)
        if snap is not None and snap[1] <= window_start:
            candidates.append((fam.snapshot_rank(snap[0]), m.finished, m.id, m))
    return max(candidates, key=lambda c: c[:3])[3] if candidates else None


def describe_anchor(fam: Family, m: BackupManifest) -> dict:
    position, taken = fam.snapshot_of(m)
    return {"name": m.id, "position": fam.describe_position(position), "time": iso(taken)}
