"""limestone-manifest.json: the format versions of a limestone directory."""

from __future__ import annotations

import json
from dataclasses import dataclass

MANIFEST_NAME = "limestone-manifest.json"
# Persistent format versions this reader knows (limestone's datastore_format.cpp).
SUPPORTED_VERSIONS = range(1, 8)
FORMAT_VERSIONS = ("1.0", "1.1")


class ManifestError(ValueError):
    """The directory cannot be checked: no manifest, or one of an unknown version."""


@dataclass(frozen=True, slots=True)
class Manifest:
    format_version: str
    persistent_format_version: int
    instance_uuid: str | None


def parse_manifest(data: bytes | None) -> Manifest:
    """Parse the manifest's bytes; None (no file) is version 0, which current limestone rejects."""
    if data is None:
        raise ManifestError(f"no {MANIFEST_NAME}: persistent format version 0, which limestone no longer reads")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError) as e:  # bad UTF-8 or JSON, an integer too long, nesting too deep
        raise ManifestError(f"{MANIFEST_NAME} is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{MANIFEST_NAME} is not a JSON object")
    fmt = obj.get("format_version")
    version = obj.get("persistent_format_version")
    if fmt not in FORMAT_VERSIONS:
        raise ManifestError(f"{MANIFEST_NAME}: unknown format_version {fmt!r} (known: {', '.join(FORMAT_VERSIONS)})")
    if type(version) is not int or version not in SUPPORTED_VERSIONS:
        raise ManifestError(f"{MANIFEST_NAME}: unsupported persistent_format_version {version!r} "
                            f"(known: {SUPPORTED_VERSIONS.start}-{SUPPORTED_VERSIONS.stop - 1})")
    uuid = obj.get("instance_uuid")
    if not isinstance(uuid, str):
        if fmt == "1.0":  # the version-1 manifest has none
            return Manifest(fmt, version, None)
        raise ManifestError(f"{MANIFEST_NAME}: format_version {fmt} without a string instance_uuid "
                            f"(limestone reports such a manifest as corrupted)")
    return Manifest(fmt, version, uuid)
