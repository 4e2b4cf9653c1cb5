"""The text meta block that opens every Tarantool file (xlog.c: xlog_meta_parse)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

FILE_TYPES = {"XLOG": "xlog", "SNAP": "snap", "VYLOG": "vylog", "RUN": "run", "INDEX": "index"}
VERSIONS = ("0.13", "0.12")
# Tarantool caps the meta block at a few hundred bytes; anything longer is not a meta block.
MAX_META_SIZE = 4096

Vclock = dict[int, int]

_VCLOCK_ITEM = re.compile(r" *(\d+) *: *(\d+) *")


class MetaError(ValueError):
    """The meta block is malformed or of an unsupported version; `offset` points at the fault."""

    def __init__(self, offset: int, message: str, code: str = "bad_meta"):
        super().__init__(message)
        self.offset = offset
        self.code = code


@dataclass(slots=True)
class Meta:
    filetype: str  # XLOG, SNAP, VYLOG, RUN, INDEX
    version: str
    instance: str | None
    vclock: Vclock | None
    prev_vclock: Vclock | None
    size: int  # bytes up to and including the empty line
    extra: dict[str, str] = field(default_factory=dict)  # unknown keys, kept as they are

    @property
    def kind(self) -> str:
        return FILE_TYPES[self.filetype]


def parse_vclock(text: str) -> Vclock:
    text = text.strip(" ")
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"vclock {text!r} is not of the form {{id: lsn, ...}}")
    inner = text[1:-1].strip(" ")
    vclock: Vclock = {}
    if not inner:
        return vclock
    for item in inner.split(","):
        m = _VCLOCK_ITEM.fullmatch(item)
        if not m:
            raise ValueError(f"vclock item {item.strip()!r} is not id: lsn")
        replica, lsn = int(m.group(1)), int(m.group(2))
        if replica in vclock:
            raise ValueError(f"vclock component {replica} appears twice")
        vclock[replica] = lsn
    return vclock


def format_vclock(vclock: Vclock) -> str:
    """As Tarantool prints it: components in order, zero components left out."""
    return "{" + ", ".join(f"{r}: {lsn}" for r, lsn in sorted(vclock.items()) if lsn) + "}"


def vclock_leq(a: Vclock, b: Vclock) -> bool:
    """Whether b reaches a in every component (what covers an xlog, what a point includes)."""
    return all(v <= b.get(k, 0) for k, v in a.items() if v)


def vclock_from_json(obj) -> Vclock:
    """A vclock as JSON keeps it (component numbers as strings); {} for none."""
    return {int(k): int(v) for k, v in (obj or {}).items()}


def vclock_sum(vclock: Vclock) -> int:
    return sum(vclock.values())


def parse_meta(buf: bytes) -> Meta | None:
    """Parse the meta block at the start of `buf`; None when `buf` ends before the block does."""
    end = buf.find(b"\n\n")
    if end < 0:
        if len(buf) >= MAX_META_SIZE:
            raise MetaError(0, f"no end of meta block in the first {MAX_META_SIZE} bytes")
        return None
    size = end + 2
    try:
        text = buf[:end].decode("ascii")
    except UnicodeDecodeError as e:
        raise MetaError(e.start, "meta block is not ASCII text") from None
    lines = text.split("\n")
    if len(lines) < 2:
        raise MetaError(0, "meta block lacks the version line")
    filetype, version = lines[0], lines[1]
    if filetype not in FILE_TYPES:
        raise MetaError(0, f"unknown file type {filetype!r} (expected one of {', '.join(FILE_TYPES)})")
    if version not in VERSIONS:
        raise MetaError(len(filetype) + 1, f"unsupported format version {version!r}", "unsupported_version")
    meta = Meta(filetype, version, None, None, None, size)
    offset = len(filetype) + len(version) + 2
    for line in lines[2:]:
        key, sep, value = line.partition(":")
        if not sep:
            raise MetaError(offset, f"meta line {line!r} is not 'Key: value'")
        key, value = key.strip(" "), value.strip(" ")
        try:
            if key in ("Instance", "Server"):
                meta.instance = value
            elif key == "VClock":
                meta.vclock = parse_vclock(value)
            elif key == "PrevVClock":
                meta.prev_vclock = parse_vclock(value)
            else:
                meta.extra[key] = value
        except ValueError as e:
            raise MetaError(offset, f"meta key {key}: {e}") from None
        offset += len(line) + 1
    if meta.kind in ("xlog", "snap", "vylog") and meta.vclock is None:
        raise MetaError(0, f"{filetype} meta block has no VClock")
    return meta


def encode_meta(filetype: str, *, instance: str, vclock: Vclock | None, prev_vclock: Vclock | None,
                version: str = "0.13", server_version: str = "2.6.0-0-g47aa4e01e") -> bytes:
    lines = [filetype, version, f"Version: {server_version}", f"Instance: {instance}"]
    if vclock is not None:
        lines.append(f"VClock: {format_vclock(vclock)}")
    if prev_vclock is not None:
        lines.append(f"PrevVClock: {format_vclock(prev_vclock)}")
    return ("\n".join(lines) + "\n\n").encode("ascii")
