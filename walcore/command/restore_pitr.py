"""Point-in-time restores: which stored files reach a point, and how they are cut there."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..findings import Refused
from ..repository import Repository, stamp_seconds
from ..repository.manifest import BackupManifest, FileEntry
from ..tarantool.meta import vclock_from_json, vclock_leq
from .backup import Progress
from .restore import _layout_name, materialize


def archived_entries(repo: Repository, family: str, instance: str) -> list[FileEntry]:
    """The records of every archived file of a source (their bytes are checked when read)."""
    from .archive import load_archived

    return [entry for entry in load_archived(repo, family, instance) if entry is not None]


def tarantool_point(repo: Repository, newest: BackupManifest, to: str, staging: Path, progress: bool):
    from ..tarantool.pitr import PointError, cut_chain, parse_point

    try:
        point = parse_point(to)
    except ValueError as e:
        raise Refused(f"--to {to!r}: {e}", "refused") from None
    backups = [r.manifest for r in repo.backups() if r.manifest is not None and r.family == "tarantool"
               and r.instance == newest.instance and r.manifest.finished <= newest.finished]

    def snap_vclock(m: BackupManifest) -> dict[int, int]:
        return vclock_from_json(m.checks.get("snapshot", {}).get("vclock"))

    def before(m: BackupManifest) -> bool:
        if point.vclock is not None:
            return vclock_leq(snap_vclock(m), point.vclock)
        taken = m.checks.get("snapshot", {}).get("time")
        if taken is None:  # the snapshot was taken before the backup started (recorded to the whole second)
            taken = stamp_seconds(m.started) + 1
        return taken <= point.time

    bases = [m for m in backups if before(m)]
    if not bases:
        raise Refused(f"no backup of {newest.instance} has a snapshot at or before {point.describe()}: no base "
                      "to restore from", "refused")
    base = max(bases, key=lambda m: (m.finished, m.id))
    start = snap_vclock(base)
    # The log after the base: xlogs of every backup of the instance and of the archive; of several versions of
    # one name (a newest xlog stored while it grew) the longest.
    xlogs: dict[str, FileEntry] = {}
    for entry in [e for m in backups for e in m.files] + archived_entries(repo, "tarantool", newest.instance):
        if entry.kind == "xlog" and entry.verification.get("vclock") is not None:
            name = Path(entry.name).name
            if name not in xlogs or entry.size > xlogs[name].size:
                xlogs[name] = entry
    ordered = [xlogs[n] for n in sorted(xlogs)]
    chain = _chain_from(ordered, start)
    base_files = [e for e in base.files if e.kind in ("snap", "vylog", "run", "index")]
    wal_dir = wal_dir_of(base)
    entries = [(_layout_name(base, e), e) for e in base_files]
    log_dir = staging / ".walvault-log"
    log_entries = [(Path(e.name).name, e) for e in chain]
    tracker = Progress(len(entries) + len(chain), sum(e.size for _, e in entries + log_entries), progress,
                       "restored")
    reused = materialize(repo, entries, staging, tracker)
    log_dir.mkdir(exist_ok=True)
    reused += materialize(repo, log_entries, log_dir, tracker)
    out = staging / wal_dir
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.xlog"):  # an interrupted run's cut log (the wal dir may be the data dir itself)
        stale.unlink()
    try:
        result = cut_chain([log_dir / name for name, _ in log_entries], out, point, start_vclock=start)
    except PointError as e:
        raise Refused(f"cannot restore to {point.describe()}: {e}", "refused") from None
    shutil.rmtree(log_dir)
    info = {"point": point.describe(), "base": base.id, "xlogs": result.files, "cut": result.cut_file,
            "vclock": {str(k): v for k, v in sorted(result.vclock.items())}, "last_time": result.last_time}
    return reused, info, entries


def wal_dir_of(m: BackupManifest) -> Path:
    """Where a Tarantool backup's log goes: where it keeps its xlogs; a snapshot holds none, so where its source
    kept them (recorded), else beside its .snap."""
    xlog = next((e.name for e in m.files if e.kind == "xlog"), None)
    if xlog is not None:
        return Path(xlog).parent
    snap = m.checks.get("snapshot", {})
    return Path(snap["wal_dir"]) if snap.get("wal_dir") else Path(snap["name"]).parent


def _chain_from(xlogs: list[FileEntry], start: dict[int, int]) -> list[FileEntry]:
    """The unbroken run of xlogs replay needs from a snapshot at `start`: from the last one beginning at or
    before it, each next one starting where the previous one's successor says it does."""
    firsts = [i for i, e in enumerate(xlogs) if vclock_leq(vclock_from_json(e.verification["vclock"]), start)]
    if not firsts:
        return []
    chain = [xlogs[firsts[-1]]]
    for e in xlogs[firsts[-1] + 1:]:
        prev = vclock_from_json(e.verification.get("prev_vclock"))
        if prev != vclock_from_json(chain[-1].verification["vclock"]):
            break  # a gap: the log ends here, and a point past it is refused by the cut
        chain.append(e)
    return chain


def limestone_point(repo: Repository, manifest: BackupManifest, to: str, staging: Path, progress: bool):
    """The backup's files with `epoch` holding one durable record, the point. limestone cancels the snippets
    past it (2 -> 6, in place) when it starts. Refused past the backup's durable epoch, and below what the
    compacted file folds: limestone writes no epoch in it, so the state of an earlier epoch is not there."""
    import re

    from ..limestone.check import prepare
    from ..limestone.epoch import EPOCH_NAME
    from ..limestone.writer import durable_epoch

    text = to.removeprefix("epoch:")
    if not re.fullmatch(r"[0-9]+", text):  # ASCII digits: str.isdigit() takes '²', which int() refuses
        raise Refused(f"--to {to!r}: a limestone point is an epoch number (limestone records no time per epoch)",
                      "refused")
    epoch = int(text)
    reached = manifest.position.get("epoch", 0)
    log: list[FileEntry] = []
    if epoch > reached:
        manifest, log = _limestone_log(repo, manifest, epoch)
    entries = [(_layout_name(manifest, e), e) for e in manifest.files] + [(e.name, e) for e in log]
    tracker = Progress(len(entries), sum(e.size for _, e in entries), progress, "restored")
    reused = materialize(repo, entries, staging, tracker)
    notes = []
    # The catalog limestone reads: compaction_catalog, or its .back when that one is missing or unreadable.
    catalog = prepare(staging).catalog
    if catalog is not None:
        # MAX_EPOCH_ID is the epoch at the compaction's rotation; a session of a later epoch may still have been
        # writing into a file rotated then, and the compaction folds it once durable: the files the compacted
        # file covers say how far it reaches.
        ranges = {Path(e.name).name: e.range.get("epochs") for e in manifest.files}
        covered = [ranges[n][1] for n in catalog.detached_pwals if ranges.get(n)]
        folded = max([catalog.max_epoch_id, *covered])
        if manifest.type == "snapshot":  # walvault's own: it knows the newest epoch it folded, and nothing else
            folded = manifest.position.get("epoch", 0)  # at or below MAX_EPOCH_ID was left out
        if epoch < folded:
            raise Refused(f"the compacted file folds every epoch up to {folded} (compaction catalog MAX_EPOCH_ID "
                          f"{catalog.max_epoch_id}, and the files it covers): the state at epoch {epoch} is not in "
                          "this backup", "refused")
        if manifest.type != "snapshot" and (gone := [n for n in catalog.detached_pwals if n not in ranges]):
            notes.append(f"{len(gone)} files the compacted file covers are not in the backup: it may hold sessions "
                         f"of epochs past MAX_EPOCH_ID {catalog.max_epoch_id} that were in flight at its rotation")
    tmp = staging / f".{EPOCH_NAME}.walvault-tmp"
    with open(tmp, "wb") as f:
        f.write(durable_epoch(epoch))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, staging / EPOCH_NAME)
    info = {"point": f"epoch {epoch}", "base": manifest.id, "durable_epoch": epoch,
            "archived_files": len(log)}
    if notes:
        info["notes"] = notes
    return reused, info, entries


def _limestone_log(repo: Repository, newest: BackupManifest, epoch: int) -> tuple[BackupManifest, list[FileEntry]]:
    """A point past the backup: a base (this backup, or a snapshot of the instance) at or before it from which the
    archive still holds the whole log, and the archived files that carry the log from there (rotated pwal files
    neither in the base nor folded into its compacted file, and the blobs). Refused past what the archive holds
    whole: every channel's entries up to the point archived (what `archive` records), and durable."""
    from .archive import EXPIRED_SUFFIX, archive_complete

    backups = [r.manifest for r in repo.source_backups("limestone", newest.instance)
               if r.manifest is not None and (r.id == newest.id or r.manifest.type == "snapshot")]
    archived = archived_entries(repo, "limestone", newest.instance)
    # Files retention deleted: a base that lacks one (neither holds nor folded it) cannot reach past it.
    prefix = f"{repo.source_dir('limestone', newest.instance)}/archive"
    expired = {Path(n).name.removesuffix(".zst" + EXPIRED_SUFFIX) for n in repo.storage.list(prefix)
               if n.endswith(".zst" + EXPIRED_SUFFIX)}

    def holds(m: BackupManifest) -> set[str]:
        return {Path(e.name).name for e in m.files} | set(m.checks.get("snapshot", {}).get("detached", []))

    # Files limestone's own compaction folded (named by an archived catalog) that the archive never held: their
    # keys are in the source's compacted file only, so a base that neither holds nor folded them cannot reach past.
    names = {Path(e.name).name for e in archived}
    folded_away = {n for n in _archived_detached(repo, archived) if n not in names}
    missing = {n for n in expired if n.startswith("pwal_")} | folded_away
    bases = [m for m in backups if m.position.get("epoch", 0) <= epoch and not missing - holds(m)]
    if not bases:
        raise Refused(f"no backup or snapshot of {newest.instance} at or before epoch {epoch} has the whole log "
                      "after it in the repository (retention deleted files it would need, or limestone's own "
                      "compaction folded files that were never archived: restore from the newest snapshot)",
                      "refused")
    base = max(bases, key=lambda m: (m.position.get("epoch", 0), m.finished, m.id))
    durable = max([base.position.get("epoch", 0)] + [e.range["epochs"][1] for e in archived
                                                     if e.kind == "epoch_rotated" and e.range.get("epochs")])
    complete = archive_complete(repo, "limestone", newest.instance)
    if complete is not None:
        durable = min(durable, max(complete, base.position.get("epoch", 0)))
    if epoch > durable:
        raise Refused(f"the log of {newest.instance} in the repository reaches epoch {durable} (backup {base.id}, "
                      f"the archived epoch files, and every channel archived up to epoch {complete}), before the "
                      f"point {epoch}", "refused")
    have = holds(base)
    log = [e for e in archived if e.kind in ("pwal_rotated", "blob") and Path(e.name).name not in have]
    return base, sorted({e.name: e for e in log}.values(), key=lambda e: e.name)


def _archived_detached(repo: Repository, archived: list[FileEntry]) -> set[str]:
    """Every DETACHED_PWAL name of the archived versions of the source's compaction catalog."""
    from ..limestone.catalog import CatalogError, parse_catalog

    out: set[str] = set()
    for e in archived:
        if e.kind == "catalog" and e.size < (1 << 24):
            data = b"".join(repo.read_object(e.stored, size=e.size, sha256=e.sha256, stored_sha256=e.stored_sha256))
            try:
                out |= set(parse_catalog(data).detached_pwals)
            except CatalogError:
                continue  # a damaged .back limestone would not read either
    return out
