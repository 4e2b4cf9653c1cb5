"""The pin and unpin commands: keep a backup (and its parent chain) whatever retention says, or stop keeping it.

Both work under the source's lease, the one an expiry holds from its plan to its last deletion: a pin taken while
an expiry of the source runs waits for it (`wait`) or is refused (LeaseBusy, exit 1), and is never lost. Once the
lease is held the backup is looked up again: an expiry that ran meanwhile may have deleted it (then, as for an id
the repository never held, RepositoryError: exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..repository import Repository, RepositoryError
from ..repository.pins import remove_pin, write_pin


@dataclass
class PinResult:
    backup: str
    family: str
    instance: str
    pinned: bool  # whether the backup is pinned now
    changed: bool  # False: it was so already (an unpin of a backup not pinned)
    pin: dict | None = None  # the pin now kept

    def to_json(self) -> dict:
        return {"backup": self.backup, "family": self.family, "instance": self.instance, "pinned": self.pinned,
                "changed": self.changed, "pin": self.pin}


def pin(repo: Repository, backup: str, note: str | None = None, *, wait: float = 0.0) -> PinResult:
    """Pin `backup` (an id, or latest) with an optional note (check_pin_note's)."""
    record = repo.find(backup)
    with repo.lease(record.family, record.instance, "pin", wait=wait) as lease:
        _still_there(repo, record)
        lease.confirm()  # the commit point: an expiry that broke this lease planned without the pin
        kept = write_pin(repo, record.family, record.instance, record.id, note)
    return PinResult(record.id, record.family, record.instance, True, True, kept)


def unpin(repo: Repository, backup: str, *, wait: float = 0.0) -> PinResult:
    record = repo.find(backup)
    with repo.lease(record.family, record.instance, "unpin", wait=wait) as lease:
        _still_there(repo, record)
        lease.confirm()
        removed = remove_pin(repo, record.family, record.instance, record.id)
    return PinResult(record.id, record.family, record.instance, False, removed)


def _still_there(repo: Repository, record) -> None:
    if repo.load_backup(record.family, record.instance, record.id).manifest is None:
        raise RepositoryError(f"no backup {record.id} in the repository {repo.display} (an expiry deleted it)")

