"""The state command: the latest durable value of every key of a limestone directory."""

from __future__ import annotations

from pathlib import Path

from ..findings import Refused
from ..limestone.check import finish, prepare
from ..limestone.state import build_state


class StateRefused(Refused):
    """The log cannot be trusted to give the whole state."""


def directory_state(root: Path) -> list[tuple[int, bytes, bytes]]:
    """Rows (storage_id, key, value) as of the durable epoch; works on a crashed directory unrepaired.

    Raises StateRefused when the log cannot be trusted to give the whole state (unrepairable, not
    checkable, or a compacted file the catalog names is missing).
    """
    root = Path(root)
    plan = prepare(root)
    covered = set(plan.catalog.detached_pwals) if plan.catalog else set()
    rows, scans = build_state(plan.pwal_paths, plan.report.durable_epoch, covered)
    report, _ = finish(plan, scans)
    if report.status in ("cannot_check", "unrepairable"):
        why = "; ".join(f.message for s in scans.values() for f in s.findings) or "; ".join(
            f.message for f in report.findings)
        raise StateRefused(f"{root}: {report.status}: {why}", report.status)
    if lost := [f.message for f in report.findings if f.code == "missing_compacted_file"]:
        raise StateRefused(f"{root}: {'; '.join(lost)}", report.status)
    return rows
