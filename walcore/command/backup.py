"""The backup command: one source (a Tarantool data dir or a limestone log directory) into the repository.

Order of work (backup_common.store_set), so that a backup is either whole and proven or absent:
1. take the source's lease, remove what an interrupted backup of it left (files without a main manifest), fencing
   each such directory first so that its writer, if it only paused, can no longer commit it;
2. choose the set (the family's rules) and, for an incremental, its parent chain (of the same source identity);
3. store each file not already held by the parent chain — read once, hashing the source bytes and the
   stored bytes, zstd-compressed, on all cores; sealed files the parent chain holds (same name and size:
   sealed files never change) are referenced, mutable ones (the newest xlog, an active pwal, `epoch`) are
   read again and referenced only when their bytes are the same; a source whose log does not extend the parent
   chain's (another history: a copy or a clone) is refused;
4. verify: a file whose SHA-256 the ledger knows as verified is not read again; others are scanned; then
   the family's set checks (chain, snapshot, vinyl; the limestone directory verdict) run on the set;
5. prove the lease is still ours, then write the manifest (copy, then main by an exclusive create): only then
   does the backup exist. A lease lost (broken by a backup that judged this one dead) stops it with LeaseLost.
Any refusal or error removes what this backup stored (but a fence another backup put in place of its manifest).
"""

from __future__ import annotations

from pathlib import Path

from ..backup_common import BackupResult, store_set
from ..family import plan_for
from ..repository import Repository


def backup(source: Path, repo: Repository, *, incremental: bool = False, connect: str | None = None,
           level: int = 3, runner=None, progress: bool = False, wait: float = 0.0,
           notes: dict[str, str] | None = None) -> BackupResult:
    """Back up one source. The copy, hash, compress and verify work runs on the runner (this machine's cores by
    default); the plan, the set's checks and the manifest stay here. `notes` (manifest.parse_notes's) are kept in
    the manifest."""
    plan = plan_for(source, connect)
    with repo.lease(plan.family, plan.instance, "backup", wait=wait) as lease:
        return store_set(repo, plan, "incremental" if incremental else "full", lease, level=level, runner=runner,
                         progress=progress, notes=notes)
