"""The verify command: check every block, every row and every chain link under the given paths.

Files are cut into work units (whole files, or byte ranges of big ones) spread over worker
processes; the units of one file merge back into exactly what one sequential scan would give.
"""

from __future__ import annotations

import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from .tarantool.check import Chain, TarantoolFile, check_chains, file_verdict, in_progress_file
from .tarantool.layout import Layout, discover, kind_of
from .tarantool.xlog import FileScan, merge_spans, scan_file

# A file larger than this is split so that both cores work on it.
SPLIT_SIZE = 32 << 20


@dataclass
class Report:
    files: list[TarantoolFile]
    chains: list[Chain]
    ignored: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return all(f.status != "damaged" for f in self.files) and all(c.status == "ok" for c in self.chains)

    def to_json(self) -> dict:
        return {"files": [f.to_json() for f in self.files], "chains": [c.to_json() for c in self.chains]}


def _units(path: Path, size: int, jobs: int) -> list[tuple[int | None, int | None]]:
    if jobs < 2 or size <= SPLIT_SIZE:
        return [(None, None)]
    n = max(2, min(size // (SPLIT_SIZE // 2), jobs * 8))
    cuts = [size * i // n for i in range(n + 1)]
    return [(None if i == 0 else cuts[i], None if i == n - 1 else cuts[i + 1]) for i in range(n)]


def _scan_unit(path: str, start: int | None, stop: int | None) -> FileScan:
    return scan_file(path, start=start, stop=stop)


def _join(path: str, parts: list[tuple[int | None, int | None, FileScan]]) -> FileScan:
    """Merge the scans of one file's ranges; re-scan from where two ranges do not meet."""
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


def verify_paths(paths: list[Path], *, jobs: int | None = None, progress: bool = False) -> Report:
    """Verify files and directories. Raises FileNotFoundError/PermissionError when a path cannot be read."""
    layout: Layout = discover(paths)
    jobs = jobs or os.cpu_count() or 1
    sizes = {str(p): p.stat().st_size for p in layout.files}
    work = []
    for p in layout.files:
        kind = kind_of(p)
        if kind and kind[1]:
            continue
        for start, stop in _units(p, sizes[str(p)], jobs):
            work.append((str(p), start, stop))
    tracker = Progress(sum(sizes.values()), progress)
    results: dict[str, list] = {}
    if jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {pool.submit(_scan_unit, *unit): unit for unit in sorted(work, key=lambda u: -sizes[u[0]])}
            for future in as_completed(futures):
                path, start, stop = futures[future]
                results.setdefault(path, []).append((start, stop, future.result()))
                tracker.advance(((stop or sizes[path]) - (start or 0)))
    else:
        for path, start, stop in work:
            results.setdefault(path, []).append((start, stop, _scan_unit(path, start, stop)))
            tracker.advance(sizes[path])
    reports: dict[str, TarantoolFile] = {}
    for p in layout.files:
        key = str(p)
        if key in results:
            reports[key] = file_verdict(_join(key, results[key]))
        else:
            reports[key] = in_progress_file(p, sizes[key])
    chains = [c for d in layout.data_dirs for c in check_chains(d, reports)]
    return Report([reports[str(p)] for p in layout.files], chains, [str(p) for p in layout.ignored])
