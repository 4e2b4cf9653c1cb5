"""The plan of a backup of a Tarantool data dir: the set (tarantool.backup_set), the newest xlog spooled so that
what is stored is what was verified, a running instance through box.backup.start()/stop(), the ledger."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..backup_common import FINGERPRINT_BYTES, LEDGER_VERDICTS, Candidate
from ..findings import Refused
from ..fsutil import file_sha256, host_name, owned_tempdir
from ..repository import Repository
from ..repository.manifest import BackupManifest, FileEntry
from .times import file_range, snapshot_time

if TYPE_CHECKING:
    from concurrent.futures import Future

    from .xlog import Span


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
        self.prefixes: dict = {}  # of a copy of what was appended to an xlog: the recorded bytes' span, by name
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
        of them for a runner elsewhere) while it is stored. The parent's newest xlog, appended to since, is
        spooled from where the parent's copy ended: only the appended bytes are stored and scanned."""
        from .backup_set import select

        since = None
        recorded = {}
        if parent is not None:
            xlogs = [e.name for e in parent.files if e.kind == "xlog"]
            since = xlogs[-1] if xlogs else None
            recorded = {e.name: e for e in parent.files}
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
            base = recorded.get(f.name)
            st = f.path.stat()  # before its bytes are read: the mtime of what is copied, at most these bytes
            prefix = _extendable(f.path, st.st_size, base)
            if prefix is not None:
                c.extends, c.mtime_ns = (parent, base), st.st_mtime_ns
                c.path = self._spool(f.name)
                # the meta block, the end of what is stored already (its fingerprint, row times), what follows
                lead = max(prefix.first_pos, base.size - FINGERPRINT_BYTES)
                _copy_ranges(f.path, c.path, [(0, prefix.first_pos), (lead, st.st_size)])
                self.prefixes[c.name] = prefix
            elif f.mutable:
                # The newest xlog may grow while it is read: copy what it holds now to a spool, judge that copy,
                # and store exactly what was judged.
                c.path = self._spool(f.name)
                _copy_ranges(f.path, c.path, [(0, st.st_size)])
            else:
                out.append(c)
                continue
            c.spooled = True
            self.scanning[c.name] = _scan_in_background(c.path, _local(runner), self._after(c))  # while stored
            out.append(c)
        return out

    def _spool(self, name: str) -> Path:
        self.spool = self.spool or owned_tempdir("walvault-spool-")  # a killed backup's is removed later
        return self.spool / Path(name).name

    def _after(self, c: Candidate) -> dict | None:
        """What scan_tarantool continues for a spooled copy of an xlog that grew: the recorded prefix's span."""
        return {str(c.path): self.prefixes[c.name]} if c.name in self.prefixes else None

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
        from ..runner import LocalRunner
        from ..scan_paths import scan_tarantool

        torn = [x for x in c.verdict.findings if x.code in ("truncated_block", "unreadable_tail")]
        # A sealed xlog (the parent's newest, rotated or left by a crash since: only its appended bytes copied) is
        # written no more: a torn tail there is damage, as a full backup finds it, not a block being written
        if not torn or len(torn) != len(c.verdict.findings) or not c.mutable:
            return False
        cut = min(x.offset for x in torn)
        size = c.path.stat().st_size
        os.truncate(c.path, cut)
        c.verdict = scan_tarantool([c.path], runner=LocalRunner(1), after=self._after(c))[str(c.path)]
        self.notes.append(f"{c.name} ends inside a block at byte {cut} (being written, or torn by a crash): "
                          f"the {size - cut} bytes after its last whole block are not stored")
        return True

    def verify(self, repo: Repository, candidates: list[Candidate], runner, progress: bool) -> dict:
        from .backup_set import judge, verdict_from_record

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
        if unknown:
            from ..scan_paths import scan_tarantool

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
        for c in unknown + [c for c in candidates if c.extends is not None]:  # what was scanned here
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
        c.entry.range = self._range(c)
        return record

    def _range(self, c: Candidate) -> dict:
        """The file's range; of a copy of what was appended, its rows' times from the recorded prefix's first
        to its own last block's (the copy does not hold the file's first block)."""
        if c.name not in self.prefixes:
            return file_range(c.verdict, c.path)
        prefix, recorded = self.prefixes[c.name], c.extends[1].range
        if c.verdict.edge_blocks is None or c.verdict.edge_blocks[1] < prefix.end_pos:  # no row was appended
            return dict(recorded)
        last = c.verdict.edge_blocks[1]
        out = file_range(replace(c.verdict, edge_blocks=[last, last]), c.path)
        if out.get("time") and recorded.get("time"):
            out["time"] = [recorded["time"][0], out["time"][1]]
        else:
            out["time"] = None
        return out

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


def _scan_in_background(copy: Path, runner, after: dict | None) -> Future:
    """The verdict on a spooled copy, by byte ranges on the local runner's cores (worker processes: the scan
    holds no lock the storing threads need; none with one job); `after`: as scan_tarantool takes it."""
    from concurrent.futures import ThreadPoolExecutor

    from ..scan_paths import scan_tarantool

    pool = ThreadPoolExecutor(1, thread_name_prefix="walvault-scan")
    future = pool.submit(lambda: scan_tarantool([copy], runner=runner, after=after)[str(copy)])
    pool.shutdown(wait=False)
    return future


def _extendable(path: Path, size: int, entry: FileEntry | None) -> Span | None:
    """The span of the bytes a parent's entry recorded of the newest xlog it stored, when the file (`size` bytes
    now) still begins with them, as far as the end of them says (their fingerprint), and its hash can go on
    from them: only what was appended since is then stored and scanned."""
    if entry is None or entry.kind != "xlog" or not entry.mutable or not entry.append_state or size < entry.size:
        return None
    from .. import sha256_state
    from .backup_set import span_from_record

    if not sha256_state.available():
        return None
    try:  # a record that does not hold together (a manifest another program wrote): the file is stored whole
        prefix = span_from_record(entry.verification, entry.size)
        resumed = sha256_state.ResumableSha256.resume(entry.append_state["sha256_state"])
        offset, digest = entry.append_state["last"]
        # the state must end in the file's recorded SHA-256 and size: carried on from another one, the whole file
        # would be recorded with a SHA-256 its pieces never make
        if not 0 <= offset <= entry.size or (resumed.state()["length"], resumed.hexdigest()) != (entry.size,
                                                                                               entry.sha256):
            return None
    except (sha256_state.StateError, KeyError, TypeError, ValueError):
        return None
    if prefix is None:
        return None
    return prefix if file_sha256(path, offset, entry.size) == digest else None


def _copy_ranges(src: Path, dst: Path, ranges: list[tuple[int, int]]) -> None:
    """Byte ranges of src copied to the same offsets of dst (a hole between them), in the kernel where it can (a
    reflink where the filesystem shares blocks)."""
    in_kernel = True
    with open(src, "rb", buffering=0) as fin, open(dst, "wb", buffering=0) as fout:
        for start, stop in ranges:
            pos = start
            while pos < stop:
                if in_kernel:
                    try:
                        n = os.copy_file_range(fin.fileno(), fout.fileno(), stop - pos, pos, pos)
                    except OSError:  # not between these filesystems: through this process
                        in_kernel = False
                        continue
                else:
                    data = os.pread(fin.fileno(), min(1 << 20, stop - pos), pos)
                    view = memoryview(data)
                    at = pos
                    while view:  # a write may take less than it is given
                        done = os.pwrite(fout.fileno(), view, at)
                        view, at = view[done:], at + done
                    n = len(data)
                if not n:
                    break
                pos += n
