"""A lease in the repository: one backup or expiry of a source (or one archive of it) at a time, with a fencing
token.

The lease is an object created only if absent (an exclusive create: a hard link locally, a PUT with If-None-Match
on an object store), holding who took it — a `holder` token unique to this acquisition, and a `generation` one past
the lease it replaced — and until when. Its holder renews it while it works, and proves it still holds it
(`confirm`) right before each commit point: a manifest, an archive record, a deletion. Every change of a lease
once it exists (a renewal, a break, a release) is conditional on what was read (`Storage.update`: under an flock
locally, If-Match on an object store), so a breaker's new lease is never overwritten by the holder it replaced,
and two breakers cannot both hold it.

A lease is stale, and may be broken, when its holder runs on this host and that process is gone (its pid names no
process, or a later one: the process's start time is recorded), or when it is another host's and has expired. A
live process on this host is never judged by age: a paused one (SIGSTOP, a frozen VM) wakes up still holding it.
A lease that does not read as one (junk JSON, an absurd `expires`, no holder) stops with a message naming it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from ..fsutil import host_name, pid_alive, process_start, random_hex
from .storage import RepositoryError, Storage

DEFAULT_TTL = 60.0
# An `expires` outside this range is not a lease's: the newest is a TTL ahead of a clock at most a day fast.
_EARLIEST = 946684800.0  # 2000-01-01
MAX_AHEAD = 86400.0


class LeaseBusy(RepositoryError):
    """Another live process holds the lease."""


class LeaseLost(RepositoryError):
    """The lease this process held was broken (or removed) by another: what it was about to commit is not
    committed."""


class LeaseUnreadable(RepositoryError):
    """A lease object that does not read as one: nobody can tell whether its holder still works."""


@dataclass
class Lease:
    storage: Storage
    key: str  # its name in `storage`
    holder: str
    command: str
    ttl: float
    generation: int = 1
    broke: str | None = None  # what the stale lease we broke said, for the report
    lost: str | None = None  # why the renewal found the lease no longer ours
    _stop: threading.Event | None = None
    _thread: threading.Thread | None = None
    _renewing: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        """Its name from the repository root: what messages and fences say."""
        return self.storage.repo_name(self.key)

    def body(self) -> bytes:
        now = time.time()
        pid = os.getpid()
        return json.dumps({"holder": self.holder, "generation": self.generation, "command": self.command,
                           "host": host_name(), "pid": pid, "pid_start": process_start(pid), "taken": now,
                           "expires": now + self.ttl}).encode()

    def _ours(self, current: bytes | None) -> bool:
        try:
            return current is not None and json.loads(current).get("holder") == self.holder
        except (ValueError, AttributeError):
            return False

    def renew(self) -> None:
        """Extend the lease, only if it is still ours; LeaseLost when it is not."""
        with self._renewing:  # one renewal at a time: the renew thread's and a confirm's
            if self.lost is None and not self.storage.update(
                    self.key, lambda current: self.body() if self._ours(current) else False):
                self.lost = "another process broke it (it judged this one dead) or removed it"
        if self.lost is not None:
            raise self._lost_error()

    def confirm(self) -> None:
        """Prove the lease is still ours right before a commit point; LeaseLost when it is not. One whose expiry is
        near (the process was paused, the renewals stalled) is renewed first, conditionally, so that the commit
        following has a TTL before any other host may judge it stale."""
        if self.lost is not None:
            raise self._lost_error()
        try:
            current = self.storage.read_bytes(self.key)
        except FileNotFoundError:
            current = None
        if not self._ours(current):
            self.lost = "another process broke it (it judged this one dead) or removed it"
            raise self._lost_error()
        if json.loads(current).get("expires", 0) - time.time() < self.ttl / 2:
            self.renew()

    def _lost_error(self) -> LeaseLost:
        return LeaseLost(f"lease {self.name} was lost: {self.lost}; nothing more of this {self.command} is committed")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.renew()
            except LeaseLost:
                return  # nothing left to renew; the next confirm raises
            except (OSError, RepositoryError):
                continue  # try again at the next beat; the lease holds until it expires

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()
        try:
            self.storage.update(self.key, lambda current: None if self._ours(current) else False)
        except (OSError, RepositoryError):
            pass  # left to expire; its holder's process is gone once this one ends

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def describe(info: dict) -> str:
    left = info.get("expires", 0) - time.time()
    when = f"expires in {left:.0f} s" if left >= 0 else f"expired {-left:.0f} s ago, its process still runs"
    return f"{info.get('command', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')}, {when})"


def stale(info: dict) -> bool:
    """A holder on this host is judged by its process alone, whatever the lease's age; another host's by its
    expiry. A live pid whose start time the lease does not hold (no /proc where it was taken, an older walvault's
    lease) is judged by expiry too: that pid alone may be a later process's."""
    if info.get("host") == host_name() and isinstance(info.get("pid"), int):
        pid = info["pid"]
        if not pid_alive(pid):
            return True
        recorded = info.get("pid_start")
        if recorded is not None:
            return process_start(pid) not in (None, recorded)  # a later process, same pid
    return info["expires"] < time.time()


def acquire(storage: Storage, name: str, command: str, *, ttl: float | None = None, wait: float = 0.0) -> Lease:
    """Take the lease `name` of `storage`, waiting up to `wait` seconds for a live holder; LeaseBusy when it stays held,
    LeaseUnreadable when what holds the name is not a lease."""
    lease = Lease(storage, name, random_hex(16), command, DEFAULT_TTL if ttl is None else ttl)
    deadline = time.monotonic() + wait
    while True:
        lease.generation = 1
        if storage.create(name, lease.body()):
            break
        found = read(storage, name, lease.ttl)
        if found is None:
            continue  # released meanwhile
        raw, info = found
        if stale(info):
            # Replaced by our own lease in one conditional step, only while it still holds the bytes judged: a
            # process that judged it too may hold a fresh lease under the same name by now.
            lease.generation = info.get("generation", 0) + 1
            if storage.update(name, lambda current: lease.body() if current == raw else False):
                lease.broke = describe(info)
                break
            continue
        if time.monotonic() >= deadline:
            raise LeaseBusy(f"{lease.name} is held by {describe(info)}: another {_kind(name)} of this source is "
                            "running")
        time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
    lease._stop = threading.Event()
    lease._thread = threading.Thread(target=lease._renew_loop, name="walvault-lease", daemon=True)
    lease._thread.start()
    return lease


def _kind(name: str) -> str:
    if name.endswith(".archive.lease"):
        return "archive or expiry"
    if name.endswith(".stream.lease"):
        return "stream"
    return "restore" if ".restore-" in name else "backup or expiry"


def read(storage: Storage, name: str, ttl: float) -> tuple[bytes, dict] | None:
    """A lease's bytes and what they say (None when it is gone). An empty one is a create seen before its write (an
    older walvault wrote leases in two steps): live while younger than `ttl`. Anything else that is not a lease is
    LeaseUnreadable."""
    try:
        raw = storage.read_bytes(name)
    except FileNotFoundError:
        return None
    if not raw:
        try:
            age = storage.age(name)
        except OSError:
            return None
        return raw, {"expires": 0.0 if age > ttl else time.time() + ttl}
    try:
        return raw, parse(raw)
    except ValueError as e:
        shown = storage.repo_name(name)
        raise LeaseUnreadable(f"the lease {shown} in repository {storage.display} cannot be read ({e}): remove "
                              f"{shown} once you know no walvault process of this source runs") from None


def parse(raw: bytes) -> dict:
    """What a lease says; ValueError naming what makes it none."""
    try:
        info = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(info, dict):
        raise ValueError("not a JSON object")
    if not isinstance(info.get("holder"), str) or not info["holder"]:
        raise ValueError("no holder")
    expires = info.get("expires")
    if isinstance(expires, bool) or not isinstance(expires, (int, float)):
        raise ValueError(f"expires {expires!r} is not a time")
    if not _EARLIEST <= expires <= time.time() + MAX_AHEAD:
        raise ValueError(f"expires {expires!r} is not a time a lease holds")
    generation = info.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or not 0 <= generation < 2**53:
        raise ValueError(f"generation {generation!r} is not a count")
    pid = info.get("pid")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0):
        raise ValueError(f"pid {pid!r} is not a process id")
    for key in ("host", "command", "pid_start"):
        if info.get(key) is not None and not isinstance(info[key], str):
            raise ValueError(f"{key} {info[key]!r} is not text")
    return info


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a lease holds")
