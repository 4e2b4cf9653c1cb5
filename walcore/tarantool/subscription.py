"""An anonymous replica's connection to a running Tarantool: connect, authenticate, subscribe from a vclock, then
packets as they come (iproto.py says the bytes; this module only moves them over a socket).

The user needs only the replication role (read on universe): the replicaset UUID that SUBSCRIBE must name (from
2.8.4 a missing or wrong one is refused) is read from `_schema` with a SELECT, not an eval.
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from dataclasses import dataclass

from . import iproto
from .live import LiveError, parse_uri, redact_uri
from .meta import Vclock, parse_vclock
from .receiver import SPACE_SPACE

SCHEMA_SPACE = 272  # _schema: {key, value...}; 'cluster' (later 'replicaset_uuid') holds the replicaset UUID


class XlogGap(LiveError):
    """The master no longer has the xlogs the subscription needs (XlogGapError); `resume` is where its log goes on
    (the vclock its message names after the gap)."""

    def __init__(self, message: str, resume: Vclock):
        super().__init__(message)
        self.resume = resume


XLOG_GAP = 32  # ER_XLOG_GAP: "Missing .xlog file between LSN <n> {vclock} and <n> {vclock}"
_GAP_END = re.compile(r"and \d+ (\{[0-9:, ]*\})")


@dataclass(frozen=True)
class Subscribed:
    instance_uuid: str  # the master's
    replicaset_uuid: str
    master_id: int  # its replica id
    master_vclock: Vclock  # what it had written when it answered
    spaces: list  # its _space tuples just before: which spaces are is_sync (Receiver.know_spaces)


class Subscription:
    """One connection; `close()` (or the context) ends it. Every error is a LiveError naming the URI redacted."""

    def __init__(self, uri: str, password: str | None, *, timeout: float = 10.0):
        self.uri = uri
        self.display = redact_uri(uri)
        host, port, self.user, uri_password = parse_uri(uri)
        self.password = password if password is not None else uri_password
        self.reader = iproto.PacketReader()
        self.greeting: iproto.Greeting | None = None
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise LiveError(f"{self.display}: cannot connect: {e.strerror or e}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sync = 0
        self._error: LiveError | None = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError as e:
            raise LiveError(f"{self.display}: connection lost: {e.strerror or e}") from None

    def _recv_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self._recv_some(n - len(data))
            if chunk is None:
                raise LiveError(f"{self.display}: no answer in {self.sock.gettimeout():g} s")
            data += chunk
        return data

    def _recv_some(self, n: int = 1 << 20) -> bytes | None:
        """Bytes received (None: none before the socket's timeout); LiveError when the peer closed."""
        try:
            chunk = self.sock.recv(n)
        except TimeoutError:
            return None
        except OSError as e:
            raise LiveError(f"{self.display}: connection lost: {e.strerror or e}") from None
        if not chunk:
            raise LiveError(f"{self.display}: the instance closed the connection")
        return chunk

    def _reply(self) -> iproto.Packet:
        """The next packet, waiting up to the socket's timeout; an error packet becomes a LiveError."""
        deadline = time.monotonic() + (self.sock.gettimeout() or 10.0)
        while (packet := self.reader.next_packet()) is None:
            if time.monotonic() > deadline:
                raise LiveError(f"{self.display}: no answer in {self.sock.gettimeout():g} s")
            chunk = self._recv_some()
            if chunk is not None:
                self.reader.feed(chunk)
        if packet.is_error:
            code, message = packet.error()
            raise LiveError(f"{self.display}: refused (error {code}): {message}")
        return packet

    def _request(self, data: bytes) -> iproto.Packet:
        self._send(data)
        return self._reply()

    def hello(self) -> iproto.Greeting:
        """The greeting (it names the instance), then AUTH when a user is named."""
        try:
            self.greeting = iproto.parse_greeting(self._recv_exactly(iproto.GREETING_SIZE))
        except iproto.ProtocolError as e:
            raise LiveError(f"{self.display}: {e}") from None
        if self.user is not None:
            self._sync += 1
            self._request(iproto.auth_request(self.user, self.password or "", self.greeting.salt, self._sync))
        return self.greeting

    def subscribe(self, vclock: Vclock) -> Subscribed:
        """After `hello`: the replicaset UUID and the spaces, then SUBSCRIBE from `vclock` as an anonymous replica
        under a fresh UUID (a dropped connection's old relay may still hold the previous one)."""
        replicaset = self._replicaset_uuid()
        self._sync += 1
        every_space = iproto.select_request(SPACE_SPACE, [], self._sync, limit=1 << 31)
        spaces = (self._request(every_space).body() or {}).get(iproto.DATA) or []
        self._send(iproto.subscribe_request(replicaset, str(uuid.uuid4()), vclock, self.greeting.version_id))
        ok = self._reply()
        body = ok.body() or {}
        master_vclock = {int(k): int(v) for k, v in (body.get(iproto.VCLOCK) or {}).items()}
        return Subscribed(self.greeting.instance_uuid, replicaset, ok.header.get(iproto.REPLICA_ID, 0),
                          master_vclock, spaces)

    def _replicaset_uuid(self) -> str:
        for key in ("cluster", "replicaset_uuid"):
            self._sync += 1
            reply = self._request(iproto.select_request(SCHEMA_SPACE, [key], self._sync))
            found = (reply.body() or {}).get(iproto.DATA) or []
            if found and len(found[0]) > 1 and isinstance(found[0][1], str):
                return found[0][1]
        raise LiveError(f"{self.display}: the instance's _schema names no replicaset UUID")

    def packets(self, wait: float) -> list[iproto.Packet]:
        """The packets that arrived, waiting at most `wait` seconds for the first; [] when none came. An error
        packet (a gap the master cannot fill, a timeout) becomes a LiveError once the packets before it are
        returned."""
        if self._error is not None:
            raise self._error
        out = self._take()
        if not out:
            self.sock.settimeout(max(wait, 0.001))
            chunk = self._recv_some()
            if chunk is None:
                return []
            self.reader.feed(chunk)
            out = self._take()
        for i, packet in enumerate(out):
            if packet.is_error:
                code, message = packet.error()
                said = f"{self.display}: the stream ended (error {code}): {message}"
                found = _GAP_END.search(message) if code == XLOG_GAP else None
                self._error = XlogGap(said, parse_vclock(found[1])) if found else LiveError(said)
                if i == 0:
                    raise self._error
                return out[:i]
        return out

    def _take(self) -> list[iproto.Packet]:
        out = []
        while (packet := self.reader.next_packet()) is not None:
            out.append(packet)
        return out

    def ack(self) -> None:
        self._send(iproto.ack_request())
