"""Pins: a backup kept whatever the retention policy says (`walvault pin`), with its parent chain.

    <backup dir>/pin.json    {"pinned": time, "by", "host", "note"} (checksummed): the backup is pinned while it
                             is there; `walvault unpin` removes it

A pin is a mutable object beside the backup's immutable manifest (pinning never rewrites a manifest), written and
removed by the storage's conditional update, under the source's lease: the lease an expiry holds while it plans and
deletes, so a pin is either in the plan of an expiry or waits for (or is refused by) the expiry that runs.
"""

from __future__ import annotations

from ..fsutil import host_name
from . import Repository, utc_now, walvault_version
from .manifest import ManifestError, check_note_text, decode_checked, encode_checked
from .storage import RepositoryError

PIN_NAME = "pin.json"


def check_pin_note(note: str | None) -> str | None:
    """`pin --note TEXT` as kept (ValueError when check_note_text refuses it); None: no note."""
    return None if note is None else check_note_text(note, "--note")


def pins_of_source(repo: Repository, family: str, instance: str) -> dict[str, dict]:
    """The pins of a source's backups, by backup id, from one listing. A pin that cannot be read still pins (its
    backup is kept): its record says why (`problem`)."""
    backups = f"{repo.source_dir(family, instance)}/backups"
    found = {}
    for name in repo.storage.list(backups):
        backup_id, _, leaf = name[len(backups) + 1:].partition("/")
        if leaf == PIN_NAME and (pin := _read(repo, name)) is not None:  # None: unpinned since the listing
            found[backup_id] = pin
    return found


def read_pin(repo: Repository, family: str, instance: str, backup_id: str) -> dict | None:
    """The backup's pin (as pins_of_source says it); None: not pinned."""
    return _read(repo, f"{repo.backup_dir(family, instance, backup_id)}/{PIN_NAME}")


def _read(repo: Repository, name: str) -> dict | None:
    try:
        return decode_checked(repo.storage.read_bytes(name), name)
    except FileNotFoundError:
        return None
    except ManifestError as e:
        return {"problem": str(e)}


def write_pin(repo: Repository, family: str, instance: str, backup_id: str, note: str | None) -> dict:
    """Pin the backup (the caller holds the source's lease and has seen its manifest): a pin there already is
    replaced, its note with it."""
    pin = {"pinned": utc_now(), "by": f"walvault {walvault_version()}", "host": host_name(), "note": note}
    name = f"{repo.backup_dir(family, instance, backup_id)}/{PIN_NAME}"
    data = encode_checked(pin)
    if not repo.storage.update(name, lambda current: data):
        raise RepositoryError(f"{name} changed while it was written: pin the backup again")
    return pin


def remove_pin(repo: Repository, family: str, instance: str, backup_id: str) -> bool:
    """Unpin the backup (under the source's lease); False when it was not pinned."""
    name = f"{repo.backup_dir(family, instance, backup_id)}/{PIN_NAME}"
    return repo.storage.update(name, lambda current: None)
