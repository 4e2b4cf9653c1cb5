"""What every front end does with a request (walcore.requests): check it, run its command on a runner, print the
result with the command's renderer, and say the exit code (`run`); or take the result and say it its own way
(`outcome`: the Airflow operators).

Exit codes, for every command: 0 done and intact; 1 findings, or refused for a stated reason (repair and
rotate because of what was found; a backup whose set would not restore, a restore into a non-empty
directory, a damaged stored object, a lease held by another backup), or for status a source stale, uncovered or
failing its last drill; 2 nothing could be checked or done
(a path is missing or unreadable, holds no WAL files, is in use by a running limestone, the repository or
a running Tarantool cannot be reached, --repo names a location holding no repository — only `init` makes one —,
or the command line is wrong).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

from . import requests as rq

EXIT_OK, EXIT_FINDINGS, EXIT_CANNOT_CHECK = 0, 1, 2


def refused(request: rq.Request) -> int | None:
    """The exit code of a request that is wrong (its problem said on stderr), before anything runs; None: none."""
    if wrong := request.problem():
        print(f"walvault: {wrong}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    return None


def run(request: rq.Request, runner) -> int:
    """Run one request that is not `refused` on `runner`: what it prints, and its exit code."""
    # A file name that is not valid UTF-8 must print (escaped) rather than end the run.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    if getattr(request, "progress", False) is None:  # default: when stderr is a terminal
        request = dataclasses.replace(request, progress=sys.stderr.isatty())
    try:
        return COMMANDS[type(request)](request, runner)
    except Exception as e:
        if (code := _failure_code(e)) is None:
            raise
        print(f"walvault: {request.not_done}: {e}", file=sys.stderr)
        return code


def _failure_code(e: Exception) -> int | None:
    """The exit code of a failure a command reports in one line; None: a bug, raised on. The modules that define
    these exceptions are imported here, once one was raised, rather than by every command."""
    from .findings import Refused
    from .limestone.layout import LiveError
    from .repository import RepositoryError
    from .repository.lease import LeaseBusy, LeaseLost
    from .repository.storage import UnsafeName
    from .runner import WorkFailed
    from .tarantool.live import LiveError as TarantoolLiveError

    if isinstance(e, (LeaseBusy, LeaseLost, UnsafeName)):
        return EXIT_FINDINGS
    if isinstance(e, (OSError, LiveError, RepositoryError, TarantoolLiveError, WorkFailed)):
        return EXIT_CANNOT_CHECK
    if isinstance(e, Refused):
        return EXIT_CANNOT_CHECK if e.status == "cannot_check" else EXIT_FINDINGS
    return None


def outcome(request: rq.Request, runner):
    """What the command of a request that is not `refused` does on `runner`, printing nothing: its result, for a
    front end that says it its own way (the Airflow operators). What the command raises is raised (`run` says it
    and gives its exit code). For the commands in RESULTS."""
    return RESULTS[type(request)](request, runner)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _repository(request):
    """The repository of the request; RepositoryError (exit 2) when the location holds none: only `init` makes
    one."""
    from .repository import Repository

    return Repository(request.repo, request.repo_options)


# -- the commands: each runs its command function and prints its result; `_<command>_result`, where there is one,
# is the run without the printing (`outcome`)


def _of_repository(request: rq.VerifyRequest) -> bool:
    return bool(request.repo) and not request.paths


def _verify_result(request: rq.VerifyRequest, runner, show=lambda report: None):
    """The report of a verify; `show(report)` is called with it before it is kept."""
    from .command.repo_verify import verify_backups
    from .command.verify import verify_sources

    if _of_repository(request):
        from .repository.encrypted import KeyMissing

        try:
            repo = _repository(request)
        except KeyMissing:  # an encrypted repository without its key: what can be checked is every object's bytes
            from .command.repo_verify import verify_stored_bytes

            return verify_stored_bytes(request.repo, request.repo_options, show=show)
        return verify_backups(repo, request.backup, runner=runner, full=request.full, progress=request.progress,
                              show=show)
    return verify_sources(request, runner=runner, show=show)


def _verify(request: rq.VerifyRequest, runner) -> int:
    of_repository = _of_repository(request)
    show = _show_repository_report if of_repository else _show_report
    report = _verify_result(request, runner, show=lambda r: show(request, r))
    if not of_repository and not report.checkable:
        return EXIT_CANNOT_CHECK
    return EXIT_OK if report.intact else EXIT_FINDINGS


def _show_report(request: rq.VerifyRequest, report) -> None:
    # inspect says which scan core ran (the pure-Python one is much slower: a user should know).
    from .scancore import describe

    detailed = isinstance(request, rq.InspectRequest)
    if request.json:
        print_json(report.to_json() | ({"scan_core": describe()} if detailed else {}))
        return
    from .text import render

    if detailed:
        print(f"scan core: {describe()}")
    sys.stdout.write(render(report, detailed=detailed, base=_common_base(request.paths)))


def _common_base(paths: list[Path]) -> Path | None:
    try:
        base = Path(os.path.commonpath([p.resolve() for p in paths]))
    except ValueError:
        return None
    return base if base.is_dir() else base.parent


def _show_repository_report(request: rq.VerifyRequest, report) -> None:
    if request.json:
        print_json(report.to_json())
        return
    for b in report.backups:
        print(f"backup {b['id']} ({b['family']} {b['instance']}): {b['status']}")
        for f in b["findings"]:
            print(f"  {f['code']}: {f.get('file', '')} {f['message']}")
    for a in report.archive:
        print(f"archive {a['family']} {a['instance']}: {a['files']} files, {a['status']}")
        for f in a["findings"]:
            print(f"  {f['code']}: {f.get('file', '')} {f['message']}")
    for f in report.repository["findings"]:
        print(f"repository: {f['code']}: {f['message']}")
    for leftover in report.leftovers:
        print("leftovers of an interrupted backup (removed by the next backup of its source, or by expire): "
              f"{leftover}")
    scanned, known = report.checked_by.get("scan", 0), report.checked_by.get("ledger", 0)
    print(f"{report.objects} objects, {report.bytes:,} bytes re-hashed; {scanned} Tarantool files scanned, "
          f"{known} verified before (ledger); verdict: {'INTACT' if report.intact else 'DAMAGED'}")


def _limestone_dir(path: Path) -> bool:
    from .limestone.layout import is_limestone_dir

    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if not is_limestone_dir(path):
        print(f"walvault: cannot check: {path} is not a limestone log directory", file=sys.stderr)
        return False
    return True


def _rotate_result(request: rq.RotateRequest, runner):
    from .command.rotate import rotate

    return rotate(request.dir, min_bytes=request.min_bytes)


def _rotate(request: rq.RotateRequest, runner) -> int:
    if not _limestone_dir(request.dir):
        return EXIT_CANNOT_CHECK
    result = _rotate_result(request, runner)
    if request.json:
        print_json(result.to_json())
    else:
        for old, new in result.renamed:
            print(f"rotated {old} -> {new}")
        for name, why in result.skipped:
            print(f"kept    {name}: {why}")
        if not result.renamed:
            print("nothing rotated")
    return EXIT_OK


def _repair(request: rq.RepairRequest, runner) -> int:
    from .command.repair import apply_repair, plan_repair

    if not _limestone_dir(request.dir):
        return EXIT_CANNOT_CHECK
    plan = plan_repair(request.dir, cut=request.cut)
    if request.apply and plan.needed:
        plan = apply_repair(plan)
    if request.json:
        print_json(plan.to_json())
    else:
        print(f"{plan.root}: {plan.status}")
        for f in plan.files:
            for action in f.actions(plan.cut):
                print(f"  {f.name}: {action}")
            if f.detach_to:
                print(f"  {f.name}: detached as {f.detach_to}")
        if plan.restore_catalog:
            print("  compaction_catalog: restore from compaction_catalog.back (the damaged one is saved)")
        for saved in plan.saved:
            print(f"  cut bytes saved in {saved}")
        if not plan.needed:
            print("nothing to repair")
        elif plan.left:
            print(f"repaired, but the repairs uncovered damage they cannot mend: {plan.left}")
        elif plan.applied:
            print("repaired")
        else:
            print("plan only: nothing was changed (run with --apply to carry it out)")
    return EXIT_OK if (plan.applied and not plan.left) or not plan.needed else EXIT_FINDINGS


def _state(request: rq.StateRequest, runner) -> int:
    from .limestone.state import format_tsv
    from .command.state import directory_state

    if not _limestone_dir(request.dir):
        return EXIT_CANNOT_CHECK
    parquet = None
    if request.parquet:
        from .parquet import ParquetOutput

        parquet = ParquetOutput(request.parquet, request.repo_options)
        parquet.check_empty()
    for rows in _batches(directory_state(request.dir, runner=runner, parquet=parquet)):
        sys.stdout.write(format_tsv(rows))
    return EXIT_OK


def _batches(rows, size: int = 4096):
    batch = []
    for row in rows:
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _init(request: rq.InitRequest, runner) -> int:
    from .repository import Repository

    repo, created = Repository.init(request.repo, request.repo_options, lock_days=request.lock_days,
                                    lock_mode=request.lock_mode, encrypt=request.encrypt)
    lock = repo.info.get("lock")
    if request.json:
        print_json({"repository": repo.display, "created": created, "format": repo.info.get("format"),
                    "since": repo.info.get("created"), "lock": lock, "encrypted": repo.encrypted})
    elif created:
        print(f"created the {'encrypted ' if repo.encrypted else ''}walvault repository {repo.display} (format "
              f"{repo.info.get('format')})" + (f"; objects locked {lock['days']} days ({lock['mode']})" if lock else ""))
    else:
        print(f"{repo.display} is a walvault repository already (format {repo.info.get('format')}, created "
              f"{repo.info.get('created')}): nothing changed")
    return EXIT_OK


def _key(request: rq.KeyRequest, runner) -> int:
    from .repository.encrypted import KEY_NAME, NEW_KEY_ENV, passphrase, rotate
    from .repository.manifest import read_info
    from .repository.storage import RepositoryError, open_storage

    storage = open_storage(request.repo, request.repo_options)
    info = read_info(storage)
    if info is None or not info.get("encryption"):
        raise RepositoryError(f"{storage.display} is not an encrypted walvault repository: it has no key to rotate")
    done = rotate(storage, passphrase(), passphrase(env=NEW_KEY_ENV))
    if request.json:
        print_json({"repository": storage.display, "rotated": done})
    else:
        print(f"{storage.display}: {KEY_NAME} {'rotated' if done == 'rotated' else 'was rotated already'}: the new "
              "key opens it, the old one no longer does")
    return EXIT_OK


def _archive_result(request: rq.ArchiveRequest, runner):
    from .command.archive import archive

    return archive(request.paths, _repository(request), level=request.level, runner=runner,
                   progress=request.progress)


def _archive(request: rq.ArchiveRequest, runner) -> int:
    result = _archive_result(request, runner)
    if request.json:
        print_json(result.to_json())
    else:
        for what, paths in (("archived", result.stored), ("already archived", result.already),
                            ("deleted by retention before, not archived again", result.expired),
                            ("not sealed, not archived", result.not_sealed)):
            for path in paths:
                print(f"{what}: {path}")
        for refused in result.refused:
            print(f"refused (damaged): {refused['path']}: "
                  + "; ".join(f"{f['code']} at {f['offset']}: {f['message']}" for f in refused["findings"][:5]))
        for c in result.conflicts:
            print(f"CONFLICT: {c['path']} was archived before with other bytes (sha256 {c['archived_sha256'][:12]}); "
                  f"the new bytes are kept as {c['kept_as']}")
        if result.superseded:
            print(f"superseded by archived xlogs, deleted: {len(result.superseded)} stream segments")
        for d in result.differs:
            print(f"DIFFERS: stream segment {d['segment']}, row {d['row']}: {d['message']}; the segment is kept")
    return EXIT_OK if result.ok else EXIT_FINDINGS


def _backup(request: rq.BackupRequest, runner) -> int:
    from .command.backup import backup
    from .family import plan_for
    from .repository.manifest import parse_notes

    plan_for(request.source, check_only=True)
    repo = _repository(request)
    result = backup(request.source, repo, incremental=request.type == "incremental", connect=request.connect,
                    level=request.level, runner=runner, progress=request.progress, wait=request.wait,
                    notes=parse_notes(request.notes))
    if request.json:
        print_json(result.to_json())
    else:
        m = result.manifest
        for note in result.notes:
            print(f"note: {note}")
        for leftover in result.removed_leftovers:
            print(f"removed the leftovers of interrupted backup {leftover}")
        print(f"backup {m.id} ({m.type}{', parent ' + m.parent if m.parent else ''}) of {m.family} {m.instance}: "
              f"{len(m.files)} files, {m.bytes:,} bytes, {m.stored_bytes:,} stored; restores to {m.position}")
        if m.notes:
            print(f"notes: {_notes(m.notes)}")
    return EXIT_OK


def _snapshot_result(request: rq.SnapshotRequest, runner):
    from .command.snapshot import snapshot

    return snapshot(request.source, _repository(request), connect=request.connect, level=request.level,
                    runner=runner, progress=request.progress, wait=request.wait)


def _snapshot(request: rq.SnapshotRequest, runner) -> int:
    from .family import plan_for

    plan_for(request.source, check_only=True)  # a wrong SOURCE is said first
    result = _snapshot_result(request, runner)
    m = result.manifest
    covers = m.checks.get("snapshot", {})
    if request.json:
        print_json({**result.to_json(), "covers": covers})
    else:
        for note in result.notes:
            print(f"note: {note}")
        if m.family == "tarantool":
            reach = f"vclock {covers.get('vclock')}"
        else:
            reach = (f"epoch {covers.get('epoch')}: {len(covers.get('folded', []))} pwal files folded now, "
                     f"{len(covers.get('detached', []))} in all")
        print(f"snapshot {m.id} of {m.family} {m.instance}: {len(m.files)} files, {m.bytes:,} bytes, "
              f"{m.stored_bytes:,} stored; covers the log up to {reach}")
    return EXIT_OK


def _expire_result(request: rq.ExpireRequest, runner):
    """NoPolicy without --days when the repository stores no usable policy; a stored policy's warning is said on
    stderr before anything is expired."""
    from .command.expire import expire, resolve_policy

    repo = _repository(request)
    days, keep_full, warning = resolve_policy(repo, request.days, request.keep_full)
    if warning:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    as_of = rq.as_of_time(request.as_of) if request.as_of else None
    return expire(repo, days, keep_full=keep_full, as_of=as_of, apply=request.apply, wait=request.wait,
                  only=request.only)


def _expire(request: rq.ExpireRequest, runner) -> int:
    from .command.expire import NoPolicy, render

    try:
        result = _expire_result(request, runner)
    except NoPolicy as e:
        print(f"walvault: nothing expired: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    for warning in result.warnings:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    if request.json:
        print_json(result.to_json())
    else:
        print("\n".join(render(result)))
    return EXIT_FINDINGS if any(s.stopped for s in result.sources) else EXIT_OK


def _policy(request: rq.PolicyRequest, runner) -> int:
    from .command.expire import check_days, stored_policy
    from .findings import Refused
    from .repository.manifest import ManifestError
    from .retention import check_keep_full, describe_policy

    repo = _repository(request)  # a typo in --repo must not leave a repository holding only a policy
    if request.days is not None or request.keep_full is not None:  # both files are written: also how a damaged
        try:  # one is mended; the part not given is kept as stored
            stored = stored_policy(repo)[0] or {}
        except ManifestError:  # neither file is good: nothing to keep
            stored = {}
        days = request.days if request.days is not None else stored.get("days")
        if days is None:
            raise Refused("no recovery window is stored: give --days N with --keep-full", "cannot_check")
        keep_full = request.keep_full if request.keep_full is not None else stored.get("keep_full", 0)
        try:
            policy = repo.set_policy(check_days(days), check_keep_full(keep_full))
        except ValueError as e:  # a stored part that is not usable: given anew, it is replaced
            raise Refused(f"the stored policy is not usable ({e}): give --days and --keep-full", "cannot_check") \
                from None
    else:
        policy, warning = stored_policy(repo)
        if warning:
            print(f"walvault: warning: {warning}", file=sys.stderr)
    if request.json:
        print_json({"policy": policy})
    elif policy is None:
        print("no retention policy stored: expire needs --days")
    else:
        print(f"retention policy: {describe_policy(policy['days'], policy.get('keep_full', 0))} (set "
              f"{policy['set']} by {policy['by']})")
    return EXIT_OK


def _drill_result(request: rq.DrillRequest, runner):
    from .command.drill import drill

    return drill(_repository(request), request.backup)


def _drill(request: rq.DrillRequest, runner) -> int:
    result = _drill_result(request, runner)
    if request.json:
        print_json(result.to_json())
    else:
        print(f"drill of backup {result.backup} ({result.family} {result.instance}): {result.status.upper()}")
        for check in result.checks:
            print(f"  {check}")
        if result.problem:
            print(f"  problem: {result.problem}")
    return EXIT_OK if result.status == "ok" else EXIT_FINDINGS


def _backups(request: rq.BackupsRequest, runner) -> int:
    from .command.repo_verify import list_backups

    backups = list_backups(_repository(request))
    if request.json:
        print_json({"backups": backups})
        return EXIT_OK
    for b in backups:
        parent = f" <- {b['parent']}" if b["parent"] else ""
        size = f"{b['files']} files, {b['bytes']:,} bytes ({b['stored_bytes']:,} stored)" if b["files"] is not None else ""
        drill = b.get("drill")
        drilled = ""
        if drill:
            drilled = f"  {'DRILL FAILED' if drill['status'] == 'failed' else 'drill ' + drill['status']} {drill['time']}"
        verification = b.get("verification")
        if verification and verification.get("status") != "ok":
            drilled += f"  DAMAGED (verify {verification.get('time')})"
        drilled += "".join(f"  copied to {c['to']} {c['time']}" for c in b.get("copies", []))
        pin = b["pin"]
        pinned = "" if pin is None else "  PINNED" + (f" ({pin['note']})" if pin.get("note") else "") \
            + (f" (its pin cannot be read: {pin['problem']})" if pin.get("problem") else "")
        notes = f"  notes: {_notes(b['notes'])}" if b["notes"] else ""
        print(f"{b['id']}  {b['type'] or '-':11} {b['family']} {b['source']}  {b['status']}  {size}  "
              f"{b['position'] or ''}{parent}{drilled}{pinned}{notes}")
    if not backups:
        print("no backups")
    return EXIT_OK


def _notes(notes: dict[str, str]) -> str:
    return ", ".join(f"{key}={value}" for key, value in notes.items())


def _pin(request: rq.PinRequest | rq.UnpinRequest, runner) -> int:
    from .command.pin import pin, unpin

    repo = _repository(request)
    if isinstance(request, rq.PinRequest):
        result = pin(repo, request.backup, request.note, wait=request.wait)
    else:
        result = unpin(repo, request.backup, wait=request.wait)
    if request.json:
        print_json(result.to_json())
    elif result.pinned:
        print(f"pinned backup {result.backup} ({result.family} {result.instance})"
              + (f": {result.pin['note']}" if result.pin["note"] else "") + "; expire keeps it and its parent chain")
    elif result.changed:
        print(f"unpinned backup {result.backup} ({result.family} {result.instance}): retention judges it again")
    else:
        print(f"backup {result.backup} ({result.family} {result.instance}) was not pinned: nothing changed")
    return EXIT_OK


def _restore(request: rq.RestoreRequest, runner) -> int:
    from .command.restore import restore

    repo = _repository(request)
    result = restore(repo, request.backup, request.target, to=request.to, progress=request.progress)
    if request.json:
        print_json(result.to_json())
    else:
        for note in result.notes:
            print(f"note: {note}")
        print(f"restored backup {result.backup} into {result.target}: {result.files} files, {result.bytes:,} bytes"
              + (f" ({result.reused} kept from an interrupted run)" if result.reused else ""))
        if result.point:
            print(f"point in time: {result.point}")
    return EXIT_OK


def _copy_result(request: rq.CopyRequest, runner):
    from .command.copy import copy_backups
    from .findings import Refused
    from .repository import Repository

    from .repository.encrypted import TO_KEY_ENV

    source = Repository(request.from_repo, request.from_options)
    destination = Repository(request.to_repo, request.to_options, key_env=TO_KEY_ENV)
    if source.storage.caps.local_paths and destination.storage.caps.local_paths \
            and os.path.realpath(source.storage.root) == os.path.realpath(destination.storage.root):
        raise Refused("--from and --to name the same repository", "cannot_check")
    return copy_backups(source, destination, None if request.all else request.backups, archive=request.archive,
                        wait=request.wait)


def _copy(request: rq.CopyRequest, runner) -> int:
    result = _copy_result(request, runner)
    for warning in result.warnings:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    if request.json:
        print_json(result.to_json())
    else:
        for backup_id in result.copied:
            print(f"copied backup {backup_id}")
        if result.already:
            print(f"already in {result.destination}: {len(result.already)} backups")
        if result.archive_copied or result.archive_already:
            print(f"archive: {result.archive_copied} files copied, {result.archive_already} already there")
        for f in result.findings:
            print(f"NOT COPIED: {f.get('backup') or f.get('file')}: {f['message']}")
        print(f"{result.source} -> {result.destination}: {result.objects} objects, {result.bytes:,} bytes copied and "
              f"verified; {'OK' if result.ok else 'FINDINGS'}")
    return EXIT_OK if result.ok else EXIT_FINDINGS


def _status_result(request: rq.StatusRequest, runner):
    from .command.status import HOUR, MINUTE, status

    return status(_repository(request), max_backup_age=request.max_backup_age * HOUR,
                  max_archive_lag=request.max_archive_lag * MINUTE)


def _status(request: rq.StatusRequest, runner) -> int:
    from .command.status import exposition, serve, write_textfile

    if request.serve is not None:
        host, port = rq.serve_address(request.serve)
        _repository(request)  # a wrong --repo is said now, not at the first scrape
        serve(host, port, lambda: exposition(_status_result(request, runner)),
              ready=lambda address: print(f"walvault: serving http://{request.serve.rpartition(':')[0]}:{address[1]}"
                                          "/metrics until stopped", file=sys.stderr, flush=True))
        return EXIT_OK
    result = _status_result(request, runner)
    for warning in result.warnings:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    if request.textfile is not None:
        write_textfile(request.textfile, exposition(result))
    if request.json:
        print_json(result.to_json())
    elif request.prometheus:
        sys.stdout.write(exposition(result))
    else:
        print("\n".join(status_lines(result)))
    return EXIT_OK if result.ok else EXIT_FINDINGS


def _position(position: dict) -> str:
    """A position as people read it: vclock {0: 9, 1: 1149}, epoch 40."""
    return ", ".join(f"{kind} " + ("{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
                                   if isinstance(value, dict) else str(value)) for kind, value in position.items())


def status_lines(result) -> list[str]:
    """`walvault status`'s text: the repository, then each source's backup, archive, source, window and drill."""
    from .command.status import duration

    sizes = ", ".join(f"{kind} {n:,}" for kind, n in result.bytes.items() if n)
    lines = [f"repository {result.repository}: {sum(result.bytes.values()):,} bytes ({sizes or 'empty'})",
             f"recovery window: {result.policy_days} days" if result.policy_days is not None
             else "recovery window: no policy stored, not judged"]
    for s in result.sources:
        where = f"{s.host}:{s.path}" if s.path else "(directory not recorded)"
        lines.append(f"{s.family} {s.instance} {where}: {'OK' if s.ok else 'PROBLEM'}")
        if s.backup:
            b = s.backup
            lines.append(f"  backup   {b['id']} ({b['type']}), {duration(b['age_seconds'])} old, restores to "
                         f"{_position(b['position'])}")
        a = s.archive
        lines.append(f"  archive  reaches {_position(a['position'])}" + (f", written {duration(a['age_seconds'])} ago"
                                                              if a['age_seconds'] is not None else "")
                     if a else "  archive  empty")
        if s.stream:
            t = s.stream
            held = f"{t['segments']} segments, to {_position(t['position'])}" if t["position"] else "no segment stored"
            lines.append(f"  stream   {held}"
                         + (f", last commit {duration(t['age_seconds'])} ago" if t['age_seconds'] is not None else "")
                         + (f"; streamer live (lease renewed {t['lease_renewed']})" if t["alive"] else
                            "; no live streamer")
                         + (f"; lags the source by {duration(t['lag_seconds'])}" if t["lag_seconds"] is not None
                            else ""))
            if t.get("note"):
                lines.append(f"           {t['note']}")
        if s.source is None:
            lines.append("  source   not on this host: its archive lag is not judged")
        else:
            lag = "unknown" if s.archive_lag_seconds is None else duration(s.archive_lag_seconds)
            lines.append(f"  source   reaches {_position(s.source['position'])}; the archive lags it by {lag}")
        if s.window is not None:
            anchor = s.window["anchor"]
            lines.append(f"  window   covered by {anchor['name']} at {_position(anchor['position'])} ({anchor['time']})"
                         if anchor else f"  window   UNCOVERED since {s.window['start']}")
        d = s.drill
        lines.append(f"  drill    {d['status']} {d['time']} (backup {d['backup']})" if d else "  drill    never")
        lines += [f"  problem: {p}" for p in s.problems]
    if not result.sources:
        lines.append("no sources")
    return lines


def _stream(request: rq.StreamRequest, runner) -> int:
    import signal
    import threading

    repo = _repository(request)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        return _stream_until_stopped(request, repo, stop)
    finally:
        # once stopped, a stop has nothing left to stop: ignored, it cannot turn the exit into a kill by SIGTERM
        # (Python restores the default action before it tears its modules down)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, signal.SIG_IGN)


def _stream_until_stopped(request: rq.StreamRequest, repo, stop) -> int:
    from .command.stream import stream, stream_directory
    from .tarantool.receiver import StreamBroken

    def say(line: str) -> None:
        print(f"walvault stream: {line}", file=sys.stderr, flush=True)

    if request.source is not None:
        state = stream_directory(repo, request.source, segment_seconds=request.segment_seconds,
                                 status_file=request.status, stop=stop, say=say)
        if request.json:
            print_json(state.to_json())
        else:
            print("\n".join(state.lines()))
        return EXIT_FINDINGS if state.problems else EXIT_OK
    try:
        given = {k: v for k, v in {"segment_bytes": request.segment_bytes, "silence_limit": request.timeout}.items()
                 if v is not None}
        state = stream(repo, request.connect, request.spool or Path("var/stream-spool"),
                       segment_seconds=request.segment_seconds, status_file=request.status, stop=stop, say=say,
                       **given)
    except StreamBroken as e:
        print(f"walvault: stream stopped: {e}", file=sys.stderr)
        return EXIT_FINDINGS
    if request.json:
        print_json(state.to_json())
    else:
        print(f"stream of {state.instance} stopped: {state.segments} segments stored, vclock "
              f"{state.vclock}; {len(state.gaps)} gaps")
        for gap in state.gaps:
            print(f"  gap: {gap}")
    return EXIT_FINDINGS if state.gaps else EXIT_OK


COMMANDS = {rq.InspectRequest: _verify, rq.VerifyRequest: _verify, rq.RotateRequest: _rotate,
            rq.RepairRequest: _repair, rq.StateRequest: _state, rq.InitRequest: _init, rq.ArchiveRequest: _archive,
            rq.BackupRequest: _backup, rq.SnapshotRequest: _snapshot, rq.ExpireRequest: _expire,
            rq.PolicyRequest: _policy, rq.KeyRequest: _key, rq.DrillRequest: _drill, rq.BackupsRequest: _backups,
            rq.RestoreRequest: _restore, rq.StatusRequest: _status, rq.StreamRequest: _stream, rq.CopyRequest: _copy,
            rq.PinRequest: _pin, rq.UnpinRequest: _pin}
RESULTS = {rq.VerifyRequest: _verify_result, rq.RotateRequest: _rotate_result, rq.ArchiveRequest: _archive_result,
           rq.SnapshotRequest: _snapshot_result, rq.ExpireRequest: _expire_result, rq.DrillRequest: _drill_result,
           rq.StatusRequest: _status_result, rq.CopyRequest: _copy_result}
