"""walvault: the command line, a table of commands: each names its arguments and the request (walcore.requests)
they build; walcore.frontend runs the request and prints its result, as for every other front end. Exit codes:
walcore.frontend.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import requests as rq
from .frontend import EXIT_CANNOT_CHECK, EXIT_OK, refused

RUNNERS = "walvault.runners"  # the entry point group where a package names the runner of an option (--spark)


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


class Arg:
    """One argument of a command: argparse's add_argument(*flags, **options). An option left out takes the
    request's default (the parser's default is SUPPRESS), so that each default is said once, in the request."""

    def __init__(self, *flags: str, **options):
        self.flags, self.options = flags, options


# The options several commands share, each defined once.
JSON = Arg("--json", action="store_true", help="print one JSON object instead of text")
JOBS = Arg("--jobs", type=int, metavar="N", help="worker processes (default: one per core)")
PROGRESS = Arg("--progress", action=argparse.BooleanOptionalAction,
               help="progress lines on stderr (default: when stderr is a terminal)")
LEVEL = Arg("--level", type=int, metavar="N", help="zstd level, 1..19 (default 3)")
REPO_OPTION = Arg("--repo-option", action="append", metavar="KEY=VALUE",
                  help="an fsspec storage option (e.g. endpoint_url=http://127.0.0.1:9000); repeatable")
KEY_FILE = Arg("--key-file", type=Path, metavar="FILE",
               help="an encrypted repository's key (passphrase): the file's first line (default: the environment "
               "variable WALVAULT_KEY); never give it on the command line")
REPO = (Arg("--repo", required=True, metavar="URL", help="the repository: a path, s3://bucket/prefix, or any fsspec "
            "URL"), REPO_OPTION, KEY_FILE)
PASSWORD_FILE = Arg("--password-file", type=Path, metavar="FILE",
                    help=f"the password of --connect's user: the file's first line (default: the environment "
                    f"variable {rq.PASSWORD_ENV}); never give it on the command line, where every local user sees it")
SPARK = Arg("--spark", metavar="MASTER", help="run the work as a Spark job (spark_jobs/) on this master: local[N] or "
            "spark://host:port; prints what the command prints without it")
WORK = (LEVEL, JOBS, JSON, PROGRESS)


def connect(what: str) -> tuple[Arg, Arg]:
    return Arg("--connect", metavar="URI", help=f"a running Tarantool ([user@]host:port): {what}"), PASSWORD_FILE


def wait(help_text: str) -> Arg:
    return Arg("--wait", type=float, metavar="SECONDS", help=help_text)


def days(help_text: str) -> Arg:
    return Arg("--days", metavar="N", help=help_text)


def keep_full(help_text: str) -> Arg:
    return Arg("--keep-full", type=int, metavar="N", help=help_text)


@dataclass(frozen=True)
class Command:
    name: str
    request: type[rq.Request]
    help: str
    arguments: tuple
    description: str | None = None
    build: Callable | None = None  # the request from the parsed arguments, when they do not map field by field


def _verify_request(fields: dict) -> rq.VerifyRequest:
    paths = fields.pop("paths", [])
    if fields.get("repo") and rq.names_backup(paths):  # with --repo, a backup id (or latest) and not sources
        fields["backup"], paths = str(paths[0]), paths[1:]
    return rq.VerifyRequest(paths=paths, **fields)


COMMANDS = (
    Command("inspect", rq.InspectRequest, "list what is there: every file, its vclock or epochs, rows, ranges",
            (Arg("paths", nargs="+", type=Path, metavar="PATH", help="files or directories"), JSON, JOBS, PROGRESS)),
    Command("verify", rq.VerifyRequest, "check that every block, row, entry and chain link is intact",
            (Arg("paths", nargs="*", type=Path, metavar="PATH",
                 help="files or directories; with --repo and no PATH: every backup and the archive; with --repo and "
                 "a backup id (or latest): that backup"),
             Arg("--repo", metavar="URL", help="the repository: a path, s3://bucket/prefix, or any fsspec URL"),
             REPO_OPTION, KEY_FILE,
             Arg("--full", action="store_true",
                 help="with --repo: scan every file, also those the ledger knows as verified"),
             SPARK, JSON, JOBS, PROGRESS), build=_verify_request),
    Command("rotate", rq.RotateRequest, "detach a limestone directory's active pwal and epoch files",
            (Arg("dir", type=Path, metavar="DIR"),
             Arg("--min-bytes", type=int, metavar="N",
                 help="rotate only active pwal files of at least N bytes (default 1: every non-empty one)"), JSON),
            description="Rename active pwal_NNNN files to pwal_NNNN.<ms14>.<n> and epoch to epoch.<ms14>.<E>, only in "
            "a directory that verifies ok and no limestone holds."),
    Command("repair", rq.RepairRequest, "repair a crashed limestone directory (prints the plan unless --apply)",
            (Arg("dir", type=Path, metavar="DIR"), Arg("--apply", action="store_true", help="carry out the plan"),
             Arg("--cut", action="store_true",
                 help="with --apply: truncate broken tails (the cut bytes are saved to DIR.walvault-cut/)"), JSON),
            description="Show, or with --apply carry out, what tglogutil repair does: detach active files, cancel "
            "nondurable snippets, mark (or with --cut truncate, after saving) broken tails."),
    Command("state", rq.StateRequest, "print the durable state of a limestone directory (latest value per key)",
            (Arg("dir", type=Path, metavar="DIR"),
             Arg("--format", choices=("tsv",), help="tsv: storage_id<TAB>key_hex<TAB>value_hex per live key, sorted"),
             Arg("--parquet", metavar="URL", help="also write the rows as Parquet files (part-NNNNN.parquet) under "
                 "this path or fsspec URL"),
             Arg("--repo-option", action="append", metavar="KEY=VALUE",
                 help="an fsspec storage option for --parquet's URL; repeatable"), SPARK)),
    Command("init", rq.InitRequest, "make a new or empty location a walvault repository (every other command needs "
            "one)", (*REPO, Arg("--lock-days", type=int, metavar="N", help="S3 with Object Lock: write every backup "
                                "object, manifest and archived file retained N days (expire keeps them until then)"),
                     Arg("--lock-mode", choices=("governance", "compliance"),
                         help="the Object Lock mode with --lock-days (default governance)"),
                     Arg("--encrypt", action="store_true", help="an encrypted repository, under the key of "
                         "WALVAULT_KEY or --key-file"), JSON),
            description="Create the repository (walvault.repo and its copy) at --repo URL. A "
            "location holding a repository already is left as it is; one holding anything else is refused (exit 2), "
            "as is --lock-days on storage without Object Lock enabled."),
    Command("key", rq.KeyRequest, "rotate the key of an encrypted repository (its data is not re-encrypted)",
            (Arg("action", choices=("rotate",)), *REPO,
             Arg("--new-key-file", type=Path, metavar="FILE", help="the new key: the file's first line (default: "
                 "the environment variable WALVAULT_NEW_KEY)"), JSON),
            description="Add a key-encryption key for future objects and put the repository's whole keyring under "
            "the new key (WALVAULT_NEW_KEY or --new-key-file), in one atomic replacement of walvault.key; the "
            "current key comes from WALVAULT_KEY or --key-file. A rotation that was killed is finished by running it "
            "again."),
    Command("archive", rq.ArchiveRequest, "copy the sealed files of sources into the repository, each verified first",
            (Arg("paths", nargs="+", type=Path, metavar="SOURCE", help="Tarantool data dirs, limestone dirs"), *REPO,
             *WORK)),
    Command("backup", rq.BackupRequest, "a full or incremental backup of one source, proven restorable",
            (Arg("source", type=Path, metavar="SOURCE"), *REPO, Arg("--type", choices=("full", "incremental")),
             Arg("--note", action="append", dest="notes", metavar="KEY=VALUE",
                 help="a note kept in the backup's manifest (walvault backups shows it); repeatable"),
             *connect("back up through box.backup.start()"),
             wait("wait this long for another backup or expiry of the source to finish (default: fail)"), *WORK,
             SPARK),
            description="Back up one Tarantool data dir or limestone log directory: a manifest of every file a "
            "restore needs, each stored zstd-compressed with its SHA-256."),
    Command("snapshot", rq.SnapshotRequest, "store a verified snapshot that covers the log up to a recorded position",
            (Arg("source", type=Path, metavar="SOURCE"), *REPO,
             *connect("box.snapshot() first, then its checkpoint"),
             wait("wait this long for another backup, snapshot or expiry of the source to finish"), *WORK),
            description="Tarantool: the newest checkpoint (.snap and its vinyl files; --connect first runs "
            "box.snapshot()). limestone: a compacted file built from the archived pwal files and the previous "
            "snapshot, in limestone's format, never in the source directory. Retention deletes only what such a "
            "snapshot covers."),
    Command("expire", rq.ExpireRequest, "retention: delete what a verified snapshot covers, outside the recovery "
            "window (prints the plan unless --apply)",
            (*REPO, days("the recovery window in days (1..36500); default: the policy stored in the repository "
                         "(walvault policy)"),
             Arg("--as-of", metavar="TIME",
                 help="judge as if it were this time (ISO 8601 UTC, or @unix seconds; default: now)"),
             keep_full("keep the newest N full backups of each source (with their chains) whatever the window says "
                       "(0: none); default: the policy stored in the repository"),
             Arg("--apply", action="store_true", help="carry out the plan"),
             wait("wait this long for a backup, snapshot or expiry of a source to finish"), JSON),
            description="Keep every point of the last N days restorable: delete archived log files and backups only "
            "when the newest verified snapshot at or before the window's start covers them. Pinned backups (walvault "
            "pin) and the newest --keep-full full backups are kept with their chains. Without --apply only "
            "the plan is printed and nothing is written."),
    Command("policy", rq.PolicyRequest, "show, or with --days or --keep-full store, the repository's retention "
            "policy",
            (*REPO, days("store this recovery window (days, 1..36500)"),
             keep_full("store this count: the newest N full backups of each source (with their chains) are kept "
                       "whatever the window says (0: none)"), JSON),
            description="Show the stored retention policy; --days and --keep-full each store their part and keep the "
            "other as stored (a first policy needs --days)."),
    Command("pin", rq.PinRequest, "keep a backup and its parent chain whatever retention says",
            (Arg("backup", metavar="BACKUP", help="a backup id, or latest"), *REPO,
             Arg("--note", metavar="TEXT", help="why it is kept (walvault backups shows it)"),
             wait("wait this long for a backup, snapshot or expiry of its source to finish (default: refuse)"), JSON),
            description="Pin BACKUP: expire keeps it and its parent chain (kept: pinned) until walvault unpin. The pin "
            "is a small object beside the backup's manifest, written under the source's lease. Exit 2 when there "
            "is no such backup, 1 when the source's lease is held past --wait."),
    Command("unpin", rq.UnpinRequest, "let retention judge a pinned backup again",
            (Arg("backup", metavar="BACKUP", help="a backup id, or latest"), *REPO,
             wait("wait this long for a backup, snapshot or expiry of its source to finish (default: refuse)"), JSON)),
    Command("drill", rq.DrillRequest, "restore a backup into a scratch directory and prove it; the verdict is recorded "
            "beside the backup (walvault backups shows it)", (Arg("backup", metavar="BACKUP"), *REPO, JSON),
            description="Restore BACKUP (an id, or latest) into a scratch directory, every hash checked; Tarantool: "
            "start a real tarantool on it (where installed) and check the recorded vclock; limestone: check the "
            "restored directory, its durable epoch and entries. Exit 1 when the drill fails."),
    Command("backups", rq.BackupsRequest, "list the repository's backups, oldest first", (*REPO, JSON)),
    Command("status", rq.StatusRequest, "per source: its newest good backup, archive, lag, recovery window and "
            "drill; as text, JSON or Prometheus metrics",
            (*REPO, JSON, Arg("--prometheus", action="store_true", help="print the Prometheus text exposition"),
             Arg("--textfile", type=Path, metavar="PATH", help="also write the exposition to PATH, atomically (node "
                 "exporter's textfile collector reads *.prom)"),
             Arg("--serve", metavar="HOST:PORT", help="serve the exposition at http://HOST:PORT/metrics, taken anew "
                 "for each scrape, until stopped"),
             Arg("--max-backup-age", type=float, metavar="HOURS",
                 help="a source whose newest good backup is older is stale (default 26)"),
             Arg("--max-archive-lag", type=float, metavar="MINUTES",
                 help="a source whose archive lags its directory on this host by more is stale (default 60)")),
            description="Per source of the repository: the newest backup that restores (its id, age and position), "
            "how far the archive reaches and how old that is, how far it lags the source directory where that is "
            "on this host, whether the retention policy's recovery window is covered (by which anchor), and the "
            "last drill's verdict; and the repository's bytes by kind. Exit 1 when a source is stale, uncovered "
            "or failed its last drill."),
    Command("stream", rq.StreamRequest, "receive a running Tarantool's rows as an anonymous replica, or follow a "
            "limestone directory's active files, and store them every few seconds, until stopped",
            (Arg("source", nargs="?", type=Path, default=None, metavar="SOURCE",
                 help="a limestone directory on this host (or --connect)"),
             Arg("--connect", metavar="URI", help="the running Tarantool to stream ([user@]host:port; "
                 "a user with the replication role)"), PASSWORD_FILE, *REPO,
             Arg("--spool", type=Path, metavar="DIR", help="where the open segment is written (default "
                 "var/stream-spool): keep it on a local disk that survives a restart"),
             Arg("--segment-seconds", type=float, metavar="S", help="seal and store a segment (limestone: store "
                 "what grew) every S seconds (default 1)"),
             Arg("--segment-bytes", type=int, metavar="B", help="or once it holds B bytes (default 16 MiB)"),
             Arg("--timeout", type=float, metavar="S", help="take the connection for lost after S seconds without "
                 "a packet, not even the instance's heartbeat (default 30; it sends one every replication_timeout)"),
             Arg("--status", type=Path, metavar="FILE", help="keep the stream's state in FILE (JSON, rewritten "
                 "atomically): connected, vclock, newest segment stored, gaps; limestone: durable epoch stored, "
                 "problems"),
             JSON),
            description="Subscribe to a running Tarantool as an anonymous replica from the newest position the "
            "repository holds of it, and store what it commits as verified segments every --segment-seconds: an "
            "RPO of seconds. With SOURCE, a limestone directory on this host: the durable part of its pwal files "
            "and its durable epoch stored as partial objects every --segment-seconds, the directory only read. "
            "Stops on SIGTERM or SIGINT, sealing and storing the open segment. Exit 0 when stopped, 1 when rows "
            "never came (a gap: the instance no longer had them), a limestone file could not be followed, or another "
            "streamer of the instance runs, 2 when the instance cannot be reached at start or SOURCE is no "
            "limestone directory."),
    Command("restore", rq.RestoreRequest, "restore a backup into an empty directory (optionally to a point in time)",
            (Arg("backup", metavar="BACKUP", help="a backup id, or latest"),
             Arg("target", type=Path, metavar="TARGET", help="an empty or missing directory"), *REPO,
             Arg("--to", metavar="TIME|POSITION", help="Tarantool: a vclock ({1: 120}), a time (ISO 8601, or @unix "
                 "seconds) or end (the newest point the repository holds: its archive, then the stream's "
                 "segments); limestone: an epoch, or end (its archive, then the stream's partials)"), JSON, PROGRESS)),
    Command("copy", rq.CopyRequest, "copy backups with their parent chains (and the archive) into a second "
            "repository, every object verified there",
            (Arg("backups", nargs="*", metavar="BACKUP", help="backup ids (or latest)"),
             Arg("--all", action="store_true", help="every backup of the source repository"),
             Arg("--from", dest="from_repo", required=True, metavar="URL", help="the repository to copy from"),
             Arg("--from-option", action="append", metavar="KEY=VALUE", help="an fsspec storage option of --from"),
             Arg("--to", dest="to_repo", required=True, metavar="URL",
                 help="the repository to copy into (walvault init made it)"),
             Arg("--to-option", action="append", metavar="KEY=VALUE", help="an fsspec storage option of --to"),
             KEY_FILE, Arg("--to-key-file", type=Path, metavar="FILE", help="an encrypted --to's key: the file's first "
                           "line (default: the environment variable WALVAULT_TO_KEY; --from's key never stands in)"),
             Arg("--archive", action="store_true", help="also the archive (and stream segments) of their sources, "
                 "of every source with --all"),
             wait("wait this long for a backup, copy or expiry of a source at the destination to finish"), JSON),
            description="Copy backups, parents first, as stored (never recompressed) into a second repository: each "
            "object read back there and checked against its SHA-256, each backup's manifest written last. Run "
            "again, it copies only what is missing. Exit 1 when something was not copied (the destination holds "
            "other bytes under a name, the source's are damaged)."),
)
_BY_NAME = {c.name: c for c in COMMANDS}


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    """The command line's parser: with the subparser of its command alone when it names one (building all 21 took
    a fifth of a short command's time), else with all of them (for --help, and for a usage error naming them)."""
    parser = _Parser(prog="walvault", description="Check and keep the write-ahead logs of Tarantool and limestone.",
                     epilog="Exit codes: 0 intact/done, 1 findings, 2 cannot check.")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    named = next((a for a in argv if not a.startswith("-")), None)
    for command in (_BY_NAME[named],) if named in _BY_NAME else COMMANDS:
        cmd = sub.add_parser(command.name, help=command.help, description=command.description or command.help,
                             argument_default=argparse.SUPPRESS)
        for arg in command.arguments:
            cmd.add_argument(*arg.flags, **arg.options)
    return parser


def _request(args: argparse.Namespace) -> rq.Request:
    """The request of a parsed command line (its storage options still as given: see `_storage_options`)."""
    command = _BY_NAME[args.command]
    names = {f.name for f in dataclasses.fields(command.request)} - {"repo_options"}
    fields = {k: v for k, v in vars(args).items() if k in names}
    return command.build(fields) if command.build else command.request(**fields)


def main(argv: list[str] | None = None) -> int:
    """Run one command line; `--spark` hands the request to the runner its package registered (spark_jobs)."""
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(argv).parse_args(argv)
    request = _request(args)
    if (code := refused(request)) is not None:
        return code
    if getattr(request, "connect", None):
        try:
            request = dataclasses.replace(request, connect=_connect_uri(request), password_file=None)
        except ValueError as e:
            print(f"walvault: {e}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
    try:
        _keys_to_environment(args)
    except ValueError as e:
        print(f"walvault: {request.not_done}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    from .repository import RepositoryError

    try:
        request = _storage_options(request, getattr(args, "repo_option", []))
        if isinstance(request, rq.CopyRequest):
            from .repository.storage import parse_options

            request = dataclasses.replace(request, from_options=parse_options(getattr(args, "from_option", [])),
                                          to_options=parse_options(getattr(args, "to_option", [])))
    except RepositoryError as e:
        print(f"walvault: {request.not_done}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if master := getattr(args, "spark", None):
        from .runner import registered

        try:
            submit = registered(RUNNERS, "spark")
        except LookupError as e:
            print(f"walvault: --spark: {e}", file=sys.stderr)
            return EXIT_CANNOT_CHECK
        return submit(request, master)
    from .frontend import run
    from .runner import LocalRunner

    return run(request, LocalRunner(getattr(request, "jobs", None)))


def _storage_options(request: rq.Request, pairs: list[str]) -> rq.Request:
    """The request with the --repo-option pairs as storage options, when it has a location to use them on."""
    if not (getattr(request, "repo", None) or getattr(request, "parquet", None)):
        return request
    from .repository.storage import parse_options

    return dataclasses.replace(request, repo_options=parse_options(pairs))


def _keys_to_environment(args: argparse.Namespace) -> None:
    """--key-file, --new-key-file and --to-key-file as WALVAULT_KEY, WALVAULT_NEW_KEY and WALVAULT_TO_KEY: where the
    repositories take their keys from, in this process and the workers and jobs it starts."""
    options = [o for o in ("key_file", "new_key_file", "to_key_file") if getattr(args, o, None) is not None]
    if not options:
        return  # the repository module that names the variables is not needed
    import os

    from .repository.encrypted import KEY_ENV, NEW_KEY_ENV, TO_KEY_ENV

    env = {"key_file": KEY_ENV, "new_key_file": NEW_KEY_ENV, "to_key_file": TO_KEY_ENV}
    for option in options:
        os.environ[env[option]] = rq.secret_file_line(getattr(args, option), f"--{option.replace('_', '-')}")


def _connect_uri(request) -> str:
    """--connect with its user's password (walcore.requests.connect_with_password); a password in the URI itself
    is warned about: a command line is visible to every local user."""
    from .tarantool.live import split_password

    if split_password(request.connect)[1] is not None and request.password_file is None:
        print(f"walvault: warning: a password in --connect is visible in the process list; use {rq.PASSWORD_ENV} or "
              "--password-file", file=sys.stderr)
    return rq.connect_with_password(request.connect, request.password_file)


def run() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = EXIT_OK
    sys.exit(code)
