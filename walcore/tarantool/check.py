"""Verdicts on Tarantool files and on the chains they form in a data dir.

Built from `xlog.FileScan` results; the links checked are those that Tarantool itself does not
(tarantool-files.md): EOF markers, PrevVClock links, silent truncation, gaps before snapshots.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import FindingList
from .layout import DataDir, kind_of, name_number
from .meta import Vclock, format_vclock, vclock_leq, vclock_sum
from .vinyl import VylogError, replay
from .xlog import SEALED_KINDS, FileScan, read_rows


@dataclass
class TarantoolFile:
    path: str
    kind: str | None
    status: str  # ok | open | in_progress | damaged
    size: int
    rows: int | None = None
    blocks: int | None = None
    zstd_blocks: int | None = None
    eof: bool = False
    instance: str | None = None
    vclock: Vclock | None = None
    prev_vclock: Vclock | None = None
    # component -> [first, last, min, max] LSN
    lsns: dict[int, list[int]] = field(default_factory=dict)
    findings: FindingList = field(default_factory=FindingList)
    edge_blocks: list[int] | None = None  # offsets of the first and the last block: where row_times reads

    def end_vclock(self) -> Vclock | None:
        """The vclock after this file's last row."""
        if self.vclock is None:
            return None
        end = dict(self.vclock)
        for comp, r in self.lsns.items():
            end[comp] = r[1]
        return end

    def mark_damaged(self) -> None:
        if self.status != "in_progress":
            self.status = "damaged"

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "family": "tarantool",
            "kind": self.kind,
            "status": self.status,
            "size": self.size,
            "rows": self.rows,
            "blocks": self.blocks,
            "zstd_blocks": self.zstd_blocks,
            "eof": self.eof,
            "instance": self.instance,
            "vclock": _vclock_json(self.vclock),
            "prev_vclock": _vclock_json(self.prev_vclock),
            "lsn_ranges": {str(c): [r[2], r[3]] for c, r in sorted(self.lsns.items())},
            "findings": [f.to_json() for f in self.findings],
        }


def _vclock_json(vclock: Vclock | None) -> dict | None:
    return None if vclock is None else {str(k): v for k, v in sorted(vclock.items())}


def in_progress_file(path: Path, size: int) -> TarantoolFile:
    kind = kind_of(path)
    return TarantoolFile(str(path), kind[0] if kind else None, "in_progress", size)


def name_findings(path: Path, kind: str, vclock: Vclock | None) -> list[tuple[str, str]]:
    """What a file's name says against its meta block's kind and vclock: (code, message) for each disagreement."""
    found = []
    named = kind_of(path)
    if named and named[0] != kind:
        found.append(("kind_mismatch", f"file is named .{named[0]} but its meta block says {kind.upper()}"))
    number = name_number(path)
    if vclock is not None and kind in ("xlog", "snap", "vylog") and number is not None \
            and number != vclock_sum(vclock):
        found.append(("name_mismatch", f"name says vclock sum {number}, meta VClock {format_vclock(vclock)} sums "
                      f"to {vclock_sum(vclock)}"))
    return found


def file_verdict(scan: FileScan) -> TarantoolFile:
    """The verdict on one file seen alone (chain checks may add to it)."""
    span, meta = scan.span, scan.meta
    findings = scan.findings
    path = Path(scan.path)
    kind = scan.kind or (kind_of(path) or (None,))[0]
    if meta is not None:
        for code, message in name_findings(path, meta.kind, meta.vclock):
            findings.add(code, 0, message)
        if meta.kind == "xlog":
            for comp, (first, *_rest) in sorted(span.lsns.items()):
                expected = meta.vclock.get(comp, 0) + 1
                if first != expected:
                    code = "lsn_gap" if first > expected else "lsn_order"
                    findings.add(code, span.first_pos, f"first lsn of component {comp} is {first}, but VClock "
                                 f"{format_vclock(meta.vclock)} says the next is {expected}")
            if span.blocks and not span.last_commit and not span.stopped:
                findings.add("unterminated_transaction", span.last_block_pos,
                             "the last row does not commit its transaction")
        if not span.eof and not span.stopped and meta.kind in SEALED_KINDS:
            findings.add("missing_eof", span.end_pos, f"a .{meta.kind} file is written whole, but it has no EOF marker")
    # One order whatever the order of discovery (ranges scanned in parallel meet in any order).
    findings.sort(key=lambda f: (f.code == "too_many_findings", f.offset is None, f.offset or 0))
    if findings:
        status = "damaged"
    elif not span.eof:
        status = "open"
    else:
        status = "ok"
    return TarantoolFile(
        scan.path, kind, status, scan.size,
        rows=span.rows if meta else None, blocks=span.blocks if meta else None,
        zstd_blocks=span.zstd_blocks if meta else None, eof=span.eof,
        instance=meta.instance if meta else None, vclock=meta.vclock if meta else None,
        prev_vclock=meta.prev_vclock if meta else None, lsns=span.lsns, findings=findings,
        edge_blocks=[span.first_pos, span.last_block_pos] if span.blocks else None)



def _same(a: Vclock, b: Vclock) -> bool:
    return vclock_leq(a, b) and vclock_leq(b, a)


@dataclass
class Chain:
    path: str
    status: str
    findings: FindingList
    xlogs: list[str]
    snapshots: list[dict]

    def to_json(self) -> dict:
        return {"path": self.path, "status": self.status, "findings": [f.to_json() for f in self.findings],
                "xlogs": self.xlogs, "snapshots": self.snapshots}


def check_chains(data_dir: DataDir, reports: dict[str, TarantoolFile]) -> list[Chain]:
    """Check every wal dir's xlog chain and link the data dir's snapshots to it.

    May mark files damaged (an xlog other than the newest without its EOF marker).
    """
    snaps = [reports[str(p)] for p in data_dir.snaps]
    # (An open vylog older than the newest is no damage: after a crash, Tarantool starts a new one at the next
    # checkpoint without reopening the old one when no vinyl space changed meanwhile.)
    vylogs = [reports[str(p)] for p in data_dir.vylogs]
    chains = []
    for wal_dir, paths in data_dir.xlog_dirs.items():
        xlogs = [reports[str(p)] for p in paths]
        findings = FindingList()
        _check_links(xlogs, findings)
        snapshots = [_link_snapshot(s, xlogs, findings) for s in snaps]
        named = [f for f in xlogs + snaps + vylogs if f.instance]
        instances = Counter(f.instance for f in named)
        if len(instances) > 1:
            most = instances.most_common(1)[0][0]
            stray = next(f for f in named if f.instance != most)
            findings.add("instance_mismatch", None, f"files of {len(instances)} instances are mixed: "
                         + ", ".join(sorted(instances)) + f"; {Path(stray.path).name} is not of {most}, as most are",
                         stray.path)
        for f in xlogs + snaps + vylogs:
            if f.status == "damaged":
                findings.add("damaged_file", None, f"{Path(f.path).name} is damaged", f.path)
        chains.append(Chain(str(wal_dir), "damaged" if findings else "ok", findings,
                            [f.path for f in xlogs], snapshots))
    return chains


def _check_links(xlogs: list[TarantoolFile], findings: FindingList) -> None:
    for i, f in enumerate(xlogs):
        if f.status == "open" and i < len(xlogs) - 1:
            # Tarantool leaves the xlog it was writing at a crash without EOF marker and starts a new one.
            # That is harmless when the next xlog continues exactly where this one ends; else it was cut.
            nxt = xlogs[i + 1]
            if nxt.vclock is not None and nxt.prev_vclock is not None and _same(nxt.prev_vclock, f.vclock) \
                    and _same(f.end_vclock(), nxt.vclock):
                f.status = "ok"
            else:
                f.findings.add("missing_eof", f.size, "an xlog older than the newest has no EOF marker and the "
                               "next xlog does not continue where it ends: it was cut short")
                f.mark_damaged()
        if i == 0 or f.vclock is None or xlogs[i - 1].vclock is None:
            continue
        prev = xlogs[i - 1]
        end = prev.end_vclock()
        name = Path(f.path).name
        if f.prev_vclock is None:
            findings.add("prev_vclock_mismatch", None, f"{name} has no PrevVClock but follows {Path(prev.path).name}", f.path)
        elif not _same(f.prev_vclock, prev.vclock):
            findings.add("xlog_gap", None, f"{name} says the previous xlog starts at {format_vclock(f.prev_vclock)}, "
                         f"but {Path(prev.path).name} starts at {format_vclock(prev.vclock)}: an xlog is missing "
                         "between them", f.path)
            continue
        if not _same(end, f.vclock):
            findings.add("rows_lost", None, f"{Path(prev.path).name} ends at {format_vclock(end)} but {name} starts at "
                         f"{format_vclock(f.vclock)}: rows between them are missing (the older file was truncated)",
                         prev.path)


def _link_snapshot(snap: TarantoolFile, xlogs: list[TarantoolFile], findings: FindingList) -> dict:
    """Which xlogs a snapshot makes redundant, and which one replay starts from."""
    out = {"path": snap.path, "vclock": _vclock_json(snap.vclock), "status": snap.status,
           "covers": [], "replay_from": None}
    if snap.vclock is None:
        return out
    name = Path(snap.path).name
    for i, f in enumerate(xlogs):
        end = f.end_vclock()
        if end is None:
            continue
        # The newest xlog is never covered, open or sealed: Tarantool appends to it, and at its next start
        # reopens the empty one a clean shutdown leaves, so what it will hold no snapshot covers yet.
        if vclock_leq(end, snap.vclock) and i < len(xlogs) - 1:
            out["covers"].append(f.path)
        elif vclock_leq(f.vclock, snap.vclock) and out["replay_from"] is None:
            out["replay_from"] = f.path
    if out["replay_from"] is None:
        later = [f for f in xlogs if f.vclock is not None and not vclock_leq(f.vclock, snap.vclock)]
        if later:
            first = later[0]
            findings.add("snapshot_gap", None, f"after {name} at {format_vclock(snap.vclock)} the next xlog "
                         f"{Path(first.path).name} starts at {format_vclock(first.vclock)}: the xlogs between are "
                         "missing, so this snapshot cannot be replayed forward", first.path)
    return out


def check_vinyl(data_dir: DataDir, reports: dict[str, TarantoolFile], walked: set[str]) -> None:
    """Check the newest vylog as recovery reads it; what stops recovery is a finding of that vylog.

    It must not be newer than the newest snapshot of its data dir. When its vinyl dir was checked as a
    directory (`walked` holds the real paths of those), every run it needs must exist, and the files of
    runs it only prepared (a dump or compaction a crash cut short, deleted unread at the next start) are
    in progress, not damage. A vylog given alone is checked as a file, and older vylogs name runs that
    garbage collection may have removed since, rightly. A damaged vylog is not followed: its own
    findings say enough.
    """
    if not data_dir.vylogs:
        return
    newest = data_dir.vylogs[-1]
    vylog = reports[str(newest)]
    if vylog.status not in ("ok", "open"):
        return
    snap = reports[str(data_dir.snaps[-1])] if data_dir.snaps else None
    if snap is not None and snap.vclock is not None and vylog.vclock is not None \
            and not vclock_leq(vylog.vclock, snap.vclock):
        vylog.findings.add("vylog_ahead_of_snapshot", None,
                           f"the newest vylog is at {format_vclock(vylog.vclock)}, past the newest snapshot "
                           f"{Path(snap.path).name} at {format_vclock(snap.vclock)}: its snapshot is missing, and "
                           "Tarantool does not start (Can't find snapshot)")
        vylog.mark_damaged()
    if os.path.realpath(newest.parent) not in walked:
        return
    try:
        runs = replay((pos, row.body) for pos, row in read_rows(newest, stop=vylog.size))
    except VylogError as e:
        vylog.findings.add("bad_vylog_record", e.offset, f"{e}: Tarantool refuses this vylog")
        vylog.mark_damaged()
        return
    except (ValueError, OSError) as e:  # changed since it was checked
        vylog.findings.add("unreadable_file", None, f"cannot read the vylog again to follow its runs: {e}")
        vylog.mark_damaged()
        return
    if runs is None:
        return
    for run in runs.needed:
        for name in run.file_names():
            if not (newest.parent / name).is_file():
                vylog.findings.add("missing_run_file", run.offset,
                                   f"run {run.run_id} of space {run.space_id}, index {run.index_id} is in use, but "
                                   f"{name} is missing: Tarantool cannot start on this vinyl dir")
                vylog.mark_damaged()
    by_real_path = {os.path.realpath(f.path): f for f in reports.values()}
    for run in runs.unfinished:
        for name in run.file_names():
            f = by_real_path.get(os.path.realpath(newest.parent / name))
            if f is not None and f.status == "damaged":
                f.status = "in_progress"
