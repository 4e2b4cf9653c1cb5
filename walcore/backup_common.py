"""What the commands and the families share below them (as pgBackRest's src/command/backup/common.c): progress on
stderr, storing a family plan's set as a backup (a full, an incremental or a snapshot: the order of work is in
command/backup.py) with its files to back up and its labels, an archived file, which verdicts the ledger keeps,
how old a temporary file is left over."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from .findings import Refused
from .repository import Repository, Stored, backup_stamp, utc_now, walvault_version
from .repository.lease import Lease, LeaseLost
from .repository.manifest import (MANIFEST_NAME, BackupManifest, FileEntry, ManifestError, Piece, commit_checked,
                                  decode_checked, source_identity)
from .repository.storage import ObjectLocked
from .runner import LocalRunner, run_all

LEDGER_VERDICTS = ("ok",)  # only sealed files that verified clean go to the ledger: their bytes never change


class NothingNew(Refused):
    """No archived file is left to fold: the newest snapshot still covers the log (not a failure of the log)."""


@dataclass
class Candidate:
    """A file to back up: where it is, its name in the backup, and how to treat it."""

    path: Path
    name: str
    kind: str
    mutable: bool
    entry: FileEntry | None = None  # filled once stored or referenced
    verdict: object | None = None  # TarantoolFile | LimestoneFile
    checked_by: str = "scan"  # scan | ledger (a verdict on record for the same bytes)
    mtime_ns: int | None = None  # of the source file, when it was listed
    spooled: bool = False  # its bytes are a copy on this machine (the newest xlog): stored from here
    # The parent chain's entry of a file that was appended to since (the newest xlog then): only the bytes from
    # its size on are stored, as the last of its pieces; its verdict continues the recorded one
    extends: tuple[BackupManifest, FileEntry] | None = None


@dataclass
class ArchiveItem:
    """A sealed file of a source to archive: where it is, its source and name there, and its verdict."""

    path: Path
    family: str
    instance: str
    name: str
    kind: str
    verdict: object
    root: Path  # the source directory the name is relative to


class Progress:
    """files, bytes and rate on stderr, every few seconds, when enabled."""

    def __init__(self, files: int, total: int, enabled: bool, what: str):
        self.files, self.total, self.enabled, self.what = files, total, enabled, what
        self.done_files = self.done = 0
        self.start = self.last = time.monotonic()

    def advance(self, nbytes: int) -> None:
        self.done_files += 1
        self.done += nbytes
        now = time.monotonic()
        if self.enabled and (now - self.last >= 2 or self.done_files == self.files):
            self.last = now
            rate = self.done / max(now - self.start, 1e-9) / 1e6
            print(f"walvault: {self.what} {self.done_files}/{self.files} files, {self.done / 1e6:,.0f} of "
                  f"{self.total / 1e6:,.0f} MB ({rate:,.0f} MB/s)", file=sys.stderr, flush=True)


# A temporary file this old is no write in progress: writes of the archive and the ledger (not under the lease)
# finish in far less.
STALE_TEMPORARY = 3600.0


@dataclass
class BackupResult:
    manifest: BackupManifest
    notes: list[str] = field(default_factory=list)
    removed_leftovers: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        m = self.manifest
        return {"id": m.id, "type": m.type, "parent": m.parent, "family": m.family, "source": m.source,
                "files": len(m.files), "bytes": m.bytes, "stored_bytes": m.stored_bytes, "position": m.position,
                "started": m.started, "finished": m.finished, "notes": self.notes,
                "removed_leftovers": self.removed_leftovers}


def new_backup_id(repo: Repository, family: str, instance: str, parent: BackupManifest | None,
                  kind: str = "full") -> str:
    """pgBackRest's labels: `YYYYMMDD-HHMMSSF` for a full backup, `<full>_YYYYMMDD-HHMMSSI` for an incremental,
    and walvault's `YYYYMMDD-HHMMSSS` for a snapshot. A clock set back must not sort a new backup before older
    ones: the label then moves past the newest. A label another source of the repository uses is skipped too, so
    that an id names one backup (what restore and verify take)."""
    newest = max(map(backup_stamp, repo.backup_ids(family, instance)), default="")
    others = {b for f, i in repo.sources() if (f, i) != (family, instance) for b in repo.backup_ids(f, i)}
    now = time.time()
    while True:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        if parent is not None:
            label = f"{parent.id.split('_')[0]}_{stamp}I"
        else:
            label = f"{stamp}{'S' if kind == 'snapshot' else 'F'}"
        if backup_stamp(label) > newest and label not in others:
            return label
        now += 1


def store_set(repo: Repository, plan, kind: str, lease: Lease, *, level: int = 3, runner=None,
              progress: bool = False, checks: dict | None = None, notes: dict[str, str] | None = None) -> BackupResult:
    """Store a plan's set as a backup of `kind` (full, incremental or snapshot), under the source's lease (the
    caller holds it: proven before each commit). `checks` are added to the manifest's (what a snapshot covers),
    `notes` kept in it."""
    identity = source_identity(plan.family, plan.source_info())
    removed, records = _remove_leftovers(repo, plan.family, plan.instance, lease,
                                         lambda m: kind != "incremental" or _extends(m, identity))
    parent = None
    chain: list[BackupManifest] = []
    if kind == "incremental":
        parent = next((r.manifest for r in records if r.manifest is not None and _extends(r.manifest, identity)),
                      None)
        if parent is None:
            source = plan.source_info()
            raise Refused(f"no full backup of {plan.family} instance {plan.instance} from this source "
                          f"({source['host']}:{source['path']}) to build an incremental on: take a full backup "
                          "first (a backup of another copy of the instance is never the parent)", "refused")
        chain = repo.chain(parent, {r.id: r.manifest for r in records if r.manifest is not None})
    started = utc_now()
    with plan:
        candidates = plan.candidates(parent, runner or LocalRunner())
        backup_id = new_backup_id(repo, plan.family, plan.instance, parent, kind)
        prefix = repo.backup_dir(plan.family, plan.instance, backup_id)
        try:
            result = _run(repo, plan, candidates, chain, backup_id, prefix, started, level, runner or LocalRunner(),
                          progress, kind, checks or {}, notes or {}, lease)
        except BaseException as e:
            # Its own objects go, its manifest too if it was stored (a commit whose reply was lost, a failure after
            # it); a fence in the manifest's place is the breaker's, and stays.
            main = f"{prefix}/{MANIFEST_NAME}"
            repo.storage.remove_tree(prefix, keep=None if _own_manifest(repo, main) else main)
            if isinstance(e, Exception) and not isinstance(e, LeaseLost):
                _lost_first(lease, e)
            raise
    result.removed_leftovers = removed
    result.notes = plan.notes + result.notes
    return result


def _own_manifest(repo: Repository, name: str) -> bool:
    """A manifest is stored at `name` and it is no breaker's fence. A breaker fences only a backup without one, so
    what reads here as a manifest now stays this writer's own."""
    try:
        return decode_checked(repo.storage.read_bytes(name), name).get("fenced") is not True
    except FileNotFoundError:
        return False
    except ManifestError:
        return True  # not a fence (a fence is written whole, checksummed): what this writer began


def _removed(repo: Repository, name: str) -> bool:
    """Remove an object this backup stored; False when its Object Lock keeps it: the backup then holds it as its own
    (a copy the repository cannot drop would otherwise be a locked object no manifest names)."""
    try:
        repo.storage.remove(name)
    except ObjectLocked:
        return False
    return True


def _lost_first(lease: Lease, error: Exception) -> None:
    """A backup that fails after its lease was lost failed because of that (its breaker removed what it was
    writing): LeaseLost is the error to report."""
    try:
        lease.confirm()
    except LeaseLost as lost:
        raise lost from error
    except Exception:  # the lease cannot be read now: the error met first is the one to report
        pass


def _extends(m: BackupManifest, identity) -> bool:
    """Whether an incremental of the source `identity` may build on backup `m`: a full or incremental one of that
    identity (a snapshot holds no log; a copy of a data dir shares the instance but not the source: its backups
    are never the parent). The newest such (Repository.newest_first) is the parent."""
    return m.type != "snapshot" and m.identity == identity


def _remove_leftovers(repo: Repository, family: str, instance: str, lease: Lease,
                      wanted: Callable[[BackupManifest], bool]) -> tuple[list[str], list]:
    """Backups without a main manifest (killed, or paused past their lease: fenced first), and the temporary files
    of killed writes under the source and at the repository's root; returns the ids removed and the source's
    backup records read, newest first, each manifest read once (under the lease, none changes meanwhile).
    Reading stops at the newest backup `wanted`: every run clears what it finds newer than its own backup, so
    older leftovers are the rare ones a lease-lost writer made late, which expire removes."""
    for prefix in (repo.source_dir(family, instance), None):
        repo.storage.remove_stale_temporaries(prefix, STALE_TEMPORARY)
    removed, records = [], []
    for record in repo.newest_first(family, instance):
        if not record.complete and repo.clear_leftovers(record, lease):
            removed.append(record.id)
            continue
        records.append(record)
        if record.manifest is not None and wanted(record.manifest):
            break
    return removed, records


def _run(repo: Repository, plan, candidates: list[Candidate], chain: list[BackupManifest], backup_id: str,
         prefix: str, started: str, level: int, runner, progress: bool, kind: str, extra_checks: dict,
         notes: dict[str, str], lease: Lease) -> BackupResult:
    held = {}  # name -> the newest entry of the parent chain holding it
    for manifest in chain:
        for entry in manifest.files:
            held[entry.name] = (manifest, entry)
    to_store = []
    for c in candidates:
        old = held.get(c.name)
        st = c.path.stat()
        c.mtime_ns = c.mtime_ns or st.st_mtime_ns  # a copy's is the source's, taken by the plan
        # A sealed file never changes: the same name, size and modification time (as pgBackRest compares them)
        # say it is the one the parent chain holds. Another history reusing a name differs in its mtime.
        if old and not c.mutable and not old[1].mutable and (old[1].size, old[1].mtime_ns) == (st.st_size,
                                                                                             st.st_mtime_ns):
            c.entry = _reference(old[0], old[1])
        else:
            to_store.append(c)
    tracker = Progress(len(to_store), sum(map(_to_read, to_store)), progress, "stored")
    by_item = {_item(prefix, c): c for c in to_store}
    # A local runner's cores go to a big file's zstd threads too; a Spark task has one core (spark.task.cpus)
    store = partial(store_object, repo, level, runner.parallelism if isinstance(runner, LocalRunner) else 1)

    def stored_one(item) -> None:
        tracker.advance(_to_read(by_item[item]))

    # Reading, SHA-256 and zstd all release the GIL: a local runner uses threads, the biggest file first. A
    # spooled copy is on this machine only: another runner stores the rest.
    items = sorted(by_item, key=lambda i: -_to_read(by_item[i]))
    # Where Object Lock retains what is written, a spooled copy waits for its verdict: one cut after it was stored
    # would be stored again over a locked version that no manifest names (current again once expiry deletes the
    # version it reads).
    settled_first = [i for i in items if by_item[i].spooled and repo.storage.lock is not None]
    items = [i for i in items if i not in settled_first]
    if isinstance(runner, LocalRunner):
        results = run_all(runner, store, items, threads=True, done=stored_one)
    else:
        results = run_all(runner, store, [i for i in items if not by_item[i].spooled], threads=True, done=stored_one)
        results.update(run_all(LocalRunner(1), store, [i for i in items if by_item[i].spooled], done=stored_one))
    cut = [_item(prefix, c) for c in plan.settle(candidates)]
    for item in settled_first + [i for i in cut if i not in settled_first]:  # what is stored is what was judged
        results[item] = store(item)
        if item in settled_first:
            stored_one(item)
    for item, c in by_item.items():
        stored = results[item]
        old = c.extends or held.get(c.name)
        if c.extends is not None and not stored.size and _removed(repo, item[0]):
            c.entry = _reference(*old)  # nothing was appended
        elif c.extends is None and old and (old[1].sha256, old[1].size) == (stored.sha256, stored.size) \
                and _removed(repo, item[0]):
            c.entry = _reference(*old)  # the same bytes are held already
        else:
            c.entry = _own(c, item[0], stored)
    if chain:
        _check_extends(plan, held, candidates)
    checks = plan.verify(repo, candidates, runner, progress)
    position = checks.pop("position")
    for key, value in extra_checks.items():
        checks[key] = {**checks.get(key, {}), **value}
    if chain and not plan.not_behind(position, chain[-1].position):
        raise Refused(f"the source is at {position}, behind its parent backup {chain[-1].id} at "
                      f"{chain[-1].position}: it is not the same history", "refused")
    for c in candidates:
        c.entry.verification = plan.verification(c)
    manifest = BackupManifest(
        id=backup_id, type=kind, parent=chain[-1].id if chain else None,
        family=plan.family, source=plan.source_info(), walvault=walvault_version(), started=started,
        finished=utc_now(), position=position, compression={"type": "zstd", "level": level},
        files=[c.entry for c in candidates], checks=checks, notes=notes)
    lease.confirm()
    if not commit_checked(repo.storage, f"{prefix}/{MANIFEST_NAME}", manifest.to_json()):
        raise LeaseLost(f"lease {lease.name} was lost: backup {backup_id} was fenced by another backup of the "
                        "source, which judged this one dead and removed what it stored; it is not committed")
    return BackupResult(manifest)


def _check_extends(plan, held: dict[str, tuple[BackupManifest, FileEntry]], candidates: list[Candidate]) -> None:
    """Refuse an incremental whose source does not extend its parent chain: every log file the chain recorded
    (of the plan's `lineage_kinds`) that the source still has under its name must hold the same bytes (a sealed
    one) or begin with the recorded bytes (the newest xlog, an active pwal: appended to since; a file renamed
    since, as a limestone channel rotated, carries them under its new name: the plan's `renamed_since`). A copy or
    a clone of the source that wrote on shares names and positions but not bytes."""
    by_name = {c.name: c for c in candidates}
    for name, (manifest, entry) in sorted(held.items()):
        if entry.kind not in plan.lineage_kinds:
            continue
        c = by_name.get(name)
        path = c.path if c is not None else plan.root / name
        if c is not None and c.extends is not None:
            continue  # its plan found the recorded bytes' end where the file holds it (its fingerprint)
        if entry.mutable:
            if path.is_file() and _begins_with(path, entry):
                continue
            renamed = plan.renamed_since(name, entry, candidates, held)
            if any(_begins_with(r.path, entry) for r in renamed):
                continue
            if not path.is_file() and not renamed:
                continue  # gone without a trace (a pwal compacted and removed): nothing to compare
        elif c is not None:
            if c.entry.sha256 == entry.sha256 and c.entry.size == entry.size:
                continue
        elif not path.is_file() or _same_file(path, entry):
            continue
        raise Refused(f"the source diverged from its parent backup {manifest.id}: {name} holds other bytes "
                      "(another history of this instance: a copy or a clone); a full backup starts a chain of "
                      "its own", "refused")


def _same_file(path: Path, entry: FileEntry) -> bool:
    """Whether a sealed source file holds the recorded bytes: its size and modification time say so, else its
    SHA-256."""
    from .fsutil import file_sha256

    st = path.stat()
    if (st.st_size, st.st_mtime_ns) == (entry.size, entry.mtime_ns):
        return True
    return st.st_size == entry.size and file_sha256(path) == entry.sha256


def _begins_with(path: Path, entry: FileEntry) -> bool:
    """Whether a file begins with the recorded bytes of a file that was appended to. Tarantool reopens the empty
    xlog a clean shutdown left and writes over its EOF marker: such a recording (its verification says eof) is
    matched without it."""
    import hashlib

    from .tarantool.block import EOF_MAGIC

    tail = EOF_MAGIC if entry.kind == "xlog" and entry.verification.get("eof") else b""
    want = entry.size - len(tail)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        left = want
        while left > 0:
            chunk = f.read(min(1 << 20, left))
            if not chunk:
                return False  # shorter than what the parent recorded
            digest.update(chunk)
            left -= len(chunk)
    digest.update(tail)
    return digest.hexdigest() == entry.sha256


def _to_read(c: Candidate) -> int:
    """The bytes a candidate's store reads: of a file appended to, those past what its parent chain holds."""
    return c.path.stat().st_size - (c.extends[1].size if c.extends is not None else 0)


def _resumable_sha256() -> bool:
    from . import sha256_state  # ctypes, imported where a mutable xlog is stored only (~15 ms)

    return sha256_state.available()


def _item(prefix: str, c: Candidate) -> tuple:
    """What stores a candidate: its object's name, its path, and from which byte (what it appends to), with the
    SHA-256 state of the bytes before (JSON) and whether the state after is kept (a mutable xlog's)."""
    keep_state = c.kind == "xlog" and (c.mutable or c.extends is not None) and _resumable_sha256()
    if c.extends is None:
        return f"{prefix}/{c.name}.zst", str(c.path), 0, None, keep_state
    entry = c.extends[1]
    return (f"{prefix}/{c.name}.zst", str(c.path), entry.size, json.dumps(entry.append_state["sha256_state"]),
            True)


def store_object(repo: Repository, level: int, cores: int, item: tuple) -> Stored:
    """One unit of a backup's copy: a source file stored as an object (wherever the runner runs it)."""
    name, path, offset, state, resumable = item
    return repo.put_object(name, Path(path), offset=offset, level=level, cores=cores, resumable=resumable,
                           continues=None if state is None else json.loads(state))


def _reference(manifest: BackupManifest, entry: FileEntry) -> FileEntry:
    return FileEntry(**{**entry.__dict__, "reference": entry.reference or manifest.id})


def _own(c: Candidate, stored_name: str, stored: Stored) -> FileEntry:
    entry = FileEntry(name=c.name, kind=c.kind, size=stored.size, sha256=stored.sha256, stored=stored_name,
                      stored_size=stored.stored_size, stored_sha256=stored.stored_sha256, reference=None,
                      mutable=c.mutable, range={}, verification={}, mtime_ns=c.mtime_ns)
    if c.extends is not None:
        base = c.extends[1]
        entry.pieces = base.objects() + [Piece(stored_name, stored.stored_size, stored.stored_sha256, stored.size,
                                               stored.sha256)]
        entry.size, entry.sha256 = base.size + stored.size, stored.whole_sha256
    if c.mutable and stored.state is not None:
        entry.append_state = {"sha256_state": stored.state, "last": last_bytes(c.path, entry.size)}
    return entry


# How much of a mutable xlog's end its record fingerprints: what says, without reading it again, that the file
# still begins with the bytes stored (a copy of the data dir that wrote on elsewhere holds other rows there).
FINGERPRINT_BYTES = 64 << 10


def last_bytes(path: Path, size: int) -> list:
    """[offset, SHA-256] of the last FINGERPRINT_BYTES of a file's first `size` bytes."""
    from .fsutil import file_sha256

    offset = max(0, size - FINGERPRINT_BYTES)
    return [offset, file_sha256(path, offset, size)]