"""The plan of a backup of a Tarantool data dir: the set (tarantool.backup_set), the newest xlog spooled so that
what is stored is what was verified, a running instance through box.backup.start()/stop(), the ledger."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from ..backup_common import LEDGER_VERDICTS, Candidate
from ..findings import Refused
from ..fsutil import host_name, owned_tempdir
from ..repository import Repository
from ..repository.manifest import BackupManifest, FileEntry
from .times import file_range, snapshot_time


class TarantoolPlan:
    family = "tarantool"
    lineage_kinds = ("xlog",)  # the log, whose bytes say which history a source is on: an incremental extends it

    def __init__(self, root: Path, connect: str | None, *, snapshot: bool = False):
        from .backup_set import instance_of

        self.root, self.connect = root, connect
        self.snapshot = snapshot  # the checkpoint's files only: a snapshot that covers the log up to its vclock
        self.notes: list[str] = []
        self.session = None
        self.checkpoint = None
        self.spool: Path | None = None
        self.scanning: dict[str, Future] = {}  # the spooled copies' scans, by name
        self.wal_dir: str | None = None
        self.instance = instance_of(root)
        if connect is None:
            self.notes.append(f"{root} is backed up as a stopped instance's data dir (no --connect given)")

    def __enter__(self):
        if self.connect:
            from .live import backup_session, take_snapshot

            if self.snapshot:
                take_snapshot(self.connect)  # so that the checkpoint pinned next covers the log up to now
            self.session = backup_session(self.connect)
            self.checkpoint = self.session.__enter__()
            if self.checkpoint.instance_uuid != self.instance:
                raise Refused(f"the instance at {self._connect_display()} is {self.checkpoint.instance_uuid}, but "
                              f"{self.root} holds {self.instance}", "refused")
        return self

    def __exit__(self, *exc):
        try:
            try:
                for future in self.scanning.values():  # a failed backup's: done before their copies are removed
                    future.cancel() or future.exception()
            finally:
                if self.session is not None:
                    self.session.__exit__(*exc)  # box.backup.stop(), also when the copy failed or was interrupted
        finally:
            if self.spool is not None:
                shutil.rmtree(self.spool, ignore_errors=True)

    def _connect_display(self) -> str:
        if not self.connect:
            return ""
        from .live import redact_uri

        return redact_uri(self.connect)

    def candidates(self, parent: BackupManifest | None, runner) -> list[Candidate]:
        """The set's files; the newest xlog spooled, and scanned on this machine's cores that `runner` uses (all
        of them for a runner elsewhere) while it is stored."""
        from .backup_set import select

        since = None
        if parent is not None:
            xlogs = [e.name for e in parent.files if e.kind == "xlog"]
            since = xlogs[-1] if xlogs else None
        self.set = select(self.root, since_xlog=since, checkpoint=self.checkpoint.files if self.checkpoint else None)
        if self.snapshot:
            xlogs = [f for f in self.set.files if f.kind == "xlog"]
            # where the log goes: a restore of the snapshot makes that (empty) directory for Tarantool
            self.wal_dir = Path(xlogs[0].name).parent.as_posix() if xlogs else None
            self.set.files = [f for f in self.set.files if f.kind != "xlog"]
        self.notes += self.set.notes
        out = []
        for f in self.set.files:
            c = Candidate(f.path, f.name, f.kind, f.mutable)
            if f.mutable:
                # The newest xlog may grow while it is read: copy what it holds now to a spool, judge that copy,
                # and store exactly what was judged.
                self.spool = self.spool or owned_tempdir("walvault-spool-")  # a killed backup's is removed later
                c.path = self.spool / Path(f.name).name
                c.spooled = True
                _copy_prefix(f.path, c.path)
                self.scanning[c.name] = _scan_in_background(c.path, _local(runner))  # while the copy is stored
            out.append(c)
        return out

    def settle(self, candidates: list[Candidate]) -> list[Candidate]:
        """The verdicts on the spooled copies, scanned while they were stored; the copies cut after their last
        whole block, which must be stored again (rarely: only a copy that ends inside a block)."""
        cut = []
        for c in candidates:
            if c.name in self.scanning:
                c.verdict = self.scanning.pop(c.name).result()
                if self._whole_blocks(c):
                    cut.append(c)
        return cut

    def _whole_blocks(self, c: Candidate) -> bool:
        """Cut a copy of the newest xlog after its last whole block when it ends inside one (True then): a
        running instance was writing that block as it was copied, or a crash tore it (Tarantool discards such a
        tail too). Any other finding stays, and refuses the backup."""
        from .check import file_verdict
        from .xlog import scan_file

        torn = [x for x in c.verdict.findings if x.code in ("truncated_block", "unreadable_tail")]
        if not torn or len(torn) != len(c.verdict.findings):
            return False
        cut = min(x.offset for x in torn)
        size = c.path.stat().st_size
        os.truncate(c.path, cut)
        c.verdict = file_verdict(scan_file(c.path))
        self.notes.append(f"{c.name} ends inside a block at byte {cut} (being written, or torn by a crash): "
                          f"the {size - cut} bytes after its last whole block are not stored")
        return True

    def verify(self, repo: Repository, candidates: list[Candidate], runner, progress: bool) -> dict:
        from .backup_set import judge, verdict_from_record
        from ..scan_paths import scan_tarantool

        unknown = []
        for c in candidates:
            if c.verdict is not None:
                continue
            record = c.entry.verification if c.entry.reference else None
            if not (record and record.get("status") in LEDGER_VERDICTS and record.get("size") == c.entry.size):
                record = repo.ledger_verdict("tarantool", self.instance, c.entry.sha256, c.entry.size)
            if record:
                c.verdict = verdict_from_record(str(c.path), record)
                c.checked_by = "ledger"
            else:
                unknown.append(c)
        scanned = scan_tarantool([c.path for c in unknown], runner=runner, progress=progress)
        for c in unknown:
            c.verdict = scanned[str(c.path)]
            c.checked_by = "scan"
        reports = {}  # the set's checks judge the files where they are in the source
        for c in candidates:
            c.verdict.path = str(self._source_path(c))
            reports[c.verdict.path] = c.verdict
        checks = judge(self.set, reports)
        checks["snapshot"]["time"] = snapshot_time(self.set.snapshot.path)
        if self.snapshot:
            checks["snapshot"]["wal_dir"] = self.wal_dir
        for c in unknown:
            if c.verdict.status in LEDGER_VERDICTS and not c.mutable:
                from .ledger import record_verdict

                record_verdict(repo, self.instance, c.entry.sha256, c.verdict)
        return {"position": {"vclock": checks.pop("position")}, **checks}

    def _source_path(self, c: Candidate) -> Path:
        return next(f.path for f in self.set.files if f.name == c.name)

    def verification(self, c: Candidate) -> dict:
        from .backup_set import verdict_record

        record = verdict_record(c.verdict)
        record["checked_by"] = getattr(c, "checked_by", "scan")
        c.entry.range = file_range(c.verdict, c.path)
        return record

    def renamed_since(self, name: str, entry: FileEntry, candidates: list[Candidate], held: dict) -> list[Candidate]:
        """Tarantool never renames an xlog: no other file carries its recorded bytes."""
        return []

    def not_behind(self, position: dict, parent: dict) -> bool:
        mine, theirs = position.get("vclock", {}), parent.get("vclock", {})
        return all(mine.get(k, 0) >= v for k, v in theirs.items())

    def source_info(self) -> dict:
        return {"instance": self.instance, "path": str(self.root.resolve()), "host": host_name(),
                "live": self.connect is not None, "connect": self._connect_display() or None}


def _local(runner):
    from ..runner import LocalRunner

    return runner if isinstance(runner, LocalRunner) else LocalRunner()


def _scan_in_background(copy: Path, runner) -> Future:
    """The verdict on a spooled copy, by byte ranges on the local runner's cores (worker processes: the scan
    holds no lock the storing threads need; none with one job)."""
    from ..scan_paths import scan_tarantool

    pool = ThreadPoolExecutor(1, thread_name_prefix="walvault-scan")
    future = pool.submit(lambda: scan_tarantool([copy], runner=runner)[str(copy)])
    pool.shutdown(wait=False)
    return future


def _copy_prefix(src: Path, dst: Path) -> None:
    """The bytes src holds now, copied in the kernel (a reflink where the filesystem shares blocks)."""
    left = src.stat().st_size
    in_kernel = True
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        while left > 0:  # both files' offsets move on either way
            if in_kernel:
                try:
                    n = os.copy_file_range(fin.fileno(), fout.fileno(), left)
                except OSError:  # not between these filesystems: through this process
                    in_kernel = False
                    continue
            else:
                data = fin.read(min(1 << 20, left))
                view = memoryview(data)
                while view:  # an unbuffered write may take less than it is given
                    view = view[fout.write(view):]
                n = len(data)
            if not n:
                break
            left -= n
