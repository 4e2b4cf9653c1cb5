"""The repository's storage: one root addressed by a URL (as pgBackRest's src/storage/), through a driver.

A plain path (or `file://`) is a local directory (`LocalStorage`); `s3://bucket/prefix` needs s3fs, and any other
fsspec protocol works with its package (`FsspecStorage`). What a driver does natively is told by its `caps`, not by
what kind it is. Every name given here is relative to the storage's root and checked before use: nothing outside
the root is ever read or written, whatever a manifest says; `sub(prefix)` is a storage rooted deeper, so that
callers build no paths. Writes are atomic: locally `fsutil.write_atomic` (a temporary file, fsync, rename, a
directory fsync); on an object store one PUT (an object appears whole or not at all), aborted on error.

On S3 with Object Lock (`ObjectLock`, set from the repository's settings), every object its `applies` names is
written with a retention period, and `remove` reads an object's lock before deleting it: a plain delete of a locked
object would only hide it behind a delete marker, so a locked one is refused (ObjectLocked), never hidden.

Credentials come from the options or the environment and are never printed: every error leaving this
module passes through `redact`.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from stat import S_ISLNK

from ..fsutil import fsync_dir, write_atomic


class RepositoryError(RuntimeError):
    """The repository cannot be used as asked; the message names why (with secrets removed)."""


class ObjectDamaged(RepositoryError):
    """A stored object whose bytes do not match what its manifest or record says (or, encrypted, do not
    authenticate)."""


class UnsafeName(RepositoryError):
    """A name that would leave the repository root (`..`, absolute, a symlink out)."""


class ObjectLocked(RepositoryError):
    """An object still under its Object Lock retention: it cannot be deleted before `until` (Unix time)."""

    def __init__(self, message: str, until: float):
        super().__init__(message)
        self.until = until


_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|key", re.I)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
               "WALVAULT_KEY", "WALVAULT_NEW_KEY", "WALVAULT_TO_KEY")  # the last three: encrypted repositories' keys
# (encrypted.py)
# Shorter values are not searched for: replacing them would garble the rest of a message.
_MIN_SECRET = 6
# Reads of a small object that was replaced while read (a renewed lease), before its error is reported.
_READ_ATTEMPTS = 3


def _secrets(options: dict) -> list[str]:
    """The storage options' secrets. Not the environment's: read when a message is redacted, so that a storage
    pickled into a Spark task does not carry the driver's WALVAULT_KEY to the executors."""
    found = []

    def walk(obj, key=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, str(k))
        elif isinstance(obj, str) and _SECRET_KEY.search(key) and not key.endswith("key_id"):
            found.append(obj)

    walk(options)
    return sorted({s for s in found if len(s) >= _MIN_SECRET}, key=len, reverse=True)


def redact_url(url: str) -> str:
    """A URL without its user info's password and without query values that look secret."""
    url = re.sub(r"(//[^/@:]*):[^/?#]*@", r"\1:***@", url)  # to the netloc's last '@' (a password may hold one)
    return re.sub(r"([?&][^=&]*(?:secret|password|token|key)[^=&]*=)[^&]*", r"\1***", url, flags=re.I)


def parse_options(pairs: Iterable[str]) -> dict:
    """`KEY=VALUE` pairs (`--repo-option`) as fsspec storage options; `a.b=c` nests, values are JSON when they parse."""
    options: dict = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # the text is not echoed: a mistyped option may be a secret
            raise RepositoryError("a repository option is KEY=VALUE with a non-empty KEY (--repo-option)")
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = value
        *parents, last = key.split(".")
        node = options
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise RepositoryError(f"the repository option {key!r} nests under a value given before")
        node[last] = parsed
    return options


def check_name(name: str) -> str:
    """A repository-relative name, refused when it could leave the root."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise UnsafeName(f"refused repository name {name!r}: empty, or holds a NUL or a backslash")
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("..", ".", "") for part in name.split("/")):
        raise UnsafeName(f"refused repository name {name!r}: it is absolute or leaves its directory")
    return str(p)


LOCAL_PROTOCOLS = (None, "file", "local")
_SCHEME_WITHOUT_SLASHES = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)")


def _plain_path(url: str) -> bool:
    """A URL without a protocol: a local path, which fsspec (0.15 s to import) has nothing to say about."""
    return "://" not in url and "::" not in url


def check_url(url: str) -> None:
    """Refuse a repository URL that would not address what it says: empty (the current directory), a scheme
    without '//' (`s3:/b/r` would be a local directory named `s3:`), a protocol fsspec does not know or whose
    package is missing."""
    if not url.strip():
        raise RepositoryError("the repository URL is empty: give a path, s3://bucket/prefix or another fsspec URL")
    if m := _SCHEME_WITHOUT_SLASHES.match(url):
        raise RepositoryError(f"{redact_url(url)} is neither a URL ({m[1]}://...) nor a plain path: a local "
                              f"directory whose name starts with '{m[1]}:' is written ./{m[1]}:...")
    if _plain_path(url):
        return
    import fsspec

    protocol, _path = fsspec.core.split_protocol(url)
    if protocol not in LOCAL_PROTOCOLS:
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as e:
            raise RepositoryError(f"cannot open repository {redact_url(url)}: {e}") from None


@dataclass(frozen=True)
class Capabilities:
    """What a driver does natively (pgBackRest's storage features): what callers and tests ask instead of its kind."""

    conditional_update: str  # how `update` stays conditional: "flock" (read and write under a lock), "if-match"
    #                          (the write is conditional on the ETag read), "" (read, compare, write: a window)
    atomic_rename: bool  # a write is renamed into place from a temporary name; a killed one leaves that temporary
    consistent_listing: bool  # a list sees other processes' writes without invalidating a client's cache
    fork_safe: bool  # its client may be used in forked worker processes
    local_paths: bool  # names are paths of this host's file system (a symlink may lead out: each is resolved)


LOCK_MODES = ("governance", "compliance")
# A lock is taken to hold this much past its end: a host's clock ahead of the store's by up to this never deletes a
# locked object (a plain delete would not fail: it would hide the object behind a delete marker).
LOCK_SKEW = 300.0


@dataclass(frozen=True)
class ObjectLock:
    """S3 Object Lock as a repository sets it: each object `applies` names (by its name from the repository root)
    is written retained in `mode` (GOVERNANCE or COMPLIANCE) for `days` from its write."""

    mode: str
    days: int
    applies: Callable[[str], bool]

    def retention(self) -> dict:
        """The PUT's parameters: the retention of an object written now."""
        import datetime

        until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=self.days)
        return {"ObjectLockMode": self.mode.upper(), "ObjectLockRetainUntilDate": until}


def open_storage(url: str, options: dict | None = None) -> Storage:
    """The storage at `url`, through the driver its protocol needs."""
    check_url(url)
    if _plain_path(url):
        return LocalStorage(url, options)
    import fsspec

    protocol, _path = fsspec.core.split_protocol(url)
    return (LocalStorage if protocol in LOCAL_PROTOCOLS else FsspecStorage)(url, options)


class Storage(ABC):
    """A storage root: the drivers' common part. Names are relative, '/'-separated; reads go through fsspec's
    file system (`fs`), which a local directory has too."""

    caps: Capabilities
    fs: object
    root: str  # the repository root in `fs`'s terms; a `sub` storage's names start at `prefix` below it
    lock: ObjectLock | None = None  # the repository's Object Lock: which objects are written retained

    def __init__(self, url: str, options: dict | None):
        self.url = url
        self.display = redact_url(url)
        self.prefix = ""
        self.options = dict(options or {})
        env_options = os.environ.get("WALVAULT_REPO_OPTIONS")
        if env_options:
            try:
                self.options = {**json.loads(env_options), **self.options}
            except (ValueError, TypeError):
                raise RepositoryError("WALVAULT_REPO_OPTIONS is not a JSON object") from None
        self._secrets = _secrets(self.options)

    # -- errors

    def redact(self, text: str) -> str:
        now = [os.environ[k] for k in _SECRET_ENV if len(os.environ.get(k) or "") >= _MIN_SECRET]
        for secret in sorted({*self._secrets, *now}, key=len, reverse=True):
            text = text.replace(secret, "***")
        return redact_url(text) if self.url in text else text

    def error(self, what: str, e: BaseException) -> RepositoryError:
        detail = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        return RepositoryError(self.redact(f"{what} in repository {self.display}: {detail}"))

    def _failed(self, verb: str, name: str, e: BaseException) -> RepositoryError:
        return self.error(f"{verb} {self.repo_name(name)}", e)

    # -- names

    def sub(self, prefix: str) -> Storage:
        """This storage rooted at `prefix` (WAL-G's GetSubFolder): its names are relative to it."""
        deeper = copy.copy(self)
        deeper.prefix = self.repo_name(prefix)
        check_name(deeper.prefix)
        return deeper

    def repo_name(self, name: str) -> str:
        """`name` as named from the repository root: what messages and records say."""
        return f"{self.prefix}/{name}" if self.prefix else name

    def full(self, name: str) -> str:
        """The checked name's path in `fs`."""
        return self._resolve(self.repo_name(name))

    def _resolve(self, repo_name: str) -> str:
        return f"{self.root}/{check_name(repo_name)}"

    def _base(self, prefix: str | None) -> str:
        """The path in `fs` of a prefix, or of this storage's root for None."""
        if prefix is not None:
            return self.full(prefix)
        return self._resolve(self.prefix) if self.prefix else self.root

    # -- reads

    def exists(self, name: str) -> bool:
        try:
            return self.fs.exists(self.full(name))
        except UnsafeName:
            raise
        except Exception as e:
            raise self._failed("cannot look up", name, e) from None

    def read_bytes(self, name: str, limit: int = 64 << 20) -> bytes:
        """A small object whole (a manifest, a lease); one larger than `limit` is refused."""
        full = self.full(name)
        for attempt in range(_READ_ATTEMPTS):
            try:
                with self.fs.open(full, "rb") as f:
                    data = f.read(limit + 1)
                break
            except FileNotFoundError:
                raise
            except Exception as e:
                if _replaced_while_read(e) and attempt + 1 < _READ_ATTEMPTS:
                    continue  # a lease renewed meanwhile: read its new version
                raise self._failed("cannot read", name, e) from None
        if len(data) > limit:
            raise RepositoryError(f"{self.repo_name(name)} in repository {self.display} is larger than {limit} bytes")
        return data

    def iter_bytes(self, name: str, chunk: int = 1 << 20) -> Iterator[bytes]:
        """An object's bytes in chunks of bounded size."""
        try:
            f = self.fs.open(self.full(name), "rb")
        except (FileNotFoundError, UnsafeName):
            raise
        except Exception as e:
            raise self._failed("cannot read", name, e) from None
        with f:
            while True:
                try:
                    data = f.read(chunk)
                except Exception as e:
                    raise self._failed("cannot read", name, e) from None
                if not data:
                    return
                yield data

    def size(self, name: str) -> int:
        try:
            return int(self.fs.size(self.full(name)))
        except (FileNotFoundError, UnsafeName):
            raise
        except Exception as e:
            raise self._failed("cannot stat", name, e) from None

    def age(self, name: str) -> float:
        """Seconds since the object was last written (OSError when it is gone)."""
        return time.time() - self.fs.modified(self.full(name)).timestamp()

    def lock_enabled(self) -> bool:
        """Whether the store can retain objects (S3: the bucket has Object Lock enabled)."""
        return False

    def locked_until(self, name: str) -> float | None:
        """Until when (Unix time) the object is retained by its Object Lock; None when it is not (or not found)."""
        return None

    def list(self, prefix: str | None = None) -> list[str]:
        """Every object name under a directory prefix (or this storage's root for None), recursive, relative to
        this storage's root, sorted."""
        base = self._base(prefix)
        try:
            found = self.fs.find(base, withdirs=False)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise self.error(f"cannot list {self.prefix if prefix is None else self.repo_name(prefix)}", e) from None
        root = self._base(None).rstrip("/") + "/"
        return sorted(p[len(root):] for p in found if p.startswith(root))

    def sizes(self) -> dict[str, int]:
        """Every object under this storage's root and its size in bytes, by name (as `list` names them)."""
        base = self._base(None)
        try:
            found = self.fs.find(base, withdirs=False, detail=True)
        except FileNotFoundError:
            return {}
        except Exception as e:
            raise self.error(f"cannot list {self.prefix}", e) from None
        root = base.rstrip("/") + "/"
        return {p[len(root):]: int(info.get("size") or 0) for p, info in found.items() if p.startswith(root)}

    def list_dirs(self, prefix: str) -> list[str]:
        """The names of the directories right under a prefix (for an object store: common prefixes)."""
        base = self.full(prefix)
        try:
            entries = self.fs.ls(base, detail=True)
        except FileNotFoundError:
            return []
        except Exception as e:
            raise self._failed("cannot list", prefix, e) from None
        return sorted(PurePosixPath(e["name"]).name for e in entries if e.get("type") == "directory")

    # -- writes

    @abstractmethod
    def write(self, name: str, chunks: Iterable[bytes]) -> int:
        """Store an object from chunks, atomically; returns its size."""

    def write_bytes(self, name: str, data: bytes) -> None:
        self.write(name, [data])

    @abstractmethod
    def create(self, name: str, data: bytes) -> bool:
        """Create an object only if none has that name (a lease, a manifest's commit, an archive record); False when
        one exists already. It appears whole."""

    def update(self, name: str, change) -> bool:
        """Replace or remove a small object only if it still holds what `change` was shown, so that two processes
        updating it (a lease renewed, broken, released) never both act on one version: `change(current)` (its bytes,
        None when it is absent) returns the new bytes, None to remove it, or False to leave it as it is. Returns
        whether it acted; False when the object changed in between. How it stays conditional is the driver's
        (`caps.conditional_update`)."""
        full = self.full(name)
        with self._updating(full):
            current, version = self._read_tagged(name, full)
            new = change(current)
            if new is False or (new is None and current is None):
                return False
            if current is None:
                return self.create(name, new)
            return self._replace(name, full, new, version)

    def _updating(self, full: str) -> contextlib.AbstractContextManager:
        """What makes an update's read and write one step, where the driver has it: a lock."""
        return contextlib.nullcontext()

    @abstractmethod
    def _read_tagged(self, name: str, full: str) -> tuple[bytes | None, str | None]:
        """An object's bytes (None when absent) and the version they are, where the driver tells one."""

    @abstractmethod
    def _replace(self, name: str, full: str, new: bytes | None, version: str | None) -> bool:
        """Write `new` over the object, or remove it for None, if it is still at `version`."""

    def remove(self, name: str) -> None:
        """Delete an object (gone already: nothing to do); ObjectLocked when its retention holds it still."""
        if self.lock is not None and self.lock.applies(self.repo_name(name)) \
                and (until := self.locked_until(name)) is not None and until + LOCK_SKEW > time.time():
            raise self._locked(name, until)
        try:
            self.fs.rm_file(self.full(name))
        except FileNotFoundError:
            pass
        except UnsafeName:
            raise
        except Exception as e:
            raise self._failed("cannot remove", name, e) from None

    def _locked(self, name: str, until: float, why: str = "") -> ObjectLocked:
        return ObjectLocked(f"{self.repo_name(name)} in repository {self.display} is locked until "
                            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(until))} (S3 Object Lock){why}: not "
                            "deleted", until)

    def remove_stale_temporaries(self, prefix: str | None, older_than: float) -> list[str]:
        """Remove the temporary files of writes killed before their rename, older than `older_than` seconds, under a
        prefix (or right at the root for None); a driver without `caps.atomic_rename` leaves none."""
        return []

    def remove_tree(self, prefix: str | None = None, keep: str | None = None) -> list[str]:
        """Remove every object under a prefix (or this storage's root for None: a backup's leftovers), but the one
        named `keep` (a fence); returns those left because their Object Lock holds them still (removed once it
        ends)."""
        locked = []
        for name in self.list(prefix):
            if name != keep:
                try:
                    self.remove(name)
                except ObjectLocked:
                    locked.append(name)
        return locked


class LocalFiles:
    """The calls Storage makes on fsspec's local file system, made on os directly (importing fsspec costs a
    command 0.1 s): the same paths, the same answers, symlinks as fsspec takes them (followed where named, listed
    but never walked below a directory listed)."""

    exists = staticmethod(os.path.exists)
    rm_file = staticmethod(os.remove)

    @staticmethod
    def open(path: str, mode: str = "rb"):
        return open(path, mode)

    @staticmethod
    def size(path: str) -> int:
        return os.stat(path).st_size

    @staticmethod
    def modified(path: str):
        import datetime

        return datetime.datetime.fromtimestamp(os.stat(path).st_mtime, tz=datetime.timezone.utc)

    @staticmethod
    def ls(path: str, detail: bool = True) -> list:
        """A directory's entries (a file: itself); FileNotFoundError when there is nothing at `path`."""
        if not os.path.isdir(path):
            os.stat(path)  # FileNotFoundError when missing
            entries = [(path, False)]
        else:
            with os.scandir(path) as found:  # a symlink is no directory here, as fsspec says ("other")
                entries = [(e.path, e.is_dir(follow_symlinks=False)) for e in found]
        if not detail:
            return [p for p, _ in entries]
        return [{"name": p, "type": "directory" if is_dir else "file"} for p, is_dir in entries]

    @staticmethod
    def find(path: str, withdirs: bool = False, detail: bool = False):
        """Every file under a directory, recursive, sorted (with detail: by path, each with its size); none when
        the directory is missing. A symlink below `path` is an entry, never walked, as fsspec lists it: a symlinked
        directory's files are listed once, where they are (removing a tree removes the link, not what it leads
        to), and a loop ends; its size is its target's (0 when it dangles)."""
        assert not withdirs
        found = {}
        for root, dirs, names in os.walk(path):
            for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                full = os.path.join(root, n)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue  # removed meanwhile
                size = st.st_size
                if S_ISLNK(st.st_mode):  # its target's size; 0 when it dangles
                    try:
                        size = os.stat(full).st_size
                    except OSError:
                        size = 0
                found[full] = {"name": full, "size": size, "type": "file"} if detail else None
        if not found and os.path.isfile(path):
            found[path] = {"name": path, "size": os.stat(path).st_size, "type": "file"}
        return dict(sorted(found.items())) if detail else sorted(found)


class LocalStorage(Storage):
    """A directory of this host (pgBackRest's posix driver): atomic writes by rename, exclusive creates by hard link,
    conditional updates under an flock."""

    caps = Capabilities(conditional_update="flock", atomic_rename=True, consistent_listing=True, fork_safe=True,
                        local_paths=True)

    def __init__(self, url: str, options: dict | None = None):
        super().__init__(url, options)
        self.fs = LocalFiles()
        scheme, sep, path = url.partition("://")  # as fsspec splits it: one letter is a drive, not a scheme
        self.root = os.path.abspath(path if sep and len(scheme) > 1 else url)

    def _resolve(self, repo_name: str) -> str:
        full = super()._resolve(repo_name)
        real_root = os.path.realpath(self.root)
        real = os.path.realpath(full)
        if real != real_root and not real.startswith(real_root + os.sep):
            raise UnsafeName(f"refused repository name {check_name(repo_name)!r}: a symlink leads out of the "
                             "repository")
        return full

    def write(self, name: str, chunks: Iterable[bytes]) -> int:
        full = self.full(name)
        self._makedirs(os.path.dirname(full))
        written = 0

        def counted() -> Iterator[bytes]:
            nonlocal written
            for chunk in chunks:
                yield chunk
                written += len(chunk)

        try:
            write_atomic(Path(full), counted())
        except OSError as e:
            raise self._failed("cannot write", name, e) from None
        return written

    def create(self, name: str, data: bytes) -> bool:
        full = self.full(name)
        self._makedirs(os.path.dirname(full))
        try:
            return write_atomic(Path(full), [data], exclusive=True)
        except OSError as e:
            raise self._failed("cannot create", name, e) from None

    def _makedirs(self, path: str) -> None:
        """mkdir -p, fsyncing each parent that gained an entry (a new directory must survive a crash too)."""
        missing = []
        while not os.path.isdir(path):
            missing.append(path)
            path = os.path.dirname(path)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            except OSError as e:
                raise self.error(f"cannot create {os.path.relpath(d, self.root)}", e) from None
            fsync_dir(os.path.dirname(d))

    @contextlib.contextmanager
    def _updating(self, full: str) -> Iterator[None]:
        """Every update of an object holds an flock on its directory (no lock file of its own to leave behind)."""
        import fcntl

        parent = os.path.dirname(full)
        self._makedirs(parent)
        fd = os.open(parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read_tagged(self, name: str, full: str) -> tuple[bytes | None, str | None]:
        try:
            return self.read_bytes(name), None
        except FileNotFoundError:
            return None, None

    def _replace(self, name: str, full: str, new: bytes | None, version: str | None) -> bool:
        if new is None:
            self.remove(name)
        else:
            self.write_bytes(name, new)
        return True  # under the flock: nobody changed it since the read

    def remove_stale_temporaries(self, prefix: str | None, older_than: float) -> list[str]:
        base = Path(self._base(prefix))
        found = base.rglob(".*.walvault-tmp") if prefix is not None else base.glob(".*.walvault-tmp")
        removed = []
        for p in found:
            try:
                if p.is_file() and not p.is_symlink() and time.time() - p.lstat().st_mtime > older_than:
                    p.unlink()
                    removed.append(p.relative_to(self._base(None)).as_posix())
            except OSError:
                continue  # gone meanwhile
        return removed

    def remove_tree(self, prefix: str | None = None, keep: str | None = None) -> list[str]:
        locked = super().remove_tree(prefix, keep)
        full = self._base(prefix)
        for root, dirs, _files in os.walk(full, topdown=False):
            for d in dirs:
                try:
                    os.rmdir(os.path.join(root, d))
                except OSError:
                    pass
        try:
            os.rmdir(full)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTEMPTY):
                raise self.error(f"cannot remove {os.path.relpath(full, self.root)}", e) from None
        return locked


class FsspecStorage(Storage):
    """An object store (S3 through s3fs) or any other fsspec file system: each write one PUT, exclusive creates by
    If-None-Match, conditional updates by If-Match where the store has them (S3)."""

    def __init__(self, url: str, options: dict | None = None):
        import fsspec

        super().__init__(url, options)
        protocol, _path = fsspec.core.split_protocol(url)
        try:
            # No listing cache: another process's new objects must be seen by the next list or exists.
            self.fs = fsspec.filesystem(protocol, **{"use_listings_cache": False, **self.options})
            self.root = self.fs._strip_protocol(url).rstrip("/")
        except (ImportError, ValueError, TypeError) as e:
            raise RepositoryError(self.redact(f"cannot open repository {self.display}: {e}")) from None
        self.caps = Capabilities(conditional_update="if-match" if hasattr(self.fs, "call_s3") else "",
                                 atomic_rename=False, consistent_listing=False, fork_safe=False, local_paths=False)

    def _retention(self, name: str) -> dict:
        """The parameters that retain an object written now under `name`, where the repository locks it."""
        return self.lock.retention() if self.lock is not None and self.lock.applies(self.repo_name(name)) else {}

    def write(self, name: str, chunks: Iterable[bytes]) -> int:
        full = self.full(name)
        written = 0
        retention = self._retention(name)
        try:
            f = self.fs.open(full, "wb", **retention)
        except Exception as e:
            raise self._failed("cannot write", name, e) from None
        try:
            for chunk in chunks:
                try:
                    f.write(chunk)
                except Exception as e:
                    raise self._failed("cannot write", name, e) from None
                written += len(chunk)
        except BaseException as e:
            _discard(f)
            if isinstance(e, OSError):  # as locally: the chunks' other errors leave as they are
                raise self._failed("cannot write", name, e) from None
            raise
        try:
            f.close()
            if retention and getattr(f, "mpu", None):
                # a multipart upload's retention, given again on the object it made: not every store applies the
                # one given when the upload began (moto does not)
                bucket, key, _ = self.fs.split_path(full)
                self.fs.call_s3("put_object_retention", Bucket=bucket, Key=key, Retention={
                    "Mode": retention["ObjectLockMode"], "RetainUntilDate": retention["ObjectLockRetainUntilDate"]})
        except Exception as e:
            raise self._failed("cannot write", name, e) from None
        return written

    def create(self, name: str, data: bytes) -> bool:
        full = self.full(name)
        try:
            self.fs.pipe_file(full, data, mode="create", **self._retention(name))
        except FileExistsError:
            return False
        except Exception as e:
            if _precondition_failed(e):
                return False
            raise self._failed("cannot create", name, e) from None
        return True

    def lock_enabled(self) -> bool:
        if not hasattr(self.fs, "call_s3"):
            return False
        bucket = self.fs.split_path(self.root)[0]
        try:
            found = self.fs.call_s3("get_object_lock_configuration", Bucket=bucket)
        except Exception as e:
            if "ObjectLockConfigurationNotFound" in str(e) or "Object Lock configuration does not exist" in str(e):
                return False
            raise self.error("cannot read the bucket's Object Lock configuration", e) from None
        return found.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled"

    def locked_until(self, name: str) -> float | None:
        """Read from head_object (the retention API itself is not answered by every store: moto 5.2.5's fails)."""
        head = self._head(name)
        until = head.get("ObjectLockRetainUntilDate") if head is not None else None
        return until.timestamp() if until is not None else None

    def _head(self, name: str) -> dict | None:
        """An S3 object's head (its version, its lock); None when it is gone, or the store is no S3."""
        if not hasattr(self.fs, "call_s3"):
            return None
        bucket, key, _ = self.fs.split_path(self.full(name))
        try:
            return self.fs.call_s3("head_object", Bucket=bucket, Key=key)
        except FileNotFoundError:
            return None
        except Exception as e:
            raise self._failed("cannot read the Object Lock of", name, e) from None

    def remove(self, name: str) -> None:
        """A locked repository's immutable object: the version read is what is deleted. A store whose clock is
        behind this host's holds a lock this host judges ended: it refuses the delete of that version, where a plain
        delete would hide the object behind a delete marker."""
        if self.lock is None or not self.lock.applies(self.repo_name(name)) or not hasattr(self.fs, "call_s3"):
            return super().remove(name)
        head = self._head(name)
        if head is None:
            return None  # gone already
        until = head["ObjectLockRetainUntilDate"].timestamp() if head.get("ObjectLockRetainUntilDate") else None
        if until is not None and until + LOCK_SKEW > time.time():
            raise self._locked(name, until)
        full = self.full(name)
        bucket, key, _ = self.fs.split_path(full)
        try:
            self.fs.call_s3("delete_object", Bucket=bucket, Key=key, **({"VersionId": head["VersionId"]}
                                                                       if head.get("VersionId") else {}))
        except FileNotFoundError:
            return None
        except Exception as e:
            if until is not None and isinstance(e, PermissionError):  # s3fs's AccessDenied
                raise self._locked(name, until, " by the store's clock, ahead of this host's (or the store "
                                   "grants no s3:DeleteObjectVersion)") from None
            raise self._failed("cannot remove", name, e) from None
        finally:
            self.fs.invalidate_cache(full)
        return None

    def _read_tagged(self, name: str, full: str) -> tuple[bytes | None, str | None]:
        """The ETag is of exactly the bytes read: s3fs makes the read conditional on the ETag it looked up."""
        attempt = 0
        while True:
            attempt += 1
            try:
                with self.fs.open(full, "rb") as f:
                    return f.read(), getattr(f, "details", {}).get("ETag")
            except FileNotFoundError:
                return None, None
            except Exception as e:
                if not (_replaced_while_read(e) and attempt < _READ_ATTEMPTS):
                    raise self._failed("cannot read", name, e) from None

    def _replace(self, name: str, full: str, new: bytes | None, version: str | None) -> bool:
        if self.caps.conditional_update != "if-match" or version is None:
            # A store walvault knows no conditional write for: the window between the read and the write is left.
            if new is None:
                self.remove(name)
            else:
                self.write_bytes(name, new)
            return True
        bucket, key, _ = self.fs.split_path(full)
        try:
            if new is None:
                self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
            else:
                self.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=new, IfMatch=version)
        except FileNotFoundError:
            return False  # removed meanwhile
        except Exception as e:
            if _precondition_failed(e):
                return False
            raise self._failed("cannot update", name, e) from None
        finally:
            self.fs.invalidate_cache(full)
        return True


def _precondition_failed(e: BaseException) -> bool:
    """An object store refused a conditional write (HTTP 412): the object is not the one the condition named."""
    return "PreconditionFailed" in str(e) or "412" in str(e)


def _replaced_while_read(e: BaseException) -> bool:
    """s3fs's FileExpired: the object changed between its look-up and its GET (the GET asks for the ETag seen)."""
    return isinstance(e, OSError) and e.errno == errno.EBUSY


def _discard(f) -> None:
    """Drop an unfinished object write so that nothing of it appears (s3fs: abort the multipart upload)."""
    try:
        if hasattr(f, "discard"):
            f.discard()
        f.closed = True
    except Exception:  # the write failed already; its error is the one to report
        pass
