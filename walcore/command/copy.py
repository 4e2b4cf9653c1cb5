"""The copy command: backups, with their parent chains, and (`archive`) a source's archive with its records, copied
from one repository into a second one that `walvault init` made (another bucket, another region, a local disk).

Each stored object is copied as stored (its compressed bytes, never recompressed) through the two repositories'
`Storage`, and read back at the destination: its SHA-256 must be the one its manifest or record holds
(`stored_sha256`), else it is removed and the backup is not committed. A backup is copied parents first, under the
destination's lease of its source (proven before each commit, as a backup proves it), its manifest last: the
commit point, so an interrupted copy leaves at most leftovers without a manifest there, no backup that does not
restore. An archived file's record is created after its object, under the destination's archive lease. Run again,
a copy skips what the destination holds already (a committed backup with the same manifest, an object with the
same bytes) and finishes the rest. An object the destination holds with other bytes is never overwritten (a
finding). The source repository records, after the destination's commit, where each backup was copied
(repository/copies.py). Each repository keeps its own policy, expiry and verdicts: none of them is copied.
"""

from __future__ import annotations

import hashlib
import itertools
import os
from dataclasses import dataclass, field

from ..repository import Repository, RepositoryError
from ..repository.archive import RECORD_SUFFIX, STREAM_DIR, complete_name
from ..repository.copies import record_copy
from ..repository.lease import Lease, LeaseLost
from ..repository.manifest import MANIFEST_NAME, BackupManifest, FileEntry, ManifestError, commit_checked, \
    decode_checked
from ..repository.storage import UnsafeName

# How long a copy waits for an archive, or an expiry, of a source's archive at the destination (as archive waits).
ARCHIVE_WAIT = 600.0


@dataclass
class CopyResult:
    source: str
    destination: str
    copied: list[str] = field(default_factory=list)  # backups committed at the destination now, parents first
    already: list[str] = field(default_factory=list)  # backups the destination held already
    archive_copied: int = 0  # archived files (and stream segments) whose record was created now
    archive_already: int = 0
    objects: int = 0  # stored objects copied now
    bytes: int = 0  # their stored bytes
    findings: list[dict] = field(default_factory=list)  # {"code", "backup" or "file", "message"}
    warnings: list[str] = field(default_factory=list)  # what did not stop the copy (its record in the source)

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_json(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def copy_backups(source: Repository, destination: Repository, backup_ids: list[str] | None, *,
                 archive: bool = False, wait: float = 0.0) -> CopyResult:
    """Copy the backups named (None: every backup that restores) with their parent chains, and with `archive` the
    archive of their sources (of every source for None), from `source` into `destination`."""
    result = CopyResult(source.display, destination.display)
    chosen = _chosen(source, backup_ids, result)
    sources = sorted({(m.family, m.instance) for m in chosen}
                     | (set(source.sources()) if archive and backup_ids is None else set()))
    for family, instance in sources:
        own = [m for m in chosen if (m.family, m.instance) == (family, instance)]
        if own:
            with destination.lease(family, instance, "copy", wait=wait) as lease:
                not_copied: set[str] = set()
                for manifest in own:
                    _copy_backup(source, destination, manifest, lease, result, not_copied)
        if archive:
            with destination.archive_lease(family, instance, "copy", wait=ARCHIVE_WAIT) as lease:
                _copy_archive(source, destination, family, instance, lease, result)
    return result


def _chosen(source: Repository, backup_ids: list[str] | None, result: CopyResult) -> list[BackupManifest]:
    """The backups to copy and every parent of theirs, each once, parents before children; RepositoryError (nothing
    copied) when one named is not in the source or its chain cannot be read (for every backup: a finding, and the
    others are copied)."""
    if backup_ids is None:
        named = [r.manifest for r in source.backups() if r.manifest is not None]
    else:
        named = [source.find(backup_id).manifest for backup_id in backup_ids]
    out, seen = [], set()
    for manifest in named:
        try:
            chain = source.chain(manifest)
        except RepositoryError as e:
            if backup_ids is not None:
                raise
            chain = []
            result.findings.append({"code": "chain_broken", "backup": manifest.id, "message": f"not copied: {e}"})
        for m in chain:
            if (m.family, m.instance, m.id) not in seen:
                seen.add((m.family, m.instance, m.id))
                out.append(m)
    return out


def _copy_backup(source: Repository, destination: Repository, manifest: BackupManifest, lease: Lease,
                 result: CopyResult, not_copied: set[str]) -> None:
    """One backup: its own objects, then its manifest (the commit point); a finding, and nothing committed, when
    its parent was not copied, the destination holds another backup under its id, or an object cannot be copied."""
    def refuse(code: str, message: str) -> None:
        not_copied.add(manifest.id)
        result.findings.append({"code": code, "backup": manifest.id, "message": message})

    if manifest.parent in not_copied:
        return refuse("parent_not_copied", f"its parent {manifest.parent} was not copied")
    found = destination.load_backup(manifest.family, manifest.instance, manifest.id)
    if found.manifest is not None:
        if found.manifest.to_json() == manifest.to_json():
            result.already.append(manifest.id)
            _record(source, manifest, _location(destination), result)  # a copy killed before its record: made now
            return None
        return refuse("conflict", f"{destination.display} holds another backup under this id: not overwritten")
    if found.fenced is not None:
        return refuse("fenced", f"{destination.display} holds the fence of an interrupted write of this backup "
                                f"({found.problem}): it cannot be committed there until the fence is gone")
    if found.complete:  # a manifest that cannot be read: not this copy's to replace
        return refuse("conflict", f"{destination.display} holds this backup with a manifest that cannot be read "
                                  f"({found.problem}): not overwritten")
    for entry in manifest.files:
        if entry.reference is None and (problem := _copy_object(source, destination, entry, result)):
            return refuse("object_not_copied", problem)
    prefix = destination.backup_dir(manifest.family, manifest.instance, manifest.id)
    lease.confirm()
    if not commit_checked(destination.storage, f"{prefix}/{MANIFEST_NAME}", manifest.to_json()):
        raise LeaseLost(f"lease {lease.name} was lost: the copy of backup {manifest.id} was fenced by a backup of the "
                        "source at the destination, which judged this copy dead; it is not committed")
    result.copied.append(manifest.id)
    _record(source, manifest, _location(destination), result)
    return None


def _record(source: Repository, manifest: BackupManifest, where: str, result: CopyResult) -> None:
    try:
        record_copy(source, manifest.family, manifest.instance, manifest.id, where)
    except RepositoryError as e:  # a source this copy may only read: the copy stands, unrecorded there
        result.warnings.append(f"the copy of backup {manifest.id} is not recorded in {source.display}: {e}")


def _location(repo: Repository) -> str:
    """The repository as a record names it: a local one by its absolute path, any other by its URL (redacted)."""
    return os.path.realpath(repo.storage.root) if repo.storage.caps.local_paths else repo.display


def _copy_object(source: Repository, destination: Repository, entry: FileEntry, result: CopyResult) -> str | None:
    """A stored object copied as stored and read back (None), unless the destination holds it already; else why it
    was not copied (the destination holds other bytes under its name, or the source's are damaged or gone)."""
    name, want = entry.stored, entry.stored_sha256
    held = _stored_sha256(destination, name)
    if held == want:
        return None
    if held is not None:
        return f"{name}: {destination.display} holds other bytes under this name: not overwritten"
    damaged = f"{name}: its bytes in {source.display} do not match their SHA-256 (damaged): not copied"
    lock = destination.storage.lock
    if lock is not None and lock.applies(destination.storage.repo_name(name)):
        # written there, damaged bytes could not be removed until their Object Lock ends: checked before the write
        if (found := _stored_sha256(source, name)) != want:
            return f"{name}: missing in {source.display}" if found is None else damaged
    digest, counted = hashlib.sha256(), [0]
    read = source.storage.iter_bytes(name)
    try:  # opened before the write: a source object that is gone is the source's, not a failed write
        first = next(read, b"")
    except FileNotFoundError:
        return f"{name}: missing in {source.display}"

    def chunks():
        for chunk in itertools.chain([first], read):
            digest.update(chunk)
            counted[0] += len(chunk)
            yield chunk

    destination.storage.write(name, chunks())
    if digest.hexdigest() != want:
        destination.storage.remove(name)
        return damaged
    if _stored_sha256(destination, name) != want:
        destination.storage.remove(name)
        return f"{name}: read back from {destination.display}, its bytes do not match their SHA-256: removed"
    result.objects += 1
    result.bytes += counted[0]
    return None


def _stored_sha256(repo: Repository, name: str) -> str | None:
    """The SHA-256 of an object's stored bytes as read from the repository (None: it holds no such object)."""
    digest = hashlib.sha256()
    try:
        for chunk in repo.storage.iter_bytes(name):
            digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def _copy_archive(source: Repository, destination: Repository, family: str, instance: str, lease: Lease,
                  result: CopyResult) -> None:
    """Every archived file and stream segment of the source with its record (the record after its object, as
    archive commits it), then how far a limestone source's archive is whole: only once every file is there."""
    base = source.source_dir(family, instance)
    findings = len(result.findings)
    for where in ("archive", STREAM_DIR):
        for record_name in source.storage.list(f"{base}/{where}"):
            if record_name.endswith(".zst" + RECORD_SUFFIX):
                _copy_archived(source, destination, record_name, lease, result)
    if len(result.findings) > findings:
        return
    try:
        complete = source.storage.read_bytes(complete_name(source, family, instance))
    except FileNotFoundError:
        return
    lease.confirm()
    destination.storage.write_bytes(complete_name(destination, family, instance), complete)


def _copy_archived(source: Repository, destination: Repository, record_name: str, lease: Lease,
                   result: CopyResult) -> None:
    def finding(code: str, message: str) -> None:
        result.findings.append({"code": code, "file": record_name, "message": message})

    try:
        record = source.storage.read_bytes(record_name)
    except FileNotFoundError:
        return  # superseded or expired since it was listed: no longer archived
    try:
        entry = FileEntry.from_json(decode_checked(record, record_name))
    except (ManifestError, UnsafeName) as e:
        return finding("record_unreadable", f"the record cannot be read in {source.display}: {e}")
    if entry.stored != record_name[:-len(RECORD_SUFFIX)]:
        return finding("record_mismatch", f"the record names object {entry.stored}: not copied")
    try:
        held = destination.storage.read_bytes(record_name)
    except FileNotFoundError:
        held = None
    if held == record:
        result.archive_already += 1
        return None
    if held is not None:
        return finding("conflict", f"{destination.display} holds another record under this name: not overwritten")
    if problem := _copy_object(source, destination, entry, result):
        if not source.storage.exists(record_name):
            return None  # superseded or expired meanwhile, its object with it
        return finding("object_not_copied", problem)
    lease.confirm()
    if not destination.storage.create(record_name, record) and destination.storage.read_bytes(record_name) != record:
        return finding("conflict", f"{destination.display}: another record was written under this name meanwhile")
    result.archive_copied += 1
    return None
