"""The repository's ledger for Tarantool files: a verdict on a sealed file's bytes, kept by their SHA-256, holds
wherever those bytes are (verify, verify --repo and backup read it back instead of scanning again)."""

from __future__ import annotations

from pathlib import Path

from ..repository import Repository
from .backup_set import verdict_from_record, verdict_record
from .check import TarantoolFile, name_findings


def recorded_verdict(repo: Repository, instance: str, sha256: str, size: int, path: str) -> TarantoolFile | None:
    """The verdict the ledger holds for these bytes, standing for a scan of the file at `path` — None unless it is
    on record and the file's name agrees with it (a renamed copy is scanned: its name is checked against its meta
    block)."""
    record = repo.ledger_verdict("tarantool", instance, sha256, size)
    if record is None:
        return None
    verdict = verdict_from_record(path, record)
    return None if name_findings(Path(path), verdict.kind, verdict.vclock) else verdict


def record_verdict(repo: Repository, instance: str, sha256: str, verdict: TarantoolFile) -> None:
    """Keep a scan's verdict on these bytes in the ledger."""
    repo.ledger_put("tarantool", instance, sha256, verdict_record(verdict))
