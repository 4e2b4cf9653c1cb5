"""Following a live limestone directory: how far each pwal file is durable, read without writing a byte.

limestone writes a session as a snippet (header, entries, from v6 an end marker) into its channel's pwal file, and
records a durable epoch D in `epoch` only once every session of an epoch at or below D is written and flushed. So a
pwal file read after D was read holds each durable snippet whole: its durable prefix ends at the first snippet
header past D, or where the file ends on an entry boundary (an entry cut by the end is one being written now: a
session started after D was durable, so of a later epoch). `durable_prefix` walks the entries past where the last
walk stopped (sans I/O: it is given them); `read_durable_epoch` reads D from the epoch files.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .epoch import scan_epoch
from .layout import kind_of
from .pwal import CANCELED_HEADER, DURABLE_EPOCH, ENTRY_NAMES, HEADERS, Broken, Entry


@dataclass(frozen=True)
class Prefix:
    """How far a pwal file is durable, from where a walk started."""

    end: int  # an entry boundary: the bytes before it are durable
    epoch: int | None  # the epoch of the snippet the prefix ends in: where the next walk goes on
    epochs: tuple[int, int] | None  # the lowest and highest snippet epoch of the bytes walked (None: none)
    problem: str | None = None  # an entry that cannot be read inside a durable snippet: the prefix stops before it
    canceled: bool = False  # the snippet the prefix ends in has a canceled header


def durable_prefix(entries: Iterable[Entry | Broken], start: int, epoch: int | None, durable: int, *,
                   canceled: bool = False, detached: bool = False) -> Prefix:
    """The durable prefix of a pwal file whose entries from `start` on are `entries` (pwal.iter_entries); `epoch`:
    the snippet `start` is inside (None at the file's start), `canceled`: whether its header is a canceled one,
    `durable`: the directory's durable epoch; `detached`: the file is a rotated one (limestone writes no more into
    it)."""
    end, low, high = start, None, None
    for e in entries:
        if isinstance(e, Broken):
            if e.code == "short_entry" and (e.type in HEADERS or epoch is None or epoch > durable):
                break  # a session being written now
            if canceled and detached:
                break  # the broken tail of a canceled snippet `tglogutil repair` left: limestone never reads it
            return Prefix(end, epoch, _span(low, high), f"at offset {e.offset}: {e.message}", canceled)
        if e.type in HEADERS:
            if e.epoch > durable:
                break
            epoch, canceled = e.epoch, e.type == CANCELED_HEADER
        elif e.type == DURABLE_EPOCH or epoch is None:
            return Prefix(end, epoch, _span(low, high), f"at offset {e.offset}: a {ENTRY_NAMES[e.type]} entry "
                          + ("outside any snippet" if epoch is None else "in a pwal file"), canceled)
        end = e.offset + e.size
        low, high = min(epoch, low if low is not None else epoch), max(epoch, high or 0)
    return Prefix(end, epoch, _span(low, high), canceled=canceled)


def _span(low: int | None, high: int | None) -> tuple[int, int] | None:
    return None if low is None else (low, high)


def read_durable_epoch(root: Path) -> int | None:
    """The directory's durable epoch: the highest record of `epoch` and of the rotated epoch files (while limestone
    rotates, `epoch` is missing a moment). Each file is opened read-only; a record cut short is not counted."""
    found = []
    for name in os.listdir(root):
        if kind_of(name) in ("epoch", "epoch_rotated"):
            try:
                with open(root / name, "rb") as f:
                    epoch = scan_epoch(f.read()).durable_epoch
            except (FileNotFoundError, IsADirectoryError):
                continue  # renamed away meanwhile: its records are in the file it became
            if epoch is not None:
                found.append(epoch)
    return max(found, default=None)


def channel_of(name: str) -> str:
    """The channel of a pwal file's name: `pwal_NNNN` of `pwal_NNNN` and of `pwal_NNNN.<ms14>.<n>`."""
    return name.split(".")[0]


def piece_findings(entries: Iterable[Entry | Broken]) -> list[dict]:
    """What is wrong with a stream's piece (pwal.iter_entries of its bytes): it must start at a snippet header and
    hold whole entries only."""
    for e in entries:
        if isinstance(e, Broken):
            return [{"code": e.code, "offset": e.offset, "message": e.message}]
        if e.offset == 0 and e.type not in HEADERS:
            return [{"code": "no_snippet_header", "offset": 0, "message": f"a piece starts with a "
                     f"{ENTRY_NAMES[e.type]} entry, not a snippet header"}]
    return []
