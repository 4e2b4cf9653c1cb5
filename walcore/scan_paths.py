"""Verifying paths (what the verify command, archive and the backup plans stand on): check every block, row,
entry and chain link under the given paths.

Both families are found by walking the paths: Tarantool files anywhere, and limestone log
directories (a directory with a manifest or pwal files; a limestone file given alone stands for
its directory). The work is cut into units — Tarantool files or byte ranges of big ones, limestone
pwal files — spread over worker processes; the ranges of one file merge back into exactly what
one sequential scan would give.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .limestone.layout import is_limestone_dir
from .limestone.layout import kind_of as limestone_kind
from .runner import LocalRunner, run_all
from .tarantool.layout import discover, kind_of

if TYPE_CHECKING:  # each family's reader is imported only when there are files of it
    from .limestone.check import LimestoneDir, LimestoneFile
    from .tarantool.check import Chain, TarantoolFile
    from .tarantool.xlog import FileScan, Span


# A file larger than this is split so that both cores work on it.
SPLIT_SIZE = 32 << 20


@dataclass
class Report:
    files: list[TarantoolFile | LimestoneFile]
    chains: list[Chain]
    dirs: list[LimestoneDir] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    checked_by: dict[str, str] = field(default_factory=dict)  # with a ledger: path -> "ledger" | "scan"
    sha256: dict[str, str] = field(default_factory=dict)  # with a ledger: path -> the SHA-256 of its bytes
    ledger_problems: list[str] = field(default_factory=list)  # with a ledger: why it was not updated

    @property
    def checkable(self) -> bool:
        return all(d.status != "cannot_check" for d in self.dirs)

    @property
    def intact(self) -> bool:
        return (all(f.status != "damaged" for f in self.files) and all(c.status == "ok" for c in self.chains)
                and all(d.status == "ok" and not d.findings for d in self.dirs))

    def to_json(self) -> dict:
        return {"files": [f.to_json() for f in self.files], "chains": [c.to_json() for c in self.chains],
                "dirs": [d.to_json() for d in self.dirs]}


def _units(size: int, jobs: int, start: int | None = None) -> list[tuple[int | None, int | None]]:
    """Byte ranges of a file to scan, [start, size) (from its first block when `start` is None)."""
    begin = start or 0
    if jobs < 2 or size - begin <= SPLIT_SIZE:
        return [(start, None)]
    n = max(2, min((size - begin) // (SPLIT_SIZE // 2), jobs * 8))
    cuts = [begin + (size - begin) * i // n for i in range(n + 1)]
    return [(start if i == 0 else cuts[i], None if i == n - 1 else cuts[i + 1]) for i in range(n)]


def _run_unit(unit: tuple):
    if unit[0] == "limestone":
        from .limestone.scan import scan_pwal

        return scan_pwal(unit[1], unit[2])
    from .tarantool.xlog import scan_file

    _, path, start, stop, exact = unit
    # A range from the middle begins at the first block found in it; one that continues a verified prefix (exact)
    # must hold a block right at its start
    return scan_file(path, start=start, stop=stop, search=not exact)


def _join(path: str, parts: list[tuple[int | None, int | None, FileScan]]) -> FileScan:
    """Merge the scans of one file's ranges; re-scan from where two ranges do not meet."""
    from .tarantool.xlog import merge_spans, scan_file

    parts.sort(key=lambda p: -1 if p[0] is None else p[0])
    whole = parts[0][2]
    xlog = whole.kind == "xlog"
    for start, stop, part in parts[1:]:
        span = whole.span
        if whole.meta is None or span.eof or span.stopped or span.end_pos is None:
            break
        if stop is not None and span.end_pos >= stop:
            continue  # the previous range already read past this one
        meets = part.span.first_pos == span.end_pos or (part.span.blocks == 0 and part.span.end_pos == span.end_pos)
        if not meets:
            part = scan_file(path, start=span.end_pos, stop=stop, search=False)
        for finding in part.findings:
            whole.findings.add(finding.code, finding.offset, finding.message)
        merge_spans(span, part.span, whole.findings, xlog=xlog)
    return whole


class Progress:
    """Progress on stderr for long runs: bytes done of the total, every few seconds."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled
        self.start = self.last = time.monotonic()

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and now - self.last >= 2:
            self.last = now
            rate = self.done / max(now - self.start, 1e-9) / 1e6
            print(f"walvault: {self.done / 1e6:,.0f} of {self.total / 1e6:,.0f} MB checked ({rate:,.0f} MB/s)",
                  file=sys.stderr, flush=True)


def _find(paths: list[Path]):
    """Tarantool layout and limestone directories under the paths."""
    roots: list[Path] = []

    def claim(d: Path) -> bool:
        if is_limestone_dir(d):
            roots.append(d)
            return True
        return False

    tarantool_paths = []
    for path in paths:
        if path.is_dir() and claim(path):
            continue
        root = _limestone_root(path) if path.is_file() and kind_of(path) is None else None
        if root is not None:
            roots.append(root)
            continue
        tarantool_paths.append(path)
    layout = discover(tarantool_paths, claim)
    unique: dict[str, Path] = {}  # a directory reached twice (a link, another spelling) is checked once
    for root in roots:
        unique.setdefault(os.path.realpath(root), root)
    return layout, sorted(unique.values())


def _limestone_root(path: Path) -> Path | None:
    """The log directory a limestone file given alone stands for: its own, or for a blob file in
    `blob/dir_NN/` the one above."""
    kind = limestone_kind(path.name)
    if kind is None:
        return None
    for root in (path.parent, path.parent.parent.parent) if kind == "blob" else (path.parent,):
        if is_limestone_dir(root):
            return root
    return None


def _run_work(work: list[tuple], unit_bytes, runner, tracker: Progress) -> dict[str, list]:
    """Run work units on the runner, biggest first; results by path."""
    done = run_all(runner, _run_unit, sorted(work, key=lambda u: -unit_bytes(u)),
                   done=lambda unit: tracker.advance(unit_bytes(unit)))
    results: dict[str, list] = {}
    for unit, result in done.items():
        results.setdefault(unit[1], []).append((unit, result))
    return results


def _tarantool_units(paths: list[Path], sizes: dict[str, int], jobs: int,
                     after: dict[str, Span] | None = None) -> list[tuple]:
    work = []
    for p in paths:
        kind = kind_of(p)
        if kind and kind[1]:
            continue
        start = after[str(p)].end_pos if after and str(p) in after else None
        for i, (first, stop) in enumerate(_units(sizes[str(p)], jobs, start)):
            work.append(("tarantool", str(p), first, stop, i == 0 and start is not None))
    return work


def _unit_bytes(sizes: dict[str, int]):
    def unit_bytes(unit) -> int:
        if unit[0] == "tarantool":
            return (unit[3] or sizes[unit[1]]) - (unit[2] or 0)
        return sizes[unit[1]]
    return unit_bytes


def scan_tarantool(paths: list[Path], *, runner=None, progress: bool = False,
                   after: dict[str, Span] | None = None) -> dict[str, TarantoolFile]:
    """The verdict on each Tarantool file seen alone (no chain checks), by str(path), scanned on the runner.
    `after`: for a file whose first bytes were verified before (an xlog that grew since), their span: only the
    bytes past it are scanned, and must continue it."""
    from .tarantool.check import file_verdict, in_progress_file
    from .tarantool.xlog import merge_spans

    runner = runner or LocalRunner()
    sizes = {str(p): p.stat().st_size for p in paths}
    work = _tarantool_units(paths, sizes, runner.parallelism, after)
    unit_bytes = _unit_bytes(sizes)
    results = _run_work(work, unit_bytes, runner, Progress(sum(map(unit_bytes, work)), progress))
    out = {}
    for p in paths:
        if str(p) not in results:
            out[str(p)] = in_progress_file(p, sizes[str(p)])
            continue
        scan = _join(str(p), [(u[2], u[3], r) for u, r in results[str(p)]])
        if after and str(p) in after and scan.meta is not None:
            prefix = copy.deepcopy(after[str(p)])
            merge_spans(prefix, scan.span, scan.findings, xlog=scan.kind == "xlog")
            scan.span = prefix
        out[str(p)] = file_verdict(scan)
    return out


def verify_paths(paths: list[Path], *, runner=None, progress: bool = False, ledger=None) -> Report:
    """Verify files and directories. Raises FileNotFoundError/PermissionError when a path cannot be read.

    With a ledger (command.verify.Ledger), a sealed Tarantool file whose bytes (by SHA-256) this walvault version
    verified clean before is not scanned again, and each one scanned clean is recorded."""
    from .limestone import check as limestone_check

    runner = runner or LocalRunner()
    layout, roots = _find(paths)
    plans = [limestone_check.prepare(root) for root in roots]
    sizes = {str(p): p.stat().st_size for p in layout.files}
    reports: dict[str, TarantoolFile] = {}
    if ledger is not None and layout.files:
        finished = [p for p in layout.files if (kind_of(p) or (None, True))[1] is False]  # no *.inprogress
        reports.update(ledger.look_up(finished, runner))
    work = _tarantool_units([p for p in layout.files if str(p) not in reports], sizes, runner.parallelism)
    for plan in plans:
        for p in plan.pwal_paths:
            sizes[str(p)] = p.stat().st_size
            work.append(("limestone", str(p), plan.report.durable_epoch))
    unit_bytes = _unit_bytes(sizes)
    results = _run_work(work, unit_bytes, runner, Progress(sum(map(unit_bytes, work)), progress))
    if layout.files:
        from .tarantool.check import check_chains, check_vinyl, file_verdict, in_progress_file
    for p in layout.files:
        key = str(p)
        if key in reports:
            continue
        if key in results:
            reports[key] = file_verdict(_join(key, [(u[2], u[3], r) for u, r in results[key]]))
        else:
            reports[key] = in_progress_file(p, sizes[key])
    if ledger is not None:
        ledger.record(reports)
    for d in layout.data_dirs:
        check_vinyl(d, reports, layout.walked)
    chains = [c for d in layout.data_dirs for c in check_chains(d, reports)]
    files: list = [reports[str(p)] for p in layout.files]
    dirs = []
    ignored = [str(p) for p in layout.ignored]
    for plan in plans:
        scans = {str(p): results[str(p)][0][1] for p in plan.pwal_paths}
        report, ls_files = limestone_check.finish(plan, scans)
        dirs.append(report)
        files += ls_files
        ignored += [str(p) for p in plan.ignored]
    return Report(files, chains, dirs, ignored, checked_by=ledger.checked_by if ledger else {},
                  sha256=ledger.sha256 if ledger else {}, ledger_problems=ledger.problems if ledger else [])
