"""A limestone snapshot: a compacted file in limestone's own format, built from the archived rotated pwal files and
the previous snapshot's compacted file (for the first, the source's own compacted file when limestone made one;
never built in the source directory, which is only read), with its catalog (the `COMPACTED_FILE` line, every
folded file as `DETACHED_PWAL`, `MAX_EPOCH_ID`, a true `MAX_BLOB_ID`), the source's manifest (its instance id
kept), the blob files its entries reference and an `epoch` file at the newest epoch it folded (its position). It
covers exactly the files it folded: limestone decides coverage by those names."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..backup_common import BackupResult, NothingNew, Progress, store_set
from ..findings import Refused
from ..fsutil import host_name, owned_tempdir, write_atomic
from ..repository import Repository
from ..repository.archive import source_archive
from ..repository.manifest import BackupManifest, FileEntry
from ..repository.materialize import materialize
from .backup_plan import LimestonePlan
from .catalog import CATALOG_NAME, parse_catalog
from .check import prepare
from .compact import COMPACTED_NAME, compact, snippet_range
from .epoch import EPOCH_NAME
from .layout import kind_of, path_instance, rotation_time
from .writer import durable_epoch


def _newest_snapshot(records: list) -> BackupManifest | None:
    """The snapshot among a source's backups that reaches furthest in its log."""
    found = [r.manifest for r in records if r.manifest is not None and r.manifest.type == "snapshot"]
    return max(found, key=lambda m: (m.position.get("epoch", 0), m.id)) if found else None


def build_snapshot(source: Path, repo: Repository, *, level: int, runner, progress: bool, wait: float) -> BackupResult:
    """The snapshot of a limestone source, folded from its archive (module docstring)."""

    source_plan = prepare(source)  # read once: the manifest, the durable epoch, limestone's own catalog
    report = source_plan.report
    manifest = report.manifest
    if manifest is None:
        raise Refused(f"{source}: limestone cannot read its manifest", "cannot_check")
    instance = manifest.instance_uuid or path_instance(source)
    manifest_bytes = (source / "limestone-manifest.json").read_bytes()
    with repo.lease("limestone", instance, "snapshot", wait=wait) as lease:
        # A copy of the directory shares the instance: only this directory's archived files and snapshots count.
        origin = {"host": host_name(), "path": str(source.resolve())}
        records = source_archive(repo, "limestone", instance, origin, source)
        if any(r is None for r in records):
            raise Refused(f"an archive record of limestone {instance} cannot be read: `walvault verify --repo` "
                          "names it; no snapshot is built over a log that cannot be read whole", "damaged")
        archived: dict[str, FileEntry] = {}
        for r in records:
            if r.name in archived and r.sha256 != archived[r.name].sha256 and r.kind not in (
                    "compacted", "catalog", "manifest"):
                raise Refused(f"{r.name} is archived twice with different bytes (a conflict): resolve it before a "
                              "snapshot folds it", "damaged")
            archived.setdefault(r.name, r)
        records = repo.source_backups("limestone", instance)
        if unreadable := [r for r in records if r.manifest is None and r.complete]:
            # it may be the previous snapshot: folding without it would lose what it holds
            raise Refused(f"the manifest of backup {unreadable[0].id} of limestone {instance} cannot be read "
                          f"({unreadable[0].problem}): no snapshot is built until it is restored", "damaged")
        identity = ("limestone", instance, origin["host"], origin["path"])
        previous = _newest_snapshot([r for r in records if r.manifest is not None and r.manifest.identity == identity])
        before = previous.checks.get("snapshot", {}) if previous else {}
        scratch = owned_tempdir("walvault-snapshot-")
        try:
            work, out, prev_dir = scratch / "log", scratch / "out", scratch / "previous"
            for d in (work, out, prev_dir):
                d.mkdir()
            if previous is not None:
                keep = [(e.name, e) for e in previous.files if e.kind in ("compacted", "catalog")]
                materialize(repo, keep, prev_dir, Progress(len(keep), 0, False, "read"))
            else:
                _source_compaction(source, source_plan.catalog, prev_dir)
            detached = set(parse_catalog((prev_dir / CATALOG_NAME).read_bytes()).detached_pwals) \
                if (prev_dir / CATALOG_NAME).exists() else set()
            source_catalog = source_plan.catalog
            if lost := set(source_catalog.detached_pwals if source_catalog else []) - set(archived) - detached:
                # limestone's own compaction folded them since the last snapshot: their keys may be nowhere else
                raise Refused(f"limestone's own compaction folded {len(lost)} pwal files the archive does not hold "
                              f"({', '.join(sorted(lost)[:3])}): archive them first; if they were deleted, their "
                              "keys are only in the source's compacted file, which this snapshot would not hold",
                              "refused")
            pwals = sorted((e for e in archived.values() if e.kind == "pwal_rotated" and e.name not in detached),
                           key=lambda e: e.name)
            epochs = [e.range["epochs"][1] for e in archived.values()
                      if e.kind == "epoch_rotated" and e.range.get("epochs")]
            # Durable: what the archived epoch files say, or the source's epoch file now (it only grows).
            durable = max([before.get("epoch", 0), report.durable_epoch or 0, *epochs])
            # What the archive does not hold yet (an active pwal, a file rotated since) is left unfolded: every
            # entry folded must be older than all of it, or a clear_storage in it would drop newer compacted ones.
            durable = min([durable] + [low - 1 for low in _unarchived_epochs(source, set(archived) | detached)])
            tracker = Progress(len(pwals), sum(e.size for e in pwals), progress, "read")
            materialize(repo, [(e.name, e) for e in pwals], work, tracker)
            try:
                folded = compact([work / e.name for e in pwals], durable, out,
                                 previous=prev_dir if any(prev_dir.iterdir()) else None)
            except ValueError as e:
                raise Refused(f"no snapshot of limestone {instance}: {e}", "damaged") from None
            if not folded.folded and previous is not None:
                raise NothingNew(f"no archived pwal file of limestone {instance} is left to fold: snapshot "
                              f"{previous.id} still covers the log up to epoch {previous.position.get('epoch')}",
                              "refused")
            if not folded.folded:
                raise Refused(f"no rotated pwal file of limestone {instance} is archived whole and durable: rotate "
                              "and archive the source first", "refused")
            write_atomic(out / "limestone-manifest.json", [manifest_bytes])
            # The snapshot's position: the newest epoch it folded. Its state is exact from there up to MAX_EPOCH_ID
            # (no file left out holds an epoch at or below that), and it was reached by the newest folded file's
            # rotation: the time retention judges it by.
            reached = max(before.get("epoch", 0), folded.reached)
            write_atomic(out / EPOCH_NAME, [durable_epoch(reached)])
            blobs = _blob_entries(folded.blob_ids, archived, previous)
            materialize(repo, blobs, out, Progress(len(blobs), 0, False, "read"))
            shutil.rmtree(work)
            times = [t for t in (rotation_time(n) for n in folded.detached) if t is not None]
            covers = {"epoch": reached, "max_epoch_id": folded.epoch,
                      "time": max([before.get("time") or 0, *times]) or None,
                      "folded": folded.folded, "detached": folded.detached, "max_blob_id": folded.max_blob_id,
                      "previous": previous.id if previous else None, "skipped": folded.skipped}
            plan = LimestonePlan(out, origin=source)
            return store_set(repo, plan, "snapshot", lease, level=level, runner=runner, progress=progress,
                             checks={"snapshot": covers})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _source_compaction(source: Path, catalog_read, into: Path) -> None:
    """The source's own compacted file and catalog (limestone's online compaction; `catalog_read`: the catalog
    limestone reads there, or None), copied as the base of the first snapshot: the keys of files it folded may be
    nowhere else (an operator deletes detached files)."""
    if catalog_read is None:
        return
    catalog = source / CATALOG_NAME
    if _parses(catalog):
        shutil.copyfile(catalog, into / CATALOG_NAME)
    else:  # limestone reads the .back when the main one does not parse
        shutil.copyfile(source / f"{CATALOG_NAME}.back", into / CATALOG_NAME)
    if (source / COMPACTED_NAME).is_file():
        shutil.copyfile(source / COMPACTED_NAME, into / COMPACTED_NAME)


def _parses(path: Path) -> bool:
    try:
        parse_catalog(path.read_bytes())
        return True
    except (OSError, ValueError):
        return False


def _unarchived_epochs(source: Path, archived: set[str]) -> list[int]:
    """The lowest snippet epoch of each pwal file of the source the archive does not hold (read only)."""
    lows = []
    for path in sorted(source.iterdir()):
        if kind_of(path.name) in ("pwal", "pwal_rotated") and path.name not in archived:
            try:
                found = snippet_range(path, 2**64 - 1)
            except ValueError as e:
                raise Refused(f"{path}: {e}: a snapshot cannot know which epochs it may fold", "damaged") from None
            if found:
                lows.append(found[0])
    return lows


def _blob_entries(blob_ids: list[int], archived: dict[str, FileEntry],
                  previous: BackupManifest | None) -> list[tuple[str, FileEntry]]:
    """The stored blob files the compacted file's entries reference: from the archive, or the previous snapshot."""
    held = {Path(e.name).name: e for e in (previous.files if previous else []) if e.kind == "blob"}
    held.update({Path(e.name).name: e for e in archived.values() if e.kind == "blob"})
    out, missing = [], []
    for blob_id in blob_ids:
        name = f"{blob_id:016x}.blob"
        if name not in held:
            missing.append(name)
        else:
            out.append((f"blob/dir_{blob_id % 100:02d}/{name}", held[name]))
    if missing:
        raise Refused(f"the compacted file references {len(missing)} blob files the repository does not hold "
                      f"({', '.join(missing[:5])}): archive the source's blobs first", "refused")
    return out
