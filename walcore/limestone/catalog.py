"""compaction_catalog: which rotated pwal files pwal_0000.compacted covers, up to which epoch."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

CATALOG_NAME = "compaction_catalog"
CATALOG_BACKUP = "compaction_catalog.back"
HEADER, FOOTER = b"COMPACTION_CATALOG_HEADER", b"COMPACTION_CATALOG_FOOTER"
# What `istream >> integer` takes from the start of a word.
_LEADING_INT = re.compile(rb"[+-]?\d+")


class CatalogError(ValueError):
    def __init__(self, offset: int, message: str):
        super().__init__(message)
        self.offset = offset


@dataclass(slots=True)
class Catalog:
    compacted_files: dict[str, int] = field(default_factory=dict)  # name -> version
    detached_pwals: list[str] = field(default_factory=list)
    max_epoch_id: int = 0
    max_blob_id: int = 0
    generation: int = 0  # GENERATION and CARRY_FILE: written by the newest limestone only
    carry_file: str | None = None


def parse_catalog(text: bytes) -> Catalog:
    """Parse the text catalog as limestone's `load_catalog_file` does; raises CatalogError (with the byte
    offset of the bad line).

    The header and footer are whole lines; each line between is split on whitespace, blank ones are
    skipped and words past those a key needs are ignored; MAX_EPOCH_ID is required; what follows the
    footer is never read.
    """
    catalog = Catalog()
    lines = text.split(b"\n")
    if lines[0] != HEADER:
        raise CatalogError(0, f"the catalog does not start with {HEADER.decode()}")
    offset = len(lines[0]) + 1
    max_epoch_found = False
    for raw in lines[1:]:
        if raw == FOOTER:
            if not max_epoch_found:
                raise CatalogError(offset, "the catalog has no MAX_EPOCH_ID line, which limestone requires")
            return catalog
        words = raw.split()
        if words:
            key, args = words[0], words[1:]
            try:
                if key == b"COMPACTED_FILE":
                    catalog.compacted_files[os.fsdecode(args[0])] = _int(args[1], signed=True)
                elif key == b"DETACHED_PWAL":
                    catalog.detached_pwals.append(os.fsdecode(args[0]))
                elif key == b"MAX_EPOCH_ID":
                    catalog.max_epoch_id = _int(args[0])
                    max_epoch_found = True
                elif key == b"MAX_BLOB_ID":
                    catalog.max_blob_id = _int(args[0])
                elif key == b"GENERATION":
                    catalog.generation = _int(args[0])
                elif key == b"CARRY_FILE":
                    catalog.carry_file = os.fsdecode(args[0])
                else:
                    raise ValueError
            except (ValueError, IndexError):
                raise CatalogError(offset, f"catalog line {raw[:80]!r} is not one limestone reads") from None
        offset += len(raw) + 1
    raise CatalogError(len(text), f"the catalog does not end with {FOOTER.decode()}: it was cut short")


def _int(word: bytes, signed: bool = False) -> int:
    """A 64-bit unsigned (or 32-bit signed) integer as `istream >>` reads one: a value that does not fit
    fails the read."""
    m = _LEADING_INT.match(word)
    if m is None:
        raise ValueError
    value = int(m[0])
    if not (-(1 << 31) <= value < (1 << 31) if signed else abs(value) < (1 << 64)):
        raise ValueError
    return value
