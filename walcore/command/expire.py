"""The expire command: retention under an explicit recovery window, deleting only what a verified snapshot covers.

The rule, per source: every point of the last N days (before `as_of`) stays restorable.
- The anchor is the verified snapshot reaching furthest in the log (by vclock or epoch) among those taken at or
  before the window's start: a `walvault snapshot`, or the snapshot a Tarantool backup holds. With none,
  nothing of the source is deleted (it is reported uncovered).
- An archived WAL, epoch or snapshot file goes only when the anchor covers its whole range (Tarantool: the
  anchor's vclock reaches its last row in every component; limestone: the anchor folded it, by name, or its
  epoch is at or below the anchor's) and its range ends before the window (the rows' own timestamps, the
  rotation time in a limestone name; the archive time where the log has none). Other archived files (vinyl,
  blobs, limestone's catalog and manifest versions) are kept; nothing of the archive expires while it holds a
  conflict or while two source identities (a copy beside the original) back the instance up.
- Backups are judged per source identity (family, instance, host, source path), each with its own anchor:
  pinned backups (`walvault pin`), backups whose point is inside the window (by the log's time), the newest
  restorable one before it, the anchor, the newest restorable backup, the newest restorable full or incremental
  one, those newer than the anchor that a failed verdict (drill, verification) doubts, and the newest `keep_full`
  restorable full backups (the policy's count: the stricter rule keeps) are kept with their parent chains; the
  rest go, children
  before parents, each manifest before its objects (a backup without its manifest does not exist), and an object
  only when no kept manifest references it.
- Nothing is deleted while a restore of the source is in progress, or when a manifest cannot be read (its
  files are not garbage: the expiry stops).
- On S3 with Object Lock (`walvault init --lock-days`), the plan reads the retention of every object it would
  delete first: a backup (with its parent chain) or an archived file holding one still locked is kept whole, "locked
  until" when, so that an apply never stops half-way on a lock (nor hides a locked object behind a delete marker).
With `apply`, each source is expired under its lease; every deletion re-checks its conditions right before it
acts and is first written to the append-only audit log. An archived file leaves a tombstone (so that archive
does not store it again while the source keeps it). A crash leaves what the next run finishes: a backup whose
manifest is gone is an interrupted one's leftovers, an archived object without its record an orphan.
"""

from __future__ import annotations

import calendar
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field

from ..backup_common import STALE_TEMPORARY
from ..family import Family, family_named
from ..findings import Refused
from ..fsutil import host_name, random_hex
from ..repository import Repository, RepositoryError, stamp_seconds, walvault_version
from ..repository.archive import DIFFERS_SUFFIX, EXPIRED_SUFFIX, RECORD_SUFFIX, STREAM_DIR
from ..repository.manifest import (COPY_SUFFIX, MANIFEST_NAME, BackupManifest, FileEntry, ManifestError,
                                   decode_checked, encode_checked)
from ..repository.lease import LeaseBusy, LeaseLost
from ..repository.pins import pins_of_source
from ..repository.storage import LOCK_SKEW, UnsafeName
from ..retention import (DAY, backup_doubts, check_days, check_keep_full, describe_anchor, describe_policy, iso,
                         stored_policy, window_anchor)

# segment, pwal_partial, epoch_partial: `walvault stream`'s (a Tarantool's sealed segments, a limestone directory's
# durable pieces and epochs)
LOG_KINDS = ("xlog", "segment", "snap", "pwal_rotated", "epoch_rotated", "pwal_partial", "epoch_partial")
CLOCK_TOLERANCE = 300.0  # seconds a record may be ahead of this host's clock (hosts' skew) before an apply refuses


class NoPolicy(RuntimeError):
    """No --days and no policy stored in the repository: nothing is deleted without one."""


@dataclass
class Item:
    """Something the plan deletes: a backup, an archived file, or what an interrupted run left."""

    path: str  # in the repository: a backup's directory, an archived object
    kind: str
    reason: str
    range: dict | None = None
    covered_by: dict | None = None
    order: tuple = ()  # deletion order within the source
    record: str | None = None  # an archived file's record, removed first
    backup_id: str | None = None
    fingerprint: bytes | None = None  # the record or manifest as planned: re-read right before deleting

    def to_json(self) -> dict:
        return {"path": self.path, "kind": self.kind, "range": self.range, "covered_by": self.covered_by,
                "reason": self.reason}


@dataclass
class SourcePlan:
    family: str
    instance: str
    anchor: dict | None = None  # {"name", "position", "time"}
    delete: list[Item] = field(default_factory=list)
    keep: list[dict] = field(default_factory=list)
    blocked: str | None = None  # why nothing of the source is deleted now (a restore in progress)
    stopped: str | None = None  # why an applied expiry stopped before the end
    deleted: int = 0
    referenced: set[str] = field(default_factory=set)  # objects kept manifests name: never deleted
    anchor_files: list[FileEntry] = field(default_factory=list)  # re-hashed before anything is deleted
    identities: list[dict] = field(default_factory=list)  # {"host", "path", "anchor"}: each source's own anchor

    def to_json(self) -> dict:
        return {"source": self.instance, "family": self.family, "anchor": self.anchor, "identities": self.identities,
                "delete": [i.to_json() for i in self.delete], "keep": self.keep, "blocked": self.blocked,
                "stopped": self.stopped, "deleted": self.deleted}


@dataclass
class ExpireResult:
    days: float
    as_of: float
    applied: bool
    sources: list[SourcePlan]
    keep_full: int = 0  # the newest full backups of each source kept whatever the window says
    audit: str | None = None  # the audit log's directory of this run
    warnings: list[str] = field(default_factory=list)  # what a plan found that an apply would refuse

    @property
    def deleted(self) -> int:
        return sum(s.deleted for s in self.sources)

    def to_json(self) -> dict:
        return {"policy": {"days": self.days, **({"keep_full": self.keep_full} if self.keep_full else {})},
                "as_of": iso(self.as_of), "applied": self.applied,
                "sources": [s.to_json() for s in self.sources], "deleted": self.deleted, "audit": self.audit,
                "warnings": self.warnings}


def resolve_policy(repo: Repository, days, keep_full: int | None = None) -> tuple[float, int, str | None]:
    """(the window: --days, else the policy stored in the repository; the count of full backups kept: --keep-full,
    else the stored policy's, else none; stored_policy's warning). NoPolicy when there is no window, or when the
    stored policy is read for its count and cannot be (it may keep backups the window would not)."""
    days = None if days is None else check_days(days)
    keep_full = None if keep_full is None else check_keep_full(keep_full)
    if days is not None and keep_full is not None:
        return days, keep_full, None
    try:
        policy, warning = stored_policy(repo)
    except ManifestError as e:
        if days is None:
            raise
        raise NoPolicy(f"{e}; it may keep full backups by count: give --keep-full N (0: none) with --days, or set "
                       "the policy again; nothing was deleted") from None
    if policy is None and days is None:
        raise NoPolicy(f"no retention policy: give --days N, or store one in {repo.display} with "
                       "`walvault policy --repo URL --days N`; nothing was deleted")
    try:
        return (check_days(policy.get("days")) if days is None else days,
                check_keep_full((policy or {}).get("keep_full", 0)) if keep_full is None else keep_full, warning)
    except ValueError as e:
        raise NoPolicy(f"the policy stored in {repo.display} is not usable ({e}); nothing was deleted") from None


def expire(repo: Repository, days: float, *, keep_full: int = 0, as_of: float | None = None, apply: bool = False,
           wait: float = 0.0, only: set[tuple[str, str]] | None = None) -> ExpireResult:
    """`only`: the (family, instance) sources to plan or expire (None: every source of the repository);
    `keep_full`: the newest full backups of each source kept whatever the window says."""
    days, keep_full = check_days(days), check_keep_full(keep_full)
    now = time.time()
    as_of = now if as_of is None else as_of
    result = ExpireResult(days, as_of, apply, [], keep_full)
    sources = repo.sources()
    if apply and as_of > now:  # judged from a future, a point written since now would look outside the window
        raise Refused(f"--as-of {iso(as_of)} is later than now ({iso(now)}): an apply judges as of now or "
                      "earlier (a plan without --apply may look ahead)", "cannot_check")
    newest = _newest_record(repo, sources)
    if newest is not None and newest[0] > now + CLOCK_TOLERANCE:
        behind = (f"the clock of this host ({iso(now)}) is behind the repository: {newest[1]}; fix the clock (NTP) "
                  "before expiring")
        if apply:
            raise Refused(behind, "cannot_check")
        result.warnings.append(f"{behind} (an --apply would be refused)")
    sources = [s for s in sources if only is None or s in only]
    if not apply:  # the plan alone writes nothing: no lease, no audit
        result.sources = [plan_source(repo, f, i, days, keep_full, as_of) for f, i in sources]
        return result
    for family, instance in sources:  # an unreadable manifest anywhere stops it before anything is deleted
        _backup_records(repo, family, instance)
    run = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + random_hex(4)
    seq = [0]
    for family, instance in sources:
        plan = SourcePlan(family, instance)
        try:
            with repo.lease(family, instance, "expire", wait=wait) as lease, \
                    repo.archive_lease(family, instance, "expire", wait=wait) as archive_lease:
                plan = plan_source(repo, family, instance, days, keep_full, as_of)  # pins read under the lease
                _apply(repo, plan, (lease, archive_lease), run, seq, {"days": days, "as_of": iso(as_of)})
        except (LeaseBusy, LeaseLost) as e:  # another source's expiry goes on; this one is reported
            plan.stopped = f"not expired: {e}"
        except Refused as e:
            plan.stopped = f"not expired: {e}"
        except RepositoryError as e:
            last = f"; the audit record {seq[0]:06d} names a deletion that may not have happened" if seq[0] else ""
            plan.stopped = f"the repository failed: {e}{last}"
        result.sources.append(plan)
    result.audit = f"audit/{run}" if seq[0] else None
    return result


def _newest_record(repo: Repository, sources: list[tuple[str, str]]) -> tuple[float, str] | None:
    """The latest time the repository records (a backup's finish or start, an archive record's archive time,
    an expiry's audit run, a lease's taking) and what records it; None when nothing has a time."""
    found: list[tuple[float, str]] = []

    def add(stamp, what: str) -> None:
        try:
            seconds = stamp_seconds(stamp) if isinstance(stamp, str) else float(stamp)
        except (TypeError, ValueError):
            return  # an unreadable time says nothing about the clock
        if math.isfinite(seconds):
            found.append((seconds, what))

    for family, instance in sources:
        for r in repo.source_backups(family, instance):
            if r.manifest is not None:
                add(r.manifest.finished, f"backup {r.id} ({family} {instance}) finished at")
                add(r.manifest.started, f"backup {r.id} ({family} {instance}) started at")
        for name in repo.storage.list(f"{repo.source_dir(family, instance)}/archive"):
            if name.endswith(".zst" + RECORD_SUFFIX):
                try:
                    add(decode_checked(repo.storage.read_bytes(name), name).get("archived"),
                        f"{name} records it archived at")
                except (FileNotFoundError, ManifestError):
                    pass  # the plan keeps an unreadable record and says so
    for run in repo.storage.list_dirs("audit"):
        try:
            add(calendar.timegm(time.strptime(run[:15], "%Y%m%d-%H%M%S")), f"the expiry audit/{run} ran at")
        except ValueError:
            pass
    for name in repo.storage.list("locks"):
        try:
            add(json.loads(repo.storage.read_bytes(name)).get("taken"), f"the lease {name} was taken at")
        except (FileNotFoundError, ValueError, AttributeError):
            pass  # released meanwhile, or not a lease walvault reads
    if not found:
        return None
    seconds, what = max(found, key=lambda f: f[0])  # at a tie, the first found: a backup's finish
    return seconds, f"{what} {iso(seconds) if seconds < 1e11 else seconds}"  # past year 5000: junk, shown as is


# -- the plan


def _backup_records(repo: Repository, family: str, instance: str) -> list:
    """Every backup record of the source; Refused when a manifest cannot be read (its files are not garbage)."""
    records = repo.source_backups(family, instance)
    if unreadable := [r for r in records if r.manifest is None and r.complete]:
        raise Refused(f"expiry stopped, nothing deleted: the manifest of {family} backup {unreadable[0].id} "
                      f"({instance}) cannot be read ({unreadable[0].problem}); its files are not garbage. Restore "
                      "the manifest (or remove the backup by hand once you know it is not needed)", "damaged")
    return records


def plan_source(repo: Repository, family: str, instance: str, days: float, keep_full: int, as_of: float) -> SourcePlan:
    """The plan of one instance under the policy (`days`, `keep_full`), as of `as_of`. Its backups are judged per
    source identity (family, instance, host, source path): a copy of a data dir beside the original shares the
    instance, and one's backup must never become the other's anchor, nor stand for it as its newest backup. The
    archive, per instance, expires only while one source identity backs it up. `keep_full`: the newest full
    backups of each source identity kept (with their chains)."""
    plan = SourcePlan(family, instance)
    window_start = as_of - days * DAY
    fam = family_named(family)
    records = _backup_records(repo, family, instance)
    manifests = [r.manifest for r in records if r.manifest is not None]
    doubts = backup_doubts(repo, family, instance, manifests)
    restorable = {backup_id: why is None for backup_id, why in doubts.items()}
    doubted = {backup_id for backup_id, why in doubts.items() if why == "doubted"}
    pinned = set(pins_of_source(repo, family, instance))
    uncovered: dict[tuple, str] = {}  # why a source identity's window has no anchor, where a doubt says it
    if busy := repo.restores_in_progress(family, instance):
        plan.blocked = f"a restore of this source is in progress: {busy[0]}"
    identities: dict[tuple, list[BackupManifest]] = {}
    for m in manifests:
        identities.setdefault(m.identity, []).append(m)
    anchors: dict[tuple, BackupManifest | None] = {}
    kept: dict[str, str] = {}
    for identity, own in sorted(identities.items(), key=lambda i: max(fam.position_key(m) for m in i[1])):
        anchor, doubted_anchor = window_anchor(fam, own, doubts, window_start)
        anchors[identity] = anchor
        if doubted_anchor is not None:
            uncovered[identity] = ("its source's snapshot reaching furthest at or before the window's start, "
                                   f"{doubted_anchor.id}, is doubted by a failed drill or verification: the log from "
                                   "an older one may be expired, so none anchors the window")
        plan.identities.append({"host": identity[2], "path": identity[3],
                                "anchor": describe_anchor(fam, anchor) if anchor is not None else None})
        for backup_id, why in _keep_backups(fam, own, restorable, doubted, pinned, keep_full, anchor, window_start,
                                            repo).items():
            kept.setdefault(backup_id, why)
    # The identity of the newest backup speaks for the instance where one anchor is shown.
    shown = next((a for a in reversed(list(anchors.values())) if a is not None), None)
    if shown is not None:
        plan.anchor = describe_anchor(fam, shown)
    plan.anchor_files = [e for a in anchors.values() if a is not None for e in a.files]
    referenced = {o.stored for m in manifests if m.id in kept for e in m.files for o in e.objects()}
    for m in sorted(manifests, key=lambda m: fam.position_key(m), reverse=True):
        prefix = repo.backup_dir(family, instance, m.id)
        anchor = anchors[m.identity]
        if m.id in kept:
            plan.keep.append({"path": prefix, "kind": f"backup ({m.type})", "reason": kept[m.id]})
        elif anchor is None:
            plan.keep.append({"path": prefix, "kind": f"backup ({m.type})",
                              "reason": uncovered.get(m.identity, "no verified snapshot of its own source at or "
                                                                  "before the window's start covers it")})
        else:
            plan.delete.append(Item(prefix, f"backup ({m.type})", "older than the window, not the newest backup "
                                    "of its source before it, and no kept backup's parent", {"position": m.position},
                                    describe_anchor(fam, anchor), (0, len(plan.delete)), backup_id=m.id,
                                    fingerprint=_manifest_bytes(repo, prefix)))
    for r in records:
        if not r.complete and shown is not None:  # an uncovered source is left as it is, garbage included
            plan.delete.append(Item(repo.backup_dir(family, instance, r.id), "leftovers",
                                    "files without a manifest: an interrupted backup's or expiry's leftovers",
                                    order=(-1,), backup_id=r.id))
    shared = None
    if len(identities) > 1:
        shared = ("two sources share the instance (" + ", ".join(f"{i[2]}:{i[3]}" for i in sorted(identities,
                  key=str)[:2]) + "): a vclock or an epoch no longer says whose history an archived file is; "
                  "nothing of its archive expires while both have backups")
    _plan_archive(repo, plan, shown if len(identities) <= 1 else None, window_start, shared, orphans=shown is not None)
    plan.delete.sort(key=lambda i: i.order)
    if repo.storage.lock is not None:
        _keep_locked(repo, plan, {m.id: m for m in manifests}, referenced, max(as_of, time.time()))
    plan.referenced = referenced
    if plan.blocked:
        plan.keep += [{"path": i.path, "kind": i.kind, "reason": plan.blocked} for i in plan.delete]
        plan.delete = []
    return plan


def _keep_backups(fam: Family, manifests: list[BackupManifest], restorable: dict[str, bool], doubted: set[str],
                  pinned: set[str], keep_full: int, anchor: BackupManifest | None, window_start: float,
                  repo: Repository) -> dict[str, str]:
    kept: dict[str, str] = {}

    def keep(m: BackupManifest | None, why: str) -> None:
        if m is not None and m.id not in kept:
            kept[m.id] = why

    for m in manifests:  # first: a pin is said whatever else keeps the backup
        if m.id in pinned:
            keep(m, "pinned")
    for m in manifests:
        if fam.backup_time(m) >= window_start:
            keep(m, "inside the window")
    before = [m for m in manifests if fam.backup_time(m) < window_start and restorable[m.id]]
    keep(max(before, key=lambda m: fam.position_key(m), default=None), "the newest backup before the window")
    keep(anchor, "the anchor: the newest verified snapshot at or before the window's start")
    usable = [m for m in manifests if restorable[m.id]]
    keep(max(usable, key=lambda m: fam.position_key(m), default=None),
         "the newest restorable backup of the source")
    keep(max((m for m in usable if m.type != "snapshot"), key=lambda m: fam.position_key(m), default=None),
         "the newest restorable full or incremental backup of the source")
    # A failed verdict keeps a backup from anchoring, not from being needed: the log an earlier expiry judged it to
    # cover is gone, so past the anchor its bytes may be the only ones of what it holds (and a verdict may be stale).
    for m in manifests:
        if m.id in doubted and anchor is not None and fam.position_key(m) > fam.position_key(anchor):
            keep(m, "newer than the anchor, and a failed drill or verification doubts it: what it holds may be in "
                    "no other backup nor in the archive (mend it and verify it again, or delete it by hand)")
    fulls = sorted((m for m in manifests if m.type == "full" and restorable[m.id]), key=fam.position_key, reverse=True)
    for m in fulls[:keep_full]:
        keep(m, f"kept by count: one of the newest {keep_full} full backups of its source")
    for m in manifests:
        if m.id in kept:
            try:
                for parent in repo.chain(m)[:-1]:
                    keep(parent, f"in the parent chain of {m.id}")
            except RepositoryError:
                pass  # an unrestorable chain: what of it is there is kept with the backup
    return kept


def _keep_locked(repo: Repository, plan: SourcePlan, manifests: dict[str, BackupManifest], referenced: set[str],
                 when: float) -> None:
    """S3 Object Lock: the retention of each object the plan deletes is read before anything is deleted (a delete of
    a locked one would fail, or only hide it behind a delete marker). A backup or archived file holding an object
    locked past `when` is kept whole, a backup with its parent chain (and what it references stays)."""
    storage = repo.storage

    def locked_until(names: list[str]) -> float | None:
        found = [u for n in names if storage.lock.applies(n) and (u := storage.locked_until(n)) is not None]
        return max(found, default=None)

    def objects(item: Item) -> list[str]:
        if item.backup_id is None:
            return [item.path] + ([item.record] if item.record else [])
        return [n for n in storage.list(item.path) if item.kind == "leftovers" or n not in referenced]

    locked: dict[str, str] = {}
    for item in plan.delete:
        until = locked_until(objects(item))
        if until is not None and until + LOCK_SKEW > when:
            locked[item.path] = f"locked until {iso(until)} (S3 Object Lock): kept whole until then"
            if item.kind != "leftovers" and item.backup_id is not None:
                try:
                    chain = repo.chain(manifests[item.backup_id])
                except RepositoryError:
                    chain = [manifests[item.backup_id]]
                for m in chain:
                    referenced.update(o.stored for e in m.files for o in e.objects())
                for parent in chain[:-1]:
                    locked.setdefault(repo.backup_dir(plan.family, plan.instance, parent.id),
                                      f"in the parent chain of {item.backup_id}, which is {locked[item.path]}")
    plan.keep += [{"path": i.path, "kind": i.kind, "reason": locked[i.path]} for i in plan.delete if i.path in locked]
    plan.delete = [i for i in plan.delete if i.path not in locked]


def _manifest_bytes(repo: Repository, prefix: str) -> bytes:
    try:
        return repo.storage.read_bytes(f"{prefix}/{MANIFEST_NAME}")
    except FileNotFoundError:
        return repo.storage.read_bytes(f"{prefix}/{MANIFEST_NAME}{COPY_SUFFIX}")


# -- the archive


def _plan_archive(repo: Repository, plan: SourcePlan, anchor: BackupManifest | None, window_start: float,
                  shared: str | None, *, orphans: bool) -> None:
    """The archive's part of the plan: what `anchor` covers goes (none: nothing does); `shared` says why nothing of
    it expires (two sources share the instance); `orphans`: the instance is covered, so garbage goes."""
    family, instance = plan.family, plan.instance
    fam = family_named(family)
    names = [n for where in ("archive", STREAM_DIR) for n in repo.storage.list(f"{repo.source_dir(family, instance)}/"
                                                                             f"{where}")]
    records = {n for n in names if n.endswith(".zst" + RECORD_SUFFIX)}
    judge = fam.coverage(anchor) if anchor is not None else None  # an anchor is a backup holding a snapshot
    present = set(names)
    for name in names:
        if not orphans or not name.endswith(".zst") or name + RECORD_SUFFIX in records:
            continue
        if name + EXPIRED_SUFFIX in present:  # its tombstone says an expiry was deleting it
            plan.delete.append(Item(name, "orphan", "an expired object without its record: left by an interrupted "
                                    "expiry", order=(1, 0)))
        elif _age(repo, name) > STALE_TEMPORARY:  # younger, it may be an archive's write in progress
            plan.delete.append(Item(name, "orphan", "an archived object without its record: left by an "
                                    "interrupted archive", order=(1, 0)))
    entries: dict[str, tuple[bytes, dict, FileEntry]] = {}
    for record_name in sorted(records):
        try:
            raw = repo.storage.read_bytes(record_name)
            obj = decode_checked(raw, record_name)
            entries[record_name] = (raw, obj, FileEntry.from_json(obj))
        except (FileNotFoundError, ManifestError, UnsafeName) as e:
            plan.keep.append({"path": record_name, "kind": "record",
                              "reason": f"its archive record cannot be read ({e}): kept with its object"})
    conflicted = {e.name for name, (_, _, e) in entries.items() if ".conflict-" in name}
    for record_name, (raw, obj, entry) in entries.items():
        path = record_name[:-len(RECORD_SUFFIX)]
        if conflicted:  # two histories under one instance (a restored copy that wrote on): a vclock or an epoch
            # no longer says which history a file belongs to, so nothing of the archive is judged covered
            plan.keep.append({"path": path, "kind": entry.kind, "reason": "the archive holds a conflict (a name "
                              f"archived with different bytes: {sorted(conflicted)[0]}): two histories of this "
                              "source; nothing of its archive expires until it is resolved"})
            continue
        if shared:
            plan.keep.append({"path": path, "kind": entry.kind, "reason": shared})
            continue
        if path + DIFFERS_SUFFIX in present:
            plan.keep.append({"path": path, "kind": entry.kind, "reason": "an archived xlog holds other rows than "
                              f"this stream segment ({path + DIFFERS_SUFFIX}): kept"})
            continue
        if entry.kind not in LOG_KINDS:
            plan.keep.append({"path": path, "kind": entry.kind,
                              "reason": "retention deletes log files only (WAL, epoch and snapshot files)"})
            continue
        if judge is None:
            plan.keep.append({"path": path, "kind": entry.kind,
                              "reason": "no verified snapshot at or before the window's start covers this source"})
            continue
        covered, rank = judge(entry)
        if not covered:
            plan.keep.append({"path": path, "kind": entry.kind, "reason": f"not covered by {anchor.id}: needed to "
                              "replay the log from the anchor"})
            continue
        ends = fam.log_end(repo, entry)
        if ends is None:
            ends = stamp_seconds(obj["archived"]) if isinstance(obj.get("archived"), str) else None
        if ends is None or ends >= window_start:
            plan.keep.append({"path": path, "kind": entry.kind, "reason": "inside the window" if ends is not None
                              else "it has no time to judge it by"})
            continue
        plan.delete.append(Item(path, entry.kind, f"covered by {anchor.id} and ended before the window "
                                f"({iso(ends)})", {**entry.range, "ends": iso(ends)}, plan.anchor, (2, rank, path),
                                record=record_name, fingerprint=raw))


def _age(repo: Repository, name: str) -> float:
    try:
        return repo.storage.age(name)
    except (OSError, ValueError):
        return 0.0  # unknown: taken for young, so not deleted


# -- carrying it out


class _Changed(RuntimeError):
    """A deletion's conditions no longer hold: the source's expiry stops."""


def _apply(repo: Repository, plan: SourcePlan, leases: tuple, run: str, seq: list[int], policy: dict) -> None:
    """Carry out the plan under the source's lease and its archive's (`leases`), each proven before each
    deletion."""
    if plan.delete and (damaged := _damaged_anchor_object(repo, plan)):
        plan.stopped = f"nothing deleted: the anchor {plan.anchor['name']} is not intact ({damaged})"
        return
    for item in plan.delete:
        try:
            _recheck(repo, plan, leases, item)
        except (_Changed, LeaseLost) as e:
            plan.stopped = f"stopped before {item.path}: {e}"
            return
        seq[0] += 1
        repo.audit(run, seq[0], {"run": run, "seq": seq[0], "time": iso(time.time()), "policy": policy,
                                 "family": plan.family, "instance": plan.instance, **item.to_json(),
                                 "by": f"walvault {walvault_version()}", "host": host_name()})
        _delete(repo, plan, item, leases[0])
        plan.deleted += 1


def _damaged_anchor_object(repo: Repository, plan: SourcePlan) -> str | None:
    """Coverage is confirmed on the anchor's stored bytes before anything it covers goes: each object is read
    and its size and SHA-256 checked against its manifest."""
    import hashlib

    for entry in (o for e in plan.anchor_files for o in e.objects()):
        digest, size = hashlib.sha256(), 0
        try:
            for chunk in repo.storage.iter_bytes(entry.stored):
                digest.update(chunk)
                size += len(chunk)
        except FileNotFoundError:
            return f"{entry.stored} is missing"
        if (size, digest.hexdigest()) != (entry.stored_size, entry.stored_sha256):
            return f"{entry.stored} does not match its recorded size and SHA-256"
    return None


def confirm(repo: Repository, family: str, instance: str, days: float,
            as_of: float | None = None) -> tuple[SourcePlan, str | None]:
    """What an expiry of the source would rely on, confirmed before it runs: the source's plan (under the stored
    policy's count, as the expiry applies it), and what of its anchor's stored bytes fails the re-hash (None: the
    anchor is intact, or there is none: plan.anchor says)."""
    as_of = time.time() if as_of is None else as_of
    days, keep_full, _ = resolve_policy(repo, days)
    plan = plan_source(repo, family, instance, days, keep_full, as_of)
    return plan, _damaged_anchor_object(repo, plan) if plan.anchor else None


def _recheck(repo: Repository, plan: SourcePlan, leases: tuple, item: Item) -> None:
    for lease in leases:
        lease.confirm()  # LeaseLost: stops this source's expiry
    if busy := repo.restores_in_progress(plan.family, plan.instance):
        raise _Changed(f"a restore of this source started: {busy[0]}")
    if item.covered_by is not None:
        anchor = repo.load_backup(plan.family, plan.instance, item.covered_by["name"])
        if anchor.manifest is None:
            raise _Changed(f"the anchor {item.covered_by['name']} can no longer be read ({anchor.problem})")
    if item.kind == "orphan" and repo.storage.exists(item.path + RECORD_SUFFIX):
        raise _Changed(f"{item.path} has its record now (an archive wrote it)")
    try:
        if item.record is not None:
            if repo.storage.read_bytes(item.record) != item.fingerprint:
                raise _Changed(f"the record {item.record} changed since the plan")
        elif item.kind != "orphan" and item.kind != "leftovers":
            if _manifest_bytes(repo, item.path) != item.fingerprint:
                raise _Changed(f"the manifest of {item.backup_id} changed since the plan")
    except FileNotFoundError:
        raise _Changed(f"{item.path} changed since the plan (gone)") from None


def _delete(repo: Repository, plan: SourcePlan, item: Item, lease) -> None:
    storage = repo.storage
    if item.kind == "leftovers":  # fenced first: a writer that only paused can no longer commit them
        repo.clear_leftovers(repo.load_backup(plan.family, plan.instance, item.backup_id), lease)
        return
    if item.record is not None:
        # The tombstone first: the source may still hold the file, and archive must not store it again.
        record = decode_checked(item.fingerprint, item.record)
        storage.write_bytes(item.path + EXPIRED_SUFFIX, encode_checked({
            "name": record["name"], "size": record["size"], "sha256": record["sha256"], "expired": iso(time.time()),
            "covered_by": item.covered_by, "reason": item.reason}))
        storage.remove(item.record)  # then the record: without it the file is not archived
        storage.remove(item.path)
        return
    if item.backup_id is None:  # an orphaned object
        storage.remove(item.path)
        return
    for name in (MANIFEST_NAME, MANIFEST_NAME + COPY_SUFFIX):  # first: without it the backup does not exist
        storage.remove(f"{item.path}/{name}")
    left = [n for n in storage.list(item.path) if n in plan.referenced]
    if not left:
        if locked := storage.remove_tree(item.path):  # the plan read every lock: one set since then
            raise RepositoryError(f"{locked[0]} was locked after the plan (S3 Object Lock): left in place")
        return
    for name in storage.list(item.path):
        if name not in plan.referenced:
            storage.remove(name)


# How an expiry's plan or result is said, by the CLI (`walvault expire`) and the Airflow tasks alike: per source its
# anchor or why it is uncovered, each deletion and its reason, what is kept and why.
APPLY_HINT = "run with --apply to carry it out"


def render_source(s: SourcePlan) -> list[str]:
    anchor = s.anchor
    lines = [f"{s.family} {s.instance}: " + (f"anchor {anchor['name']} at {anchor['position']} ({anchor['time']})"
                                             if anchor else "UNCOVERED: no verified snapshot at or before the "
                                             "window's start; nothing of it is deleted")]
    if len(s.identities) > 1:  # a copy of the source beside it: each source identity has its own anchor
        lines += [f"  source {i['host']}:{i['path']}: " + (f"anchor {i['anchor']['name']}" if i["anchor"] else "UNCOVERED")
                  for i in s.identities]
    lines += [f"  {'deleted' if n < s.deleted else 'delete'}  {item.path}: {item.reason}"
              for n, item in enumerate(s.delete)]
    kept = sorted(Counter(k["reason"] for k in s.keep).items(), key=lambda kv: -kv[1])
    lines.append(f"  keep {len(s.keep)}: " + ", ".join(f"{n} {why}" for why, n in kept))
    lines += [f"  kept: {k['path']}: {k['reason']}" for k in s.keep if k["reason"].startswith("locked until")]
    if s.blocked:
        lines.append(f"  blocked: {s.blocked}")
    if s.stopped:
        lines.append(f"  STOPPED: {s.stopped}")
    return lines


def render(result: ExpireResult, apply_hint: str = APPLY_HINT) -> list[str]:
    """The whole report; `apply_hint`: how to carry out a plan (the CLI's flag, or a DAG's way)."""
    lines = [f"policy: {describe_policy(result.days, result.keep_full)}, as of {iso(result.as_of)}"]
    for s in result.sources:
        lines += render_source(s)
    if result.applied:
        lines.append(f"{result.deleted} deleted" + (f"; audit log {result.audit}" if result.audit else ""))
    else:
        lines.append(f"plan only: {sum(len(s.delete) for s in result.sources)} to delete, nothing was changed "
                     f"({apply_hint})")
    return lines
