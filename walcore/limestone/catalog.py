"""compaction_catalog: which rotated pwal files pwal_0000.compacted covers, up to which epoch."""

from __future__ import annotations

from dataclasses import dataclass, field

CATALOG_NAME = "compaction_catalog"
CATALOG_BACKUP = "compaction_catalog.back"
HEADER, FOOTER = "COMPACTION_CATALOG_HEADER", "COMPACTION_CATALOG_FOOTER"


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


def parse_catalog(text: bytes) -> Catalog:
    """Parse the text catalog; raises CatalogError (with the byte offset of the bad line)."""
    catalog = Catalog()
    offset = 0
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if not lines or lines[0] != HEADER.encode():
        raise CatalogError(0, f"the catalog does not start with {HEADER}")
    if lines[-1] != FOOTER.encode():
        raise CatalogError(len(text), f"the catalog does not end with {FOOTER}: it was cut short")
    offset = len(lines[0]) + 1
    for raw in lines[1:-1]:
        parts = raw.decode("ascii", "replace").split(" ")
        try:
            if parts[0] == "COMPACTED_FILE" and len(parts) == 3:
                catalog.compacted_files[parts[1]] = int(parts[2])
            elif parts[0] == "DETACHED_PWAL" and len(parts) == 2:
                catalog.detached_pwals.append(parts[1])
            elif parts[0] == "MAX_EPOCH_ID" and len(parts) == 2:
                catalog.max_epoch_id = int(parts[1])
            elif parts[0] == "MAX_BLOB_ID" and len(parts) == 2:
                catalog.max_blob_id = int(parts[1])
            else:
                raise ValueError
        except ValueError:
            raise CatalogError(offset, f"catalog line {raw[:80]!r} is not one limestone writes") from None
        offset += len(raw) + 1
    return catalog
