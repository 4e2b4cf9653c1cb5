"""A lease in the repository: one backup or expiry of a source at a time.

The lease is an object created only if absent (O_EXCL locally, a conditional PUT on an object store),
holding who took it and until when. Its holder renews it while it works; a lease past its time, or
one whose holder process is gone from this host, is stale and may be broken. Locally a stale lease is
broken under an flock, and only while it still holds what was judged stale, so that two processes cannot both
break it and then both hold it; on an object store by a delete after the same re-read.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from ..fsutil import pid_alive
from .storage import RepositoryError, Storage

DEFAULT_TTL = 60.0


class LeaseBusy(RepositoryError):
    """Another live process holds the lease."""


@dataclass
class Lease:
    storage: Storage
    name: str
    holder: str
    command: str
    ttl: float
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None
    broke: str | None = None  # what the stale lease we broke said, for the report

    def _body(self) -> bytes:
        now = time.time()
        return json.dumps({"holder": self.holder, "command": self.command, "host": socket.gethostname(),
                           "pid": os.getpid(), "taken": now, "expires": now + self.ttl}).encode()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                current = json.loads(self.storage.read_bytes(self.name))
                if current.get("holder") != self.holder:
                    return  # broken by someone who judged us dead: nothing left to renew
                self.storage.write_bytes(self.name, self._body())
            except (OSError, ValueError, RepositoryError):
                continue  # try again at the next beat; the lease holds until it expires

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        try:
            current = json.loads(self.storage.read_bytes(self.name))
        except (OSError, ValueError, RepositoryError):
            return
        if current.get("holder") == self.holder:
            self.storage.remove(self.name)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def describe(info: dict) -> str:
    left = info.get("expires", 0) - time.time()
    return (f"{info.get('command', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, "
            f"expires in {left:.0f} s)")


def stale(info: dict) -> bool:
    if info.get("expires", 0) < time.time():
        return True
    return info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int) \
        and not pid_alive(info["pid"])


def acquire(storage: Storage, name: str, command: str, *, ttl: float = DEFAULT_TTL, wait: float = 0.0) -> Lease:
    """Take the lease `name`, waiting up to `wait` seconds for a live holder; LeaseBusy when it stays held."""
    lease = Lease(storage, name, uuid.uuid4().hex, command, ttl)
    deadline = time.monotonic() + wait
    while True:
        if storage.create(name, lease._body()):
            break
        found = read(storage, name, ttl)
        if found is None:
            continue  # released meanwhile
        raw, info = found
        if stale(info):
            if _break(storage, name, raw):
                lease.broke = describe(info)
            continue
        if time.monotonic() >= deadline:
            raise LeaseBusy(f"{name} is held by {describe(info)}: another backup or expiry of this source is "
                            "running")
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
    lease._stop = threading.Event()
    lease._thread = threading.Thread(target=lease._renew_loop, name="walvault-lease", daemon=True)
    lease._thread.start()
    return lease


def read(storage: Storage, name: str, ttl: float) -> tuple[bytes, dict] | None:
    """A lease's bytes and what they say (None when it is gone); a torn or foreign one is judged by its age alone:
    live while younger than `ttl`."""
    try:
        raw = storage.read_bytes(name)
        info = json.loads(raw)
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return None
    except ValueError:
        try:
            info = {"expires": 0} if storage.age(name) > ttl else {"expires": time.time() + ttl}
        except OSError:
            return None
    return raw, info


def _break(storage: Storage, name: str, judged: bytes) -> bool:
    """Remove the lease judged stale, only if it still holds the bytes judged: a process that judged it too and
    broke it first may hold a fresh lease under the same name by now. Locally the re-read and the removal are
    one step under an flock; on an object store the window between them is what is left (no conditional
    delete here)."""
    fd = None
    if storage.local:
        import fcntl

        # The flock is on the leases' directory itself: no file of its own to leave behind.
        fd = os.open(os.path.dirname(storage.full(name)), os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        if storage.read_bytes(name) != judged:
            return False
        storage.remove(name)
        return True
    except FileNotFoundError:
        return False
    finally:
        if fd is not None:
            os.close(fd)
