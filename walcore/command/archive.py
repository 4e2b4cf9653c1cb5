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
import socket
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..fsutil import file_sha256
from ..repository import Repository, SourceChanged, utc_now
from ..repository.archive import EXPIRED_SUFFIX, RECORD_SUFFIX, complete_name, load_record, source_key
from ..repository.manifest import FileEntry, ManifestError, decode_checked, encode_checked
from .common import Progress

VERSIONED_KINDS = ("compacted", "catalog", "manifest")
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

    @property
    def ok(self) -> bool:
        return not self.refused and not self.conflicts

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class _Item:
    path: Path
    family: str
    instance: str
    name: str
    kind: str
    verdict: object
    root: Path  # the source directory the name is relative to


def archive(sources: list[Path], repo: Repository, *, level: int = 3, runner=None,
            progress: bool = False) -> ArchiveResult:
    from ..runner import LocalRunner
    from ..scan_paths import verify_paths

    runner = runner or LocalRunner()
    result = ArchiveResult()
    report = verify_paths([Path(s) for s in sources], runner=runner, progress=progress)
    items = _tarantool_items(report, result) + _limestone_items(report, result)
    tracker = Progress(len(items), sum(i.path.stat().st_size for i in items), progress, "archived")
    sources = sorted({(i.family, i.instance) for i in items} | {("limestone", _limestone_instance(d))
                                                                 for d in report.dirs if d.manifest is not None})
    with ExitStack() as stack:
        leases = {source: stack.enter_context(repo.archive_lease(*source, "archive", wait=ARCHIVE_WAIT))
                  for source in sources}  # in one order: two archives of overlapping sources cannot deadlock
        with ThreadPoolExecutor(max_workers=runner.parallelism) as pool:
            list(pool.map(lambda item: _store(repo, item, result, level, tracker, leases[item.family, item.instance]),
                          items))
        _record_complete(repo, report, result, leases)
    for field_name in ("stored", "already", "expired", "not_sealed"):
        getattr(result, field_name).sort()
    return result


def _tarantool_items(report, result: ArchiveResult) -> list[_Item]:
    from ..tarantool.layout import kind_of

    files = {f.path: f for f in report.files if f.to_json()["family"] == "tarantool"}
    chains = {c.path: c for c in report.chains}
    items = []
    newest = set()
    for chain in chains.values():
        if chain.xlogs:
            newest.add(chain.xlogs[-1])
    instance_of_dir: dict[str, str] = {}
    for f in files.values():
        if f.instance:
            instance_of_dir.setdefault(str(Path(f.path).parent), f.instance)
    vylogs: dict[Path, list] = {}  # the newest vylog of each vinyl dir is still written to
    for f in files.values():
        if f.kind == "vylog":
            vylogs.setdefault(Path(f.path).parent, []).append(f)
    for group in vylogs.values():
        newest.add(max(group, key=lambda f: Path(f.path).name).path)
    for f in files.values():
        path = Path(f.path)
        if f.status == "in_progress" or path.name.endswith(".inprogress"):
            result.not_sealed.append(f.path)
            continue
        if f.path in newest:
            result.not_sealed.append(f.path)
            continue
        if f.status == "damaged":
            result.refused.append({"path": f.path, "findings": [x.to_json() for x in f.findings]})
            continue
        if f.status != "ok":
            result.not_sealed.append(f.path)
            continue
        root = _data_root(path, f.kind)
        instance = f.instance or instance_of_dir.get(str(root)) or _instance_near(root, files)
        if instance is None:
            result.refused.append({"path": f.path, "findings": [{"code": "no_instance", "offset": None,
                                   "message": "no file beside it names its instance"}]})
            continue
        items.append(_Item(path, "tarantool", instance, Path(os.path.relpath(path, root)).as_posix(),
                           kind_of(path)[0], f, root))
    return items


def _data_root(path: Path, kind: str) -> Path:
    """The data dir a file belongs to: memtx/, wal/ and vinyl/ side by side count as one, their parent."""
    d = path.parent
    if kind in ("run", "index"):
        d = d.parent.parent  # <vinyl_dir>/<space>/<index>/<file>
    if d.name in ("memtx", "wal", "vinyl") and any((d.parent / n).is_dir() for n in ("memtx", "wal", "vinyl")
                                                  if n != d.name):
        return d.parent
    return d


def _instance_near(root: Path, files: dict) -> str | None:
    for f in files.values():
        if f.instance and Path(f.path).is_relative_to(root):
            return f.instance
    return None


def _limestone_items(report, result: ArchiveResult) -> list[_Item]:
    items = []
    sealed = ("pwal_rotated", "epoch_rotated", "blob") + VERSIONED_KINDS
    for d in report.dirs:
        root = Path(d.path)
        if d.status == "cannot_check" or d.manifest is None:
            result.refused.append({"path": d.path, "findings": [x.to_json() for x in d.findings]})
            continue
        instance = _limestone_instance(d)
        for f in report.files:
            if f.to_json()["family"] != "limestone" or not Path(f.path).is_relative_to(root):
                continue
            if f.kind not in sealed:
                result.not_sealed.append(f.path)
                continue
            if f.status == "damaged":
                result.refused.append({"path": f.path, "findings": [x.to_json() for x in f.findings]})
                continue
            items.append(_Item(Path(f.path), "limestone", instance, Path(os.path.relpath(f.path, root)).as_posix(),
                               f.kind, f, root))
    return items


def _limestone_instance(d) -> str:
    from ..limestone.layout import path_instance

    return d.manifest.instance_uuid or path_instance(Path(d.path))


def _record_complete(repo: Repository, report, result: ArchiveResult, leases: dict) -> None:
    """Record how far each limestone source's log is archived whole: below the lowest epoch of any of its pwal
    files that is not archived (an active channel, a channel a rotation skipped, a refused file), and durable.
    Archived epoch files alone do not say it: a rotation may leave a channel active. It only grows: a new entry
    always has an epoch past the durable one. It is kept per source directory too (a copy of the directory shares
    the instance)."""
    archived = set(result.stored) | set(result.already) | set(result.expired)
    for d in report.dirs:
        if d.status == "cannot_check" or d.manifest is None:
            continue
        root = Path(d.path)
        left = [f for f in report.files if f.kind in ("pwal", "pwal_rotated")  # limestone's kinds only
                and Path(f.path).is_relative_to(root) and f.path not in archived and f.size]
        if any(f.epoch_range is None for f in left):
            continue  # a file not archived whose epochs are unknown (damaged): nothing more is known whole
        complete = min([d.durable_epoch or 0] + [f.epoch_range[0] - 1 for f in left])
        instance = _limestone_instance(d)
        name = complete_name(repo, "limestone", instance)
        try:
            before = decode_checked(repo.storage.read_bytes(name), "archive-complete")
        except (FileNotFoundError, ManifestError):
            before = {}
        epoch = before.get("epoch") if isinstance(before.get("epoch"), int) else None
        per = dict(before.get("sources") or {}) if isinstance(before.get("sources"), dict) else {}
        key = source_key(socket.gethostname(), str(root.resolve()))
        if (epoch is not None and complete <= epoch) and isinstance(per.get(key), int) and complete <= per[key]:
            continue
        per[key] = max(complete, per[key]) if isinstance(per.get(key), int) else complete
        leases["limestone", instance].confirm()
        repo.storage.write_bytes(name, encode_checked({"epoch": complete if epoch is None else max(epoch, complete),
                                                       "sources": per, "updated": utc_now()}))


def _store(repo: Repository, item: _Item, result: ArchiveResult, level: int, tracker: Progress, lease) -> None:
    base = f"{repo.source_dir(item.family, item.instance)}/archive"
    digest = functools.cache(lambda: file_sha256(item.path))  # the file is read once, whatever asks for its hash
    name = item.name
    if item.kind in VERSIONED_KINDS:
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
        stored = repo.put_object(object_name, item.path, level=level)
    except SourceChanged as e:
        result.refused.append({"path": str(item.path), "findings": [{"code": "changed", "offset": None,
                                                                     "message": str(e)}]})
        return
    verdict = _verdict_record(item)
    entry = FileEntry(name=item.name, kind=item.kind, size=stored.size, sha256=stored.sha256, stored=object_name,
                      stored_size=stored.stored_size, stored_sha256=stored.stored_sha256, reference=None,
                      mutable=False, range=_range(item), verification=verdict)
    lease.confirm()
    if problem := _commit_record(repo, record_name, entry, item):
        result.refused.append({"path": str(item.path), "findings": [{"code": "not_committed", "offset": None,
                                                                     "message": problem}]})
        return
    if item.family == "tarantool" and verdict.get("status") == "ok":
        repo.ledger_put("tarantool", item.instance, stored.sha256, verdict)
    if existing is not None:
        result.conflicts.append({"path": str(item.path), "archived_sha256": existing.sha256,
                                 "sha256": stored.sha256, "kept_as": object_name})
    else:
        result.stored.append(str(item.path))
    tracker.advance(stored.size)


def _commit_record(repo: Repository, record_name: str, entry: FileEntry, item: _Item) -> str | None:
    """Create the record of a stored object, exclusively; then make sure the object it names is still the one
    stored (an expiry that took it for an orphan meanwhile removed it: the record goes too). None when committed,
    else why not."""
    data = encode_checked({**entry.__dict__, "archived": utc_now(), "source": str(item.path),
                           "host": socket.gethostname(), "source_dir": str(item.root.resolve())})
    if not repo.storage.create(record_name, data):
        found = load_record(repo, record_name)
        if found is None:  # a damaged record (archive took it for none): replaced, under the lease just proven
            repo.storage.write_bytes(record_name, data)
        elif (found.stored, found.sha256, found.stored_sha256) != (entry.stored, entry.sha256, entry.stored_sha256):
            return f"{record_name} was written by another process meanwhile: archive the file again"
    try:
        size = repo.storage.size(entry.stored)
    except FileNotFoundError:
        size = None
    if size != entry.stored_size:
        repo.storage.remove(record_name)
        return f"{entry.stored} was removed or replaced while its record was written (an expiry took it for an " \
               "orphan): archive the file again"
    return None


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


def _verdict_record(item: _Item) -> dict:
    if item.family == "tarantool":
        from ..tarantool.backup_set import verdict_record

        return {**verdict_record(item.verdict), "checked_by": "scan"}
    record = item.verdict.to_json()
    del record["path"]
    return {**record, "checked_by": "scan"}


def _range(item: _Item) -> dict:
    if item.family == "tarantool":
        from ..tarantool.times import file_range

        return file_range(item.verdict, item.path)
    return {"epochs": item.verdict.epoch_range} if item.verdict.epoch_range else {}

