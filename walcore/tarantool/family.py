"""Tarantool as a walvault family (walcore.family.Family): positions are vclocks, a snapshot is a checkpoint's
.snap, an archived file's log ends at its last row's time, a restore is proven by starting a real `tarantool`."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from ..backup_common import ArchiveItem, store_set
from ..findings import Refused
from ..repository import Repository, stamp_seconds
from ..repository.manifest import BackupManifest, FileEntry
from .meta import vclock_from_json, vclock_leq
from .times import snapshot_taken

_START = """
local json = require('json')
local cfg = json.decode(arg[1])
box.cfg{memtx_dir = cfg.memtx_dir, wal_dir = cfg.wal_dir, vinyl_dir = cfg.vinyl_dir, work_dir = cfg.work_dir,
        log = cfg.log, feedback_enabled = false, checkpoint_interval = 0}
local vclock = {}
for k, v in pairs(box.info.vclock) do vclock[tostring(k)] = v end
io.stdout:write(json.encode({vclock = vclock, uuid = box.info.uuid}))
os.exit(0)
"""


class Tarantool:
    name = "tarantool"
    uses_ledger = True  # a sealed file's verdict depends on its bytes alone
    rewritten_kinds = ()  # Tarantool never writes a sealed file again
    stream_note = "rows of is_local spaces are not streamed: a restore takes them from the archived xlogs"

    def plan(self, source: Path, connect: str | None, *, snapshot: bool):
        from .backup_plan import TarantoolPlan

        return TarantoolPlan(source, connect, snapshot=snapshot)

    def follow(self, source: Path, repo: Repository, *, seconds: float, status_file: Path | None, stop, say):
        raise Refused(f"{source} is a Tarantool data dir: a running Tarantool is streamed with --connect URI (as a "
                      "replica), not by reading its files", "cannot_check")

    def snapshot(self, source: Path, repo: Repository, *, connect: str | None, level: int, runner, progress: bool,
                 wait: float):
        plan = self.plan(source, connect, snapshot=True)
        with repo.lease(plan.family, plan.instance, "snapshot", wait=wait) as lease:
            return store_set(repo, plan, "snapshot", lease, level=level, runner=runner, progress=progress)

    def position_key(self, m: BackupManifest) -> tuple:
        return (sum(vclock_from_json(m.position.get("vclock")).values()), m.finished, m.id)

    def snapshot_of(self, m: BackupManifest) -> tuple[object, float] | None:
        snap = m.checks.get("snapshot")
        if not isinstance(snap, dict) or snap.get("vclock") is None:
            return None
        taken = snapshot_taken(snap["vclock"], snap.get("time"), [e.range for e in m.files if e.kind == "xlog"],
                               started=stamp_seconds(m.started), finished=stamp_seconds(m.finished))
        return vclock_from_json(snap["vclock"]), float(taken)

    def snapshot_rank(self, position) -> int:
        return sum(position.values())

    def describe_position(self, position) -> dict:
        return {"vclock": {str(k): v for k, v in sorted(position.items())}}

    def backup_time(self, m: BackupManifest) -> float:
        times = [e.range["time"][1] for e in m.files if e.kind == "xlog" and e.range.get("time")]
        if all("time" in e.range for e in m.files if e.kind == "xlog"):
            snap = self.snapshot_of(m)
            times += [snap[1]] if snap else []
            if times:
                return max(times)
        return stamp_seconds(m.finished)

    def coverage(self, anchor: BackupManifest) -> Callable[[FileEntry], tuple[bool, int]]:
        """A file is covered when the anchor's vclock reaches its last row in every component."""
        position = self.snapshot_of(anchor)[0]

        def covered(entry: FileEntry) -> tuple[bool, int]:
            vclock = entry.range.get("vclock")
            if not vclock:
                return False, 0
            end = vclock_from_json(vclock[1])
            return vclock_leq(end, position), sum(end.values())

        return covered

    def log_end(self, repo: Repository, entry: FileEntry) -> float | None:
        """The time of the file's last row: from its record, or (a record of an older walvault) from its bytes."""
        if "time" in entry.range:
            return entry.range["time"][1] if entry.range["time"] else None
        from ..backup_common import Progress
        from ..fsutil import owned_tempdir
        from ..repository.materialize import materialize
        from .times import row_times, snapshot_time

        scratch = owned_tempdir("walvault-expire-")
        try:
            materialize(repo, [("file", entry)], scratch, Progress(1, 0, False, "read"))
            if entry.kind == "snap":
                return snapshot_time(scratch / "file")
            times = row_times(scratch / "file")
            return times[1] if times else None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def archive_reach(self, repo: Repository, instance: str, source: dict,
                      entries: list[FileEntry]) -> tuple[int, dict, float | None] | None:
        """How far the archived xlog and snap files (and the stream's segments) reach: their end vclocks component
        by component, and the time of the last row of the file that reaches furthest. Not the end with the largest
        sum: a segment's component 0 is where its stream started (local rows are never streamed), so an xlog with
        many local rows would outrank newer segments. The furthest file is the one furthest in the replicated
        components; of two as far, the one with more local rows after them."""
        logs = [(vclock_from_json(e.range["vclock"][1]), e) for e in entries
                if e.kind in ("xlog", "segment", "snap") and e.range.get("vclock")]
        if not logs:
            return None
        reach: dict[int, int] = {}
        for end, _entry in logs:
            for component, lsn in end.items():
                reach[component] = max(reach.get(component, 0), lsn)
        _end, newest = max(logs, key=lambda log: (sum(v for k, v in log[0].items() if k), log[0].get(0, 0),
                                                  log[1].kind != "snap"))
        return sum(reach.values()), self.describe_position(reach), self.log_end(repo, newest)

    def stream_reach_entries(self, repo: Repository, instance: str) -> list[FileEntry]:
        """The newest segment's record only: within one history its end reaches every other one's."""
        from ..repository.archive import newest_segment

        newest = newest_segment(repo, self.name, instance)
        return [newest] if newest is not None else []

    def stream_behind(self, source_position: dict, stream_position: dict) -> bool:
        """Component 0 (local spaces' rows) is never replicated: only the other replica ids' LSNs count."""
        streamed = vclock_from_json(stream_position["vclock"])
        return any(replica_id and lsn > streamed.get(replica_id, 0)
                   for replica_id, lsn in vclock_from_json(source_position["vclock"]).items())

    def source_instance(self, source: Path) -> str | None:
        from .backup_set import instance_of

        try:
            return instance_of(source)
        except (Refused, OSError, ValueError):
            return None

    def source_reach(self, source: Path) -> tuple[int, dict, float | None] | None:
        """The newest xlog's end vclock (an active one too) and the time of the log's last row; a data dir without
        xlogs reaches as far as its newest snapshot."""
        from .check import file_verdict
        from .layout import discover
        from .meta import MAX_META_SIZE, parse_meta
        from .times import row_times, snapshot_time
        from .xlog import scan_file

        best = None
        for data_dir in discover([source]).data_dirs:
            for xlogs in data_dir.xlog_dirs.values():
                end, written = None, None
                for path in reversed(xlogs):  # newest first: a file just opened holds no row yet
                    f = file_verdict(scan_file(path))
                    end = end or f.end_vclock()
                    if f.edge_blocks:
                        try:
                            written = (row_times(path, edges=f.edge_blocks) or [None, None])[1]
                        except ValueError:  # a block being written: the time of the rows before it
                            continue
                        break
                if end is not None and (best is None or sum(end.values()) > best[0]):
                    best = (sum(end.values()), self.describe_position(end), written)
            if best is None and data_dir.snaps:
                with open(data_dir.snaps[-1], "rb") as f:
                    meta = parse_meta(f.read(MAX_META_SIZE))
                if meta is not None and meta.vclock is not None:
                    best = (sum(meta.vclock.values()), self.describe_position(meta.vclock),
                            snapshot_time(data_dir.snaps[-1]))
        return best

    def archive_items(self, report, result) -> list[ArchiveItem]:
        """The sealed files of a verified report (scan_paths.Report) to archive; what is not sealed, or is damaged,
        or names no instance, goes to the result's (command.archive.ArchiveResult) not_sealed and refused."""
        from .layout import kind_of

        files = {f.path: f for f in report.files if f.to_json()["family"] == self.name}
        chains = {c.path: c for c in report.chains}
        items = []
        newest = set()
        for chain in chains.values():
            if chain.xlogs:
                newest.add(chain.xlogs[-1])
        instance_of_dir: dict[str, str] = {}
        for f in files.values():
            if f.instance:
                instance_of_dir.setdefault(str(Path(f.path).parent), f.instance)
        vylogs: dict[Path, list] = {}  # the newest vylog of each vinyl dir is still written to
        for f in files.values():
            if f.kind == "vylog":
                vylogs.setdefault(Path(f.path).parent, []).append(f)
        for group in vylogs.values():
            newest.add(max(group, key=lambda f: Path(f.path).name).path)
        for f in files.values():
            path = Path(f.path)
            if f.status == "in_progress" or path.name.endswith(".inprogress"):
                result.not_sealed.append(f.path)
                continue
            if f.path in newest:
                result.not_sealed.append(f.path)
                continue
            if f.status == "damaged":
                result.refused.append({"path": f.path, "findings": [x.to_json() for x in f.findings]})
                continue
            if f.status != "ok":
                result.not_sealed.append(f.path)
                continue
            root = _data_root(path, f.kind)
            instance = f.instance or instance_of_dir.get(str(root)) or _instance_near(root, files)
            if instance is None:
                result.refused.append({"path": f.path, "findings": [{"code": "no_instance", "offset": None,
                                                                     "message": "no file beside it names its "
                                                                                "instance"}]})
                continue
            items.append(ArchiveItem(path, self.name, instance, Path(os.path.relpath(path, root)).as_posix(),
                                     kind_of(path)[0], f, root))
        return items

    def archive_sources(self, report) -> set[tuple[str, str]]:
        return set()  # a data dir's source is its archived files'

    def record_archived(self, repo: Repository, report, archived: set[str], leases: dict, result) -> None:
        """Nothing beyond the files' records (an xlog says where the log goes on: its PrevVClock); the stream's
        segments whose rows the archived xlogs now hold are deleted (tarantool/supersede.py)."""
        from .supersede import supersede

        for (family, instance), lease in sorted(leases.items()):
            if family == self.name:
                done = supersede(repo, family, instance, lease)
                result.superseded += done.deleted
                result.differs += done.differs

    def archived_verification(self, item: ArchiveItem) -> dict:
        from .backup_set import verdict_record

        return {**verdict_record(item.verdict), "checked_by": "scan"}

    def archived_range(self, item: ArchiveItem) -> dict:
        from .times import file_range

        return file_range(item.verdict, item.path)

    def restored_name(self, entry: FileEntry) -> str:
        return entry.name

    def finish_restore(self, manifest: BackupManifest, staging: Path) -> None:
        """A snapshot holds no xlog: Tarantool needs its wal dir there all the same."""
        from ..repository.materialize import wal_dir_of

        if manifest.type == "snapshot":
            (staging / wal_dir_of(manifest)).mkdir(parents=True, exist_ok=True)

    def point_restore(self, repo: Repository, manifest: BackupManifest, to: str, staging: Path,
                      progress: bool) -> tuple[int, dict, list, list[str]]:
        from ..restore_pitr import tarantool_point

        reused, point_info, entries = tarantool_point(repo, manifest, to, staging, progress)
        short = [f"the end restored is not the newest the stream stored: {point_info['unreached']}"] \
            if point_info.get("unreached") else []
        return reused, point_info, entries, _components_taken_as_zero(to, manifest, point_info) + short

    def prove_restore(self, m: BackupManifest, target: Path, work: Path) -> str:
        """A real `tarantool` (where installed) starts on the restore and reaches the recorded vclock."""
        import subprocess  # here, not for every command of the family

        from ..repository.materialize import wal_dir_of

        binary = shutil.which("tarantool")
        if binary is None:
            return "tarantool is not installed here: not started"
        snaps = sorted(target.rglob("*.snap"))
        xlogs = sorted(target.rglob("*.xlog"))
        vylogs = sorted(target.rglob("*.vylog"))
        memtx = snaps[-1].parent if snaps else target
        cfg = {"memtx_dir": str(memtx), "wal_dir": str(xlogs[-1].parent if xlogs else target / wal_dir_of(m)),
               "vinyl_dir": str(vylogs[-1].parent if vylogs else memtx), "work_dir": str(target),
               "log": str(work / "tarantool.log")}
        script = work / "start.lua"
        script.write_text(_START)
        proc = subprocess.run([binary, str(script), json.dumps(cfg)], capture_output=True, text=True, timeout=600,
                              cwd=work, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            log = (work / "tarantool.log").read_text(errors="replace") if (work / "tarantool.log").exists() else ""
            last = (log.strip().splitlines() or proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise Refused(f"tarantool did not start on the restore (exit {proc.returncode}): {last}", "damaged")
        started = json.loads(proc.stdout)
        reached = {k: v for k, v in started["vclock"].items() if v}
        wanted = {k: v for k, v in m.position.get("vclock", {}).items() if v}
        if reached != wanted:
            raise Refused(f"tarantool started at vclock {reached}, the backup records {wanted}", "damaged")
        if started["uuid"] != m.instance:
            raise Refused(f"tarantool started as instance {started['uuid']}, the backup is of {m.instance}",
                          "damaged")
        return f"tarantool started on it at the recorded vclock {reached}"


def _components_taken_as_zero(to: str, manifest: BackupManifest, point_info: dict) -> list[str]:
    """A vclock point that leaves out a component the log has stops before that component's first row: say so."""
    from .pitr import parse_point

    point = None if to.strip() == "end" else parse_point(to)
    if point is None or point.vclock is None:
        return []
    has = {int(c) for vclock in (point_info.get("vclock") or {}, manifest.position.get("vclock") or {})
           for c, lsn in vclock.items() if lsn}
    return [f"the point names no component {c}: taken as 0, so the restore stops before its first row"
            + (" (component 0 counts local-space rows)" if c == 0 else "") for c in sorted(has - set(point.vclock))]


def _data_root(path: Path, kind: str) -> Path:
    """The data dir a file belongs to: memtx/, wal/ and vinyl/ side by side count as one, their parent."""
    d = path.parent
    if kind in ("run", "index"):
        d = d.parent.parent  # <vinyl_dir>/<space>/<index>/<file>
    if d.name in ("memtx", "wal", "vinyl") and any((d.parent / n).is_dir() for n in ("memtx", "wal", "vinyl")
                                                  if n != d.name):
        return d.parent
    return d


def _instance_near(root: Path, files: dict) -> str | None:
    for f in files.values():
        if f.instance and Path(f.path).is_relative_to(root):
            return f.instance
    return None
