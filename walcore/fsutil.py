"""Durable file operations: every write of walvault's is a temporary file, fsync, rename, and an
fsync of the directory. Scratch directories named after their owner's process, so that what a killed
process left is found and removed by the next one."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def random_hex(nbytes: int) -> str:
    """2 * nbytes random hex digits, for a name or a token of its own (uuid4().hex without uuid: importing it, and
    platform with it, took a twentieth of a short command's start-up)."""
    return os.urandom(nbytes).hex()


def write_atomic(path: Path, chunks: Iterable[bytes], *, mode: int = 0o666, exclusive: bool = False) -> bool:
    """Write `chunks` to `path` so that it either does not change or holds all of them: into a temporary file beside
    it (a name of its own, so that two writers of one name never share it), fsynced, renamed over `path` (or,
    `exclusive`, hard-linked to it: a link never replaces a file), then the directory fsynced. False when `exclusive`
    and `path` exists. No temporary file is left behind on an error; a killed writer's stays, named
    `.<name>.<hex8>.walvault-tmp`. `mode` (less the umask) from the moment the file exists: 0o600 for secrets."""
    tmp = path.with_name(f".{path.name}.{random_hex(4)}.walvault-tmp")
    try:
        with open(tmp, "xb", opener=lambda name, flags: os.open(name, flags, mode)) as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        if not exclusive:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
    finally:
        try:
            os.unlink(tmp)  # gone already after a rename
        except OSError:
            pass
    fsync_dir(path.parent)
    return True


def read_chunks(path: Path, offset: int = 0, size: int = 1 << 20):
    """The bytes of `path` from `offset` to its end, in chunks of bounded size."""
    with open(path, "rb") as f:
        f.seek(offset)
        while chunk := f.read(size):
            yield chunk


class Sha256:
    """SHA-256, fed on a thread of its own when `threaded` (hashlib releases the GIL), so that the thread feeding
    it goes on reading, compressing and writing: a big file's copy then runs on more than one core. Chunks must
    not be changed once given. `hexdigest()` is that of the chunks given so far (it waits for them), and more may
    follow; the with block (or `close()`) ends the thread. `hasher`: the hash object fed (a
    sha256_state.ResumableSha256), else a new hashlib one."""

    def __init__(self, threaded: bool = False, hasher=None):
        self._hash = hasher if hasher is not None else hashlib.sha256()
        self._thread = None
        self._error: BaseException | None = None
        if threaded:
            import queue
            import threading

            self._queue: queue.Queue = queue.Queue(maxsize=8)  # at most 8 chunks waiting: bounded memory
            self._thread = threading.Thread(target=self._run, name="walvault-sha256", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        # The queue is drained whatever happens, so that a feeder or a waiter never blocks on a dead thread; the
        # first error is raised by hexdigest()
        while (data := self._queue.get()) is not None:
            try:
                if self._error is None:
                    self._hash.update(data)
            except BaseException as e:
                self._error = e
            finally:
                self._queue.task_done()

    def update(self, data: bytes) -> None:
        if self._thread is None:
            self._hash.update(data)
        else:
            self._queue.put(data)

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        if self._thread is not None and self._thread.is_alive():
            self._queue.join()
        if self._error is not None:
            raise self._error
        return self._hash.hexdigest()

    def __enter__(self) -> Sha256:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def file_sha256(path: Path, start: int = 0, stop: int | None = None) -> str:
    """The SHA-256 of a file's bytes, or of those from `start` up to `stop`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = None if stop is None else stop - start
        while left is None or left > 0:
            data = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not data:
                break
            h.update(data)
            if left is not None:
                left -= len(data)
    return h.hexdigest()


def pid_alive(pid: int) -> bool:
    """Whether a process of this host still runs (a zombie, killed and not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed process stays a zombie until its parent reaps it (a killed Spark job's driver, whose JVM parent
    # died with it, waits for init): it holds nothing.
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def host_name() -> str:
    """This machine's name, as every record names the host that wrote it (a lease's holder is told local by it)."""
    return os.uname().nodename


def process_start(pid: int) -> str | None:
    """What tells a process of this host from a later one given the same pid: the boot's id and the process's
    start time (in clock ticks since boot, /proc/<pid>/stat field 22); None when it cannot be read."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat", "rb") as f:
            start = f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    return f"{boot}/{start}"


_swept: set[str] = set()  # prefixes whose orphans this process has removed already


def owned_tempdir(prefix: str) -> Path:
    """A scratch directory `<tmp>/<prefix><pid>-<random>`; `remove_orphaned_tempdirs(prefix)` removes it once its
    process is gone, whatever killed it (run here the first time a process makes one of that prefix)."""
    if prefix not in _swept:
        _swept.add(prefix)
        remove_orphaned_tempdirs(prefix)
    import tempfile  # with random and shutil's archivers: only where a scratch directory is made

    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def remove_orphaned_tempdirs(prefix: str) -> list[str]:
    import tempfile

    removed = []
    base = tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]+")
    for name in os.listdir(base):
        m = pattern.fullmatch(name)
        path = os.path.join(base, name)
        if m and not pid_alive(int(m.group(1))) and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
