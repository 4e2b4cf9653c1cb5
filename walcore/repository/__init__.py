"""The backup repository: storage, info and manifests, leases, stored objects and the verification ledger.

Layout under the root (names are what `Repository` builds; nothing else is written there):

    walvault.repo(.copy)                              format version, checksummed; the repository's settings:
                                                      "lock" {"mode", "days"}: S3 Object Lock (walvault init)
    walvault.policy(.copy)                            the retention policy (checksummed): {"days": N, "keep_full": M}
    locks/<family>-<instance>.lease                   one backup, snapshot, expiry or copy of a source at a time
    locks/<family>-<instance>.archive.lease           one archive or expiry of a source's archive at a time
    locks/<family>-<instance>.stream.lease            one `walvault stream` of an instance at a time
    locks/<family>-<instance>.restore-<hex>.lease     a restore in progress (expiry leaves the source alone)
    audit/<YYYYMMDD-HHMMSS>-<hex8>/<nnnnnn>.json      append-only: every deletion of an expiry, just before it
    <family>/<instance>/backups/<id>/<name>.zst       a backup's (or a snapshot's) own files, zstd-compressed
    <family>/<instance>/backups/<id>/backup.manifest(.copy)   written last: without it the backup does not exist
                                                      (or a fence: its leftovers are removed, no late commit)
    <family>/<instance>/backups/<id>/drill.json       the verdict of the backup's last restore drill
    <family>/<instance>/backups/<id>/verify.json      the verdict of the last verify --repo that checked it
    <family>/<instance>/backups/<id>/copies.json      where `walvault copy` copied it (after the copy's commit)
    <family>/<instance>/backups/<id>/pin.json         a pin (`walvault pin`): retention keeps the backup and its chain
    <family>/<instance>/archive/<name>.zst            archived sealed files
    <family>/<instance>/archive/<name>.zst.json       each one's record (checksummed): without it, not archived
    <family>/<instance>/archive/<name>.zst.expired    a tombstone: retention deleted these bytes (not archived again)
    <family>/<instance>/stream/<name>.xlog.zst        a segment `walvault stream` received and sealed, named as an
                                                      xlog; its record (.json, its vclock range): the commit point
    <family>/<instance>/stream/<name>.xlog.zst.differs.json   an archived xlog holds other bytes for a row of that
                                                      segment (which row, which xlog): the segment is kept
    <family>/<instance>/archive-complete.json         limestone: the epoch up to which every channel is archived
    <family>/<instance>/ledger/<sha256>.json          what verifying those bytes found (so they are not re-read)
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ..fsutil import Sha256, random_hex
from .lease import DEFAULT_TTL, Lease, acquire, describe, stale
from .lease import read as read_lease
from .manifest import (COPY_SUFFIX, INFO_NAME, MANIFEST_NAME, POLICY_NAME, BackupManifest, Loaded, ManifestError,
                       decode_checked, encode_checked, ensure_info, load_checked, read_info, save_checked)
from .storage import ObjectDamaged, ObjectLock, RepositoryError, Storage, UnsafeName, check_name, open_storage

FAMILIES = ("tarantool", "limestone")
_INSTANCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_BACKUP_ID = re.compile(r"\d{8}-\d{6}(F(_\d{8}-\d{6}I)?|S)")
READ_CHUNK = 1 << 20
# A file this large is compressed by zstd's own threads, on the cores it is given: one big xlog (the common case,
# up to 256 MB) would otherwise take one core while the others wait. Its frame differs from one compressed without
# threads; the repository records the bytes stored, whichever they are.
PARALLEL_COMPRESSION_BYTES = 16 << 20


def walvault_version() -> str:
    """The version that manifests, records and the ledger name (pyproject.toml reads it from here too)."""
    from .. import __version__

    return __version__


STAMP = "%Y-%m-%dT%H:%M:%SZ"  # how manifests and records write a time


def utc_now() -> str:
    return time.strftime(STAMP, time.gmtime())


def stamp_seconds(stamp: str) -> float:
    """The Unix time a STAMP names."""
    import calendar

    return float(calendar.timegm(time.strptime(stamp, STAMP)))


class SourceUnreadable(RepositoryError):
    """A source file could not be read (gone, replaced, an I/O error) while it was stored."""


class SourceChanged(RepositoryError):
    """A source file changed while it was copied: its copy is not trusted."""


@dataclass
class Stored:
    size: int
    sha256: str
    stored_size: int
    stored_sha256: str
    # put_object(resumable=True): the SHA-256 state after the bytes before `offset` (`continues`) and these, and
    # the digest of them all
    state: dict | None = None
    whole_sha256: str | None = None


@dataclass
class BackupRecord:
    """A backup found in the repository: its manifest, or why it could not be read."""

    family: str
    instance: str
    id: str
    manifest: BackupManifest | None
    problem: str | None = None  # the manifest's main file was damaged (the copy was used), or neither is good
    complete: bool = True  # False: files without a manifest (an interrupted backup's leftovers)
    fenced: float | None = None  # when its leftovers were fenced: their writer can no longer commit them
    cleared: bool = False  # fenced, nothing left but the fence, and the fence kept a while yet: nothing to list


# How long a fence stays where an interrupted backup's leftovers were. A writer paused longer than this, right
# between proving its lease and its commit, is the one case it no longer stops.
FENCE_KEEP = 7 * 86400.0


# What bytes_by_kind tells apart: backups (and snapshots), the archive, the verification ledger, verification
# reports, the expiry audit log, leases, the repository's own records (walvault.repo, walvault.policy), other.
BYTE_KINDS = ("backups", "archive", "ledger", "reports", "audit", "locks", "metadata", "other")
_TOP_KINDS = {"reports": "reports", "audit": "audit", "locks": "locks"}
_SOURCE_KINDS = {"backups": "backups", "archive": "archive", "stream": "archive", "archive-complete.json": "archive",
                 "ledger": "ledger"}


def _kind_of_object(name: str) -> str:
    parts = name.split("/")
    if len(parts) == 1:
        return "metadata" if parts[0].removesuffix(COPY_SUFFIX) in (INFO_NAME, POLICY_NAME) else "other"
    if parts[0] in FAMILIES and len(parts) >= 3:
        return _SOURCE_KINDS.get(parts[2], "other")
    return _TOP_KINDS.get(parts[0], "other")


def is_immutable(name: str) -> bool:
    """What Object Lock retains (by its name from the root): a backup's objects and its manifest (a fence written in
    its place too), an archived file and its record: written once, removed only by expiry. Everything else is
    rewritten or replaced (leases, the policy, the ledger, verdicts, reports, tombstones, the stream's segments and
    partials, which the archive supersedes or a stream replaces as they grow) and is never locked."""
    parts = name.split("/")
    if len(parts) < 4 or parts[0] not in FAMILIES:
        return False
    last = parts[-1]
    if parts[2] == "backups":
        return len(parts) >= 5 and (last.endswith(".zst") or last.removesuffix(COPY_SUFFIX) == MANIFEST_NAME)
    return parts[2] == "archive" and (last.endswith(".zst") or last.endswith(".zst.json"))


def is_backup_id(text: str) -> bool:
    return bool(_BACKUP_ID.fullmatch(text))


def backup_stamp(backup_id: str) -> str:
    """When a backup id was given, YYYYMMDD-HHMMSS: its own part (an incremental's id begins with its full's).
    Each new id of a source is given a later one than all before it (backup_common.new_backup_id)."""
    return backup_id.split("_")[-1][:15]


def check_instance(instance: str) -> str:
    if not isinstance(instance, str) or not _INSTANCE.fullmatch(instance):
        raise UnsafeName(f"refused instance name {instance!r}")
    return instance


class Repository:
    def __init__(self, url: str, options: dict | None = None, *, create: bool = False, settings: dict | None = None,
                 key: str | None = None, key_env: str | None = None):
        """`settings`: what a repository created now keeps in walvault.repo (`init`'s "lock" and "encryption");
        `key`: the passphrase of an encrypted repository (default: $`key_env`, which is WALVAULT_KEY unless said;
        encrypted.py). A key given for a plain repository is refused: whoever gives one means it encrypted."""
        from .encrypted import KEY_ENV, KEY_NAME, EncryptedStorage, key_source, open_keyring, passphrase

        self.storage = open_storage(url, options)
        self.display = self.storage.display
        key_env = key_env or KEY_ENV
        key = passphrase(key, key_env)
        if create:
            if key is not None and not (settings or {}).get("encryption") and read_info(self.storage) is None:
                # refused before walvault.repo is written: a plain repository made now would refuse the key forever
                raise RepositoryError(f"{self.display} holds no repository and a key was given "
                                      f"({key_source(key_env)}): not made a plain one (an encrypted one is made by "
                                      f"`walvault init --repo {self.display} --encrypt`)")
            self.info = ensure_info(self.storage, utc_now(), walvault_version(), settings)
        else:
            self.info = read_info(self.storage)
            if self.info is None:
                raise RepositoryError(f"{self.display} is not a walvault repository (no walvault.repo): create one "
                                      f"with `walvault init --repo {self.display}`")
        if lock := self.info.get("lock"):  # set on the driver that writes: under the encryption
            self.storage.lock = ObjectLock(lock["mode"], lock["days"], is_immutable)
        if self.encrypted:
            self.storage = EncryptedStorage(self.storage, open_keyring(self.storage, key, key_env))
        elif self.storage.exists(KEY_NAME):
            # walvault.repo is in clear: whoever can write the bucket could make it say "plain" so that backups are
            # written in clear; a repository made encrypted is never made plain, so its key file gives it away
            raise RepositoryError(f"{self.display}: walvault.repo says the repository is not encrypted, but it holds "
                                  f"an encrypted repository's key file {KEY_NAME}: walvault.repo was changed; refused "
                                  "(nothing is written in clear)")
        elif key is not None:
            # a key given means the operator believes the repository encrypted: writing in clear would betray that
            raise RepositoryError(f"{self.display} is not encrypted, but a key was given ({key_source(key_env)}): "
                                  "refused, lest what is meant to be sealed be written in clear (a plain repository "
                                  "takes no key)")
        self.locks = self.storage.sub("locks")

    @property
    def encrypted(self) -> bool:
        return bool(self.info.get("encryption"))

    @classmethod
    def init(cls, url: str, options: dict | None = None, *, lock_days: int | None = None,
             lock_mode: str = "governance", encrypt: bool = False, key: str | None = None) -> tuple[Repository, bool]:
        """`walvault init`: the repository at `url`, made there when the location is missing or empty; (it, whether
        it was made now). A location holding anything but a repository is refused: a mistyped path must not turn
        a directory of other things into a repository. `lock_days`: every immutable object is written under S3
        Object Lock (`lock_mode`) for that many days; refused where the store has no Object Lock enabled, and on
        a repository made without it (or with another). `encrypt`: an encrypted one, under `key` (encrypted.py)."""
        from .encrypted import KEY_ENV, KEY_NAME, create_key_file, key_source, passphrase

        storage = open_storage(url, options)
        if storage.caps.local_paths and os.path.lexists(storage.root) and not os.path.isdir(storage.root):
            raise RepositoryError(f"{storage.display} exists and is not a directory: not made a repository")
        lock = {"mode": lock_mode, "days": lock_days} if lock_days is not None else None
        if (info := read_info(storage)) is not None:
            if lock is not None and info.get("lock") != lock:
                raise RepositoryError(f"{storage.display} is a walvault repository already, with "
                                      + (f"Object Lock {info['lock']['mode']} for {info['lock']['days']} days"
                                         if info.get("lock") else "no Object Lock")
                                      + ": init changes no repository's settings")
            if encrypt and not info.get("encryption"):
                raise RepositoryError(f"{storage.display} is a walvault repository already, not encrypted: an "
                                      "encrypted one is made in a new or empty location")
            return cls(url, options, key=key), False
        if lock is not None and not storage.lock_enabled():
            raise RepositoryError(f"--lock-days: {storage.display} cannot lock objects (only S3 with Object Lock "
                                  "enabled on the bucket can): not made a repository")
        try:
            held = storage.fs.ls(storage.root, detail=False)
        except FileNotFoundError:
            held = []
        except Exception as e:
            raise storage.error("cannot list the location", e) from None
        # a key file alone: an encrypted init stopped before its commit point (walvault.repo), which only an
        # encrypted init takes over (a plain repository holding a key file is refused as a changed walvault.repo)
        if [h for h in held if not encrypt or h.rstrip("/").rsplit("/", 1)[-1] != KEY_NAME]:
            raise RepositoryError(f"{storage.display} is not empty and holds no walvault repository: not made one "
                                  "(init makes a repository only in a new or empty location)")
        settings = {"lock": lock} if lock is not None else {}
        key = passphrase(key)  # a key given without encrypt: refused by the constructor before walvault.repo
        if encrypt:
            if key is None:
                raise RepositoryError(f"an encrypted repository needs a key: give it in {key_source(KEY_ENV)}")
            create_key_file(storage, key)  # before walvault.repo, the commit point, says the repository is encrypted
            settings["encryption"] = {"cipher": "AES-256-GCM", "key_file": KEY_NAME}
        return cls(url, options, create=True, settings=settings, key=key), True

    # -- names

    @staticmethod
    def source_dir(family: str, instance: str) -> str:
        if family not in FAMILIES:
            raise UnsafeName(f"unknown family {family!r}")
        return f"{family}/{check_instance(instance)}"

    def backup_dir(self, family: str, instance: str, backup_id: str) -> str:
        if not _BACKUP_ID.fullmatch(backup_id):
            raise UnsafeName(f"refused backup id {backup_id!r}")
        return f"{self.source_dir(family, instance)}/backups/{backup_id}"

    def backup_storage(self, family: str, instance: str, backup_id: str) -> Storage:
        """The storage rooted at a backup's directory."""
        return self.storage.sub(self.backup_dir(family, instance, backup_id))

    def lease(self, family: str, instance: str, command: str, *, wait: float = 0.0,
              ttl: float | None = None) -> Lease:
        return acquire(self.locks, f"{family}-{check_instance(instance)}.lease", command, ttl=ttl, wait=wait)

    def archive_lease(self, family: str, instance: str, command: str, *, wait: float = 0.0) -> Lease:
        """One archive (or expiry) of a source's archive at a time: apart from the source's lease, so that a long
        backup does not hold archiving up."""
        return acquire(self.locks, f"{family}-{check_instance(instance)}.archive.lease", command, wait=wait)

    def stream_lease(self, family: str, instance: str) -> Lease:
        """One `walvault stream` of an instance at a time: apart from the archive's, which a stream would otherwise
        hold for as long as it runs."""
        return acquire(self.locks, self._stream_lease_name(family, instance), "stream")

    def stream_holder(self, family: str, instance: str) -> dict | None:
        """What the stream lease of the instance says while a live `walvault stream` holds it (its `host`, `pid`,
        `taken`: when it was last renewed, every TTL/4 while the streamer runs, and `expires`); None when none does
        (never taken, released at a stop, or stale: its process gone, or not renewed in a TTL). A streamer renews
        it however idle its source is: this tells a live one from a dead one where no new segment can."""
        found = read_lease(self.locks, self._stream_lease_name(family, instance), DEFAULT_TTL)
        # expired is dead even while its process lives on this host (stopped, wedged), though only a holder whose
        # process is gone has its lease taken over
        if found is None or stale(found[1]) or found[1]["expires"] < time.time():
            return None
        return found[1]

    @staticmethod
    def _stream_lease_name(family: str, instance: str) -> str:
        return f"{family}-{check_instance(instance)}.stream.lease"

    def restore_pin(self, family: str, instance: str) -> Lease | None:
        """Mark a restore of the source in progress, so that an expiry leaves the source alone meanwhile; None
        when the repository cannot be written (a restore from a read-only copy needs no mark: nothing expires
        there)."""
        name = f"{family}-{check_instance(instance)}.restore-{random_hex(8)}.lease"
        try:
            return acquire(self.locks, name, "restore")
        except RepositoryError:
            return None

    def restores_in_progress(self, family: str, instance: str) -> list[str]:
        """What each live restore mark of the source says (a stale one, of a dead process, does not count)."""
        prefix = f"{family}-{check_instance(instance)}.restore-"
        found = []
        for name in self.locks.list():
            lease = read_lease(self.locks, name, DEFAULT_TTL) if name.startswith(prefix) else None
            if lease is not None and not stale(lease[1]):
                found.append(describe(lease[1]))
        return found

    # -- the retention policy and the audit log

    def policy(self) -> dict | None:
        loaded = self.load_policy()
        return loaded.obj if loaded is not None else None

    def load_policy(self) -> Loaded | None:
        """The stored policy and the file it was read from: the copy, with the reason, when the main file is
        damaged (a caller acting on it says so). None when none is stored; ManifestError naming both files and
        how to set it again when neither is good (a damaged policy is never used)."""
        try:
            return load_checked(self.storage, POLICY_NAME)
        except FileNotFoundError:
            return None
        except ManifestError as e:
            raise ManifestError(f"the retention policy cannot be read: {e}; set it again: walvault policy --repo "
                                f"{self.display} --days N") from None

    def set_policy(self, days: float, keep_full: int = 0) -> dict:
        """Store the policy: the recovery window in days and, when not 0, the newest full backups kept by count."""
        policy = {"days": days, **({"keep_full": keep_full} if keep_full else {}), "set": utc_now(),
                  "by": f"walvault {walvault_version()}"}
        save_checked(self.storage, POLICY_NAME, policy)
        return policy

    def audit(self, run: str, seq: int, record: dict) -> str:
        """Append one record to the audit log: a new object, never rewritten."""
        log, entry = self.storage.sub("audit").sub(run), f"{seq:06d}.json"
        if not log.create(entry, encode_checked(record)):
            raise RepositoryError(f"audit record {log.repo_name(entry)} exists already: another expiry used the same "
                                  "run id")
        return log.repo_name(entry)

    # -- objects

    def put_object(self, name: str, path: Path, *, offset: int = 0, limit: int | None = None, level: int = 3,
                   cores: int = 1, resumable: bool = False, continues: dict | None = None) -> Stored:
        """Store the bytes of a source file from `offset` (its first `limit` of them when given), zstd-compressed,
        hashing both sides; SourceChanged when the file changed meanwhile (its size, or its mtime for a copy to its
        end). A big file takes up to `cores` cores (zstd's threads, the hashes on threads of their own).
        `resumable`: the source bytes are hashed also as the continuation of `continues` (the SHA-256 state after
        the file's bytes before `offset`; None: from its start), whose state the result carries."""
        import zstandard

        before = os.stat(path)
        counts = [0, 0]
        size = max(0, before.st_size - offset) if limit is None else min(limit, max(0, before.st_size - offset))
        big = size >= PARALLEL_COMPRESSION_BYTES and cores > 1
        if big:  # one thread per core, in jobs of 1 MiB: ~15 MiB held, not ~80
            params = zstandard.ZstdCompressionParameters.from_level(level, threads=cores, job_size=1 << 20)
            compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
        else:
            compressor = zstandard.ZstdCompressor(level=level).compressobj()

        def read(f, size: int) -> bytes:
            try:
                return f.read(size)
            except OSError as e:  # the source's error, not the repository's (the write would be blamed)
                raise SourceUnreadable(f"cannot read the source file {path}: {e.strerror or e}") from None

        def chunks() -> Iterator[bytes]:
            try:
                f = open(path, "rb")
            except OSError as e:
                raise SourceUnreadable(f"cannot read the source file {path}: {e.strerror or e}") from None
            with f:
                f.seek(offset)
                left = limit if limit is not None else None
                while left is None or left > 0:
                    data = read(f, READ_CHUNK if left is None else min(READ_CHUNK, left))
                    if not data:
                        break
                    if left is not None:
                        left -= len(data)
                    src_hash.update(data)
                    if whole_hash is not None:
                        whole_hash.update(data)
                    counts[0] += len(data)
                    out = compressor.compress(data)
                    if out:
                        out_hash.update(out)
                        counts[1] += len(out)
                        yield out
            out = compressor.flush()
            out_hash.update(out)
            counts[1] += len(out)
            yield out

        resumed = None
        if resumable:
            from ..sha256_state import ResumableSha256

            resumed = ResumableSha256.resume(continues) if continues is not None else ResumableSha256()
        own = resumed if continues is None else None  # from the file's start, it is the source hash itself
        with ExitStack() as hashes:
            src_hash = hashes.enter_context(Sha256(threaded=big, hasher=own))
            out_hash = hashes.enter_context(Sha256(threaded=big))
            whole_hash = None
            if resumed is not None and own is None:
                whole_hash = hashes.enter_context(Sha256(threaded=big, hasher=resumed))
            self.storage.write(name, chunks())
        after = os.stat(path)
        expected = limit if limit is not None else before.st_size - offset
        if counts[0] != expected or (limit is None and (after.st_size, after.st_mtime_ns) != (before.st_size,
                                                                                              before.st_mtime_ns)):
            self.storage.remove(name)
            raise SourceChanged(f"{path} changed while it was copied ({before.st_size} bytes before, {counts[0]} "
                                f"read from byte {offset}, {after.st_size} after): its copy is not trusted")
        stored = Stored(counts[0], src_hash.hexdigest(), counts[1], out_hash.hexdigest())
        if resumed is not None:
            stored.whole_sha256, stored.state = resumed.hexdigest(), resumed.state()
        return stored

    def read_object(self, stored: str, *, size: int, sha256: str, stored_sha256: str,
                    check_stored: bool = True, out_hash: Sha256 | None = None) -> Iterator[bytes]:
        """The original bytes of a stored object, streamed; ObjectDamaged (after the last chunk) when its stored
        bytes, its size or its content hash differ from what is recorded. Nothing is trusted before that.
        Without `check_stored`, the stored bytes' SHA-256 is left out: what a restore writes is proven by the
        content's (a damaged object fails that, or zstd), and the other hash took a third of reading a big object.
        `out_hash`: the hash fed the bytes read (one given nothing yet), else a new one."""
        big = size >= PARALLEL_COMPRESSION_BYTES and (os.cpu_count() or 1) > 1
        with ExitStack() as hashes:
            if out_hash is None:
                out_hash = hashes.enter_context(Sha256(threaded=big))
            in_hash = hashes.enter_context(Sha256(threaded=big and check_stored))
            yield from self._checked_chunks(stored, size, sha256, stored_sha256 if check_stored else None,
                                            out_hash, in_hash)

    def read_entry(self, entry, *, check_stored: bool = True) -> Iterator[bytes]:
        """A backup file's bytes (a manifest's FileEntry), streamed from its object or its pieces in order, checked
        as read_pieces checks them."""
        return self.read_pieces(entry.name, entry.objects(), size=entry.size, sha256=entry.sha256,
                                check_stored=check_stored)

    def read_pieces(self, what: str, pieces: list, *, size: int, sha256: str,
                    check_stored: bool = True) -> Iterator[bytes]:
        """The bytes of stored objects one after the other (manifest.Piece: each checked as read_object checks
        it); of more than one, the whole is checked against `size` and `sha256` too (ObjectDamaged naming `what`
        after the last chunk)."""
        def read(p, out_hash=None):
            return self.read_object(p.stored, size=p.size, sha256=p.sha256, stored_sha256=p.stored_sha256,
                                    check_stored=check_stored, out_hash=out_hash)

        if len(pieces) == 1:
            yield from read(pieces[0])
            return
        total = 0
        with Sha256(threaded=size >= PARALLEL_COMPRESSION_BYTES) as whole:
            # the first piece's SHA-256 is the whole's after its bytes: they are hashed once, not twice
            for chunk in read(pieces[0], out_hash=whole):
                total += len(chunk)
                yield chunk
            for p in pieces[1:]:
                for chunk in read(p):
                    whole.update(chunk)
                    total += len(chunk)
                    yield chunk
            if (total, whole.hexdigest()) != (size, sha256):
                raise ObjectDamaged(f"{what}: its pieces ({', '.join(p.stored for p in pieces)}) do not make the "
                                    "file recorded (its size or SHA-256 differs)")

    def _checked_chunks(self, stored: str, size: int, sha256: str, stored_sha256: str | None, out_hash: Sha256,
                        in_hash: Sha256) -> Iterator[bytes]:
        import zstandard

        total = 0
        decompressor = zstandard.ZstdDecompressor().decompressobj()
        try:
            for chunk in self.storage.iter_bytes(stored):
                if stored_sha256 is not None:
                    in_hash.update(chunk)
                data = decompressor.decompress(chunk)
                if data:
                    total += len(data)
                    if total > size:
                        raise ObjectDamaged(f"{stored}: holds more than the {size} bytes recorded")
                    out_hash.update(data)
                    yield data
        except zstandard.ZstdError as e:
            raise ObjectDamaged(f"{stored}: not a whole zstd stream ({e})") from None
        except FileNotFoundError:
            raise ObjectDamaged(f"{stored}: missing") from None
        if stored_sha256 is not None and in_hash.hexdigest() != stored_sha256:
            raise ObjectDamaged(f"{stored}: its stored bytes do not match their SHA-256")
        if not decompressor.eof:
            raise ObjectDamaged(f"{stored}: the zstd stream is cut short")
        if total != size:
            raise ObjectDamaged(f"{stored}: holds {total} bytes, {size} recorded")
        if out_hash.hexdigest() != sha256:
            raise ObjectDamaged(f"{stored}: its content does not match its SHA-256")

    # -- backups

    def sources(self) -> list[tuple[str, str]]:
        return [(family, instance) for family in FAMILIES for instance in self.storage.list_dirs(family)
                if _INSTANCE.fullmatch(instance)]

    def backup_ids(self, family: str, instance: str) -> list[str]:
        return [d for d in self.storage.list_dirs(f"{self.source_dir(family, instance)}/backups")
                if _BACKUP_ID.fullmatch(d)]

    def load_backup(self, family: str, instance: str, backup_id: str) -> BackupRecord:
        """A backup's record. Its main manifest is the commit point: without it (even with a copy: the writer
        stopped between the two) the files are leftovers; a damaged main one with a good copy is used from the
        copy. A fence in its place says the leftovers were taken from their writer."""
        backup = self.backup_storage(family, instance, backup_id)
        main = backup.repo_name(MANIFEST_NAME)
        leftovers = "an interrupted backup's leftovers"
        try:
            loaded = load_checked(backup, MANIFEST_NAME)
        except FileNotFoundError:
            return BackupRecord(family, instance, backup_id, None, f"no manifest: {leftovers}", complete=False)
        except (ManifestError, UnsafeName) as e:
            return BackupRecord(family, instance, backup_id, None, str(e))
        if loaded.problem == f"{main} is missing":
            return BackupRecord(family, instance, backup_id, None, f"no main manifest, only its copy: {leftovers}",
                                complete=False)
        if loaded.used == main and loaded.obj.get("fenced") is True:
            return self._fenced(family, instance, backup_id, loaded.obj)
        try:
            manifest = BackupManifest.from_json(loaded.obj)
        except (ManifestError, UnsafeName) as e:
            return BackupRecord(family, instance, backup_id, None, f"{loaded.used}: {e}")
        if (manifest.id, manifest.family, manifest.instance) != (backup_id, family, instance):
            return BackupRecord(family, instance, backup_id, None,
                                f"{loaded.used} describes {manifest.family}/{manifest.instance} backup {manifest.id}, "
                                "not the one it is stored as")
        problem = f"{loaded.problem}; {loaded.used} was used" if loaded.problem else None
        return BackupRecord(family, instance, backup_id, manifest, problem)

    def _fenced(self, family: str, instance: str, backup_id: str, fence: dict) -> BackupRecord:
        try:
            when = stamp_seconds(fence.get("time"))
        except (TypeError, ValueError):
            when = 0.0  # a fence of no known time is old: removed with its directory
        residue = [n for n in self.backup_storage(family, instance, backup_id).list() if n != MANIFEST_NAME]
        return BackupRecord(family, instance, backup_id, None,
                            f"fenced by {fence.get('lease')} at {fence.get('time')}: an interrupted backup's "
                            "leftovers, which their writer can no longer commit", complete=False, fenced=when,
                            cleared=not residue and time.time() - when <= FENCE_KEEP)

    def clear_leftovers(self, record: BackupRecord, lease: Lease) -> bool:
        """Remove an interrupted backup's leftovers once their writer can no longer commit them: a fence is created
        in place of its main manifest first (an exclusive create: a late writer's commit then fails), and stays
        FENCE_KEEP before the directory goes. False when a manifest appeared meanwhile (the writer committed: its
        backup is left alone), nothing was left to remove, or what is left is still under its Object Lock (removed
        once that ends)."""
        backup = self.backup_storage(record.family, record.instance, record.id)
        lease.confirm()
        fenced = record.fenced
        if fenced is None:
            fence = encode_checked({"fenced": True, "by": lease.holder, "lease": lease.name, "time": utc_now()})
            fenced = time.time()
            if not backup.create(MANIFEST_NAME, fence):
                record = self.load_backup(record.family, record.instance, record.id)
                if record.fenced is None:
                    return False
                fenced = record.fenced
        if record.cleared:
            return False
        return not backup.remove_tree(keep=None if time.time() - fenced > FENCE_KEEP else MANIFEST_NAME)

    def source_backups(self, family: str, instance: str) -> list[BackupRecord]:
        """Every backup of one source, as found (in no particular order); a fence whose leftovers are gone is
        none."""
        records = [self.load_backup(family, instance, b) for b in self.backup_ids(family, instance)]
        return [r for r in records if not r.cleared]

    def newest_first(self, family: str, instance: str) -> Iterator[BackupRecord]:
        """The backups of one source as source_backups finds them, the one given its id last first (backup_stamp),
        each manifest read only when it is reached: a caller looking for the newest of some kind reads no more of
        them than it needs (a source backed up hourly for a month holds 720; on an object store each read is a
        request)."""
        for backup_id in sorted(self.backup_ids(family, instance), key=lambda b: (backup_stamp(b), b), reverse=True):
            record = self.load_backup(family, instance, backup_id)
            if not record.cleared:
                yield record

    def backups(self) -> list[BackupRecord]:
        """Every backup of every source, oldest first (by id, then finish time)."""
        records = [r for f, i in self.sources() for r in self.source_backups(f, i)]
        return sorted(records, key=lambda r: (r.id, r.manifest.finished if r.manifest else ""))

    def backups_of(self, path) -> list[BackupManifest]:
        """The complete backups (snapshots included) of the data directory at `path`, oldest first."""
        where = str(Path(path).resolve())
        return [r.manifest for r in self.backups() if r.manifest is not None and r.manifest.source.get("path") == where]

    def find(self, backup_id: str) -> BackupRecord:
        """A backup by id, or `latest` (the newest complete backup); RepositoryError when there is none."""
        records = [r for r in self.backups() if r.manifest is not None]
        if backup_id == "latest":
            if not records:
                raise RepositoryError(f"the repository {self.display} holds no backup")
            newest = {}
            for r in records:
                key = (r.family, r.instance)
                if key not in newest or (r.manifest.finished, r.id) > (newest[key].manifest.finished, newest[key].id):
                    newest[key] = r
            if len(newest) > 1:  # `latest` of which source? Restoring the wrong one would look like success.
                raise RepositoryError(f"the repository {self.display} holds backups of {len(newest)} sources; name "
                                      "the backup: " + ", ".join(f"{r.id} ({f}/{i})" for (f, i), r in
                                                                 sorted(newest.items())))
            return next(iter(newest.values()))
        holders = [(f, i) for f, i in self.sources() if backup_id in self.backup_ids(f, i)]  # listings only
        found = [r for r in (self.load_backup(f, i, backup_id) for f, i in holders) if not r.cleared]
        if not found:
            raise RepositoryError(f"no backup {backup_id} in the repository {self.display}")
        if len(found) > 1:
            raise RepositoryError(f"backup id {backup_id} names backups of several sources")
        record = found[0]
        if record.manifest is None:
            raise RepositoryError(f"backup {backup_id} cannot be used: {record.problem}")
        return record

    def chain(self, manifest: BackupManifest, known: dict[str, BackupManifest] | None = None) -> list[BackupManifest]:
        """The backup and its parents, full first; RepositoryError when a parent is missing or unreadable. `known`:
        manifests of the source read already, by id (not read again)."""
        chain = [manifest]
        while chain[0].parent is not None:
            parent = (known or {}).get(chain[0].parent)
            record = BackupRecord(manifest.family, manifest.instance, parent.id, parent) if parent else \
                self.load_backup(manifest.family, manifest.instance, chain[0].parent)
            if record.manifest is None:
                raise RepositoryError(f"backup {chain[0].id} needs its parent {chain[0].parent}, which cannot be "
                                      f"read: {record.problem}")
            if len(chain) > 10000 or any(m.id == record.manifest.id for m in chain):
                raise RepositoryError(f"backup {manifest.id}: its parent chain loops")
            chain.insert(0, record.manifest)
        if chain[0].type not in ("full", "snapshot") or any(m.type == "snapshot" for m in chain[1:]):
            raise RepositoryError(f"backup {manifest.id}: its chain does not start with a full backup")
        return chain

    # -- what the repository holds

    def bytes_by_kind(self) -> dict[str, int]:
        """The bytes the repository holds, by kind (BYTE_KINDS): every object counted once, by where it is in the
        layout above."""
        found = dict.fromkeys(BYTE_KINDS, 0)
        for name, size in self.storage.sizes().items():
            found[_kind_of_object(name)] += size
        return found

    # -- the ledger: what verifying a file's bytes found, by their SHA-256

    def _ledger(self, family: str, instance: str, sha256: str) -> tuple[Storage, str]:
        """The ledger's storage and the entry's name in it."""
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise UnsafeName(f"refused ledger key {sha256!r}")
        return self.storage.sub(self.source_dir(family, instance)).sub("ledger"), f"{sha256}.json"

    def ledger_get(self, family: str, instance: str, sha256: str) -> dict | None:
        ledger, entry = self._ledger(family, instance, sha256)
        try:
            data = ledger.read_bytes(entry)
            return decode_checked(data, "ledger entry")
        except (FileNotFoundError, ManifestError):
            return None

    def ledger_verdict(self, family: str, instance: str, sha256: str, size: int) -> dict | None:
        """The verdict on record for these bytes when it can stand for a scan: clean, of the same size, and found
        by this walvault version (a newer one may check more)."""
        entry = self.ledger_get(family, instance, sha256)
        verdict = (entry or {}).get("verdict")
        if (not isinstance(verdict, dict) or entry.get("by") != walvault_version() or verdict.get("status") != "ok"
                or verdict.get("size") != size):
            return None
        return verdict

    def ledger_put(self, family: str, instance: str, sha256: str, verdict: dict) -> None:
        ledger, entry = self._ledger(family, instance, sha256)
        ledger.write_bytes(entry, encode_checked({"sha256": sha256, "verdict": verdict, "by": walvault_version()}))


__all__ = ["Repository", "RepositoryError", "is_backup_id", "ObjectDamaged", "SourceChanged", "BackupRecord", "Stored",
           "check_name", "utc_now", "walvault_version"]
