"""The verdict of a backup's last restore drill, kept beside it (`<backup dir>/drill.json`, checksummed): the drill
command writes it, `walvault backups` shows it."""

from __future__ import annotations

from . import Repository
from .manifest import ManifestError, decode_checked

DRILL_NAME = "drill.json"


def last_drill(repo: Repository, family: str, instance: str, backup_id: str) -> dict | None:
    """The verdict of the backup's last drill (None: never drilled, or its record cannot be read)."""
    try:
        data = repo.storage.read_bytes(f"{repo.backup_dir(family, instance, backup_id)}/{DRILL_NAME}")
        return decode_checked(data, DRILL_NAME)
    except (FileNotFoundError, ManifestError):
        return None
