"""Where a backup has been copied (`walvault copy`), kept beside it in the repository it was copied from:

    <backup dir>/copies.json    {"copies": {<destination>: {"time", "by"}}}, checksummed; a destination is the
                                repository as `copy --to` named it (credentials redacted)

Written after the destination's manifest is committed, so it never names a copy that does not restore; each copy
adds its destination by a conditional update (two copies of one backup at once both stay). `backups` shows it.
"""

from __future__ import annotations

from . import Repository, utc_now, walvault_version
from .manifest import MANIFEST_NAME, ManifestError, decode_checked, encode_checked

COPIES_NAME = "copies.json"
_UPDATE_ATTEMPTS = 10


def record_copy(repo: Repository, family: str, instance: str, backup_id: str, destination: str) -> None:
    """Add `destination` to the backup's copies, unless it is named there already (a copy run again, or killed
    between its commit and this record before) or the backup's manifest is gone meanwhile (an expiry deleted it:
    a record there would leave a directory of the backup behind)."""
    where = repo.backup_dir(family, instance, backup_id)
    if not repo.storage.exists(f"{where}/{MANIFEST_NAME}"):
        return
    entry = {"time": utc_now(), "by": f"walvault {walvault_version()}"}
    named = []

    def change(current: bytes | None) -> bytes | bool:
        copies = _copies(current, where)
        if destination in copies:
            named.append(destination)
            return False
        return encode_checked({"copies": {**copies, destination: entry}})

    for _attempt in range(_UPDATE_ATTEMPTS):  # another copy of the backup updated it in between: read it again
        if repo.storage.update(f"{where}/{COPIES_NAME}", change) or named:
            return


def copies_of(repo: Repository, family: str, instance: str, backup_id: str) -> list[dict]:
    """The backup's copies: [{"to", "time", "by"}], by destination; [] when it was never copied (or its record
    cannot be read)."""
    where = repo.backup_dir(family, instance, backup_id)
    try:
        current = repo.storage.read_bytes(f"{where}/{COPIES_NAME}")
    except FileNotFoundError:
        return []
    return [{"to": to, **entry} for to, entry in sorted(_copies(current, where).items())]


def _copies(current: bytes | None, where: str) -> dict:
    if current is None:
        return {}
    try:
        copies = decode_checked(current, f"{where}/{COPIES_NAME}").get("copies")
    except ManifestError:
        return {}  # damaged: rewritten whole by the next copy
    return {k: v for k, v in copies.items() if isinstance(v, dict)} if isinstance(copies, dict) else {}
