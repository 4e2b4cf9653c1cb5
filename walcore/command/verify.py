"""The verify command (`walvault verify PATH...`): walcore.scan_paths checks the paths; with a repository, its
ledger spares a sealed Tarantool file verified clean before (by the SHA-256 of its bytes) another scan."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..repository import Repository
from ..runner import run_all
from ..tarantool.ledger import recorded_verdict

if TYPE_CHECKING:
    from ..tarantool.check import TarantoolFile


def _identity(path: str) -> tuple[int, int, int, int]:
    """What changes when a file is written or replaced: inode, size, modification and change times."""
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _hash_file(path: str) -> tuple[str, int, str | None, tuple]:
    """SHA-256, size and instance (from the meta block) of a Tarantool file — its key in the ledger — and its
    identity before it was read."""
    from ..fsutil import read_chunks
    from ..tarantool.meta import MetaError, parse_meta

    identity = _identity(path)
    digest, size, instance = hashlib.sha256(), 0, None
    for chunk in read_chunks(Path(path)):
        if size == 0:
            try:
                meta = parse_meta(chunk)
                instance = meta.instance if meta is not None else None
            except MetaError:
                pass  # a damaged file: it is scanned, and its findings say why
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size, instance, identity


class Ledger:
    """Incremental verification through the repository's ledger: verdicts keyed by the SHA-256 of the bytes.

    Only Tarantool files: a limestone pwal file's verdict depends on the directory's durable epoch, not on its
    bytes alone (and it is scanned at the speed of reading it). The ledger is an optimisation: when the
    repository cannot be written, verification goes on and `problems` says why nothing was recorded."""

    def __init__(self, repo, *, full: bool = False):
        self.repo, self.full = repo, full
        self.keys: dict[str, tuple[str, int, str | None, tuple]] = {}
        self.checked_by: dict[str, str] = {}  # path -> "ledger" | "scan"
        self.sha256: dict[str, str] = {}
        self.problems: list[str] = []

    def look_up(self, paths: list[Path], runner) -> dict[str, TarantoolFile]:
        """Hash the files (on the runner); the verdicts on record for the bytes of each, unless `full`."""
        from ..repository import check_instance
        from ..repository.storage import UnsafeName

        self.keys = run_all(runner, _hash_file, [str(p) for p in paths])
        found = {}
        for path, (sha256, size, instance, identity) in self.keys.items():
            self.sha256[path] = sha256
            try:
                instance = check_instance(instance) if instance else None
            except UnsafeName:
                instance = None  # an Instance no repository name can hold: scanned, never recorded
            self.keys[path] = (sha256, size, instance, identity)
            verdict = None if self.full or instance is None else recorded_verdict(self.repo, instance, sha256,
                                                                                  size, path)
            if verdict is not None:
                found[path] = verdict
                self.checked_by[path] = "ledger"
        return found

    def record(self, reports: dict[str, TarantoolFile]) -> None:
        """Put each file scanned clean and sealed (its EOF marker read: its bytes never change) in the ledger,
        when the bytes scanned are the bytes hashed: the file is the one it was before it was hashed (not
        written to, nor replaced, meanwhile)."""
        from ..repository.storage import RepositoryError
        from ..tarantool.ledger import record_verdict

        for path, verdict in reports.items():
            if path in self.checked_by:
                continue
            self.checked_by[path] = "scan"
            key = self.keys.get(path)
            if not (key and verdict.status == "ok" and verdict.eof and key[1] == verdict.size and key[2]):
                continue
            try:
                if _identity(path) != key[3]:
                    continue
            except OSError:
                continue
            try:
                record_verdict(self.repo, key[2], key[0], verdict)
            except RepositoryError as e:
                self.problems.append(f"the ledger was not updated: {e}")
                return


def verify_sources(request, *, runner, show) -> object:
    """Verify `request.paths`; `show(report)` is called with the verdict, before the report is kept (with
    `request.repo`). Refused (cannot check) when a path holds no WAL file: an empty or wrong directory must not
    pass for an intact one."""
    from pathlib import Path

    from ..findings import Refused
    from ..repository.report import keep, warn, write_source_report
    from ..scan_paths import verify_paths

    repo = Repository(request.repo, request.repo_options) if request.repo else None
    started = time.time()
    report = verify_paths(request.paths, runner=runner, progress=request.progress,
                          ledger=Ledger(repo, full=request.full) if repo else None)
    # Every path must hold a file that was checked (found under it, or under where it leads: a file reached twice
    # is listed once, under the first path). A file of no kind (neither its name nor its meta says one) is not a
    # WAL file.
    checked = [f.path for f in report.files if f.status != "in_progress" and f.kind] + [d.path for d in report.dirs]
    checked += [os.path.realpath(c) for c in checked]
    if empty := [p for p in request.paths if not any(Path(c).is_relative_to(q) for c in checked
                                                     for q in (p, os.path.realpath(p)))]:
        raise Refused(f"no WAL files to check under {', '.join(map(str, empty))}", "cannot_check")
    show(report)
    if repo is not None:
        for problem in report.ledger_problems:
            warn(f"warning: {problem}")
        keep(repo, write_source_report, report, [str(p) for p in request.paths], started, runner.name)
    return report
