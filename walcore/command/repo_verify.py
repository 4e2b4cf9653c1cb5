"""`verify --repo`: re-hash every stored object, scan the Tarantool files they hold (blocks, rows), check every
manifest and chain, report what is missing or damaged (as pgBackRest's verify, and more). The command keeps its report (repository/report.py) after the verdict is out."""

from __future__ import annotations

import contextlib
import shutil
import time
from dataclasses import astuple, dataclass, field
from functools import partial
from pathlib import PurePosixPath

from ..backup_common import Progress
from ..family import family_named
from ..fsutil import owned_tempdir
from ..limestone.follow import piece_findings
from ..limestone.pwal import iter_entries
from ..limestone.stream import PIECE_KIND
from ..repository import FAMILIES, ObjectDamaged, Repository, RepositoryError, utc_now, walvault_version
from ..repository.copies import copies_of
from ..repository.archive import DIFFERS_SUFFIX, RECORD_SUFFIX, STREAM_DIR, load_record
from ..repository.pins import read_pin
from ..repository.verdicts import VERIFY_NAME, last_drill, last_verification, write_verdict
from ..repository.manifest import (COPY_SUFFIX, INFO_NAME, MANIFEST_NAME, POLICY_NAME, FileEntry, PairState, Piece,
                                   inspect_pair)
from ..runner import LocalRunner, run_all
from ..tarantool.ledger import record_verdict, recorded_verdict


@dataclass
class RepoReport:
    backups: list[dict] = field(default_factory=list)  # {"id", "family", "instance", "status", "findings"}
    archive: list[dict] = field(default_factory=list)  # {"family", "instance", "files", "status", "findings"}
    leftovers: list[str] = field(default_factory=list)  # interrupted backups: removed by the next backup or expire
    objects: int = 0
    bytes: int = 0
    checked_by: dict = field(default_factory=dict)  # "scan" | "ledger" | "hash" -> objects checked so
    checked: dict = field(default_factory=dict)  # stored object -> (size, problem, checked_by, findings); not in JSON
    repository: dict = field(default_factory=lambda: {"findings": []})  # walvault.repo and walvault.policy pairs

    @property
    def intact(self) -> bool:
        """Nothing to report: a backup read from its manifest's copy is restorable, but its redundancy is gone."""
        return all(b["status"] == "ok" and not b["findings"] for b in self.backups) \
            and all(a["status"] == "ok" for a in self.archive) and not self.repository["findings"]

    def to_json(self) -> dict:
        return {"intact": self.intact, **{k: v for k, v in self.__dict__.items() if k != "checked"}}


def verify_repository(repo: Repository, backup_id: str | None = None, *, runner=None, full: bool = False,
                      progress: bool = False) -> RepoReport:
    """Re-hash every stored object and, for Tarantool files, scan what it holds block by block and row by row,
    unless the ledger knows those bytes as verified clean by this walvault version (`full`: scan them all)."""
    report = RepoReport()
    report.repository["findings"] = (redundancy_findings(repo, INFO_NAME, "info")
                                     + redundancy_findings(repo, POLICY_NAME, "policy"))
    if repo.encrypted and backup_id is None:  # every object authenticated, also those no manifest or record names
        report.repository["findings"] += stored_findings(repo.storage.inner, repo.storage.keyring)
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
    objects = {}
    for e in entries:  # a piece of a file is a unit of its own (re-hashed), unless a backup's file is that object
        for p in (e.pieces or [])[:-1]:
            objects.setdefault(p.stored, (p.stored, p.size, p.sha256, p.stored_sha256, e.name, EARLIER_PIECE, ()))
    for e in entries:
        objects[e.stored] = (e.stored, e.size, e.sha256, e.stored_sha256, e.name, e.kind, _pieces(e))
    tracker = Progress(len(objects), sum(o[1] for o in objects.values()), progress, "verified")
    # Processes scan on every core; an object store's client (s3fs) is not safe across fork: threads there.
    results = run_all(runner or LocalRunner(), partial(check_object, repo, full), list(objects.values()),
                      threads=not repo.storage.caps.fork_safe, done=lambda o: tracker.advance(o[1]))
    checked = {o[0]: result[0] for o, result in results.items()}  # stored object -> its problem (None: intact)
    scans = {o[0]: result[1] for o, result in results.items()}  # stored object -> findings of its scan, if any
    for obj, (problem, found, checked_by) in results.items():
        report.checked[obj[0]] = (obj[1], problem, checked_by, found)
        if problem is None:
            report.objects += 1
            report.bytes += obj[1]
            report.checked_by[checked_by] = report.checked_by.get(checked_by, 0) + 1
    report.checked_by = dict(sorted(report.checked_by.items()))  # one order, whatever order the objects ended in
    for record in records:
        out = {"id": record.id, "family": record.family, "instance": record.instance, "status": "ok", "findings": []}
        if not record.complete and backup_id is None:
            report.leftovers.append(f"{record.family}/{record.instance}/{record.id}")
            continue
        findings = out["findings"]
        if record.manifest is None:
            findings.append({"code": "manifest_unreadable", "message": record.problem})
        else:
            parents: set[str] = set()  # where the objects of the backup's parent chain are
            try:
                chain = repo.chain(record.manifest)
                ids = {m.id for m in chain}
                parents = {repo.backup_dir(m.family, m.instance, m.id) + "/" for m in chain[:-1]}
                # Verifying one backup checks the redundancy of every manifest it is read with: its parents' too.
                for m in chain if backup_id is not None else [record.manifest]:
                    findings += redundancy_findings(
                        repo, f"{repo.backup_dir(m.family, m.instance, m.id)}/{MANIFEST_NAME}", "manifest")
                for parent, child in zip(chain, chain[1:]):
                    if parent.instance != child.instance:
                        findings.append({"code": "chain_broken", "message": f"{child.id} of {child.instance} has "
                                         f"parent {parent.id} of {parent.instance}"})
            except RepositoryError as e:
                ids = set()
                findings.append({"code": "chain_broken", "message": str(e)})
                findings += redundancy_findings(
                    repo, f"{repo.backup_dir(record.family, record.instance, record.id)}/{MANIFEST_NAME}", "manifest")
            for entry in record.manifest.files:
                if entry.reference is not None and entry.reference not in ids:
                    findings.append({"code": "reference_broken", "file": entry.name,
                                     "message": f"refers to backup {entry.reference}, not in its chain"})
                # a file's earlier pieces are objects its parent chain stored: another's may go with that one
                for p in (entry.pieces or [])[:-1]:
                    if not any(p.stored.startswith(d) for d in parents):
                        findings.append({"code": "piece_outside_chain", "file": entry.name,
                                         "message": f"its piece {p.stored} is no object of its parent chain"})
                for problem in dict.fromkeys(checked[o.stored] for o in entry.objects()):
                    if problem:
                        findings.append({"code": "object_damaged", "file": entry.name, "message": problem})
                for f in scans[entry.stored] or []:
                    findings.append({"code": "file_damaged", "file": entry.name,
                                     "message": f"{f['code']} at {f['offset']}: {f['message']}"})
                if entry.verification.get("status") not in ("ok", "open"):
                    findings.append({"code": "file_not_verified", "file": entry.name,
                                     "message": f"recorded as {entry.verification.get('status')}"})
        # A backup whose manifest or its copy is damaged, the other good, stays usable (status ok), yet the finding
        # makes the repository not intact: its redundancy is gone until it is mended.
        if record.manifest is None or any(not f.get("redundancy") for f in findings):
            out["status"] = "damaged"
        report.backups.append(out)
    for (family, instance), (names, found) in archived.items():
        report.archive.append(_verify_archive(family, instance, names, found, checked, scans))
    return report


def stored_findings(storage, keyring) -> list[dict]:
    """An encrypted repository's objects, each checked against its trailer's CRC32C and, with the `keyring`,
    authenticated (encrypted.py): a finding `object_unauthentic` names each that fails; its key file against its
    checksum (`key_file_damaged`)."""
    from ..repository.encrypted import CLEAR_NAMES, KEY_NAME, key_file_problem, object_problem

    findings = []
    if problem := key_file_problem(storage):
        findings.append({"code": "key_file_damaged", "path": KEY_NAME, "message": problem})
    for name in storage.list():
        if name in CLEAR_NAMES or name.endswith(".walvault-tmp"):  # a killed write's temporary is no object
            continue
        if problem := object_problem(storage, name, keyring):
            findings.append({"code": "object_unauthentic", "path": name, "message": problem})
    return findings


def verify_stored_bytes(url: str, options: dict, *, show) -> RepoReport:
    """`verify --repo` of an encrypted repository without its key: every object's stored bytes against their trailer's
    CRC32C (nothing is written: a report would need the key)."""
    from ..repository.storage import open_storage

    storage = open_storage(url, options)
    report = RepoReport()
    report.repository["findings"] = [{"code": f"info_{p.state}", "path": p.path, "message": p.message}
                                     for p in inspect_pair(storage, INFO_NAME).problems] + stored_findings(storage, None)
    sizes = storage.sizes()
    report.objects, report.bytes = len(sizes), sum(sizes.values())
    show(report)
    return report


def redundancy_findings(repo: Repository, name: str, what: str) -> list[dict]:
    """The findings on a checked pair (`what`: "manifest", "info" or "policy"), each naming its file and how to
    restore the redundancy: codes `<what>_damaged` / `<what>_missing` (the main file), `<what>_copy_damaged` /
    `<what>_copy_missing`, `<what>_copies_differ`."""
    state = inspect_pair(repo.storage, name)
    return [{"code": f"{what}{'_copy' if p.side == 'copy' and p.state != 'differs' else ''}_"
                     f"{'copies_differ' if p.state == 'differs' else p.state}",
             "path": p.path, "message": f"{p.message}; {_mend_hint(repo, state, what, p.state)}", "redundancy": True}
            for p in state.problems]


def _mend_hint(repo: Repository, state: PairState, what: str, problem: str) -> str:
    if what == "policy":  # setting it writes both files
        days = state.good.get("days") if state.good is not None else "N"
        return f"to restore both files, set the policy again: walvault policy --repo {repo.display} --days {days}"
    main, copy = state.name, state.name + COPY_SUFFIX
    if problem == "differs":
        return f"once you know {main} is right, copy its bytes over {copy}"
    if state.good is None:
        return "neither file is good: restore both from a copy of the repository"
    good, bad = (main, copy) if state.main is not None else (copy, main)
    return f"to restore the redundancy, copy the bytes of {good} (which is good) over {bad}"


SCANNED_KINDS = ("snap", "xlog", "segment", "vylog", "run", "index")  # a stream's segment is an xlog


def check_object(repo: Repository, full: bool, obj: tuple) -> tuple[str | None, list[dict] | None, str]:
    """One unit of the work: a stored object re-read and checked against its recorded hashes and, when it holds
    a Tarantool file whose bytes the ledger does not know as verified (or `full`), scanned as `verify` scans a
    file (from a local copy under its own name, so that its name is checked too). Returns its problem (None:
    intact), the findings of the scan (None: not scanned), and how its content was checked. A file kept in
    pieces is the unit of its last piece: that piece alone is re-hashed (each other piece is a unit of its
    own), and the file whole, all its pieces in order, when it is scanned."""
    stored, size, sha256, stored_sha256, name, kind, pieces = obj
    family, instance = stored.split("/")[:2]
    base = PurePosixPath(name).name
    if base in ("", ".", ".."):
        base = f"file.{kind}"
    # The ledger's family's files are judged by their bytes alone: those are scanned (a name no family has, which
    # only a forged manifest holds, is re-hashed only).
    scanned = kind in SCANNED_KINDS and family in FAMILIES and family_named(family).uses_ledger
    piece = kind == PIECE_KIND  # a limestone stream's piece: small, scanned every time
    scan = piece or scanned and (full or recorded_verdict(repo, instance, sha256, size, base) is None)
    checked_by = "scan" if scan else "ledger" if scanned else "hash"
    scratch = owned_tempdir("walvault-verify-") if scan else None
    try:
        copy = scratch / base if scratch else None
        try:
            with open(copy, "wb") if copy else contextlib.nullcontext() as out:
                for chunk in _content(repo, obj, whole=scan):
                    if out is not None:
                        out.write(chunk)
        except ObjectDamaged as e:
            return str(e), None, checked_by
        except RepositoryError as e:
            return f"{stored}: {e}", None, checked_by
        except OSError as e:  # the scratch copy (a full temporary directory): this object cannot be checked
            raise RepositoryError(f"{stored}: cannot copy it to {scratch} to scan it: {e.strerror or e}") from None
        if copy is None:
            return None, None, checked_by
        if piece:
            return None, piece_findings(iter_entries(copy)), checked_by
        from ..tarantool.check import file_verdict
        from ..tarantool.xlog import scan_file

        verdict = file_verdict(scan_file(copy))
        if verdict.status == "ok" and verdict.eof:
            try:
                record_verdict(repo, instance, sha256, verdict)
            except RepositoryError:
                pass  # a read-only repository: the scan stands, nothing is recorded
        return None, [f.to_json() for f in verdict.findings], checked_by
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


EARLIER_PIECE = "earlier-piece"  # the kind of a unit that re-hashes a piece of a file which is not the last


def _pieces(entry: FileEntry) -> tuple:
    return () if entry.pieces is None else tuple(astuple(p) for p in entry.pieces)


def _content(repo: Repository, obj: tuple, whole: bool):
    """An object's bytes, checked; of a file in pieces, its last piece's, or `whole`, the file's."""
    stored, size, sha256, stored_sha256, name, _kind, pieces = obj
    if not pieces:
        return repo.read_object(stored, size=size, sha256=sha256, stored_sha256=stored_sha256)
    pieces = [Piece(*p) for p in pieces]
    return repo.read_pieces(name, pieces if whole else pieces[-1:], size=size, sha256=sha256)


def _archive_entries(repo: Repository, family: str, instance: str) -> tuple[list[str], dict[str, FileEntry | None]]:
    """The archive's object names (the stream's segments included), and each record's entry (None: unreadable)."""
    names = [n for where in ("archive", STREAM_DIR) for n in repo.storage.list(f"{repo.source_dir(family, instance)}/"
                                                                             f"{where}")]
    return names, {n: load_record(repo, n) for n in names if n.endswith(".zst" + RECORD_SUFFIX)}


def _verify_archive(family: str, instance: str, names: list[str], records: dict[str, FileEntry | None],
                    checked: dict[str, str | None], scans: dict[str, list | None]) -> dict:
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
        for f in scans.get(entry.stored) or []:
            findings.append({"code": "file_damaged", "file": entry.name,
                             "message": f"{f['code']} at {f['offset']}: {f['message']}"})
        if ".conflict-" in name:
            findings.append({"code": "conflict", "file": entry.name,
                             "message": "archived twice with other bytes; both are kept"})
    for name in names:
        if name.endswith(".zst") and name + RECORD_SUFFIX not in records:
            findings.append({"code": "unrecorded_object", "file": name,
                             "message": "an object without its record (an interrupted archive): not archived"})
        if name.endswith(DIFFERS_SUFFIX):
            findings.append({"code": "segment_differs", "file": name[:-len(DIFFERS_SUFFIX)],
                             "message": f"an archived xlog holds other rows than this stream segment ({name} says "
                                        "which): the segment is kept"})
    status = "ok" if all(f["code"] == "unrecorded_object" for f in findings) else "damaged"
    return {"family": family, "instance": instance, "files": len(records), "status": status, "findings": findings}


def list_backups(repo: Repository) -> list[dict]:
    """`walvault backups --json`: every backup, oldest first, with its last restore drill (or None), its notes,
    its pin (None: not pinned) and where it was copied (`walvault copy`)."""
    out = []
    for r in repo.backups():
        m = r.manifest
        if m is None:
            status = "incomplete" if not r.complete else "unreadable"
            out.append({"id": r.id, "type": None, "parent": None, "source": r.instance, "family": r.family,
                        "status": status, "files": None, "bytes": None, "stored_bytes": None, "started": None,
                        "finished": None, "position": None, "notes": {},
                        "pin": read_pin(repo, r.family, r.instance, r.id), "problem": r.problem})
            continue
        out.append({"id": m.id, "type": m.type, "parent": m.parent, "source": m.instance, "family": m.family,
                    "status": "ok" if r.problem is None else "manifest_copy_used", "files": len(m.files),
                    "bytes": m.bytes, "stored_bytes": m.stored_bytes, "started": m.started, "finished": m.finished,
                    "position": m.position, "drill": last_drill(repo, m.family, m.instance, m.id),
                    "verification": last_verification(repo, m.family, m.instance, m.id), "notes": m.notes,
                    "pin": read_pin(repo, m.family, m.instance, m.id),
                    "copies": copies_of(repo, m.family, m.instance, m.id),
                    **({"problem": r.problem} if r.problem else {})})
    return out


def verify_backups(repo: Repository, backup: str | None, *, runner, show, full: bool = False,
                   progress: bool | None = None) -> RepoReport:
    """Verify the repository, or its backup `backup`; `show(report)` is called with the verdict, before the report
    is kept (every front end keeps it)."""
    from ..repository.report import keep, write_repository_report

    started = time.time()
    report = verify_repository(repo, backup, runner=runner, full=full, progress=progress)
    show(report)
    keep(repo, write_repository_report, report, backup, started, runner.name)
    _record_verdicts(repo, report)
    return report


def _record_verdicts(repo: Repository, report: RepoReport) -> None:
    """Each checked backup's verdict beside it (repository/verdicts.py): status and retention read it there, not
    from the newest of many reports. A backup whose manifest was not read gets none: there was nothing to judge (a
    backup still being written, when named: once committed, it is another), and status names an unreadable
    manifest itself. A repository that cannot be written is said, as for the report."""
    from ..repository.report import warn

    time_checked = utc_now()
    for b in report.backups:
        if any(f["code"] == "manifest_unreadable" for f in b["findings"]):
            continue
        damage = [f for f in b["findings"] if not f.get("redundancy")]
        verdict = {"status": b["status"], "time": time_checked, "findings": len(damage),
                   "problem": (f"{damage[0].get('file') or b['id']}: {damage[0]['message']}" if damage else None),
                   "by": f"walvault {walvault_version()}"}
        try:
            write_verdict(repo, b["family"], b["instance"], b["id"], VERIFY_NAME, verdict)
        except RepositoryError as e:
            warn(f"warning: the verdicts of the backups were not recorded beside them: {e}")
            return
