"""Talk to a running Tarantool over iproto: pin a checkpoint with box.backup.start() while its files are copied.

A running instance deletes old checkpoints (checkpoint_count) and compacts vinyl runs on its own, so the
files of a checkpoint can vanish mid-copy. box.backup.start() pins the newest checkpoint and names its files
(the .snap, and for vinyl the .vylog and every .run/.index it needs) until box.backup.stop(). The pin is
global to the instance, not tied to the connection, so `backup_session` stops it whatever happens in the
body. The PyPI `tarantool` connector is imported only here, when a live instance is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .layout import kind_of, name_number
from .meta import Vclock

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")

# One round trip, so that the vclock and the directories describe the instance as the pin was taken. The pin
# is undone here if reading the state fails, because the client would not know whether to stop it.
_START = """
local files = box.backup.start()
local ok, state = pcall(function()
    local checkpoints = {}
    for _, c in ipairs(box.info.gc().checkpoints) do
        table.insert(checkpoints, {signature = c.signature, vclock = c.vclock})
    end
    return {vclock = box.info.vclock, uuid = box.info.uuid, cwd = require('fio').cwd(),
            memtx_dir = box.cfg.memtx_dir, wal_dir = box.cfg.wal_dir, vinyl_dir = box.cfg.vinyl_dir,
            checkpoints = checkpoints}
end)
if not ok then
    box.backup.stop()
    error(state)
end
return files, state
"""


class LiveError(RuntimeError):
    """A live instance could not be reached or refused a call; the message carries the URI redacted."""


@dataclass
class Checkpoint:
    """The checkpoint box.backup.start() pinned, and where the instance keeps its files."""

    files: list[Path]  # absolute: the .snap, and for vinyl the .vylog and .run/.index files
    vclock: Vclock  # box.info.vclock as the pin was taken: the xlogs must reach at least this far
    snapshot_vclock: Vclock | None  # the vclock of the .snap among `files`
    instance_uuid: str
    dirs: dict[str, Path]  # absolute memtx_dir, wal_dir, vinyl_dir, work_dir


def _parts(uri: str) -> tuple[str, str | None, str | None, str]:
    """(the scheme with its :// or "", the user (None: no @), the password (None: none), host:port). The scheme is
    taken off first: in `tarantool://user@host:port` the colon after it does not start a password. The user ends
    at the last @ (a user name may hold one), the password starts at the user's first colon."""
    scheme = _SCHEME.match(uri)
    head = uri[:scheme.end()] if scheme else ""
    userinfo, at, hostport = uri[len(head):].rpartition("@")
    if not at:
        return head, None, None, hostport
    user, colon, password = userinfo.partition(":")
    return head, user, (password if colon else None), hostport


def redact_uri(uri: str) -> str:
    """The URI with its password replaced by ***, fit for messages and logs."""
    head, user, password, hostport = _parts(uri)
    return uri if password is None else f"{head}{user}:***@{hostport}"


def split_password(uri: str) -> tuple[str, str | None]:
    """(the URI without its password, the password or None)."""
    head, user, password, hostport = _parts(uri)
    return (uri, None) if password is None else (f"{head}{user}@{hostport}", password)


def with_password(uri: str, password: str) -> str:
    """The URI of [tarantool://]user@host:port with the password added, to be kept in memory only (never in a
    command line: /proc/PID/cmdline is readable by every local user)."""
    head, user, present, hostport = _parts(uri)
    if user is None or present is not None:
        raise LiveError(f"{redact_uri(uri)}: a password is added only to a URI naming a user and no password")
    return f"{head}{user}:{password}@{hostport}"


def parse_uri(uri: str) -> tuple[str, int, str | None, str | None]:
    """(host, port, user, password) from [tarantool://][user[:password]@]host:port."""
    scheme = _SCHEME.match(uri)
    _head, user, password, hostport = _parts(uri)
    host, _, port = hostport.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:3301
    if (scheme and scheme[1].lower() != "tarantool") or not host or not port.isdigit() or user == "":
        raise LiveError(f"{redact_uri(uri)}: not a Tarantool URI ([tarantool://][user[:password]@]host:port)")
    return host, int(port), user, password


def _reason(exc: BaseException) -> str:
    """The innermost error's message: the connector wraps errors in errors and shows (code, message) tuples."""
    while inner := exc.__cause__ or next((a for a in exc.args if isinstance(a, BaseException)), None):
        exc = inner
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(getattr(exc, "message", "") or exc or type(exc).__name__)


def _connect(uri: str, timeout: float):
    host, port, user, password = parse_uri(uri)
    try:
        import tarantool
    except ImportError:
        raise LiveError("talking to a running Tarantool needs the `tarantool` package (pip install tarantool)"
                        ) from None
    try:
        # No schema fetch: a backup user needs only 'execute', not read access to the system spaces.
        # reconnect_max_attempts=0: after a dropped connection a call reconnects once (the pin is global, so
        # box.backup.stop() still works on a new session) instead of retrying ten times.
        return tarantool.Connection(host, port, user=user, password=password, connection_timeout=timeout,
                                    socket_timeout=timeout, reconnect_max_attempts=0, fetch_schema=False)
    except (tarantool.Error, OSError) as e:
        raise LiveError(f"{redact_uri(uri)}: cannot connect: {_reason(e)}") from None


def _eval(conn, uri: str, code: str, what: str) -> list:
    """Run Lua `code`; a failure becomes a LiveError naming `what` (a lost connection says so)."""
    import tarantool

    try:
        return conn.eval(code).data
    except tarantool.NetworkError as e:
        raise LiveError(f"{redact_uri(uri)}: {what}: connection lost: {_reason(e)}") from None
    except (tarantool.Error, OSError) as e:
        raise LiveError(f"{redact_uri(uri)}: {what} failed: {_reason(e)}") from None


def _vclock(value) -> Vclock:
    """{id: lsn} from a Lua vclock table, which msgpack sends as a map, or as an array when its keys are 1..n."""
    if isinstance(value, list):
        return {i: int(lsn) for i, lsn in enumerate(value, start=1) if lsn is not None}
    return {int(k): int(v) for k, v in value.items()}


def _checkpoint(files: list, state: dict) -> Checkpoint:
    """Paths come relative to the instance's current directory, which box.cfg made its work_dir."""
    work_dir = Path(state["cwd"])
    paths = [work_dir / f for f in files]
    snaps = [p for p in paths if kind_of(p) == ("snap", False)]
    vclocks = {c["signature"]: _vclock(c["vclock"]) for c in state["checkpoints"]}
    return Checkpoint(
        files=paths,
        vclock=_vclock(state["vclock"]),
        snapshot_vclock=vclocks.get(name_number(snaps[0])) if snaps else None,
        instance_uuid=state["uuid"],
        dirs={"memtx_dir": work_dir / state["memtx_dir"], "wal_dir": work_dir / state["wal_dir"],
              "vinyl_dir": work_dir / state["vinyl_dir"], "work_dir": work_dir},
    )


@contextmanager
def backup_session(uri: str, *, timeout: float = 30.0) -> Iterator[Checkpoint]:
    """Pin the newest checkpoint of the instance at `uri` for the body; box.backup.stop() on any exit.

    `uri` is [tarantool://][user[:password]@]host:port; the user needs 'execute' on 'universe'. `timeout`
    bounds the connection and each call. Raises LiveError when the instance cannot be reached, a backup is
    already in progress there, or stopping fails (its files then stay pinned until someone stops it).
    """
    conn = _connect(uri, timeout)
    try:
        try:
            files, state = _eval(conn, uri, _START, "box.backup.start()")
        except LiveError as e:
            if "already in progress" in str(e):
                raise LiveError(f"{redact_uri(uri)}: a backup is already in progress on this instance "
                                "(another client's, or one never stopped: box.backup.stop() there ends it)"
                                ) from None
            if "connection lost" in str(e):
                raise LiveError(f"{e}; the instance may have pinned its checkpoint all the same: see "
                                "box.info.gc() there, and box.backup.stop() if no backup is running") from None
            raise
        try:
            yield _checkpoint(files, state)
        finally:
            _eval(conn, uri, "box.backup.stop()", "box.backup.stop()")
    finally:
        conn.close()


def current_vclock(uri: str, *, timeout: float = 30.0) -> Vclock:
    """box.info.vclock of the instance at `uri` now."""
    conn = _connect(uri, timeout)
    try:
        return _vclock(_eval(conn, uri, "return box.info.vclock", "box.info.vclock")[0])
    finally:
        conn.close()


def take_snapshot(uri: str, *, timeout: float = 600.0) -> None:
    """box.snapshot() on the instance at `uri`: a new checkpoint of everything written so far."""
    conn = _connect(uri, timeout)
    try:
        _eval(conn, uri, "box.snapshot()", "box.snapshot()")
    finally:
        conn.close()
