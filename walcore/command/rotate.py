"""The rotate command: detach a limestone directory's active pwal files and its epoch file.

Active `pwal_NNNN` files become `pwal_NNNN.<ms14>.<n>` and `epoch` becomes
`epoch.<ms14>.<E>` (the names limestone gives them when it rotates for a backup), so that they are
immutable and can be archived; limestone opens new active files when it next starts. Only a
directory that verifies ok and that no limestone holds is rotated, under limestone's own lock; no
existing file is ever overwritten, and every rename is followed by an fsync of the directory.

The epoch E in `epoch.<ms14>.<E>`: limestone writes its current (switched) epoch. A directory
rotated offline has no current epoch; walvault writes the highest epoch that appears in any
snippet header (canceled ones included): it bounds every record of the rotated file, and it is the
epoch limestone records as durable when it next starts.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..limestone.check import check_dir
from ..limestone.epoch import EPOCH_NAME
from ..findings import Refused
from ..fsutil import fsync_dir
from ..limestone.layout import exclusive_lock, kind_of, rotated_name


class RotateRefused(Refused):
    """The directory is not in a state to rotate (it needs repair, or cannot be checked)."""


@dataclass
class Rotation:
    root: str
    renamed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, why)

    def to_json(self) -> dict:
        return {"path": self.root, "renamed": [{"from": a, "to": b} for a, b in self.renamed],
                "skipped": [{"file": a, "why": b} for a, b in self.skipped]}


def rotate(root: Path, *, min_bytes: int = 1, now_ms: int | None = None) -> Rotation:
    """Rotate the active files of at least `min_bytes`. Raises LiveError, RotateRefused or OSError.

    Everything is decided under the lock, and every target name is checked free, before the first rename.
    """
    root = Path(root)
    with exclusive_lock(root):
        plan, report, _ = check_dir(root)
        if report.status != "ok" or report.findings:  # a lost blob or compacted file: no archive goes on silently
            reasons = "; ".join(f.message for f in report.findings) or f"the directory is {report.status}"
            raise RotateRefused(f"{root}: {reasons} (run walvault verify; repair first if it says so)", report.status)
        if stray := [p.name for p in plan.ignored if p.name.startswith(EPOCH_NAME)]:
            # Once `epoch` is rotated away and empty, limestone reads every epoch* file for the durable epoch.
            raise RotateRefused(f"{root}: {', '.join(stray)} would be read for the durable epoch once epoch is "
                                f"rotated; move it aside first", report.status)
        now_ms = now_ms if now_ms is not None else time.time_ns() // 1_000_000
        result = Rotation(str(root))
        renames = []
        for path in plan.pwal_paths:
            if kind_of(path.name) != "pwal":
                continue
            size = path.stat().st_size
            if size < max(min_bytes, 1):
                result.skipped.append((path.name, f"{size} bytes, under --min-bytes {max(min_bytes, 1)}"))
                continue
            renames.append((path.name, rotated_name(root, path.name, now_ms)))
        epoch = root / EPOCH_NAME
        if renames and epoch.exists():
            renames.append((EPOCH_NAME, f"{EPOCH_NAME}.{now_ms:014d}.{report.max_appeared_epoch}"))
        taken = [new for _, new in renames if (root / new).exists()]
        if taken:
            raise RotateRefused(f"{root}: {', '.join(taken)} exists already; nothing renamed")
        for old, new in renames:
            os.rename(root / old, root / new)
            fsync_dir(root)
            result.renamed.append((old, new))
        if any(old == EPOCH_NAME for old, _ in renames):
            # limestone starts a new, empty epoch file at rotation; the durable epoch now comes from the
            # rotated one until the next record is written.
            fd = os.open(epoch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.fsync(fd)
            os.close(fd)
            fsync_dir(root)
    return result
