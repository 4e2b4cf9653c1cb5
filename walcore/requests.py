"""What each command is asked to do: one dataclass per command, built alike by every front end (the command line,
a Spark job's plan, an Airflow task) and checked in one place, `problem()`, before anything runs.

A request's JSON (`to_json`, `from_json`) is its fields by name: paths as strings, the rest as they are. The
defaults here are the commands' defaults; the command line takes them from here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

PASSWORD_ENV = "WALVAULT_PASSWORD"  # the password of --connect's user, when --password-file does not give it


@dataclass(kw_only=True)
class Request:
    command: ClassVar[str]
    # What stderr says first when the command does not go ahead.
    not_done: ClassVar[str] = "cannot check"

    def problem(self) -> str | None:
        """What is wrong with the request, said as the command line's options are (None: nothing)."""
        return None

    def to_json(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: dict):
        """The request of `data` (TypeError naming an unknown field); paths become Paths."""
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        if unknown := set(data) - set(kinds):
            raise TypeError(f"{cls.command} takes no {', '.join(sorted(unknown))}")
        return cls(**{k: _typed(kinds[k], v) for k, v in data.items()})


def _plain(value):
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _typed(kind: str, value):
    if value is None:
        return None
    if kind.startswith("Path"):
        return Path(value)
    if kind.startswith("list[Path]"):
        return [Path(v) for v in value]
    return value


# -- checks shared by several commands, each said once


def _jobs_problem(jobs: int | None) -> str | None:
    return "--jobs must be at least 1" if jobs is not None and jobs < 1 else None


def _level_problem(level: int) -> str | None:
    return None if 1 <= level <= 19 else "--level is 1..19"


def _wait_problem(wait: float) -> str | None:
    return None if math.isfinite(wait) and wait >= 0 else "--wait must be a finite number of seconds, not negative"


def _days_problem(days) -> str | None:
    if days is None:
        return None
    from .command.expire import check_days

    try:
        check_days(days)
    except ValueError as e:
        return f"--days: {e}"
    return None


def _keep_full_problem(keep_full: int | None) -> str | None:
    from .retention import check_keep_full

    problem = _value_problem(check_keep_full, keep_full) if keep_full is not None else None
    return problem and f"--keep-full: {problem}"


def _value_problem(check, value) -> str | None:
    """What `check(value)` refuses (its ValueError's message); None: nothing."""
    try:
        check(value)
    except ValueError as e:
        return str(e)
    return None


def _password_problem(password_file: Path | None, connect: str | None) -> str | None:
    return "--password-file goes with --connect (the password of its user)" if password_file is not None \
        and not connect else None


def _repo_problem(repo: str | None, option: str = "--repo") -> str | None:
    if repo is None:
        return None
    from .repository import RepositoryError
    from .repository.storage import check_url

    try:
        check_url(repo)
    except RepositoryError as e:
        return f"{option}: {e}"
    return None


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p is not None), None)


_LIMESTONE_POINT = re.compile(r"(epoch:)?[0-9]+")  # ASCII digits: str.isdigit() takes '²', which int() refuses


def point(text: str):
    """The Tarantool point (pitr.Point) a --to or --as-of names; None when it names none walvault can use."""
    from .tarantool.pitr import format_time, parse_point

    try:
        found = parse_point(text)
        if found.time is not None:
            format_time(found.time)  # a time walvault can print (not 1e30)
    except (ValueError, OverflowError, OSError):
        return None
    return found


def as_of_time(text: str) -> float | None:
    found = point(text)
    return found.time if found is not None else None


def names_backup(paths: list) -> bool:
    """With --repo, PATHs are sources, unless the one given is a backup id or `latest`."""
    from .repository import is_backup_id

    return len(paths) >= 1 and all(str(p) == "latest" or is_backup_id(str(p)) for p in paths[:1])


def secret_file_line(path: Path, option: str) -> str:
    """The first line of a file holding a secret (a password, a key), given as `option`; ValueError names the file,
    never its content."""
    try:
        with open(path, encoding="utf-8") as f:
            line = f.readline()
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{option} {path}: not UTF-8 text") from None
    secret = line.removesuffix("\n").removesuffix("\r")
    if not secret:
        raise ValueError(f"{option} {path}: its first line is empty")
    return secret


def connect_with_password(connect: str, password_file: Path | None) -> str:
    """A --connect URI with its user's password: its own, the first line of `password_file`, or $WALVAULT_PASSWORD.
    The result is kept in memory only; ValueError says what is wrong (never the password)."""
    from .tarantool.live import LiveError, split_password, with_password

    bare, password = split_password(connect)
    if password is not None:
        if password_file is not None:
            raise ValueError("--connect holds a password and --password-file gives one: give it once, in the file")
        return connect
    if password_file is not None:
        if "@" not in bare:
            raise ValueError("--password-file: --connect names no user (user@host:port)")
        password = secret_file_line(password_file, "--password-file")
    else:
        password = os.environ.get(PASSWORD_ENV)
    if password is None or "@" not in bare:  # a user-less URI (guest) takes no password
        return connect
    try:
        return with_password(connect, password)
    except LiveError as e:
        raise ValueError(str(e)) from None


# -- the requests


@dataclass(kw_only=True)
class VerifyRequest(Request):
    """Sources (`paths`), or with `repo` and no paths the repository, or with `backup` one backup of it."""
    command = "verify"
    paths: list[Path] = field(default_factory=list)
    backup: str | None = None
    repo: str | None = None
    repo_options: dict = field(default_factory=dict)
    full: bool = False
    json: bool = False
    jobs: int | None = None
    progress: bool | None = None

    def problem(self):
        return _first(_jobs_problem(self.jobs),
                      "verify needs a PATH (or --repo URL to verify a repository)" if not self.paths
                      and not self.backup and not self.repo else None,
                      "verify --repo takes at most one BACKUP" if self.backup and self.paths else None,
                      _repo_problem(self.repo))


@dataclass(kw_only=True)
class InspectRequest(VerifyRequest):
    """What verify checks, listed in detail (no repository)."""
    command = "inspect"


@dataclass(kw_only=True)
class RotateRequest(Request):
    command, not_done = "rotate", "not rotated"
    dir: Path
    min_bytes: int = 1
    json: bool = False

    def problem(self):
        return "--min-bytes must not be negative" if self.min_bytes < 0 else None


@dataclass(kw_only=True)
class RepairRequest(Request):
    command, not_done = "repair", "not repaired"
    dir: Path
    apply: bool = False
    cut: bool = False
    json: bool = False

    def problem(self):
        return "--cut goes with --apply (without --apply nothing is changed anyway)" if self.cut and not self.apply \
            else None


@dataclass(kw_only=True)
class StateRequest(Request):
    command, not_done = "state", "no state"
    dir: Path
    parquet: str | None = None
    repo_options: dict = field(default_factory=dict)  # fsspec storage options of the parquet URL


@dataclass(kw_only=True)
class _RepoRequest(Request):
    """A command on the repository of `repo` (checked last, after the command's own options)."""
    repo: str
    repo_options: dict = field(default_factory=dict)
    json: bool = False

    def problem(self):
        return _repo_problem(self.repo)


@dataclass(kw_only=True)
class InitRequest(_RepoRequest):
    command, not_done = "init", "no repository made"
    encrypt: bool = False
    lock_days: int | None = None  # S3 Object Lock: immutable objects retained this many days; None: no lock
    lock_mode: str = "governance"

    def problem(self):
        from .repository.storage import LOCK_MODES

        return _first("--lock-days must be a whole number of days, 1 to 36500" if self.lock_days is not None
                      and not (isinstance(self.lock_days, int) and 1 <= self.lock_days <= 36500) else None,
                      f"--lock-mode is one of {', '.join(LOCK_MODES)}" if self.lock_mode not in LOCK_MODES else None,
                      "--lock-mode goes with --lock-days" if self.lock_days is None and self.lock_mode != "governance"
                      else None, super().problem())


@dataclass(kw_only=True)
class KeyRequest(_RepoRequest):
    """`walvault key rotate`: the key of an encrypted repository (the keys themselves come from the environment)."""
    command, not_done = "key", "key not rotated"
    action: str = "rotate"


@dataclass(kw_only=True)
class ArchiveRequest(_RepoRequest):
    command, not_done = "archive", "not archived"
    paths: list[Path]
    level: int = 3
    jobs: int | None = None
    progress: bool | None = None

    def problem(self):
        return _first(_jobs_problem(self.jobs), _level_problem(self.level), super().problem())


@dataclass(kw_only=True)
class _SourceRequest(_RepoRequest):
    """What backup and snapshot share: one source stored into the repository, under its lease."""
    source: Path
    connect: str | None = field(default=None, repr=False)  # it may hold a password
    password_file: Path | None = None
    wait: float = 0.0
    level: int = 3
    jobs: int | None = None
    progress: bool | None = None

    def problem(self):
        return _first(_jobs_problem(self.jobs), _level_problem(self.level), _wait_problem(self.wait),
                      _password_problem(self.password_file, self.connect), super().problem())


@dataclass(kw_only=True)
class BackupRequest(_SourceRequest):
    command, not_done = "backup", "not backed up"
    type: str = "full"
    notes: list[str] = field(default_factory=list)  # KEY=VALUE, kept in the manifest

    def problem(self):
        from .repository.manifest import parse_notes

        return _first(_value_problem(parse_notes, self.notes), super().problem())


@dataclass(kw_only=True)
class SnapshotRequest(_SourceRequest):
    command, not_done = "snapshot", "no snapshot"


@dataclass(kw_only=True)
class ExpireRequest(_RepoRequest):
    command, not_done = "expire", "nothing expired"
    days: str | float | None = None  # None: the repository's stored policy
    as_of: str | None = None  # None: now
    apply: bool = False
    wait: float = 0.0
    only: set[tuple[str, str]] | None = None  # the (family, instance) sources to expire; None: every source
    keep_full: int | None = None  # None: the stored policy's

    def problem(self):
        return _first(_days_problem(self.days), _keep_full_problem(self.keep_full), _wait_problem(self.wait),
                      f"--as-of {self.as_of!r} is not a time (ISO 8601 UTC, or @unix seconds)"
                      if self.as_of is not None and as_of_time(self.as_of) is None else None,
                      super().problem())


@dataclass(kw_only=True)
class PolicyRequest(_RepoRequest):
    command, not_done = "policy", "no policy"
    days: str | None = None  # None (and no keep_full): show the stored policy
    keep_full: int | None = None  # None: as stored

    def problem(self):
        return _first(_days_problem(self.days), _keep_full_problem(self.keep_full), super().problem())


@dataclass(kw_only=True)
class PinRequest(_RepoRequest):
    command, not_done = "pin", "not pinned"
    backup: str
    note: str | None = None
    wait: float = 0.0

    def problem(self):
        from .repository.pins import check_pin_note

        return _first(_value_problem(check_pin_note, self.note), _wait_problem(self.wait), super().problem())


@dataclass(kw_only=True)
class UnpinRequest(_RepoRequest):
    command, not_done = "unpin", "not unpinned"
    backup: str
    wait: float = 0.0

    def problem(self):
        return _first(_wait_problem(self.wait), super().problem())


@dataclass(kw_only=True)
class DrillRequest(_RepoRequest):
    command, not_done = "drill", "no drill"
    backup: str


@dataclass(kw_only=True)
class BackupsRequest(_RepoRequest):
    command, not_done = "backups", "cannot list"


@dataclass(kw_only=True)
class RestoreRequest(_RepoRequest):
    command, not_done = "restore", "not restored"
    backup: str
    target: Path
    to: str | None = None
    progress: bool | None = None

    def problem(self):
        return _first(f"--to {self.to!r} is not a point: a vclock ('{{1: 120, 0: 5}}' or '1:120,0:5'), a time (ISO "
                      "8601, or @unix seconds), end (the newest the repository holds) or, for limestone, an epoch "
                      "(N or epoch:N)"
                      if self.to is not None and not (_LIMESTONE_POINT.fullmatch(self.to) or self.to.strip() == "end"
                                                      or point(self.to))
                      else None,
                      super().problem())


@dataclass(kw_only=True)
class StatusRequest(_RepoRequest):
    """Thresholds in hours and minutes, as people set them; walcore.command.status judges in seconds."""
    command, not_done = "status", "no status"
    prometheus: bool = False
    textfile: Path | None = None
    serve: str | None = None  # HOST:PORT
    max_backup_age: float = 26.0  # hours: a daily backup and its run time
    max_archive_lag: float = 60.0  # minutes

    def problem(self):
        return _first("--json and --prometheus: give one" if self.json and self.prometheus else None,
                      "--serve answers scrapes; it takes no --json or --textfile" if self.serve is not None
                      and (self.json or self.textfile is not None) else None,
                      _address_problem(self.serve),
                      f"--textfile {self.textfile}: its directory does not exist" if self.textfile is not None
                      and not Path(self.textfile).parent.is_dir() else None,
                      _threshold_problem("--max-backup-age", self.max_backup_age),
                      _threshold_problem("--max-archive-lag", self.max_archive_lag),
                      super().problem())


@dataclass(kw_only=True)
class StreamRequest(_RepoRequest):
    """`walvault stream`: a running Tarantool's rows (`connect`) into the repository as sealed segments, or the
    durable part of a limestone directory's active files (`source`) as partial objects, until stopped."""
    command, not_done = "stream", "not streamed"
    source: Path | None = None
    connect: str | None = field(default=None, repr=False)  # it may hold a password
    password_file: Path | None = None
    spool: Path | None = None  # --connect only, as segment_bytes and timeout: None is stream()'s default
    segment_seconds: float = 1.0
    segment_bytes: int | None = None
    status: Path | None = None  # the status file, rewritten as the stream goes
    timeout: float | None = None  # seconds without a packet before the connection is taken for lost

    def problem(self):
        return _first("stream takes a limestone directory SOURCE or --connect URI (a running Tarantool), not both"
                      if self.source is not None and self.connect else None,
                      "stream needs a limestone directory SOURCE or --connect URI (a running Tarantool)"
                      if self.source is None and not self.connect else None,
                      "--spool, --segment-bytes, --timeout and --password-file are for --connect (a running "
                      "Tarantool), not a limestone SOURCE" if self.source is not None and (
                          self.spool, self.segment_bytes, self.timeout, self.password_file) != (None,) * 4 else None,
                      "--segment-seconds must be a positive number" if not 0 < self.segment_seconds < math.inf
                      else None,
                      "--segment-bytes must be at least 4096" if self.segment_bytes is not None
                      and self.segment_bytes < 4096 else None,
                      "--timeout must be a positive number" if self.timeout is not None
                      and not 0 < self.timeout < math.inf else None,
                      f"--status {self.status}: its directory does not exist" if self.status is not None
                      and not Path(self.status).parent.is_dir() else None,
                      _password_problem(self.password_file, self.connect), super().problem())


@dataclass(kw_only=True)
class CopyRequest(Request):
    """`walvault copy`: backups (`backups`, or `all`) with their parent chains, and with `archive` their sources'
    archive, from the repository `from_repo` into `to_repo`."""
    command, not_done = "copy", "not copied"
    from_repo: str
    to_repo: str
    from_options: dict = field(default_factory=dict)
    to_options: dict = field(default_factory=dict)
    backups: list[str] = field(default_factory=list)
    all: bool = False
    archive: bool = False
    wait: float = 0.0
    json: bool = False

    def problem(self):
        from .repository import is_backup_id

        return _first("copy takes BACKUP ids or --all, not both" if self.backups and self.all else None,
                      "copy needs BACKUP ids (or latest) or --all" if not self.backups and not self.all else None,
                      next((f"{b!r} is not a backup id (nor latest)" for b in self.backups
                            if b != "latest" and not is_backup_id(b)), None),
                      _wait_problem(self.wait),
                      "--from and --to name the same repository" if self.from_repo.rstrip("/") ==
                      self.to_repo.rstrip("/") else None,
                      _repo_problem(self.from_repo, "--from"), _repo_problem(self.to_repo, "--to"))


def serve_address(text: str) -> tuple[str, int] | None:
    """(host, port) of a --serve HOST:PORT ([::1]:PORT for IPv6); None when it names none."""
    host, _, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not port.isascii() or not port.isdigit() or int(port) > 65535:
        return None
    return host, int(port)


def _address_problem(serve: str | None) -> str | None:
    return f"--serve {serve!r} is not HOST:PORT (e.g. 127.0.0.1:9477)" if serve is not None \
        and serve_address(serve) is None else None


def _threshold_problem(option: str, value: float) -> str | None:
    return None if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 \
        else f"{option} must be a positive number"
