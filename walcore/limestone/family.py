"""limestone as a walvault family (walcore.family.Family): positions are durable epochs, a snapshot is one
`walvault snapshot` built (a compacted file covering named files), an archived file's log ends at its rotation
time, a restore is proven by limestone's own checks."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from ..backup_common import ArchiveItem
from ..findings import Refused
from ..fsutil import host_name
from ..repository import Repository, stamp_seconds, utc_now
from ..repository.archive import archive_complete, complete_name, load_record, segment_records, source_key
from ..repository.manifest import BackupManifest, FileEntry, ManifestError, decode_checked, encode_checked
from .layout import REWRITTEN_KINDS, dir_instance, restored_name
from .manifest import MANIFEST_NAME


class Limestone:
    name = "limestone"
    uses_ledger = False  # a pwal file's verdict depends on the directory's durable epoch, not its bytes alone
    rewritten_kinds = REWRITTEN_KINDS
    stream_note = None

    def plan(self, source: Path, connect: str | None, *, snapshot: bool):
        from .backup_plan import LimestonePlan

        if connect:
            raise Refused("--connect is for a running Tarantool; a limestone directory is backed up from an "
                          "online-backup copy or a stopped datastore", "cannot_check")
        return LimestonePlan(source)

    def follow(self, source: Path, repo: Repository, *, seconds: float, status_file: Path | None, stop, say):
        from .stream import follow

        instance = self.source_instance(source)
        if instance is None:
            raise Refused(f"{source}: no readable {MANIFEST_NAME}: not a limestone directory walvault can follow",
                          "cannot_check")
        return follow(repo, self.name, source, instance, seconds=seconds, status_file=status_file, stop=stop,
                      say=say)

    def snapshot(self, source: Path, repo: Repository, *, connect: str | None, level: int, runner, progress: bool,
                 wait: float):
        from .snapshot import build_snapshot

        if connect:
            raise Refused("--connect is for a running Tarantool: a limestone snapshot is built from the archive",
                          "cannot_check")
        return build_snapshot(source, repo, level=level, runner=runner, progress=progress, wait=wait)

    def position_key(self, m: BackupManifest) -> tuple:
        return (m.position.get("epoch", 0), m.finished, m.id)

    def snapshot_of(self, m: BackupManifest) -> tuple[object, float] | None:
        snap = m.checks.get("snapshot")
        if not isinstance(snap, dict) or m.type != "snapshot" or snap.get("epoch") is None:
            return None
        taken = snap.get("time")
        return int(snap["epoch"]), float(taken) if taken is not None else stamp_seconds(m.started)

    def snapshot_rank(self, position) -> int:
        return position

    def describe_position(self, position) -> dict:
        return {"epoch": position}

    def backup_time(self, m: BackupManifest) -> float:
        from .layout import rotation_time

        if m.type == "snapshot":
            return self.snapshot_of(m)[1]
        if times := [t for t in (rotation_time(e.name) for e in m.files) if t is not None]:
            return max(times)
        return stamp_seconds(m.finished)

    def coverage(self, anchor: BackupManifest) -> Callable[[FileEntry], tuple[bool, int]]:
        """A rotated pwal file is covered when the anchor folded it (by name); the others by their epochs."""
        epoch = self.snapshot_of(anchor)[0]
        detached = set(anchor.checks["snapshot"].get("detached", []))

        def covered(entry: FileEntry) -> tuple[bool, int]:
            epochs = entry.range.get("epochs") or [0, 0]
            if entry.kind == "pwal_rotated":
                return Path(entry.name).name in detached, epochs[1]
            return epochs[1] <= epoch, epochs[1]

        return covered

    def log_end(self, repo: Repository, entry: FileEntry) -> float | None:
        """A rotated file's rotation time; a stream's partial: when the streamer read the durable epoch it holds."""
        from .layout import rotation_time

        return entry.range["time"] if "time" in entry.range else rotation_time(entry.name)

    def archive_reach(self, repo: Repository, instance: str, source: dict,
                      entries: list[FileEntry]) -> tuple[int, dict, float | None] | None:
        """The epoch up to which every channel of the directory is archived (archive-complete; else the furthest
        archived epoch), or the stream's newest durable epoch where that is further (its pieces hold every channel
        up to it), and the newest time of an archived file at or below it (a rotation's, or when the stream read
        its epoch)."""
        from .stream import EPOCH_KIND

        logs = [e for e in entries if e.kind in ("pwal_rotated", "epoch_rotated") and e.range.get("epochs")]
        streamed = [e for e in entries if e.kind == EPOCH_KIND]
        epoch = archive_complete(repo, self.name, instance, source)
        if epoch is None:  # not recorded (an older walvault's archive): as far as an archived file reaches
            epoch = max((e.range["epochs"][1] for e in logs), default=None)
        if streamed:
            epoch = max([e.range["epochs"][1] for e in streamed] + ([epoch] if epoch is not None else []))
        if epoch is None:
            return None
        times = [t for e in logs + streamed if e.range["epochs"][1] <= epoch
                 and (t := self.log_end(repo, e)) is not None]
        return epoch, self.describe_position(epoch), max(times, default=None)

    def stream_reach_entries(self, repo: Repository, instance: str) -> list[FileEntry]:
        """The stored durable epoch's record (the stream's commit point; the one before it is deleted once it is
        stored), read by name: the pieces' records are not."""
        from .stream import EPOCH_PREFIX

        names = [n for n in segment_records(repo, self.name, instance)
                 if n.rpartition("/")[2].startswith(EPOCH_PREFIX)]
        return [e for e in (load_record(repo, n) for n in names) if e is not None]

    def stream_behind(self, source_position: dict, stream_position: dict) -> bool:
        return source_position["epoch"] > stream_position["epoch"]

    def source_instance(self, source: Path) -> str | None:
        """Its manifest's instance_uuid, else the one derived from its path (as a backup of it is kept under)."""
        from .layout import path_instance
        from .manifest import MANIFEST_NAME, ManifestError, parse_manifest

        try:
            manifest = parse_manifest((Path(source) / MANIFEST_NAME).read_bytes())
        except (OSError, ManifestError):
            return None
        return manifest.instance_uuid or path_instance(Path(source))

    def source_reach(self, source: Path) -> tuple[int, dict, float | None] | None:
        """The durable epoch of the directory's epoch files, and when the one holding it was last written."""
        from .epoch import scan_epoch
        from .layout import kind_of

        found = []  # (epoch, when written)
        for path in Path(source).iterdir():
            if kind_of(path.name) in ("epoch", "epoch_rotated") and path.is_file():
                epoch = scan_epoch(path.read_bytes()).durable_epoch
                if epoch is not None:
                    found.append((epoch, path.stat().st_mtime))
        if not found:
            return None
        epoch, written = max(found)
        return epoch, self.describe_position(epoch), written

    def archive_items(self, report, result) -> list[ArchiveItem]:
        """The sealed files of each checked directory of a report (rotated pwal and epoch files, blobs, each content
        of a file limestone rewrites); what is not sealed, or is damaged, goes to the result's not_sealed and
        refused."""
        items = []
        sealed = ("pwal_rotated", "epoch_rotated", "blob") + REWRITTEN_KINDS
        for d in report.dirs:
            root = Path(d.path)
            if d.status == "cannot_check" or d.manifest is None:
                result.refused.append({"path": d.path, "findings": [x.to_json() for x in d.findings]})
                continue
            instance = dir_instance(d)
            for f in report.files:
                if f.to_json()["family"] != self.name or not Path(f.path).is_relative_to(root):
                    continue
                if f.kind not in sealed:
                    result.not_sealed.append(f.path)
                    continue
                if f.status == "damaged":
                    result.refused.append({"path": f.path, "findings": [x.to_json() for x in f.findings]})
                    continue
                items.append(ArchiveItem(Path(f.path), self.name, instance,
                                         Path(os.path.relpath(f.path, root)).as_posix(), f.kind, f, root))
        return items

    def archive_sources(self, report) -> set[tuple[str, str]]:
        """Every checked directory's source, also with nothing to archive: its archive-complete record moves on."""
        return {(self.name, dir_instance(d)) for d in report.dirs if d.manifest is not None}

    def record_archived(self, repo: Repository, report, archived: set[str], leases: dict, result) -> None:
        """Record how far each source's log is archived whole: below the lowest epoch of any of its pwal files
        that is not archived (an active channel, a channel a rotation skipped, a refused file), and durable.
        Archived epoch files alone do not say it: a rotation may leave a channel active. It only grows: a new entry
        always has an epoch past the durable one. It is kept per source directory too (a copy of the directory
        shares the instance)."""
        for d in report.dirs:
            if d.status == "cannot_check" or d.manifest is None:
                continue
            root = Path(d.path)
            left = [f for f in report.files if f.kind in ("pwal", "pwal_rotated")  # limestone's kinds only
                    and Path(f.path).is_relative_to(root) and f.path not in archived and f.size]
            if any(f.epoch_range is None for f in left):
                continue  # a file not archived whose epochs are unknown (damaged): nothing more is known whole
            complete = min([d.durable_epoch or 0] + [f.epoch_range[0] - 1 for f in left])
            instance = dir_instance(d)
            name = complete_name(repo, self.name, instance)
            try:
                before = decode_checked(repo.storage.read_bytes(name), "archive-complete")
            except (FileNotFoundError, ManifestError):
                before = {}
            epoch = before.get("epoch") if isinstance(before.get("epoch"), int) else None
            per = dict(before.get("sources") or {}) if isinstance(before.get("sources"), dict) else {}
            key = source_key(host_name(), str(root.resolve()))
            if (epoch is not None and complete <= epoch) and isinstance(per.get(key), int) and complete <= per[key]:
                continue
            per[key] = max(complete, per[key]) if isinstance(per.get(key), int) else complete
            leases[self.name, instance].confirm()
            repo.storage.write_bytes(name, encode_checked({
                "epoch": complete if epoch is None else max(epoch, complete), "sources": per, "updated": utc_now()}))

    def archived_verification(self, item: ArchiveItem) -> dict:
        record = item.verdict.to_json()
        del record["path"]
        return {**record, "checked_by": "scan"}

    def archived_range(self, item: ArchiveItem) -> dict:
        return {"epochs": item.verdict.epoch_range} if item.verdict.epoch_range else {}

    def restored_name(self, entry: FileEntry) -> str:
        return restored_name(entry.name, entry.kind)

    def finish_restore(self, manifest: BackupManifest, staging: Path) -> None:
        """The files are the whole directory limestone reads."""

    def point_restore(self, repo: Repository, manifest: BackupManifest, to: str, staging: Path,
                      progress: bool) -> tuple[int, dict, list, list[str]]:
        from ..restore_pitr import limestone_point

        return (*limestone_point(repo, manifest, to, staging, progress), [])

    def prove_restore(self, m: BackupManifest, target: Path, work: Path) -> str:
        """The restore verifies ok, with the recorded durable epoch and durable entry counts."""
        from .check import check_dir

        _plan, report, _scans = check_dir(target)
        recorded = m.checks.get("directory", {})
        if report.status != "ok":
            raise Refused(f"the restore verifies {report.status}: "
                          + "; ".join(f.message for f in report.findings[:3]), "damaged")
        if report.durable_epoch != m.position.get("epoch"):
            raise Refused(f"the restore's durable epoch is {report.durable_epoch}, the backup records "
                          f"{m.position.get('epoch')}", "damaged")
        if recorded.get("durable_entries") is not None and report.durable_entries != recorded["durable_entries"]:
            raise Refused(f"the restore holds durable entries {report.durable_entries}, the backup recorded "
                          f"{recorded['durable_entries']}", "damaged")
        return (f"limestone's checks pass: durable epoch {report.durable_epoch}, entries "
                f"{report.durable_entries} as recorded")
