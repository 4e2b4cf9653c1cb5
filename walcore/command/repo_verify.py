"""`verify --repo`: re-hash every stored object, check every manifest and chain, report what is missing or
damaged (as pgBackRest's verify). Nothing is written here (the command keeps its report: verify_report)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

from ..repository import ObjectDamaged, Repository, RepositoryError
from ..repository.manifest import FileEntry
from ..runner import LocalRunner, run_all
from .archive import RECORD_SUFFIX, _load_record
from .backup import Progress


@dataclass
class RepoReport:
    backups: list[dict] = field(default_factory=list)  # {"id", "family", "instance", "status", "findings"}
    archive: list[dict] = field(default_factory=list)  # {"family", "instance", "files", "status", "findings"}
    leftovers: list[str] = field(default_factory=list)  # interrupted backups: removed by the next backup
    objects: int = 0
    bytes: int = 0
    checked: dict = field(default_factory=dict)  # stored object -> (size, its problem or None); not in the JSON

    @property
    def intact(self) -> bool:
        """Nothing to report: a backup read from its manifest's copy is restorable, but its redundancy is gone."""
        return all(b["status"] == "ok" and not b["findings"] for b in self.backups) \
            and all(a["status"] == "ok" for a in self.archive)

    def to_json(self) -> dict:
        return {"intact": self.intact, **{k: v for k, v in self.__dict__.items() if k != "checked"}}


def verify_repository(repo: Repository, backup_id: str | None = None, *, runner=None,
                      progress: bool = False) -> RepoReport:
    report = RepoReport()
    records = repo.backups()
    if backup_id is not None:
        # The backup asked for, also when it cannot be used (reported as damaged, not as a repository error).
        chosen = [r for r in records if r.id == backup_id and backup_id != "latest"]
        records = chosen or [repo.find(backup_id)]
    entries = [e for r in records if r.manifest for e in r.manifest.files]
    archived = {}
    if backup_id is None:
        for family, instance in repo.sources():
            archived[(family, instance)] = _archive_entries(repo, family, instance)
    entries += [e for _names, found in archived.values() for name, e in found.items()
                if e is not None and e.stored == name[: -len(RECORD_SUFFIX)]]
    # Each stored object is read once, however many backups reference it, on the runner's workers.
    objects = {e.stored: (e.stored, e.size, e.sha256, e.stored_sha256) for e in entries}
    tracker = Progress(len(objects), sum(o[1] for o in objects.values()), progress, "verified")
    results = run_all(runner or LocalRunner(), partial(check_object, repo), list(objects.values()), threads=True,
                      done=lambda o: tracker.advance(o[1]))
    checked = {o[0]: problem for o, problem in results.items()}  # stored object -> its problem (None: intact)
    for name, problem in checked.items():
        report.checked[name] = (objects[name][1], problem)
        if problem is None:
            report.objects += 1
            report.bytes += objects[name][1]
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
                problem = checked[entry.stored]
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
    for (family, instance), (names, found) in archived.items():
        report.archive.append(_verify_archive(family, instance, names, found, checked))
    return report


def check_object(repo: Repository, obj: tuple[str, int, str, str]) -> str | None:
    """One unit of the work: a stored object re-read and checked against its recorded hashes; its problem."""
    stored, size, sha256, stored_sha256 = obj
    try:
        for _ in repo.read_object(stored, size=size, sha256=sha256, stored_sha256=stored_sha256):
            pass
        return None
    except ObjectDamaged as e:
        return str(e)
    except RepositoryError as e:
        return f"{stored}: {e}"


def _archive_entries(repo: Repository, family: str, instance: str) -> tuple[list[str], dict[str, FileEntry | None]]:
    """The archive's object names, and each record's entry (None: unreadable)."""
    names = repo.storage.list(f"{repo.source_dir(family, instance)}/archive")
    return names, {n: _load_record(repo, n) for n in names if n.endswith(".zst" + RECORD_SUFFIX)}


def _verify_archive(family: str, instance: str, names: list[str], records: dict[str, FileEntry | None],
                    checked: dict[str, str | None]) -> dict:
    findings = []
    for name, entry in records.items():
        if entry is None:
            findings.append({"code": "record_unreadable", "file": name, "message": "the archive record cannot be read"})
            continue
        if entry.stored != name[: -len(RECORD_SUFFIX)]:
            findings.append({"code": "record_mismatch", "file": name, "message": f"names object {entry.stored}"})
            continue
        problem = checked.get(entry.stored)
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
