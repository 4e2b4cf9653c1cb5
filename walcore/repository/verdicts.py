"""The last verdicts on a backup, kept beside it (checksummed, each rewritten by the next of its kind):

    <backup dir>/drill.json     its last restore drill (`walvault drill`): {"status": "ok" | "failed", "time", ...}
    <backup dir>/verify.json    what the last `walvault verify --repo` that checked it found:
                                {"status": "ok" | "damaged", "time", "problem", "findings"}

A backup whose last verdict of either kind is a failure is not counted on to restore (walcore.retention): retention
anchors nothing on it and status does not call it good, until a drill or a verification passes again.
"""

from __future__ import annotations

from . import Repository
from .manifest import MANIFEST_NAME, ManifestError, decode_checked, encode_checked

DRILL_NAME = "drill.json"
VERIFY_NAME = "verify.json"


def last_verdict(repo: Repository, family: str, instance: str, backup_id: str, name: str) -> dict | None:
    """The backup's last verdict of a kind (`name`: DRILL_NAME or VERIFY_NAME); None: never given, or its record
    cannot be read."""
    try:
        data = repo.storage.read_bytes(f"{repo.backup_dir(family, instance, backup_id)}/{name}")
        return decode_checked(data, name)
    except (FileNotFoundError, ManifestError):
        return None


def last_drill(repo: Repository, family: str, instance: str, backup_id: str) -> dict | None:
    return last_verdict(repo, family, instance, backup_id, DRILL_NAME)


def last_verification(repo: Repository, family: str, instance: str, backup_id: str) -> dict | None:
    return last_verdict(repo, family, instance, backup_id, VERIFY_NAME)


def write_verdict(repo: Repository, family: str, instance: str, backup_id: str, name: str, verdict: dict) -> None:
    """The verdict beside the backup, unless its manifest is gone meanwhile (an expiry deleted it while it was
    checked): written there, it would leave a directory of the backup behind."""
    where = repo.backup_dir(family, instance, backup_id)
    if repo.storage.exists(f"{where}/{MANIFEST_NAME}"):
        repo.storage.write_bytes(f"{where}/{name}", encode_checked(verdict))


def failed_verdict(repo: Repository, family: str, instance: str, backup_id: str) -> str | None:
    """Why the backup's own last verdicts say it may not restore (None: neither failed)."""
    drill = last_drill(repo, family, instance, backup_id)
    if drill is not None and drill.get("status") != "ok":
        return f"its last drill ({drill.get('time')}) failed: {drill.get('problem')}"
    verification = last_verification(repo, family, instance, backup_id)
    if verification is not None and verification.get("status") != "ok":
        return f"its last verification ({verification.get('time')}) found it damaged: {verification.get('problem')}"
    return None
