"""walvault: the command line.

Exit codes, for every command: 0 done and intact; 1 findings, or refused for a stated reason (repair and
rotate because of what was found; a backup whose set would not restore, a restore into a non-empty
directory, a damaged stored object, a lease held by another backup); 2 nothing could be checked or done
(a path is missing or unreadable, holds no WAL files, is in use by a running limestone, the repository or
a running Tarantool cannot be reached, --repo names a location holding no repository — only `init` makes one —,
or the command line is wrong).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

EXIT_OK, EXIT_FINDINGS, EXIT_CANNOT_CHECK = 0, 1, 2
PASSWORD_ENV = "WALVAULT_PASSWORD"  # the password of --connect's user, when --password-file does not give it


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 on usage errors already; keep its message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_CANNOT_CHECK, f"walvault: {message}\n")


class _Version(argparse.Action):
    """--version: walvault's version and the scan core it runs (looked up only when asked)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version and the scan core, then exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__, scancore

        print(f"walvault {__version__}\nscan core: {scancore.describe()}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="walvault", description="Check and keep the write-ahead logs of Tarantool and limestone.",
                     epilog="Exit codes: 0 intact/done, 1 findings, 2 cannot check.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_text in (("inspect", "list what is there: every file, its vclock or epochs, rows, ranges"),
                            ("verify", "check that every block, row, entry and chain link is intact")):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        if name == "verify":
            cmd.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                             help="files or directories; with --repo and no PATH: every backup and the archive; "
                             "with --repo and a backup id (or latest): that backup")
            _repo_arguments(cmd, required=False)
            cmd.add_argument("--full", action="store_true",
                             help="with --repo: scan every file, also those the ledger knows as verified")
            _spark_argument(cmd)
        else:
            cmd.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or directories")
        cmd.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="worker processes (default: one per core)")
        cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress lines on stderr (default: when stderr is a terminal)")
    cmd = sub.add_parser("rotate", help="detach a limestone directory's active pwal and epoch files",
                         description="Rename active pwal_NNNN files to pwal_NNNN.<ms14>.<n> and epoch to "
                         "epoch.<ms14>.<E>, only in a directory that verifies ok and no limestone holds.")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--min-bytes", type=int, default=1, metavar="N",
                     help="rotate only active pwal files of at least N bytes (default 1: every non-empty one)")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("repair", help="repair a crashed limestone directory (prints the plan unless --apply)",
                         description="Show, or with --apply carry out, what tglogutil repair does: detach active "
                         "files, cancel nondurable snippets, mark (or with --cut truncate, after saving) broken "
                         "tails.")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--apply", action="store_true", help="carry out the plan")
    cmd.add_argument("--cut", action="store_true",
                     help="with --apply: truncate broken tails (the cut bytes are saved to DIR.walvault-cut/)")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("state", help="print the durable state of a limestone directory (latest value per key)")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--format", choices=("tsv",), default="tsv",
                     help="tsv: storage_id<TAB>key_hex<TAB>value_hex per live key, sorted")
    cmd.add_argument("--parquet", metavar="URL",
                     help="also write the rows as Parquet files (part-NNNNN.parquet) under this path or fsspec URL")
    cmd.add_argument("--repo-option", action="append", default=[], metavar="KEY=VALUE",
                     help="an fsspec storage option for --parquet's URL; repeatable")
    _spark_argument(cmd)
    cmd = sub.add_parser("init", help="make a new or empty location a walvault repository (every other command "
                         "needs one)", description="Create the repository (walvault.repo and its copy) at --repo "
                         "URL. A location holding a repository already is left as it is; one holding anything else "
                         "is refused (exit 2).")
    _repo_arguments(cmd)
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("archive", help="copy the sealed files of sources into the repository, each verified first")
    cmd.add_argument("paths", nargs="+", type=Path, metavar="SOURCE", help="Tarantool data dirs, limestone dirs")
    _repo_arguments(cmd)
    _work_arguments(cmd)
    cmd = sub.add_parser("backup", help="a full or incremental backup of one source, proven restorable",
                         description="Back up one Tarantool data dir or limestone log directory: a manifest of "
                         "every file a restore needs, each stored zstd-compressed with its SHA-256.")
    cmd.add_argument("source", type=Path, metavar="SOURCE")
    _repo_arguments(cmd)
    cmd.add_argument("--type", choices=("full", "incremental"), default="full")
    cmd.add_argument("--connect", metavar="URI",
                     help="a running Tarantool ([user@]host:port): back up through box.backup.start()")
    _password_argument(cmd)
    cmd.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                     help="wait this long for another backup or expiry of the source to finish (default: fail)")
    _work_arguments(cmd)
    _spark_argument(cmd)
    cmd = sub.add_parser("snapshot", help="store a verified snapshot that covers the log up to a recorded position",
                         description="Tarantool: the newest checkpoint (.snap and its vinyl files; --connect first "
                         "runs box.snapshot()). limestone: a compacted file built from the archived pwal files and "
                         "the previous snapshot, in limestone's format, never in the source directory. Retention "
                         "deletes only what such a snapshot covers.")
    cmd.add_argument("source", type=Path, metavar="SOURCE")
    _repo_arguments(cmd)
    cmd.add_argument("--connect", metavar="URI",
                     help="a running Tarantool ([user@]host:port): box.snapshot() first, then its checkpoint")
    _password_argument(cmd)
    cmd.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                     help="wait this long for another backup, snapshot or expiry of the source to finish")
    _work_arguments(cmd)
    cmd = sub.add_parser("expire", help="retention: delete what a verified snapshot covers, outside the recovery "
                         "window (prints the plan unless --apply)",
                         description="Keep every point of the last N days restorable: delete archived log files "
                         "and backups only when the newest verified snapshot at or before the window's start covers "
                         "them. Without --apply only the plan is printed and nothing is written.")
    _repo_arguments(cmd)
    cmd.add_argument("--days", metavar="N", help="the recovery window in days (1..36500); default: the policy "
                     "stored in the repository (walvault policy)")
    cmd.add_argument("--as-of", metavar="TIME", help="judge as if it were this time (ISO 8601 UTC, or @unix "
                     "seconds; default: now)")
    cmd.add_argument("--apply", action="store_true", help="carry out the plan")
    cmd.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                     help="wait this long for a backup, snapshot or expiry of a source to finish")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("policy", help="show, or with --days store, the repository's retention policy")
    _repo_arguments(cmd)
    cmd.add_argument("--days", metavar="N", help="store this recovery window (days, 1..36500)")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("drill", help="restore a backup into a scratch directory and prove it; the verdict is "
                         "recorded beside the backup (walvault backups shows it)",
                         description="Restore BACKUP (an id, or latest) into a scratch directory, every hash "
                         "checked; Tarantool: start a real tarantool on it (where installed) and check the recorded "
                         "vclock; limestone: check the restored directory, its durable epoch and entries. Exit 1 "
                         "when the drill fails.")
    cmd.add_argument("backup", metavar="BACKUP")
    _repo_arguments(cmd)
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("backups", help="list the repository's backups, oldest first")
    _repo_arguments(cmd)
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("restore", help="restore a backup into an empty directory (optionally to a point in time)")
    cmd.add_argument("backup", metavar="BACKUP", help="a backup id, or latest")
    cmd.add_argument("target", type=Path, metavar="TARGET", help="an empty or missing directory")
    _repo_arguments(cmd)
    cmd.add_argument("--to", metavar="TIME|POSITION",
                     help="Tarantool: a vclock ({1: 120}) or a time (ISO 8601, or @unix seconds); limestone: an "
                     "epoch")
    cmd.add_argument("--json", action="store_true")
    cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return parser


def _repo_arguments(cmd, required: bool = True) -> None:
    cmd.add_argument("--repo", required=required, metavar="URL",
                     help="the repository: a path, s3://bucket/prefix, or any fsspec URL")
    cmd.add_argument("--repo-option", action="append", default=[], metavar="KEY=VALUE",
                     help="an fsspec storage option (e.g. endpoint_url=http://127.0.0.1:9000); repeatable")


def _password_argument(cmd) -> None:
    cmd.add_argument("--password-file", type=Path, metavar="FILE",
                     help=f"the password of --connect's user: the file's first line (default: the environment "
                     f"variable {PASSWORD_ENV}); never give it on the command line, where every local user sees it")


def _spark_argument(cmd) -> None:
    cmd.add_argument("--spark", metavar="MASTER",
                     help="run the work as a Spark job (spark_jobs/) on this master: local[N] or spark://host:port; "
                     "prints what the command prints without it")


def _work_arguments(cmd) -> None:
    cmd.add_argument("--level", type=int, default=3, metavar="N", help="zstd level, 1..19 (default 3)")
    cmd.add_argument("--jobs", type=int, default=None, metavar="N", help="parallel workers (default: one per core)")
    cmd.add_argument("--json", action="store_true")
    cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress lines on stderr (default: when stderr is a terminal)")


# What stderr says first when a command that writes or trusts a directory does not go ahead.
_NOT_DONE = {"init": "no repository made", "rotate": "not rotated", "repair": "not repaired", "state": "no state",
             "archive": "not archived", "backup": "not backed up", "restore": "not restored", "backups": "cannot list",
             "snapshot": "no snapshot", "expire": "nothing expired", "policy": "no policy", "drill": "no drill"}


def main(argv: list[str] | None = None, runner=None) -> int:
    """Run one command. `runner` says where its units of work run (spark_jobs passes its own); `--spark` submits
    the command as a Spark job, which calls this again with a Spark runner."""
    from .findings import Refused
    from .limestone.layout import LiveError

    parser = _parser()
    args = parser.parse_args(argv)
    if wrong := _usage_error(args):
        print(f"walvault: {wrong}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if getattr(args, "connect", None):
        try:
            args.connect = _connect_uri(args)
        except ValueError as e:
            print(f"walvault: {e}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
    if getattr(args, "spark", None):
        if runner is not None:
            print("walvault: --spark inside a Spark job", file=sys.stderr)
            return EXIT_CANNOT_CHECK
        from spark_jobs.submit import submit_command  # the Spark side is imported only when asked for

        return submit_command(args)
    if runner is None:
        from .runner import LocalRunner

        runner = LocalRunner(getattr(args, "jobs", None))
    args.runner = runner
    # A file name that is not valid UTF-8 must print (escaped) rather than end the run.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    from .repository import RepositoryError
    from .repository.lease import LeaseBusy, LeaseLost
    from .repository.storage import UnsafeName
    from .runner import WorkFailed
    from .tarantool.live import LiveError as TarantoolLiveError

    not_done = _NOT_DONE.get(args.command, "cannot check")
    try:
        if args.command == "verify" and args.repo and (not args.paths or names_backup(args.paths)):
            return _verify_repo(args)
        if args.command in ("inspect", "verify"):
            return _verify(args)
        return globals()[f"_{args.command}"](args)
    except (LeaseBusy, LeaseLost, UnsafeName) as e:
        print(f"walvault: {not_done}: {e}", file=sys.stderr)
        return EXIT_FINDINGS
    except (OSError, LiveError, RepositoryError, TarantoolLiveError, WorkFailed) as e:
        print(f"walvault: {not_done}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    except Refused as e:
        print(f"walvault: {not_done}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK if e.status == "cannot_check" else EXIT_FINDINGS


def _usage_error(args) -> str | None:
    """What is wrong with a command line that argparse lets through (checked before anything runs, also before a
    Spark job is submitted)."""
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        return "--jobs must be at least 1"
    if getattr(args, "level", None) is not None and not 1 <= args.level <= 19:
        return "--level is 1..19"
    if args.command == "verify" and not args.paths and not args.repo:
        return "verify needs a PATH (or --repo URL to verify a repository)"
    if args.command == "verify" and args.repo and names_backup(args.paths) and len(args.paths) > 1:
        return "verify --repo takes at most one BACKUP"
    if args.command == "repair" and args.cut and not args.apply:
        return "--cut goes with --apply (without --apply nothing is changed anyway)"
    if args.command == "rotate" and args.min_bytes < 0:
        return "--min-bytes must not be negative"
    if args.command in ("expire", "policy") and args.days is not None:
        from .command.expire import check_days

        try:
            check_days(args.days)
        except ValueError as e:
            return f"--days: {e}"
    if getattr(args, "wait", None) is not None and not (math.isfinite(args.wait) and args.wait >= 0):
        return "--wait must be a finite number of seconds, not negative"
    if args.command == "expire" and args.as_of is not None and _as_of(args.as_of) is None:
        return f"--as-of {args.as_of!r} is not a time (ISO 8601 UTC, or @unix seconds)"
    if args.command == "restore" and args.to is not None and not (_LIMESTONE_POINT.fullmatch(args.to)
                                                                  or _point(args.to)):
        return (f"--to {args.to!r} is not a point: a vclock ('{{1: 120, 0: 5}}' or '1:120,0:5'), a time (ISO 8601, "
                "or @unix seconds) or, for limestone, an epoch (N or epoch:N)")
    if getattr(args, "password_file", None) is not None and not args.connect:
        return "--password-file goes with --connect (the password of its user)"
    if getattr(args, "repo", None) is not None:  # verify's is optional
        from .repository import RepositoryError
        from .repository.storage import check_url

        try:
            check_url(args.repo)
        except RepositoryError as e:
            return f"--repo: {e}"
    return None


_LIMESTONE_POINT = re.compile(r"(epoch:)?[0-9]+")  # ASCII digits: str.isdigit() takes '²', which int() refuses


def _point(text: str):
    """The Tarantool point (pitr.Point) a --to or --as-of names; None when it names none walvault can use."""
    from .tarantool.pitr import format_time, parse_point

    try:
        point = parse_point(text)
        if point.time is not None:
            format_time(point.time)  # a time walvault can print (not 1e30)
    except (ValueError, OverflowError, OSError):
        return None
    return point


def _as_of(text: str) -> float | None:
    point = _point(text)
    return point.time if point is not None else None


def _connect_uri(args) -> str:
    """--connect with its user's password: from the URI (warned: a command line is visible to every local user),
    from --password-file, or from WALVAULT_PASSWORD. The result is kept in memory only; ValueError says what is
    wrong (never the password)."""
    from .tarantool.live import split_password, with_password

    bare, password = split_password(args.connect)
    if password is not None:
        if args.password_file is not None:
            raise ValueError("--connect holds a password and --password-file gives one: give it once, in the file")
        print(f"walvault: warning: a password in --connect is visible in the process list; use {PASSWORD_ENV} or "
              "--password-file", file=sys.stderr)
        return args.connect
    if args.password_file is not None:
        if "@" not in bare:
            raise ValueError("--password-file: --connect names no user (user@host:port)")
        try:
            with open(args.password_file, encoding="utf-8") as f:
                line = f.readline()
        except OSError as e:
            raise ValueError(f"--password-file {args.password_file}: cannot read it ({e.strerror or e})") from None
        except UnicodeDecodeError:
            raise ValueError(f"--password-file {args.password_file}: not UTF-8 text") from None
        password = line.removesuffix("\n").removesuffix("\r")
        if not password:
            raise ValueError(f"--password-file {args.password_file}: its first line is empty")
    else:
        password = os.environ.get(PASSWORD_ENV)
    if password is None or "@" not in bare:  # a user-less URI (guest) takes no password
        return args.connect
    return with_password(args.connect, password)


def _verify(args) -> int:
    from .command.verify import Ledger
    from .scan_paths import verify_paths

    progress = _progress(args)
    repo = _repository(args) if getattr(args, "repo", None) else None
    started = time.time()
    report = verify_paths(args.paths, runner=args.runner, progress=progress,
                          ledger=Ledger(repo, full=args.full) if repo else None)
    # An empty or wrong directory must not pass for an intact one: every path must hold a file that was checked
    # (found under it, or under where it leads: a file reached twice is listed once, under the first path).
    # A file of no kind (neither its name nor its meta says one) is not a WAL file.
    checked = [f.path for f in report.files if f.status != "in_progress" and f.kind] + [d.path for d in report.dirs]
    checked += [os.path.realpath(c) for c in checked]
    if empty := [p for p in args.paths if not any(Path(c).is_relative_to(q) for c in checked
                                                   for q in (p, os.path.realpath(p)))]:
        print(f"walvault: cannot check: no WAL files to check under {', '.join(map(str, empty))}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    # inspect says which scan core ran (the pure-Python one is much slower: a user should know).
    from .scancore import describe

    if args.json:
        _print_json(report.to_json() | ({"scan_core": describe()} if args.command == "inspect" else {}))
    else:
        from .text import render

        if args.command == "inspect":
            print(f"scan core: {describe()}")
        sys.stdout.write(render(report, detailed=args.command == "inspect", base=_common_base(args.paths)))
    if repo is not None:
        from .command.verify_report import write_source_report

        for problem in report.ledger_problems:
            print(f"walvault: warning: {problem}", file=sys.stderr)
        _keep_report(repo, write_source_report, report, [str(p) for p in args.paths], started, args.runner.name)
    if not report.checkable:
        return EXIT_CANNOT_CHECK
    return EXIT_OK if report.intact else EXIT_FINDINGS


def _limestone_dir(path: Path) -> bool:
    from .limestone.layout import is_limestone_dir

    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if not is_limestone_dir(path):
        print(f"walvault: cannot check: {path} is not a limestone log directory", file=sys.stderr)
        return False
    return True


def _rotate(args) -> int:
    from .command.rotate import rotate

    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    result = rotate(args.dir, min_bytes=args.min_bytes)
    if args.json:
        _print_json(result.to_json())
    else:
        for old, new in result.renamed:
            print(f"rotated {old} -> {new}")
        for name, why in result.skipped:
            print(f"kept    {name}: {why}")
        if not result.renamed:
            print("nothing rotated")
    return EXIT_OK


def _repair(args) -> int:
    from .command.repair import apply_repair, plan_repair

    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    plan = plan_repair(args.dir, cut=args.cut)
    if args.apply and plan.needed:
        plan = apply_repair(plan)
    if args.json:
        _print_json(plan.to_json())
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


def _state(args) -> int:
    from .limestone.state import format_tsv
    from .command.state import directory_state

    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    parquet = None
    if args.parquet:
        from .repository.storage import parse_options
        from .parquet import ParquetOutput

        parquet = ParquetOutput(args.parquet, parse_options(args.repo_option))
        parquet.check_empty()
    for rows in _batches(directory_state(args.dir, runner=args.runner, parquet=parquet)):
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


def _progress(args) -> bool:
    return sys.stderr.isatty() if args.progress is None else args.progress


def _repository(args):
    """The repository of --repo; RepositoryError (exit 2) when the location holds none: only `init` makes one."""
    from .repository import Repository
    from .repository.storage import parse_options

    return Repository(args.repo, parse_options(args.repo_option))


def _init(args) -> int:
    from .repository import Repository
    from .repository.storage import parse_options

    repo, created = Repository.init(args.repo, parse_options(args.repo_option))
    if args.json:
        _print_json({"repository": repo.display, "created": created, "format": repo.info.get("format"),
                     "since": repo.info.get("created")})
    elif created:
        print(f"created the walvault repository {repo.display} (format {repo.info.get('format')})")
    else:
        print(f"{repo.display} is a walvault repository already (format {repo.info.get('format')}, created "
              f"{repo.info.get('created')}): nothing changed")
    return EXIT_OK


def _archive(args) -> int:
    from .command.archive import archive

    repo = _repository(args)
    result = archive(args.paths, repo, level=args.level, runner=args.runner, progress=_progress(args))
    if args.json:
        _print_json(result.to_json())
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
    return EXIT_OK if result.ok else EXIT_FINDINGS


def _backup(args) -> int:
    from .command.backup import backup
    from .family import plan_for

    plan_for(args.source, check_only=True)
    repo = _repository(args)
    result = backup(args.source, repo, incremental=args.type == "incremental", connect=args.connect,
                    level=args.level, runner=args.runner, progress=_progress(args), wait=args.wait)
    if args.json:
        _print_json(result.to_json())
    else:
        m = result.manifest
        for note in result.notes:
            print(f"note: {note}")
        for leftover in result.removed_leftovers:
            print(f"removed the leftovers of interrupted backup {leftover}")
        print(f"backup {m.id} ({m.type}{', parent ' + m.parent if m.parent else ''}) of {m.family} {m.instance}: "
              f"{len(m.files)} files, {m.bytes:,} bytes, {m.stored_bytes:,} stored; restores to {m.position}")
    return EXIT_OK


def _snapshot(args) -> int:
    from .command.snapshot import snapshot
    from .family import plan_for

    plan_for(args.source, check_only=True)  # a wrong SOURCE is said first
    repo = _repository(args)
    result = snapshot(args.source, repo, connect=args.connect, level=args.level, runner=args.runner,
                      progress=_progress(args), wait=args.wait)
    m = result.manifest
    covers = m.checks.get("snapshot", {})
    if args.json:
        _print_json({**result.to_json(), "covers": covers})
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


def _expire(args) -> int:
    from .command.expire import NoPolicy, expire, render, resolve_policy

    repo = _repository(args)
    try:
        days, warning = resolve_policy(repo, args.days)
    except NoPolicy as e:
        print(f"walvault: nothing expired: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if warning:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    as_of = _as_of(args.as_of) if args.as_of else None
    result = expire(repo, days, as_of=as_of, apply=args.apply, wait=args.wait)
    for warning in result.warnings:
        print(f"walvault: warning: {warning}", file=sys.stderr)
    if args.json:
        _print_json(result.to_json())
    else:
        print("\n".join(render(result)))
    return EXIT_FINDINGS if any(s.stopped for s in result.sources) else EXIT_OK


def _policy(args) -> int:
    from .command.expire import check_days, stored_policy

    repo = _repository(args)  # a typo in --repo must not leave a repository holding only a policy
    if args.days is not None:  # both files are written: this is also how a damaged one is mended
        policy = repo.set_policy(check_days(args.days))
    else:
        policy, warning = stored_policy(repo)
        if warning:
            print(f"walvault: warning: {warning}", file=sys.stderr)
    if args.json:
        _print_json({"policy": policy})
    elif policy is None:
        print("no retention policy stored: expire needs --days")
    else:
        print(f"retention policy: keep every point of the last {policy['days']} days (set {policy['set']} by "
              f"{policy['by']})")
    return EXIT_OK


def _drill(args) -> int:
    from .command.drill import drill

    result = drill(_repository(args), args.backup)
    if args.json:
        _print_json(result.to_json())
    else:
        print(f"drill of backup {result.backup} ({result.family} {result.instance}): {result.status.upper()}")
        for check in result.checks:
            print(f"  {check}")
        if result.problem:
            print(f"  problem: {result.problem}")
    return EXIT_OK if result.status == "ok" else EXIT_FINDINGS


def _backups(args) -> int:
    from .command.repo_verify import list_backups

    backups = list_backups(_repository(args))
    if args.json:
        _print_json({"backups": backups})
        return EXIT_OK
    for b in backups:
        parent = f" <- {b['parent']}" if b["parent"] else ""
        size = f"{b['files']} files, {b['bytes']:,} bytes ({b['stored_bytes']:,} stored)" if b["files"] is not None else ""
        drill = b.get("drill")
        drilled = ""
        if drill:
            drilled = f"  {'DRILL FAILED' if drill['status'] == 'failed' else 'drill ' + drill['status']} {drill['time']}"
        print(f"{b['id']}  {b['type'] or '-':11} {b['family']} {b['source']}  {b['status']}  {size}  "
              f"{b['position'] or ''}{parent}{drilled}")
    if not backups:
        print("no backups")
    return EXIT_OK


def _restore(args) -> int:
    from .command.restore import restore

    repo = _repository(args)
    result = restore(repo, args.backup, args.target, to=args.to, progress=_progress(args))
    if args.json:
        _print_json(result.to_json())
    else:
        for note in result.notes:
            print(f"note: {note}")
        print(f"restored backup {result.backup} into {result.target}: {result.files} files, {result.bytes:,} bytes"
              + (f" ({result.reused} kept from an interrupted run)" if result.reused else ""))
        if result.point:
            print(f"point in time: {result.point}")
    return EXIT_OK


def _verify_repo(args) -> int:
    from .command.repo_verify import verify_repository

    repo = _repository(args)
    started = time.time()
    report = verify_repository(repo, str(args.paths[0]) if args.paths else None, runner=args.runner,
                               full=args.full, progress=_progress(args))
    if args.json:
        _print_json(report.to_json())
    else:
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
            print(f"leftovers of an interrupted backup (removed by the next backup): {leftover}")
        scanned, known = report.checked_by.get("scan", 0), report.checked_by.get("ledger", 0)
        print(f"{report.objects} objects, {report.bytes:,} bytes re-hashed; {scanned} Tarantool files scanned, "
              f"{known} verified before (ledger); verdict: {'INTACT' if report.intact else 'DAMAGED'}")
    from .command.verify_report import write_repository_report

    _keep_report(repo, write_repository_report, report, str(args.paths[0]) if args.paths else None, started,
                 args.runner.name)
    return EXIT_OK if report.intact else EXIT_FINDINGS


def _keep_report(repo, write, *args) -> None:
    """Keep a verification's report in the repository, after the verdict is out: a repository that cannot be
    written (a read-only mount) does not stop a verification, it is said."""
    from .repository import RepositoryError

    sys.stdout.flush()
    try:
        where = write(repo, *args)
    except RepositoryError as e:
        print(f"walvault: warning: the report was not kept: {e}", file=sys.stderr)
        return
    print(f"walvault: report written to {repo.display}/{where}", file=sys.stderr)


def names_backup(paths: list) -> bool:
    """With --repo, PATHs are sources, unless the one given is a backup id or `latest`."""
    from .repository import is_backup_id

    return len(paths) >= 1 and all(str(p) == "latest" or is_backup_id(str(p)) for p in paths[:1])


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _common_base(paths: list[Path]) -> Path | None:
    try:
        base = Path(os.path.commonpath([p.resolve() for p in paths]))
    except ValueError:
        return None
    return base if base.is_dir() else base.parent


def run() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = EXIT_OK
    sys.exit(code)
