"""The archive command: sealed files of each source copied into the repository under their own names.

Sealed means that the database will never write to the file again: Tarantool's snapshots, xlogs other
than the newest, vylogs other than the newest, finished run and index files; limestone's rotated pwal and
epoch files and blobs. The newest xlog and vylog, an active `pwal_NNNN`, `epoch` and `*.inprogress` files
are never archived. The compacted file, the catalog and the manifest are rewritten in place by limestone,
so each content of theirs is archived under `<name>@<first 12 hex of its SHA-256>`.

Each file is verified by walcore first; a damaged one is refused with its findings and not stored. Storing runs
under each source's archive lease (apart from its backup lease; an expiry takes both), proven right before each
record is created: a record is the commit point (without it the file is not archived), created exclusively.
The same name with the same bytes again is a no-op; the same name with other bytes is a conflict: the new
bytes are kept beside the old as `<name>.conflict-<sha12>` and the conflict is reported.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..backup_common import ArchiveItem, Progress
from ..family import family_named
from ..fsutil import file_sha256, host_name
from ..repository import FAMILIES, Repository, SourceChanged
from ..repository.archive import EXPIRED_SUFFIX, RECORD_SUFFIX, commit_record, load_record
from ..repository.manifest import FileEntry, ManifestError, decode_checked


# How long an archive waits for another archive, or an expiry, of a source to finish with its archive (it has no
# --wait: archiving is scheduled often, and an expiry takes minutes).
ARCHIVE_WAIT = 600.0


@dataclass
class ArchiveResult:
    stored: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)  # deleted by retention before: not archived again
    not_sealed: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)  # {"path", "findings"}
    conflicts: list[dict] = field(default_factory=list)  # {"path", "archived_sha256", "sha256", "kept_as"}
    superseded: list[str] = field(default_factory=list)  # stream segments deleted: archived xlogs hold their rows
    differs: list[dict] = field(default_factory=list)  # segments an archived xlog disagrees with: {"segment", "xlog",
    # "row", "message"}

    @property
    def ok(self) -> bool:
        return not self.refused and not self.conflicts and not self.differs

    def to_json(self) -> dict:
        return dict(self.__dict__)


def archive(sources: list[Path], repo: Repository, *, level: int = 3, runner=None,
            progress: bool = False) -> ArchiveResult:
    from ..runner import LocalRunner
    from ..scan_paths import verify_paths

    runner = runner or LocalRunner()
    result = ArchiveResult()
    report = verify_paths([Path(s) for s in sources], runner=runner, progress=progress)
    families = [family_named(name) for name in FAMILIES]
    items = [i for family in families for i in family.archive_items(report, result)]
    tracker = Progress(len(items), sum(i.path.stat().st_size for i in items), progress, "archived")
    sources = sorted({(i.family, i.instance) for i in items}
                     | {source for family in families for source in family.archive_sources(report)})
    with ExitStack() as stack:
        leases = {source: stack.enter_context(repo.archive_lease(*source, "archive", wait=ARCHIVE_WAIT))
                  for source in sources}  # in one order: two archives of overlapping sources cannot deadlock
        # the stores run here whatever the runner: this machine's cores (a local runner's) for a big file's zstd
        cores = runner.parallelism if isinstance(runner, LocalRunner) else os.cpu_count() or 1
        with ThreadPoolExecutor(max_workers=runner.parallelism) as pool:
            list(pool.map(lambda item: _store(repo, item, result, level, cores, tracker,
                                              leases[item.family, item.instance]), items))
        archived = set(result.stored) | set(result.already) | set(result.expired)
        for family in families:
            family.record_archived(repo, report, archived, leases, result)
    for field_name in ("stored", "already", "expired", "not_sealed"):
        getattr(result, field_name).sort()
    return result


def _store(repo: Repository, item: ArchiveItem, result: ArchiveResult, level: int, cores: int, tracker: Progress,
           lease) -> None:
    fam = family_named(item.family)
    base = f"{repo.source_dir(item.family, item.instance)}/archive"
    digest = functools.cache(lambda: file_sha256(item.path))  # the file is read once, whatever asks for its hash
    name = item.name
    if item.kind in fam.rewritten_kinds:
        name = f"{name}@{digest()[:12]}"
    record_name = f"{base}/{name}.zst{RECORD_SUFFIX}"
    existing = load_record(repo, record_name) if repo.storage.exists(record_name) else None
    tombstoned = False
    if existing is None:  # retention may have deleted this name: the same bytes are not stored again, and other
        existing = _tombstone(repo, f"{base}/{name}.zst{EXPIRED_SUFFIX}")  # bytes are another history's: a conflict
        tombstoned = existing is not None
    if existing is not None and existing.size == item.path.stat().st_size and existing.sha256 == digest():
        (result.expired if tombstoned else result.already).append(str(item.path))
        tracker.advance(0)
        return
    object_name = f"{base}/{name}.zst"
    if existing is not None:
        object_name = f"{base}/{name}.conflict-{digest()[:12]}.zst"
        record_name = object_name + RECORD_SUFFIX
    try:
        stored = repo.put_object(object_name, item.path, level=level, cores=cores)
    except SourceChanged as e:
        result.refused.append({"path": str(item.path), "findings": [{"code": "changed", "offset": None,
                                                                     "message": str(e)}]})
        return
    verdict = fam.archived_verification(item)
    entry = FileEntry(name=item.name, kind=item.kind, size=stored.size, sha256=stored.sha256, stored=object_name,
                      stored_size=stored.stored_size, stored_sha256=stored.stored_sha256, reference=None,
                      mutable=False, range=fam.archived_range(item), verification=verdict)
    lease.confirm()
    origin = {"source": str(item.path), "host": host_name(), "source_dir": str(item.root.resolve())}
    if problem := commit_record(repo, record_name, entry, origin):
        result.refused.append({"path": str(item.path), "findings": [{"code": "not_committed", "offset": None,
                                                                     "message": problem}]})
        return
    if fam.uses_ledger and verdict.get("status") == "ok":
        repo.ledger_put(fam.name, item.instance, stored.sha256, verdict)
    if existing is not None:
        result.conflicts.append({"path": str(item.path), "archived_sha256": existing.sha256,
                                 "sha256": stored.sha256, "kept_as": object_name})
    else:
        result.stored.append(str(item.path))
    tracker.advance(stored.size)


@dataclass
class _Expired:
    size: int | None
    sha256: str | None


def _tombstone(repo: Repository, name: str) -> _Expired | None:
    """What retention deleted under this name (a source keeps old files a while after they expire)."""
    try:
        record = decode_checked(repo.storage.read_bytes(name), name)
    except (FileNotFoundError, ManifestError):
        return None
    return _Expired(record.get("size"), record.get("sha256"))
