"""The drill command: a backup restored into a scratch directory and proven, its verdict recorded beside it.

Proof, beyond the restore's own check of every file's hashes:
- Tarantool: a real `tarantool` (where installed) starts on the restore and reaches the recorded vclock;
- limestone: the restore verifies ok, with the recorded durable epoch and durable entry counts.
The verdict goes to `<backup dir>/drill.json` (checksummed, rewritten by each drill) and `walvault backups` shows
it: a backup whose last drill failed is marked.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..findings import Refused
from ..fsutil import owned_tempdir
from ..repository import Repository, utc_now, walvault_version
from ..repository.drill import DRILL_NAME
from ..repository.manifest import BackupManifest, encode_checked
from ..repository.materialize import wal_dir_of
from ..restore_set import restore_into

_START = """
local json = require('json')
local cfg = json.decode(arg[1])
box.cfg{memtx_dir = cfg.memtx_dir, wal_dir = cfg.wal_dir, vinyl_dir = cfg.vinyl_dir, work_dir = cfg.work_dir,
        log = cfg.log, feedback_enabled = false, checkpoint_interval = 0}
local vclock = {}
for k, v in pairs(box.info.vclock) do vclock[tostring(k)] = v end
io.stdout:write(json.encode({vclock = vclock, uuid = box.info.uuid}))
os.exit(0)
"""


@dataclass
class DrillResult:
    backup: str
    family: str
    instance: str
    status: str  # ok | failed
    checks: list[str] = field(default_factory=list)  # what was proven
    problem: str | None = None
    time: str = field(default_factory=utc_now)

    def to_json(self) -> dict:
        return dict(self.__dict__)


def drill(repo: Repository, backup_id: str) -> DrillResult:
    """Restore the backup into a scratch directory (a killed drill's is removed by the next), prove it, record the
    verdict."""
    found = repo.find(backup_id)
    m = found.manifest
    result = DrillResult(m.id, m.family, m.instance, "ok")
    work = owned_tempdir("walvault-drill-")
    try:
        target = work / "restore"
        try:
            restored = restore_into(repo, m.id, target)
            result.checks.append(f"restored {restored.files} files, {restored.bytes:,} bytes, every hash checked")
            if m.family == "tarantool":
                _prove_tarantool(m, target, work, result)
            else:
                _prove_limestone(m, target, result)
        except (Refused, OSError, ValueError) as e:
            result.status, result.problem = "failed", str(e)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    repo.storage.write_bytes(f"{repo.backup_dir(m.family, m.instance, m.id)}/{DRILL_NAME}",
                             encode_checked({**result.to_json(), "by": f"walvault {walvault_version()}"}))
    return result


def _prove_tarantool(m: BackupManifest, target: Path, work: Path, result: DrillResult) -> None:
    binary = shutil.which("tarantool")
    if binary is None:
        result.checks.append("tarantool is not installed here: not started")
        return
    snaps = sorted(target.rglob("*.snap"))
    xlogs = sorted(target.rglob("*.xlog"))
    vylogs = sorted(target.rglob("*.vylog"))
    memtx = snaps[-1].parent if snaps else target
    cfg = {"memtx_dir": str(memtx), "wal_dir": str(xlogs[-1].parent if xlogs else target / wal_dir_of(m)),
           "vinyl_dir": str(vylogs[-1].parent if vylogs else memtx), "work_dir": str(target),
           "log": str(work / "tarantool.log")}
    script = work / "start.lua"
    script.write_text(_START)
    proc = subprocess.run([binary, str(script), json.dumps(cfg)], capture_output=True, text=True, timeout=600,
                          cwd=work, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        log = (work / "tarantool.log").read_text(errors="replace") if (work / "tarantool.log").exists() else ""
        last = (log.strip().splitlines() or proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise Refused(f"tarantool did not start on the restore (exit {proc.returncode}): {last}", "damaged")
    started = json.loads(proc.stdout)
    reached = {k: v for k, v in started["vclock"].items() if v}
    wanted = {k: v for k, v in m.position.get("vclock", {}).items() if v}
    if reached != wanted:
        raise Refused(f"tarantool started at vclock {reached}, the backup records {wanted}", "damaged")
    if started["uuid"] != m.instance:
        raise Refused(f"tarantool started as instance {started['uuid']}, the backup is of {m.instance}", "damaged")
    result.checks.append(f"tarantool started on it at the recorded vclock {reached}")


def _prove_limestone(m: BackupManifest, target: Path, result: DrillResult) -> None:
    from ..limestone.check import check_dir

    _plan, report, _scans = check_dir(target)
    recorded = m.checks.get("directory", {})
    if report.status != "ok":
        raise Refused(f"the restore verifies {report.status}: " + "; ".join(f.message for f in report.findings[:3]),
                      "damaged")
    if report.durable_epoch != m.position.get("epoch"):
        raise Refused(f"the restore's durable epoch is {report.durable_epoch}, the backup records "
                      f"{m.position.get('epoch')}", "damaged")
    if recorded.get("durable_entries") is not None and report.durable_entries != recorded["durable_entries"]:
        raise Refused(f"the restore holds durable entries {report.durable_entries}, the backup recorded "
                      f"{recorded['durable_entries']}", "damaged")
    result.checks.append(f"limestone's checks pass: durable epoch {report.durable_epoch}, entries "
                         f"{report.durable_entries} as recorded")
