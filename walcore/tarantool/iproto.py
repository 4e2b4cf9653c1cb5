"""Tarantool's binary protocol (iproto) as an anonymous replica speaks it, without I/O (h11's style): the requests
as bytes, and a reader that is fed the bytes received and gives whole packets.

What the stream is, as measured against the Tarantool installed here, is in docs/streaming.md (from
../shared/docs/tarantool-replication.md): a 128-byte greeting; AUTH (chap-sha1); SUBSCRIBE as an anonymous
replica, answered OK with the master's vclock; then rows, each sent with sync 0 and byte for byte as in the
master's xlog, and heartbeats (type 0, no body) after `replication_timeout` of silence. The receiver keeps the
stream alive with ACKs; an ACK with an empty vclock keeps it alive without voting in a synchronous quorum.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

import msgpack

GREETING_SIZE = 128

# Request and row types (src/box/iproto_constants.h).
OK, SELECT, AUTH, SUBSCRIBE = 0, 1, 7, 66
RAFT = 30  # an election's state (2.6.1+): sent to replicas outside the log, with no LSN
INSERT, REPLACE, UPDATE, DELETE, UPSERT = 2, 3, 4, 5, 9
DML_TYPES = frozenset((INSERT, REPLACE, UPDATE, DELETE, UPSERT))
# Synchronous replication's rows, each with an LSN, body {REPLICA_ID: the queue's owner, LSN: ...}: CONFIRM commits
# the owner's transactions up to the LSN, ROLLBACK undoes those from it on; PROMOTE and DEMOTE (2.10+) move the
# queue to another owner (the old one's confirmed up to the LSN, the rest undone).
PROMOTE, DEMOTE, CONFIRM, ROLLBACK = 31, 32, 40, 41
ERROR_TYPE = 0x8000
# Header keys.
TYPE, SYNC, REPLICA_ID, LSN, TIMESTAMP, SERVER_VERSION, TSN, FLAGS = 0, 1, 2, 3, 4, 6, 8, 9
COMMIT_FLAG = 0x01
# Body keys.
SPACE_ID, INDEX_ID, LIMIT, OFFSET, ITERATOR, KEY = 0x10, 0x11, 0x12, 0x13, 0x14, 0x20
TUPLE, USER_NAME, DATA = 0x21, 0x23, 0x30
INSTANCE_UUID, REPLICASET_UUID, VCLOCK, REPLICA_ANON = 0x24, 0x25, 0x26, 0x50
ERROR_24, ERROR_STACK = 0x31, 0x52
ERROR_MESSAGE = 0x03  # in an error stack's entry

MAX_PACKET = 1 << 31  # no row is larger (a block holds at most 2 GiB)
_UINT_WIDTHS = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}  # msgpack uint 8 to 64: bytes after the first


class ProtocolError(ValueError):
    """The peer sent what iproto is not: a bad greeting, framing or msgpack."""


@dataclass(frozen=True)
class Greeting:
    version: str  # "2.6.0-0-g..."
    instance_uuid: str
    salt: bytes  # its first 20 bytes scramble the password

    @property
    def version_id(self) -> int:
        """The version as Tarantool packs it (major << 16 | minor << 8 | patch): SUBSCRIBE sends the receiver's."""
        parts = [int(p) for p in self.version.split("-")[0].split(".")[:3] if p.isdigit()]
        major, minor, patch = (parts + [0, 0, 0])[:3]
        return major << 16 | minor << 8 | patch


def parse_greeting(data: bytes) -> Greeting:
    if len(data) != GREETING_SIZE:
        raise ProtocolError(f"a greeting is {GREETING_SIZE} bytes, not {len(data)}")
    first, second = data[:64].decode("ascii", "replace"), data[64:].decode("ascii", "replace")
    words = first.split()
    if len(words) < 3 or words[0] != "Tarantool" or "(Binary)" not in words:
        raise ProtocolError(f"not a Tarantool binary port: {first.strip()!r}")
    try:
        salt = base64.b64decode(second.strip())
    except ValueError:
        raise ProtocolError("the greeting's salt is not base64") from None
    return Greeting(words[1], words[-1], salt)


def _packet(header: dict, body: dict | None) -> bytes:
    payload = msgpack.packb(header) + (msgpack.packb(body) if body is not None else b"")
    return b"\xce" + struct.pack(">I", len(payload)) + payload


def auth_request(user: str, password: str, salt: bytes, sync: int) -> bytes:
    """AUTH with chap-sha1: sha1(password) XOR sha1(salt[:20] + sha1(sha1(password)))."""
    step1 = hashlib.sha1(password.encode()).digest()
    step3 = hashlib.sha1(salt[:20] + hashlib.sha1(step1).digest()).digest()
    scramble = bytes(a ^ b for a, b in zip(step1, step3))
    return _packet({TYPE: AUTH, SYNC: sync}, {USER_NAME: user, TUPLE: ["chap-sha1", scramble]})


def subscribe_request(replicaset_uuid: str, own_uuid: str, vclock: dict[int, int], version_id: int) -> bytes:
    """SUBSCRIBE as an anonymous replica from `vclock`, with sync 0: rows then come as the master wrote them."""
    return _packet({TYPE: SUBSCRIBE, SYNC: 0}, {REPLICASET_UUID: replicaset_uuid, INSTANCE_UUID: own_uuid,
                                                VCLOCK: dict(vclock), SERVER_VERSION: version_id,
                                                REPLICA_ANON: True})


def select_request(space_id: int, key: list, sync: int, limit: int = 1) -> bytes:
    """SELECT of at most `limit` tuples equal to `key` by the primary key (every one: key [])."""
    return _packet({TYPE: SELECT, SYNC: sync}, {SPACE_ID: space_id, INDEX_ID: 0, LIMIT: limit, OFFSET: 0,
                                               ITERATOR: 0, KEY: key})


def ack_request() -> bytes:
    """An ACK with an empty vclock: keeps the relay from timing out, and never counts toward a synchronous quorum
    (before 2.10 an anonymous replica's ACK with its vclock does)."""
    return _packet({TYPE: OK}, {VCLOCK: {}})


@dataclass(slots=True)
class Packet:
    header: dict
    row: bytes  # the header and body as received: a row's bytes as the master's xlog holds them
    body_at: int  # where the body starts in `row` (== len(row): none)

    @property
    def type(self) -> int:
        return self.header.get(TYPE, -1)

    @property
    def is_error(self) -> bool:
        return self.type >= ERROR_TYPE

    def body(self):
        """The body decoded (None: there is none)."""
        if self.body_at >= len(self.row):
            return None
        return msgpack.unpackb(self.row[self.body_at:], strict_map_key=False, raw=False,
                               unicode_errors="surrogateescape")

    def space_id(self):
        """A DML row's space id, read without decoding the rest of its body where it comes first (as Tarantool
        writes it): a stream decodes it for every row."""
        row, at = self.row, self.body_at
        if len(row) > at + 2 and 0x80 <= row[at] <= 0x8F and row[at + 1] == SPACE_ID:
            first = row[at + 2]
            if first <= 0x7F:
                return first
            width = _UINT_WIDTHS.get(first)
            if width is not None and len(row) >= at + 3 + width:
                return int.from_bytes(row[at + 3:at + 3 + width], "big")
        body = self.body()
        return body.get(SPACE_ID) if isinstance(body, dict) else None

    def error(self) -> tuple[int, str]:
        """An error packet's code and message (the error stack's first entry's, else the 1.x message)."""
        body = self.body() or {}
        message = body.get(ERROR_24)
        stack = body.get(ERROR_STACK)
        if isinstance(stack, dict) and stack.get(0):
            first = stack[0][0] if isinstance(stack[0], list) and stack[0] else {}
            if isinstance(first, dict):
                message = first.get(ERROR_MESSAGE, message)
        return self.type & (ERROR_TYPE - 1), str(message)


class PacketReader:
    """Fed the bytes received, gives whole packets; keeps at most one unfinished packet."""

    def __init__(self):
        self._buffer = bytearray()
        self._at = 0

    def feed(self, data: bytes) -> None:
        if self._at:
            del self._buffer[: self._at]
            self._at = 0
        self._buffer += data

    def next_packet(self) -> Packet | None:
        """The next whole packet, or None until more bytes are fed."""
        buf, at = self._buffer, self._at
        if at >= len(buf):
            return None
        size, start = _length(buf, at)
        if size is None or start + size > len(buf):
            return None
        row = bytes(buf[start:start + size])
        self._at = start + size
        unpacker = msgpack.Unpacker(strict_map_key=False, raw=False, unicode_errors="surrogateescape")
        unpacker.feed(row)
        try:
            header = unpacker.unpack()
        except (msgpack.OutOfData, ValueError) as e:
            raise ProtocolError(f"a packet's header is not msgpack: {e}") from None
        if not isinstance(header, dict):
            raise ProtocolError("a packet's header is not a map")
        return Packet(header, row, unpacker.tell())


def _length(buf: bytearray, at: int) -> tuple[int | None, int]:
    """The packet length (a msgpack uint) at `at`, and where the packet starts; (None, at): not all here yet."""
    first = buf[at]
    if first <= 0x7F:
        return first, at + 1
    width = _UINT_WIDTHS.get(first)
    if width is None:
        raise ProtocolError(f"a packet length is not a msgpack uint (byte 0x{first:02x})")
    if at + 1 + width > len(buf):
        return None, at
    size = int.from_bytes(buf[at + 1:at + 1 + width], "big")
    if size > MAX_PACKET:
        raise ProtocolError(f"a packet of {size} bytes")
    return size, at + 1 + width
