"""walvault's pipeline configuration: the sources, the repository connection, retention, schedules and Spark.

One YAML file, its path from `WALVAULT_CONFIG`, else `walvault.yaml` beside the DAGs. It is read at DAG parse
time for the schedules and the trigger form's choices, so reading it is cheap: one small file, no database and no
network. Secrets are never in it: the repository's credentials and a running Tarantool's password live in Airflow
connections, which the file names. Every error names the key at fault.

    repository:
      connection: walvault_repo        # an Airflow connection: a path, or S3 with its credentials
      create: false                    # true: the DAGs create the repository where there is none; false (the
                                       # default): a missing one fails the task, which says to run
                                       # `walvault init --repo URL` (a mistyped path never becomes a repository)
    sources:
      - name: tt1                      # what the trigger form offers
        family: tarantool              # tarantool | limestone
        path: /data/tt1                # the data dir (relative: to this file)
        connection: tt1_live           # optional: a running Tarantool (host, port, login, password)
        stream:                        # optional, a running Tarantool only: `walvault stream` follows it, one
          segment_seconds: 1           # streamer per streamed source in the walvault-stream service
                                       # (walvault_provider.streams); a segment sealed every S seconds (default 1)
          connection: tt1_repl         # optional: its user's connection (the replication role is all it needs);
                                       # default: the source's `connection`, whose user then needs that role too
        copy_to: repo_dr               # optional: this source's second repository (else the top-level copy_to)
      - name: ls1
        family: limestone
        path: /data/ls1
        rotate_min_bytes: 67108864     # limestone: rotate once the active files hold this much (default 64 MiB)
    copy_to: walvault_repo_copy        # optional: an Airflow connection of a second repository (`walvault init`
                                       # made it): walvault_backup copies each backup there after it verified
                                       # (`walvault copy`); a source's own `copy_to` wins. None: no copy
    retention:
      days: 30                         # the recovery window (walvault expire)
    backup:
      full_every_days: 7               # a scheduled backup is full when the source's newest full is this old
    schedules:                         # cron expressions or presets; null: triggered only
      archive: "*/15 * * * *"
      backup: "0 1 * * *"
      snapshot: on backup              # by data, not by clock: when a source's backup asset updates (its sources
                                       # only); null: triggered only. A cron here is refused, saying so
      retention: on snapshot           # when a snapshot asset updates, deleting at most once a day; null: triggered
                                       # only. A cron here is refused, saying so
      restore_drill: "0 5 * * 0"
      status: "*/10 * * * *"          # walvault_status: the textfile and the freshness alerts
      late_after_minutes: 30           # a scheduled run that starts later than this after its time (a catch-up
                                       # at unpause, after scheduler downtime) only plans: retention deletes
                                       # nothing, a backup is skipped; the next on-time run does the work
    spark:
      connections: [spark_default]     # Spark connections (local[2] embedded, a master in production); the first
                                       # is the default, the backup form offers them all
    runs:                              # how the DAGs' tasks are owned, retried and bounded
      owner: walvault                  # the tasks' owner (the UI's Owner column)
      retries: 3                       # a task failing for a passing cause (a lease held, the repository, a
      retry_delay_minutes: 5           # Tarantool or the Spark master unreachable) is retried after 5, 10, 20
      max_retry_delay_minutes: 30      # minutes (doubled, at most this); a verdict (damage, a refusal) never is
      lease_wait_minutes: 5            # how long a task waits for a lease another command holds before it is
                                       # retried: a waiting task holds a worker slot, a task waiting to retry none
      task_timeout_minutes: {backup: 360}   # per DAG: execution_timeout of each of its tasks
      run_timeout_minutes: {backup: 720}    # per DAG: dagrun_timeout, the whole run with its retries
    notify:                            # optional: no mail without it
      smtp:
        connection: smtp_default       # an Airflow SMTP connection: host, port, login, password, TLS (extra)
        from: walvault@example.com     # optional: else the connection's `from_email` extra
        to: [oncall@example.com]
      events: [failure, recovery]      # a task failed; a run succeeded after the DAG's previous run failed (the
                                       # key is not `on`: YAML reads that as true)
    freshness:                         # walvault_status's alerts, each naming its source (mailed as `notify` says)
      max_backup_age_hours: 26         # "no verified backup of S for N hours": a daily backup and its run time
      max_archive_lag_minutes: 60      # "archive of S behind by more than M minutes" (the source on this host)
      max_stream_lag_seconds: 60       # a streamed source: "stream of S is down" (no live streamer renews its
                                       # lease), or "stream of S behind by more than N seconds" (on this host)
      remind_every_hours: 4            # a source still stale is mailed again this often; its runs in between
                                       # fail without mail (its first run stale, or a new alert, mails at once)
    metrics:                           # optional: no textfile without it
      textfile: /var/lib/node_exporter/textfile/walvault.prom   # walvault status's Prometheus exposition,
                                       # written whole by every walvault_status run (relative: to this file);
                                       # its directory must exist (node exporter's --collector.textfile.directory)
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ENV_VAR = "WALVAULT_CONFIG"
DEFAULT_NAME = "walvault.yaml"
FAMILIES = ("tarantool", "limestone")
# The DAGs that follow the data (walvault_provider.assets): the one value each takes besides null.
DATA_SCHEDULES = {"snapshot": "on backup", "retention": "on snapshot"}
# UTC; the snapshot after each backup, retention after each snapshot (by their assets), the drill on Sunday, the
# status check every 10 minutes.
DEFAULT_SCHEDULES = {"archive": "*/15 * * * *", "backup": "0 1 * * *", **DATA_SCHEDULES, "restore_drill": "0 5 * * 0",
                     "status": "*/10 * * * *"}
DEFAULT_ROTATE_MIN_BYTES = 64 << 20
# Per DAG (minutes): execution_timeout of each task (the longest: a full backup or a drill of a big source), and
# dagrun_timeout (room for the retries). An archive runs every 15 minutes: it is bounded under its next runs'; a
# status reads metadata only: a check that takes 10 minutes is itself the news.
DEFAULT_TASK_TIMEOUTS = {"archive": 60, "backup": 360, "snapshot": 180, "retention": 120, "restore_drill": 360,
                         "status": 10}
DEFAULT_RUN_TIMEOUTS = {"archive": 120, "backup": 720, "snapshot": 360, "retention": 240, "restore_drill": 720,
                        "status": 60}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a task id part as it is: no two names make one id
_CONN_ID = re.compile(r"[A-Za-z0-9_.-]{1,250}")
_PRESETS = {"@once", "@hourly", "@daily", "@weekly", "@monthly", "@yearly", "@continuous"}
_SECRET_WORDS = ("password", "secret", "token", "access_key", "private_key")
NOTIFY_EVENTS = ("failure", "recovery")
_ADDRESS = re.compile(r"[^@\s,;<>]+@[^@\s,;<>]+")  # one bare address: a list in one string would be split unseen


class ConfigError(ValueError):
    """The configuration file cannot be used; the message names the file and the key at fault."""


@dataclass(frozen=True)
class Source:
    name: str
    family: str
    path: Path
    connection: str | None = None  # an Airflow connection to a running Tarantool
    rotate_min_bytes: int = DEFAULT_ROTATE_MIN_BYTES
    stream: Stream | None = None  # None: not streamed
    copy_to: str | None = None  # the Airflow connection of the second repository its backups are copied to


@dataclass(frozen=True)
class Stream:
    """How a source is streamed (`walvault stream`, run by walvault_provider.streams)."""
    connection: str  # the Airflow connection of the streamer's user: the source's own unless `stream.connection`
    segment_seconds: float = 1.0


@dataclass(frozen=True)
class Runs:
    """How the DAGs' tasks are owned, retried and bounded (the `runs` section)."""
    owner: str = "walvault"
    retries: int = 3
    retry_delay_minutes: float = 5
    max_retry_delay_minutes: float = 30
    lease_wait_minutes: float = 5
    task_timeout_minutes: dict = field(default_factory=lambda: dict(DEFAULT_TASK_TIMEOUTS))
    run_timeout_minutes: dict = field(default_factory=lambda: dict(DEFAULT_RUN_TIMEOUTS))

    @property
    def lease_wait(self) -> float:
        """Seconds a task waits for a lease before it fails to be retried (walcore's `wait`)."""
        return self.lease_wait_minutes * 60

    def default_args(self, dag: str) -> dict:
        """The default_args of the DAG `dag` (a key of DEFAULT_SCHEDULES): owner, retries with back-off, and each
        task's execution_timeout. A verdict raises AirflowFailException, which no retry follows."""
        from datetime import timedelta

        return {"owner": self.owner, "retries": self.retries,
                "retry_delay": timedelta(minutes=self.retry_delay_minutes), "retry_exponential_backoff": 2.0,
                "max_retry_delay": timedelta(minutes=self.max_retry_delay_minutes),
                "execution_timeout": timedelta(minutes=self.task_timeout_minutes[dag])}

    def dagrun_timeout(self, dag: str):
        from datetime import timedelta

        return timedelta(minutes=self.run_timeout_minutes[dag])


@dataclass(frozen=True)
class Notify:
    """Where failure and recovery mail goes (walvault_provider.notifications): the SMTP server and its credentials
    are the Airflow connection's, never this file's."""
    to: tuple[str, ...]
    events: frozenset[str] = frozenset(NOTIFY_EVENTS)
    connection: str = "smtp_default"
    sender: str | None = None  # None: the connection's `from_email` extra


@dataclass(frozen=True)
class Freshness:
    """When walvault_status alerts on a source (the `freshness` section); the defaults are walvault status's."""
    max_backup_age_hours: float = 26
    max_archive_lag_minutes: float = 60
    max_stream_lag_seconds: float = 60
    remind_every_hours: float = 4


@dataclass(frozen=True)
class Config:
    path: Path
    sources: tuple[Source, ...]
    repository_connection: str = "walvault_repo"
    retention_days: float = 30
    schedules: dict = field(default_factory=lambda: dict(DEFAULT_SCHEDULES))
    spark_connections: tuple[str, ...] = ("spark_default",)
    full_every_days: float = 7
    repository_create: bool = False  # whether the DAGs may create a missing repository
    late_after_minutes: float = 30  # a scheduled run starting later than this after its time only plans
    runs: Runs = field(default_factory=Runs)
    notify: Notify | None = None  # None: no mail
    freshness: Freshness = field(default_factory=Freshness)
    textfile: Path | None = None  # where walvault_status writes the Prometheus exposition; None: nowhere

    @property
    def families(self) -> list[str]:
        """The configured sources' families: the DAGs' tags."""
        return sorted({s.family for s in self.sources})

    @property
    def spark_connection(self) -> str:
        """The Spark connection of scheduled runs."""
        return self.spark_connections[0]

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        raise ConfigError(f"{self.path}: no source named {name!r} (configured: "
                          f"{', '.join(s.name for s in self.sources)})")


def config_path(dags_folder: Path | None = None) -> Path:
    """`WALVAULT_CONFIG`, else walvault.yaml beside the DAGs."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return (dags_folder or Path(__file__).resolve().parents[2] / "dags") / DEFAULT_NAME


def load(path: Path | None = None) -> Config:
    import yaml

    path = Path(path) if path is not None else config_path()
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the walvault configuration ({e.strerror or e}); set {ENV_VAR} "
                          "to its path") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}): save it as UTF-8") from None
    try:
        raw = yaml.load(text, Loader=_loader(path))
    except DuplicateKey as e:
        raise ConfigError(str(e)) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not YAML: {e}") from None
    return parse(raw, path)


class DuplicateKey(ValueError):
    """A mapping names one key twice: YAML would keep the later value silently (a retention window changed unseen)."""


def _loader(path: Path):
    """yaml's SafeLoader, refusing a mapping that holds a key twice."""
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _value in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: its keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    if key in seen:
                        raise DuplicateKey(f"{path}: the key {key!r} is given twice (lines {seen[key]} and {line}): "
                                           "remove one")
                    seen[key] = line
                except TypeError:  # an unhashable key: the base class says so
                    break
            return super().construct_mapping(node, deep=deep)

    return Loader


def parse(raw, path: Path) -> Config:
    where = str(path)

    def fail(key: str, message: str):
        raise ConfigError(f"{where}: {key}: {message}")

    if not isinstance(raw, dict):
        fail("(top)", "the file must hold a mapping (repository, sources, retention, backup, schedules, spark, runs, "
             "notify, freshness, metrics)")
    _no_secrets(raw, "", fail)
    _known(raw, ("repository", "sources", "retention", "backup", "schedules", "spark", "runs", "notify", "freshness",
                 "metrics", "copy_to"), "", fail)
    backup = _section(raw, "backup", ("full_every_days",), fail)
    repository = _section(raw, "repository", ("connection", "create"), fail)
    retention = _section(raw, "retention", ("days",), fail)
    spark = _section(raw, "spark", ("connections",), fail)
    schedules_raw = _section(raw, "schedules", (*DEFAULT_SCHEDULES, "late_after_minutes"), fail)
    late_after = schedules_raw.get("late_after_minutes", 30)
    if isinstance(late_after, bool) or not isinstance(late_after, (int, float)) or not 0 < late_after <= 1440:
        fail("schedules.late_after_minutes", f"{late_after!r} is not a number of minutes (more than 0, at most 1440)")
    sources_raw = raw.get("sources")
    if not isinstance(sources_raw, list) or not sources_raw:
        fail("sources", "a list of at least one source (name, family, path)")
    sources, names = [], set()
    for i, item in enumerate(sources_raw):
        key = f"sources[{i}]"
        if not isinstance(item, dict):
            fail(key, "a mapping with name, family and path")
        _known(item, ("name", "family", "path", "connection", "rotate_min_bytes", "stream", "copy_to"), key, fail)
        name = item.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            fail(f"{key}.name", f"{name!r} is not a name (letters, digits, '_', '-'; up to 64)")
        if name in names:
            fail(f"{key}.name", f"{name!r} is configured twice")
        names.add(name)
        family = item.get("family")
        if family not in FAMILIES:
            fail(f"{key}.family", f"{family!r} is not one of {', '.join(FAMILIES)}")
        source_path = item.get("path")
        if not isinstance(source_path, str) or not source_path:
            fail(f"{key}.path", "the source directory, a string")
        connection = item.get("connection")
        if connection is not None and (family != "tarantool" or not _conn_id(connection)):
            fail(f"{key}.connection", "an Airflow connection id, for a running Tarantool only")
        min_bytes = item.get("rotate_min_bytes", DEFAULT_ROTATE_MIN_BYTES)
        if "rotate_min_bytes" in item and family != "limestone":
            fail(f"{key}.rotate_min_bytes", "limestone sources only")
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 1:
            fail(f"{key}.rotate_min_bytes", f"{min_bytes!r} is not a positive number of bytes")
        full = Path(os.path.abspath(path.parent / source_path))  # dags/../var -> var; symlinks kept
        sources.append(Source(name, family, full, connection, min_bytes, _stream(item, connection, key, fail),
                              _copy_to(item, key, fail) or _copy_to(raw, "", fail)))
    days = retention.get("days", 30)
    try:
        from walcore.command.expire import check_days

        days = check_days(days)
    except ValueError as e:
        fail("retention.days", str(e))
    schedules = dict(DEFAULT_SCHEDULES)
    for name, value in schedules_raw.items():
        if name == "late_after_minutes":
            continue
        if name in DATA_SCHEDULES and value not in (DATA_SCHEDULES[name], None):
            fail(f"schedules.{name}", f"{value!r}: walvault_{name} follows the data, not the clock: write "
                 f"{DATA_SCHEDULES[name]!r} (the default), or null for triggered only")
        if name not in DATA_SCHEDULES and value is not None and not _schedule(value):
            fail(f"schedules.{name}", f"{value!r} is not a cron expression (5 fields) or a preset "
                 f"({', '.join(sorted(_PRESETS))})")
        schedules[name] = value
    repository_create = repository.get("create", False)
    if not isinstance(repository_create, bool):
        fail("repository.create", f"{repository_create!r} is neither true nor false")
    repository_connection = repository.get("connection", "walvault_repo")
    if not _conn_id(repository_connection):
        fail("repository.connection", f"{repository_connection!r} is not an Airflow connection id")
    for i, source in enumerate(sources):
        if source.copy_to == repository_connection:
            fail(f"sources[{i}].copy_to" if "copy_to" in sources_raw[i] else "copy_to",
                 f"{source.copy_to!r} is the repository's own connection: a copy goes to a second repository")
    spark_connections = spark.get("connections", ["spark_default"])
    if not isinstance(spark_connections, list) or not spark_connections:
        fail("spark.connections", "a list of at least one Airflow connection id (the first is the default)")
    for i, conn_id in enumerate(spark_connections):
        if not _conn_id(conn_id) or conn_id in spark_connections[:i]:
            fail(f"spark.connections[{i}]", f"{conn_id!r} is not an Airflow connection id, or is listed twice")
    full_every = backup.get("full_every_days", 7)
    if isinstance(full_every, bool) or not isinstance(full_every, (int, float)) or not 0 < full_every <= 366:
        fail("backup.full_every_days", f"{full_every!r} is not a number of days (more than 0, at most 366)")
    return Config(path, tuple(sources), repository_connection, days, schedules, tuple(spark_connections),
                  float(full_every), repository_create, float(late_after), _runs(raw, fail),
                  _notify(raw, fail), _freshness(raw, fail), _textfile(raw, path, fail))


def _copy_to(mapping: dict, key: str, fail) -> str | None:
    """The `copy_to` connection id of a mapping (a source, or the top), or None."""
    value = mapping.get("copy_to")
    if value is not None and not _conn_id(value):
        fail(f"{key}.copy_to" if key else "copy_to", f"{value!r} is not an Airflow connection id (of the second "
             "repository)")
    return value


def _runs(raw: dict, fail) -> Runs:
    section = _section(raw, "runs", tuple(Runs.__dataclass_fields__), fail)
    owner = section.get("owner", Runs.owner)
    if not isinstance(owner, str) or not owner.strip():
        fail("runs.owner", f"{owner!r} is not a name")
    retries = section.get("retries", Runs.retries)
    if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 20:
        fail("runs.retries", f"{retries!r} is not a number of retries (0 to 20)")
    minutes = {}
    for key in ("retry_delay_minutes", "max_retry_delay_minutes", "lease_wait_minutes"):
        value = section.get(key, getattr(Runs, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1440:
            fail(f"runs.{key}", f"{value!r} is not a number of minutes (0 to 1440)")
        minutes[key] = float(value)
    timeouts = {}
    for key, defaults in (("task_timeout_minutes", DEFAULT_TASK_TIMEOUTS),
                          ("run_timeout_minutes", DEFAULT_RUN_TIMEOUTS)):
        given = _section(section, key, tuple(defaults), lambda k, m: fail(f"runs.{k}", m))
        for dag, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 10080:
                fail(f"runs.{key}.{dag}", f"{value!r} is not a number of minutes (more than 0, at most a week)")
        timeouts[key] = {**defaults, **{dag: float(value) for dag, value in given.items()}}
    return Runs(owner.strip(), retries, **minutes, **timeouts)


def _notify(raw: dict, fail) -> Notify | None:
    if raw.get("notify") is None:
        return None
    if isinstance(raw["notify"], dict) and True in raw["notify"]:
        fail("notify.on", "YAML reads the key `on` as true: the events are listed under `events`")
    notify = _section(raw, "notify", ("smtp", "events"), fail)
    if not isinstance(notify.get("smtp"), dict):
        fail("notify.smtp", "a mapping (connection, from, to): the one notifier shipped")
    smtp = _section(notify, "smtp", ("connection", "from", "to"), lambda key, message: fail(f"notify.{key}", message))
    connection = smtp.get("connection", "smtp_default")
    if not _conn_id(connection):
        fail("notify.smtp.connection", f"{connection!r} is not an Airflow connection id")
    sender = smtp.get("from")
    if sender is not None and not (isinstance(sender, str) and _ADDRESS.fullmatch(sender)):
        fail("notify.smtp.from", f"{sender!r} is not one mail address")
    to = smtp.get("to")
    if not isinstance(to, list) or not to:
        fail("notify.smtp.to", "a list of at least one mail address")
    for i, address in enumerate(to):
        if not (isinstance(address, str) and _ADDRESS.fullmatch(address)) or address in to[:i]:
            fail(f"notify.smtp.to[{i}]", f"{address!r} is not one mail address, or is listed twice")
    events = notify.get("events", list(NOTIFY_EVENTS))
    if not isinstance(events, list) or not events:
        fail("notify.events", f"a list of at least one of {', '.join(NOTIFY_EVENTS)}")
    for i, event in enumerate(events):
        if event not in NOTIFY_EVENTS or event in events[:i]:
            fail(f"notify.events[{i}]", f"{event!r} is not one of {', '.join(NOTIFY_EVENTS)}, or is listed twice")
    return Notify(tuple(to), frozenset(events), connection, sender)


def _stream(item: dict, connection: str | None, key: str, fail) -> Stream | None:
    if item.get("stream") is None:
        return None
    if not isinstance(item["stream"], dict):
        fail(f"{key}.stream", "a mapping (segment_seconds, connection; {} for the defaults)")
    stream = _section(item, "stream", ("segment_seconds", "connection"), lambda k, m: fail(f"{key}.{k}", m))
    if item.get("family") != "tarantool":
        fail(f"{key}.stream", "a running Tarantool only (walvault stream follows it as a replica)")
    connection = stream.get("connection", connection)
    if connection is None:
        fail(f"{key}.stream", "the running Tarantool to follow: the source's `connection`, or `stream.connection`")
    if not _conn_id(connection):
        fail(f"{key}.stream.connection", f"{connection!r} is not an Airflow connection id")
    seconds = stream.get("segment_seconds", Stream.segment_seconds)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 3600:
        fail(f"{key}.stream.segment_seconds", f"{seconds!r} is not a number of seconds (more than 0, at most 3600)")
    return Stream(connection, float(seconds))


def _freshness(raw: dict, fail) -> Freshness:
    section = _section(raw, "freshness", tuple(Freshness.__dataclass_fields__), fail)
    limits = {"max_backup_age_hours": 24 * 366, "max_archive_lag_minutes": 10080, "max_stream_lag_seconds": 86400,
              "remind_every_hours": 24 * 7}
    values = {}
    for key, limit in limits.items():
        value = section.get(key, getattr(Freshness, key))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= limit:
            fail(f"freshness.{key}", f"{value!r} is not a number (more than 0, at most {limit})")
        values[key] = float(value)
    return Freshness(**values)


def _textfile(raw: dict, path: Path, fail) -> Path | None:
    textfile = _section(raw, "metrics", ("textfile",), fail).get("textfile")
    if textfile is None:
        return None
    if not isinstance(textfile, str) or not textfile.endswith(".prom"):
        fail("metrics.textfile", f"{textfile!r} is not a file name ending .prom (node exporter reads only those)")
    return Path(os.path.abspath(path.parent / textfile))


def _conn_id(value) -> bool:
    return isinstance(value, str) and bool(_CONN_ID.fullmatch(value))


def _section(raw: dict, name: str, keys: tuple[str, ...], fail) -> dict:
    section = raw.get(name) or {}
    if not isinstance(section, dict):
        fail(name, "a mapping")
    _known(section, keys, name, fail)
    return section


def _known(mapping: dict, keys: tuple[str, ...], where: str, fail) -> None:
    for key in mapping:
        if key not in keys:
            fail(f"{where}.{key}" if where else str(key), f"unknown key (known: {', '.join(keys)})")


def _no_secrets(obj, where: str, fail) -> None:
    """Credentials belong in Airflow connections: a key that names one is refused wherever it is."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            here = f"{where}.{key}" if where else str(key)
            if any(word in str(key).lower() for word in _SECRET_WORDS):
                fail(here, "secrets are not kept in this file: put them in the Airflow connection it names")
            _no_secrets(value, here, fail)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            _no_secrets(value, f"{where}[{i}]", fail)


def _schedule(value) -> bool:
    """A preset, or a cron expression of 5 fields Airflow accepts (61 minutes would fail only at DAG import)."""
    from croniter import croniter

    if not isinstance(value, str):
        return False
    return value in _PRESETS or (len(value.split()) == 5 and croniter.is_valid(value))
