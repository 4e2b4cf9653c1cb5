"""The repair command: make a crashed limestone directory startable again, as `tglogutil repair` does.

By default it only prints the plan. With `--apply`, under limestone's own lock and only when
nothing unrepairable was found, it:
1. detaches every non-empty active pwal file (`pwal_NNNN` -> `pwal_NNNN.<ms14>.<n>`), so that nothing
   is ever appended after a broken tail;
2. cancels every nondurable snippet: its header byte 2 becomes 6, in place;
3. marks a broken tail as the real tool does — the header of a broken snippet, or the first byte of
   a tail that starts where a header must be (zero fill), becomes 6 — or, with `--cut`, truncates
   the file there, after the bytes to be cut were saved next to the directory
   (`<dir>.walvault-cut/<file>.<offset>`), so that nothing is lost.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..limestone.catalog import CATALOG_BACKUP, CATALOG_NAME
from ..limestone.check import check_dir
from ..findings import Refused
from ..fsutil import fsync_dir, read_chunks, write_atomic
from ..limestone.layout import exclusive_lock, kind_of, rotated_name
from ..limestone.pwal import CANCELED_HEADER, SNIPPET_HEADER


class RepairRefused(Refused):
    """The directory has damage repair must not touch, or cannot be checked."""


@dataclass
class FilePlan:
    name: str
    size: int
    cancel: list[int] = field(default_factory=list)  # nondurable snippet headers: 2 -> 6
    tail_mark: int | None = None  # broken tail: this byte -> 6
    cut_at: int | None = None  # with --cut: truncate here
    detach_to: str | None = None

    def actions(self, cut: bool) -> list[str]:
        out = [f"cancel nondurable snippet at {o} (byte 2 -> 6)" for o in self.cancel]
        if cut and self.cut_at is not None:
            out.append(f"truncate at {self.cut_at}, cutting {self.size - self.cut_at} bytes (saved first)")
        elif self.tail_mark is not None:
            out.append(f"mark the broken tail at {self.tail_mark} as a canceled snippet (byte -> 6)")
        return out


@dataclass
class RepairPlan:
    root: Path
    status: str  # the directory's verdict before repair
    files: list[FilePlan]
    cut: bool
    restore_catalog: bool = False  # compaction_catalog is unreadable and its .back is good
    applied: bool = False
    saved: list[str] = field(default_factory=list)
    # After --apply: why the directory is still not ok (damage the repairs uncovered), or None.
    left: str | None = None

    @property
    def needed(self) -> bool:
        # A repairable directory may need no byte changed: a broken tail after a canceled header in an
        # active file is mended by detaching the file alone (limestone never reads past it then).
        return self.status == "repairable" or self.restore_catalog or any(f.actions(self.cut) for f in self.files)

    def to_json(self) -> dict:
        return {"path": str(self.root), "status": self.status, "cut": self.cut, "applied": self.applied,
                "saved": self.saved, "restore_catalog": self.restore_catalog, "left": self.left,
                "files": [{"file": f.name, "detach_to": f.detach_to, "actions": f.actions(self.cut)}
                          for f in self.files if f.actions(self.cut) or f.detach_to]}


def plan_repair(root: Path, *, cut: bool = False, checked=None) -> RepairPlan:
    """What repair would do; writes nothing. Raises RepairRefused when it must not be done.

    `checked` is check_dir(root), when the caller has just made it.
    """
    root = Path(root)
    plan, report, scans = checked or check_dir(root)
    if report.status == "cannot_check":
        raise RepairRefused(f"{root}: cannot check: " + "; ".join(f.message for f in report.findings), report.status)
    if report.status == "unrepairable":
        raise RepairRefused(f"{root}: unrepairable, nothing changed: {_unrepairable(scans)}", report.status)
    files = []
    for path in plan.pwal_paths:
        s = scans[str(path)]
        files.append(FilePlan(path.name, s.size, list(s.marks), s.tail_mark, s.cut_at if cut else None))
    restore = any(f.code == "bad_catalog" for f in report.findings) and report.status == "repairable"
    if restore and not (root / CATALOG_NAME).is_file():
        # It is saved aside before the backup replaces it: a FIFO would block that copy, a directory fail it.
        raise RepairRefused(f"{root}: {CATALOG_NAME} is not a regular file; move it aside, then repair again",
                            report.status)
    return RepairPlan(root, report.status, files, cut, restore)


def _unrepairable(scans) -> str:
    return "; ".join(f"{Path(s.path).name} at {f.offset}: {f.message}" for s in scans.values() for f in s.findings
                     if f.code in ("corrupted_durable_snippet", "unexpected_entry"))


def apply_repair(rp: RepairPlan, *, now_ms: int | None = None) -> RepairPlan:
    """Carry out a plan (see the module doc). Raises LiveError when limestone holds the directory."""
    root = rp.root
    with exclusive_lock(root):
        fresh = plan_repair(root, cut=rp.cut)  # the directory may have changed since the plan was shown
        if [f.actions(rp.cut) for f in fresh.files] != [f.actions(rp.cut) for f in rp.files]:
            raise RepairRefused(f"{root} changed since the plan was made; run repair again")
        if not fresh.needed:
            return fresh
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        # What can fail for reasons outside the log (the directory for saved bytes) comes before any change.
        if fresh.restore_catalog or any(f.cut_at is not None for f in fresh.files):
            _cut_dir(root).mkdir(exist_ok=True)
        if fresh.restore_catalog:
            _restore_catalog(root, fresh)
        for f in fresh.files:
            if kind_of(f.name) == "pwal" and f.size > 0:
                f.detach_to = rotated_name(root, f.name, now_ms)
                os.rename(root / f.name, root / f.detach_to)
                fsync_dir(root)
        for f in fresh.files:
            _repair_file(root / (f.detach_to or f.name), f, fresh)
        _repair_what_it_uncovers(fresh)
        fsync_dir(root)
        fresh.applied = True
        return fresh


def _repair_what_it_uncovers(rp: RepairPlan) -> None:
    """Marking a broken tail can uncover another behind it (a file damaged in several places): repair
    again until nothing is left to do, so that the directory verifies ok. Later passes' actions are
    added to the plan, after the first's. Damage a repair cannot mend, uncovered so, is kept in `left`."""
    done: list = []
    while True:
        checked = check_dir(rp.root)
        _, report, scans = checked
        if report.status == "unrepairable":
            rp.left = f"unrepairable: {_unrepairable(scans)}"
            return
        again = plan_repair(rp.root, cut=rp.cut, checked=checked)
        todo = [f for f in again.files if f.actions(rp.cut)]
        if not todo or todo == done:
            return
        for f in todo:
            _repair_file(rp.root / f.name, f, again)
        rp.files += todo
        rp.saved += again.saved
        done = todo


def _repair_file(path: Path, f: FilePlan, rp: RepairPlan) -> None:
    if not f.actions(rp.cut):
        return
    cut_at = f.cut_at if rp.cut else None
    if cut_at is not None:  # the bytes to be cut are saved as they are, before anything is written
        rp.saved.append(str(_save_tail(rp.root, path, cut_at)))
    with open(path, "r+b") as fh:
        for offset in f.cancel:
            if cut_at is None or offset < cut_at:
                _overwrite(fh, offset, expected=(SNIPPET_HEADER,))
        if cut_at is not None:
            fh.truncate(cut_at)
        elif f.tail_mark is not None:
            _overwrite(fh, f.tail_mark, expected=None)
        fh.flush()
        os.fsync(fh.fileno())


def _restore_catalog(root: Path, rp: RepairPlan) -> None:
    """What limestone does at start: the catalog's backup replaces it (the damaged one is kept aside)."""
    rp.saved.append(str(_save_tail(root, root / CATALOG_NAME, 0)))
    write_atomic(root / CATALOG_NAME, read_chunks(root / CATALOG_BACKUP))


def _overwrite(fh, offset: int, expected) -> None:
    fh.seek(offset)
    old = fh.read(1)
    if expected is not None and (not old or old[0] not in expected):
        raise RepairRefused(f"{fh.name}: byte {offset} is {old!r}, not a snippet header; nothing more changed")
    fh.seek(offset)
    fh.write(bytes([CANCELED_HEADER]))


def _cut_dir(root: Path) -> Path:
    root = root.resolve()  # `.` has no name: the copy would land inside the directory
    return root.parent / f"{root.name}.walvault-cut"


def _save_tail(root: Path, path: Path, offset: int) -> Path:
    """Copy the bytes from `offset` to the end into `<dir>.walvault-cut/`, durably, before any cut."""
    keep = _cut_dir(root)
    keep.mkdir(exist_ok=True)
    target = keep / f"{path.name}.{offset}"
    n = 1
    while target.exists():  # an earlier cut at the same place: keep both
        target = keep / f"{path.name}.{offset}.{n}"
        n += 1
    write_atomic(target, read_chunks(path, offset))
    fsync_dir(keep.parent)
    return target
