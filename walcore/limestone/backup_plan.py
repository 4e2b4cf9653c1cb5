"""The plan of a backup of a limestone log directory: every file limestone reads (never data/, compaction_temp/, ctrl/),
refused while a limestone holds it or while it does not verify ok.

From the choice of files to the end of the check, the backup holds limestone's own lock (flock LOCK_EX on the
manifest), as rotate and repair do: a limestone that started meanwhile could otherwise change the files
between their copies and the check, which reads the source after the copies were made."""

from __future__ import annotations

import os
from pathlib import Path

from ..backup_common import Candidate
from ..findings import Refused
from ..fsutil import host_name
from ..repository import Repository
from ..repository.manifest import BackupManifest, FileEntry


class LimestonePlan:
    family = "limestone"
    lineage_kinds = ("pwal", "pwal_rotated", "epoch_rotated")  # the log: an incremental's source extends it

    def __init__(self, root: Path, *, origin: Path | None = None):
        """`origin`: the source directory a snapshot built in `root` (a scratch directory) stands for: its
        instance and path are the origin's."""
        from .check import prepare
        from .layout import path_instance

        self.root = root
        self.origin = origin or root
        self.notes: list[str] = []
        self._lock = None
        plan = prepare(root)
        manifest = plan.report.manifest
        if manifest is None:
            raise Refused(f"{root}: limestone cannot read its manifest: "
                          + "; ".join(f.message for f in plan.report.findings), "cannot_check")
        if plan.report.live:
            raise Refused(f"{root} is held by a running limestone: back up the copy its online backup hands out, "
                          "or stop it first", "cannot_check")
        self.instance = manifest.instance_uuid or path_instance(self.origin)
        if not manifest.instance_uuid:
            self.notes.append(f"the manifest (format {manifest.format_version}) names no instance_uuid: the "
                              f"backup is kept under {self.instance}, derived from the directory's path")

    def __enter__(self):
        from .layout import exclusive_lock

        self._lock = exclusive_lock(self.root)
        self._lock.__enter__()  # LiveError when a limestone took the directory since __init__
        return self

    def __exit__(self, *exc):
        lock, self._lock = self._lock, None
        return lock.__exit__(*exc) if lock is not None else None

    def candidates(self, parent: BackupManifest | None, runner) -> list[Candidate]:
        from .layout import DERIVED, kind_of

        out = []
        for dirpath, dirs, names in os.walk(self.root):
            rel_dir = Path(os.path.relpath(dirpath, self.root))
            if rel_dir == Path("."):
                dirs[:] = [d for d in dirs if d == "blob"]
            for n in sorted(names):
                rel = (rel_dir / n).as_posix() if rel_dir != Path(".") else n
                kind = kind_of(n) if rel_dir == Path(".") else ("blob" if n.endswith(".blob") else None)
                if kind is None or rel.split("/")[0] in DERIVED:
                    continue
                out.append(Candidate(Path(dirpath) / n, rel, kind,
                                     kind in ("pwal", "epoch", "compacted", "catalog", "manifest")))
        return sorted(out, key=lambda c: c.name)

    def settle(self, candidates: list[Candidate]) -> list[Candidate]:
        """Nothing is scanned while it is stored: no copy is cut after it was stored."""
        return []

    def verify(self, repo: Repository, candidates: list[Candidate], runner, progress: bool) -> dict:
        from ..scan_paths import verify_paths

        report = verify_paths([self.root], runner=runner, progress=progress)
        d = report.dirs[0]
        # The check sees the directory as in use: by this backup's own lock, which no limestone can hold meanwhile.
        d.live = False
        if d.status != "ok" or d.findings:
            # the directory's findings, then its files' (a nondurable snippet or a broken tail is a file's)
            found = [f"{f.code}: {f.message}" for f in d.findings] + [
                f"{os.path.relpath(v.path, self.root)}: {f.code} at {f.offset}: {f.message}"
                for v in report.files for f in v.findings]
            why = "; ".join(found[:5]) + (f"; and {len(found) - 5} more" if len(found) > 5 else "") or d.status
            hint = " (walvault repair DIR --apply mends it)" if d.status == "repairable" else ""
            verdict = f"is {d.status}{hint}" if d.status != "ok" else "verifies ok but has findings"
            raise Refused(f"{self.root} {verdict}: {why}", "damaged" if d.status != "cannot_check"
                          else "cannot_check")
        by_path = {os.path.realpath(f.path): f for f in report.files}
        for c in candidates:
            c.verdict = by_path.get(os.path.realpath(c.path))
            if c.verdict is not None and c.verdict.status == "damaged":
                raise Refused(f"{c.path}: " + "; ".join(f.message for f in c.verdict.findings[:3]), "damaged")
        return {"position": {"epoch": d.durable_epoch}, "directory": d.to_json()}

    def verification(self, c: Candidate) -> dict:
        if c.verdict is None:  # blobs: present, and referred to or not; their bytes have no structure to check
            return {"status": "ok", "kind": c.kind, "checked_by": "presence"}
        record = c.verdict.to_json()
        del record["path"]
        record["checked_by"] = "scan"
        if c.verdict.epoch_range:
            c.entry.range = {"epochs": c.verdict.epoch_range}
        return record

    def renamed_since(self, name: str, entry: FileEntry, candidates: list[Candidate], held: dict) -> list[Candidate]:
        """An active pwal rotated since: the channel's new rotated files carry its recorded bytes."""
        if entry.kind != "pwal":
            return []
        return [r for r in candidates if r.kind == "pwal_rotated" and r.name.startswith(name + ".")
                and r.name not in held]

    def not_behind(self, position: dict, parent: dict) -> bool:
        return position.get("epoch", 0) >= parent.get("epoch", 0)

    def source_info(self) -> dict:
        return {"instance": self.instance, "path": str(self.origin.resolve()), "host": host_name(),
                "live": False, "connect": None}
