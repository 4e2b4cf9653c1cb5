"""The state command: the latest durable value of every key of a limestone directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..findings import Refused
from ..limestone.check import finish, prepare
from ..limestone.scan import scan_pwal
from ..runner import LocalRunner, run_all


class StateRefused(Refused):
    """The log cannot be trusted to give the whole state."""


def _scan(unit: tuple[str, int]):
    return scan_pwal(unit[0], unit[1])


def directory_state(root: Path, *, runner=None, parquet=None) -> Iterator[tuple[int, bytes, bytes]]:
    """Rows (storage_id, key, value) as of the durable epoch, sorted; works on a crashed directory unrepaired.
    The files are judged first (on the runner), then the state is built there (and written as Parquet too when
    `parquet` is given).

    Raises StateRefused when the log cannot be trusted to give the whole state (unrepairable, not
    checkable, or a compacted file the catalog names is missing).
    """
    root = Path(root)
    runner = runner or LocalRunner()
    plan = prepare(root)
    epoch = plan.report.durable_epoch
    results = run_all(runner, _scan, [(str(p), epoch) for p in plan.pwal_paths])
    scans = {str(p): results[(str(p), epoch)] for p in plan.pwal_paths}  # in the files' order, not as they finished
    report, _ = finish(plan, scans)
    if report.status in ("cannot_check", "unrepairable"):
        why = "; ".join(f.message for s in scans.values() for f in s.findings) or "; ".join(
            f.message for f in report.findings)
        raise StateRefused(f"{root}: {report.status}: {why}", report.status)
    if lost := [f.message for f in report.findings if f.code == "missing_compacted_file"]:
        raise StateRefused(f"{root}: {'; '.join(lost)}", report.status)
    covered = set(plan.catalog.detached_pwals) if plan.catalog else set()
    return runner.state_rows(plan.pwal_paths, epoch, covered, parquet=parquet)
