"""`verify --repo`: re-hash every stored object, check every manifest and chain, report what is missing or
damaged (as pgBackRest's verify). Nothing is written."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..repository import ObjectDamaged, Repository, RepositoryError
from ..repository.manifest import FileEntry
from .archive import RECORD_SUFFIX, _load_record
from .backup import Progress


@dataclass
class RepoReport:
    backups: list[dict] = field(default_factory=list)  # {"id", "family", "instance", "status", "findings"}
    archive: list[dict] = field(default_factory=list)  # {"family", "instance", "files", "status", "findings"}
    leftovers: list[str] = field(default_factory=list)  # interrupted backups: removed by the next backup
    objects: int = 0
    bytes: int = 0

    @property
    def intact(self) -> bool:
        """Nothing to report: a backup read from its manifest's copy is restorable, but its redundancy is gone."""
        return all(b["status"] == "ok" and not b["findings"] for b in self.backups) \
            and all(a["status"] == "ok" for a in self.archive)

    def to_json(self) -> dict:
        return {"intact": self.intact, **self.__dict__}


def verify_repository(repo: Repository, backup_id: str | None = None, *, progress: bool = False) -> RepoReport:
    report = RepoReport()
    checked: dict[str, str | None] = {}  # stored object -> its problem (None: intact), each read once
    records = repo.backups()
    if backup_id is not None:
        # The backup asked for, also when it cannot be used (reported as damaged, not as a repository error).
        chosen = [r for r in records if r.id == backup_id and backup_id != "latest"]
        records = chosen or [repo.find(backup_id)]
    entries = [e for r in records if r.manifest for e in r.manifest.files]
    tracker = Progress(len({e.stored for e in entries}), sum(e.size for e in {e.stored: e for e in entries}.values()),
                       progress, "verified")

    def check_object(entry: FileEntry) -> str | None:
        if entry.stored not in checked:
            try:
                for _ in repo.read_object(entry.stored, size=entry.size, sha256=entry.sha256,
                                          stored_sha256=entry.stored_sha256):
                    pass
                checked[entry.stored] = None
                report.objects += 1
                report.bytes += entry.size
            except ObjectDamaged as e:
                checked[entry.stored] = str(e)
            except RepositoryError as e:
                checked[entry.stored] = f"{entry.stored}: {e}"
            tracker.advance(entry.size)
        return checked[entry.stored]

    for record in records:
        out = {"id": record.id, "family": record.family, "instance": record.instance, "status": "ok", "findings": []}
        if not record.complete and backup_id is None:
            report.leftovers.append(f"{record.family}/{record.instance}/{record.id}")
            continue
        findings = out["findings"]
        if record.problem:
            findings.append({"code": "manifest_damaged" if record.manifest else "manifest_unreadable",
                             "message": record.problem})
        if record.manifest is not None:
            try:
                chain = repo.chain(record.manifest)
                ids = {m.id for m in chain}
                for parent, child in zip(chain, chain[1:]):
                    if parent.instance != child.instance:
                        findings.append({"code": "chain_broken", "message": f"{child.id} of {child.instance} has "
                                         f"parent {parent.id} of {parent.instance}"})
            except RepositoryError as e:
                ids = set()
                findings.append({"code": "chain_broken", "message": str(e)})
            for entry in record.manifest.files:
                if entry.reference is not None and entry.reference not in ids:
                    findings.append({"code": "reference_broken", "file": entry.name,
                                     "message": f"refers to backup {entry.reference}, not in its chain"})
                problem = check_object(entry)
                if problem:
                    findings.append({"code": "object_damaged", "file": entry.name, "message": problem})
                if entry.verification.get("status") not in ("ok", "open"):
                    findings.append({"code": "file_not_verified", "file": entry.name,
                                     "message": f"recorded as {entry.verification.get('status')}"})
        # A backup whose manifest is damaged but whose copy is good stays usable (status ok), yet the finding
        # makes the repository not intact: its redundancy is gone until it is backed up again.
        if record.manifest is None or any(f["code"] != "manifest_damaged" for f in findings):
            out["status"] = "damaged"
        report.backups.append(out)
    if backup_id is None:
        for family, instance in repo.sources():
            report.archive.append(_verify_archive(repo, family, instance, check_object))
    return report


def _verify_archive(repo: Repository, family: str, instance: str, check_object) -> dict:
    prefix = f"{repo.source_dir(family, instance)}/archive"
    names = repo.storage.list(prefix)
    records = [n for n in names if n.endswith(".zst" + RECORD_SUFFIX)]
    findings = []
    for name in records:
        entry = _load_record(repo, name)
        if entry is None:
            findings.append({"code": "record_unreadable", "file": name, "message": "the archive record cannot be read"})
            continue
        if entry.stored != name[: -len(RECORD_SUFFIX)]:
            findings.append({"code": "record_mismatch", "file": name, "message": f"names object {entry.stored}"})
            continue
        problem = check_object(entry)
        if problem:
            findings.append({"code": "object_damaged", "file": entry.name, "message": problem})
        if ".conflict-" in name:
            findings.append({"code": "conflict", "file": entry.name,
                             "message": "archived twice with other bytes; both are kept"})
    for name in names:
        if name.endswith(".zst") and name + RECORD_SUFFIX not in records:
            findings.append({"code": "unrecorded_object", "file": name,
                             "message": "an object without its record (an interrupted archive): not archived"})
    status = "ok" if all(f["code"] == "unrecorded_object" for f in findings) else "damaged"
    return {"family": family, "instance": instance, "files": len(records), "status": status, "findings": findings}


def list_backups(repo: Repository) -> list[dict]:
    """`walvault backups --json`: every backup, oldest first."""
    out = []
    for r in repo.backups():
        m = r.manifest
        if m is None:
            status = "incomplete" if not r.complete else "unreadable"
            out.append({"id": r.id, "type": None, "parent": None, "source": r.instance, "family": r.family,
                        "status": status, "files": None, "bytes": None, "stored_bytes": None, "started": None,
                        "finished": None, "position": None, "problem": r.problem})
            continue
        out.append({"id": m.id, "type": m.type, "parent": m.parent, "source": m.instance, "family": m.family,
                    "status": "ok" if r.problem is None else "manifest_copy_used", "files": len(m.files),
                    "bytes": m.bytes, "stored_bytes": m.stored_bytes, "started": m.started, "finished": m.finished,
                    "position": m.position, **({"problem": r.problem} if r.problem else {})})
    return out
