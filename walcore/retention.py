"""What retention judges a source's recovery window by, shared by the commands that judge it (expire deletes by
it, status reports it): the repository's policy, which backups restore, and the anchor of a window.

The anchor of a window is the verified snapshot reaching furthest in the log (by vclock or epoch) among those
taken at or before the window's start, of the restorable backups of one source: a `walvault snapshot`, or the
snapshot a Tarantool backup holds. A source with none is uncovered: not every point of its window restores; so is
one whose snapshot reaching furthest there is doubted (a failed drill or verification).
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
MAX_KEEP_FULL = 10000  # full backups kept by count: past it, a typo


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


def check_keep_full(value) -> int:
    """A count of full backups kept whatever the window says: a whole number from 0 (none) to MAX_KEEP_FULL
    (ValueError naming what is wrong)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_KEEP_FULL:
        raise ValueError(f"the count of full backups {value!r} is not a whole number from 0 to {MAX_KEEP_FULL}")
    return value


def describe_policy(days: float, keep_full: int) -> str:
    """A policy as `policy` and `expire` say it."""
    counted = f" and the newest {keep_full} full backups of each source" if keep_full else ""
    return f"keep every point of the last {days} days{counted}"


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


def backup_doubts(repo: Repository, family: str, instance: str,
                  manifests: list[BackupManifest]) -> dict[str, str | None]:
    """Why each backup of a source is not counted on to restore, by id: None (it restores), "broken" (its parent
    chain does not read, or an object its manifest names is missing) or "doubted" (whole, but a last verdict on it
    or on a backup of its chain failed: repository/verdicts.py, a failed drill, a verification that found damage;
    a verdict may be stale, so its bytes are not garbage)."""
    stored = set(repo.storage.list(f"{repo.source_dir(family, instance)}/backups"))
    failed: dict[str, bool] = {}

    def judged_failed(m: BackupManifest) -> bool:
        if m.id not in failed:
            failed[m.id] = failed_verdict(repo, m.family, m.instance, m.id) is not None
        return failed[m.id]

    def doubt(m: BackupManifest) -> str | None:
        try:
            chain = repo.chain(m)
        except RepositoryError:
            return "broken"
        if not all(o.stored in stored for e in m.files for o in e.objects()):
            return "broken"
        return "doubted" if any(judged_failed(c) for c in chain) else None

    return {m.id: doubt(m) for m in manifests}


def window_anchor(fam: Family, manifests: list[BackupManifest], doubts: dict[str, str | None],
                  window_start: float) -> tuple[BackupManifest | None, BackupManifest | None]:
    """(the anchor, None) of one source's window starting at `window_start`, among its `manifests` as `doubts`
    (backup_doubts) judges them; (None, None): no verified snapshot at or before the start. (None, the snapshot)
    where one reaching further than every restorable one is doubted: the window is uncovered too, not anchored on
    an older snapshot, since an earlier expiry may have anchored on the doubted one and deleted the log from the
    older one on."""
    best: dict[bool, tuple] = {}
    for m in manifests:
        snap = fam.snapshot_of(m)
        if doubts[m.id] != "broken" and snap is not None and snap[1] <= window_start:
            candidate = (fam.snapshot_rank(snap[0]), m.finished, m.id, m)
            doubted = doubts[m.id] is not None
            if doubted not in best or candidate[:3] > best[doubted][:3]:
                best[doubted] = candidate
    good, doubted = best.get(False), best.get(True)
    if doubted is not None and (good is None or doubted[0] > good[0]):
        return None, doubted[3]
    return (good[3] if good is not None else None), None


def describe_anchor(fam: Family, m: BackupManifest) -> dict:
    position, taken = fam.snapshot_of(m)
    return {"name": m.id, "position": fam.describe_position(position), "time": iso(taken)}
