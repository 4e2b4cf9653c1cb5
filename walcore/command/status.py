"""The status command: what an on-call engineer asks of a repository, per source, and the same as Prometheus
metrics.

A source is one directory backed up or archived (family, instance, host and path, as manifests and archive
records name it). For each: its newest backup that restores (walcore.retention: whole, and neither its last drill
nor its last verification failed), with its age;
how far its archive reaches in the log and when that point was written; where the directory is on this host,
how far it reaches itself and how many seconds of its log the archive lacks; whether the repository's retention
policy (`walvault policy`) keeps its recovery window restorable, judged as expire judges it (walcore.retention:
an anchor at or before the window's start); its last drill's verdict; and which of its backups the last
verification that checked them found damaged. For the repository: its bytes by kind.

A source has a problem when it has no backup that restores, its newest one is older than `max_backup_age` or
finished more than `CLOCK_SLACK` in the future (a clock set wrong, or a forged manifest: its age says nothing),
its archive lags the reachable directory by more than `max_archive_lag` (or holds nothing of a directory that has
a log), its window is not covered, its last drill failed, a verification found one of its backups damaged, or a
manifest of its instance cannot be read. Without a stored policy the windows are not judged.

`exposition` says a result in Prometheus' text format (node exporter's textfile collector reads it from
`write_textfile`'s file; `walvault status --serve` answers scrapes with it).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..family import family_named
from ..repository import Repository, stamp_seconds
from ..repository.archive import archive_origins, segment_differences, segment_records, split_archive
from ..repository.verdicts import last_drill, last_verification
from ..retention import DAY, backup_doubts, check_days, describe_anchor, iso, stored_policy, window_anchor

HOUR, MINUTE = 3600.0, 60.0
CLOCK_SLACK = 5 * MINUTE  # a backup finished further ahead of this host's clock than this is not taken as fresh


@dataclass
class SourceStatus:
    family: str
    instance: str
    host: str | None
    path: str | None
    backup: dict | None = None  # the newest backup that restores: {"id", "type", "finished", "age_seconds", ...}
    archive: dict | None = None  # how far the archive reaches: {"position", "time", "age_seconds", "files"}
    stream: dict | None = None  # its stream: {"segments", "position", "last_commit", "age_seconds", "alive",
    # "lease_renewed", "lag_seconds" (_stream), "note" (what the stream does not hold), "differs" (segments an
    # archived xlog disagrees with)}
    source: dict | None = None  # the directory on this host: {"position", "time", "instance" it holds now}
    archive_lag_seconds: float | None = None
    window: dict | None = None  # {"days", "start", "covered", "anchor"}; None: no policy to judge by
    drill: dict | None = None  # the last drill of any of its backups: {"backup", "status", "time", "problem"}
    verification: dict | None = None  # {"time" (the newest verdict), "damaged": [{"backup", "time", "problem"}]}
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict:
        return {"family": self.family, "instance": self.instance, "host": self.host, "path": self.path,
                "ok": self.ok, "backup": self.backup, "archive": self.archive, "stream": self.stream,
                "source": self.source, "archive_lag_seconds": self.archive_lag_seconds, "window": self.window,
                "drill": self.drill, "verification": self.verification, "problems": self.problems}


@dataclass
class StatusResult:
    repository: str
    time: float  # when it was judged
    policy_days: float | None
    max_backup_age: float  # seconds
    max_archive_lag: float  # seconds
    sources: list[SourceStatus]
    bytes: dict[str, int]
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sources)

    def to_json(self) -> dict:
        return {"repository": self.repository, "time": iso(self.time), "ok": self.ok,
                "policy": None if self.policy_days is None else {"days": self.policy_days},
                "thresholds": {"max_backup_age_seconds": self.max_backup_age,
                               "max_archive_lag_seconds": self.max_archive_lag},
                "sources": [s.to_json() for s in self.sources], "bytes": self.bytes, "warnings": self.warnings}


def status(repo: Repository, *, max_backup_age: float = 26 * HOUR,
           max_archive_lag: float = 60 * MINUTE) -> StatusResult:
    """The status of every source of the repository, judged now (time.time()); thresholds in seconds. Reads the
    repository and the sources' newest files only; writes nothing."""
    now = time.time()
    policy, warning = stored_policy(repo)
    warnings = [warning] if warning else []
    days = None
    if policy is None:
        warnings.append("no retention policy stored: the recovery windows are not judged (walvault policy --repo "
                        f"{repo.display} --days N)")
    else:
        try:
            days = check_days(policy.get("days"))
        except ValueError as e:
            warnings.append(f"the stored retention policy is not usable ({e}): the recovery windows are not judged")
    result = StatusResult(repo.display, now, days, max_backup_age, max_archive_lag, [], repo.bytes_by_kind(),
                          warnings)
    for family, instance in repo.sources():
        result.sources += _instance_status(repo, family, instance, now, result)
    return result


def _instance_status(repo: Repository, family: str, instance: str, now: float,
                     result: StatusResult) -> list[SourceStatus]:
    fam = family_named(family)
    records = repo.source_backups(family, instance)
    manifests = [r.manifest for r in records if r.manifest is not None]
    # A backup whose manifest cannot be read is of no known directory: each of the instance's says it.
    unreadable = [f"the manifest of backup {r.id} cannot be read ({r.problem})" for r in records
                  if r.manifest is None and r.complete]
    doubts = backup_doubts(repo, family, instance, manifests)
    drills = {m.id: last_drill(repo, family, instance, m.id) for m in manifests}
    # `walvault stream`'s: the archive reaches as far as they; only the records that say how far are read
    segments = fam.stream_reach_entries(repo, instance)
    streamed_count = len(segment_records(repo, family, instance))
    differing = segment_differences(repo, family, instance)
    streamer = repo.stream_holder(family, instance)
    verifications = {m.id: last_verification(repo, family, instance, m.id) for m in manifests}
    places = {(m.source.get("host"), m.source.get("path")) for m in manifests}
    places |= archive_origins(repo, family, instance)
    if not places:  # only archive records of an older walvault, which do not say where they came from
        places = {(None, None)}
    found = []
    for host, path in sorted(places, key=lambda p: (str(p[0]), str(p[1]))):
        s = SourceStatus(family, instance, host, path, problems=list(unreadable))
        own = [m for m in manifests if (m.source.get("host"), m.source.get("path")) == (host, path)]
        usable = [m for m in own if doubts[m.id] is None]
        _backup(s, max(usable, key=fam.position_key, default=None), now, result.max_backup_age)
        entries = [e for e in split_archive(repo, family, instance, {"host": host, "path": path})[0] if e]
        reach = fam.archive_reach(repo, instance, {"host": host, "path": path}, entries + segments)
        if reach is not None:
            s.archive = {"position": reach[1], "time": iso(reach[2]), "files": len(entries),
                         "age_seconds": None if reach[2] is None else max(0.0, now - reach[2])}
        for d in differing:
            s.problems.append(f"the stream's segment {d['segment']} differs from the archived xlog {d['xlog']} at row "
                              f"{d['row']}: {d['message']}; the segment is kept")
        _lag(s, fam, reach, result.max_archive_lag)
        s.stream = _stream(repo, fam, s, segments, streamed_count, streamer, now)
        if s.stream is not None:
            s.stream |= {"note": fam.stream_note, "differs": differing}
        if result.policy_days is not None:
            start = now - result.policy_days * DAY
            anchor, doubted = window_anchor(fam, own, doubts, start)
            s.window = {"days": result.policy_days, "start": iso(start), "covered": anchor is not None,
                        "anchor": describe_anchor(fam, anchor) if anchor is not None else None}
            if doubted is not None:
                s.problems.append(f"the recovery window of {result.policy_days} days is not covered: the snapshot "
                                  f"reaching furthest at or before its start ({iso(start)}), {doubted.id}, is doubted "
                                  "by a failed drill or verification, and the log from an older one may be expired")
            elif anchor is None:
                s.problems.append(f"the recovery window of {result.policy_days} days is not covered: no verified "
                                  f"snapshot at or before its start ({iso(start)})")
        verdicts = [d for m in own if (d := drills[m.id]) is not None]
        if verdicts:
            last = max(verdicts, key=lambda d: str(d.get("time")))
            s.drill = {k: last.get(k) for k in ("backup", "status", "time", "problem")}
            if last.get("status") != "ok":
                s.problems.append(f"the last drill (of backup {last.get('backup')}, {last.get('time')}) failed: "
                                  f"{last.get('problem')}")
        _verification(s, {m.id: verifications[m.id] for m in own if verifications[m.id] is not None})
        found.append(s)
    return found


def _backup(s: SourceStatus, newest, now: float, max_age: float) -> None:
    if newest is None:
        s.problems.append("no backup that restores (whole, and no failed drill or verification)")
        return
    age = now - stamp_seconds(newest.finished)
    s.backup = {"id": newest.id, "type": newest.type, "finished": newest.finished, "age_seconds": max(0.0, age),
                "position": newest.position}
    if age < -CLOCK_SLACK:
        s.problems.append(f"the newest backup that restores, {newest.id}, finished {duration(-age)} in the future "
                          f"({newest.finished}): a clock is wrong, and its age says nothing of how fresh it is")
    elif age > max_age:
        s.problems.append(f"the newest backup that restores, {newest.id}, is {duration(age)} old (more than "
                          f"{duration(max_age)})")


def _verification(s: SourceStatus, verdicts: dict[str, dict]) -> None:
    """The source's backups that their last verification found damaged: each a problem until mended and verified
    again (or expired)."""
    if not verdicts:
        return
    damaged = [{"backup": backup_id, "time": v.get("time"), "problem": v.get("problem")}
               for backup_id, v in sorted(verdicts.items()) if v.get("status") != "ok"]
    s.verification = {"time": max(str(v.get("time")) for v in verdicts.values()), "damaged": damaged}
    if damaged:
        first = damaged[0]
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        s.problems.append(f"the last verification of backup {first['backup']} ({first['time']}) found it damaged"
                          f"{more}: {first['problem']}")


def _stream(repo: Repository, fam, s: SourceStatus, segments: list, count: int, streamer: dict | None,
            now: float) -> dict | None:
    """The source's stream (None: no segment stored, no streamer running): its stored segments, whether a live
    streamer holds its lease (renewed however idle the source is, so it tells a live streamer from a dead one
    where the newest segment's age cannot), and where the directory is on this host, how many seconds of the
    source's log it lacks (0: it holds all)."""
    if not segments and streamer is None:
        return None
    stream = {"segments": count, "position": None, "last_commit": None, "age_seconds": None,
              "alive": streamer is not None, "lease_renewed": iso(streamer.get("taken")) if streamer else None,
              "lag_seconds": None}
    streamed = fam.archive_reach(repo, s.instance, {"host": s.host, "path": s.path}, segments) if segments else None
    if streamed is None:
        return stream
    stream |= {"position": streamed[1], "last_commit": iso(streamed[2]),
               "age_seconds": None if streamed[2] is None else max(0.0, now - streamed[2])}
    if s.source is not None and s.source["instance"] in (None, s.instance):
        if not fam.stream_behind(s.source["position"], streamed[1]):
            stream["lag_seconds"] = 0.0
        elif s.source["time"] is not None and streamed[2] is not None:
            stream["lag_seconds"] = max(0.0, stamp_seconds(s.source["time"]) - streamed[2])
    return stream


def _lag(s: SourceStatus, fam, reach, max_lag: float) -> None:
    """The source's own reach where its directory is on this host, and how far behind it the archive is."""
    if s.path is None or not Path(s.path).is_dir():
        return
    try:
        own = fam.source_reach(Path(s.path))
    except (OSError, ValueError) as e:
        s.problems.append(f"the source directory {s.path} cannot be read here: {e}")
        return
    if own is None:
        return
    held = fam.source_instance(Path(s.path))
    s.source = {"position": own[1], "time": iso(own[2]), "instance": held}
    if held is not None and held != s.instance:
        return  # the directory holds another history now: its log is not this instance's to lag behind
    if reach is None:
        s.problems.append(f"nothing of the source is archived; its log reaches {own[1]}")
        return
    if own[0] <= reach[0]:
        s.archive_lag_seconds = 0.0
    elif own[2] is not None and reach[2] is not None:
        s.archive_lag_seconds = max(0.0, own[2] - reach[2])
    if s.archive_lag_seconds is not None and s.archive_lag_seconds > max_lag:
        s.problems.append(f"the archive is {duration(s.archive_lag_seconds)} behind the source (more than "
                          f"{duration(max_lag)}): it reaches {reach[1]}, the source {own[1]}")


def duration(seconds: float) -> str:
    """A number of seconds as people say it: 45s, 12m05s, 3h02m, 2d04h."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


# -- the Prometheus exposition

PREFIX = "walvault_"
SOURCE_LABELS = ("family", "instance", "host", "source")


def exposition(result: StatusResult) -> str:
    """The result in Prometheus' text exposition format: a gauge per fact, per source labelled by family,
    instance, host and source (the directory); a fact not known (no backup, not reachable) is left out."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    def gauge(name: str, doc: str, labels=SOURCE_LABELS) -> GaugeMetricFamily:
        return GaugeMetricFamily(PREFIX + name, doc, labels=labels)

    per_source = {
        "source_ok": gauge("source_ok", "1 when the source has no problem (walvault status exits 0 for it), else 0"),
        "last_backup_timestamp_seconds": gauge("last_backup_timestamp_seconds",
                                               "When the newest backup that restores finished (Unix time)"),
        "last_backup_age_seconds": gauge("last_backup_age_seconds",
                                         "Age of the newest backup that restores, when the status was taken"),
        "archive_timestamp_seconds": gauge("archive_timestamp_seconds",
                                           "When the newest archived point of the log was written (Unix time)"),
        "archive_age_seconds": gauge("archive_age_seconds",
                                     "Age of the newest archived point of the log, when the status was taken"),
        "archive_lag_seconds": gauge("archive_lag_seconds", "Seconds of the reachable source's log the archive "
                                     "does not hold yet (0: it holds all)"),
        "stream_last_commit_timestamp_seconds": gauge("stream_last_commit_timestamp_seconds", "When the newest "
                                                       "transaction the stream stored was committed (Unix time)"),
        "stream_up": gauge("stream_up", "1 while a live walvault stream holds the source's stream lease (renewed "
                           "however idle the source), 0 when none does"),
        "stream_lag_seconds": gauge("stream_lag_seconds", "Seconds of the reachable source's log the stream has "
                                    "not stored (0: it holds all)"),
        "recovery_window_covered": gauge("recovery_window_covered", "1 when every point of the retention "
                                         "policy's window restores (an anchor at or before its start), else 0"),
        "last_drill_success": gauge("last_drill_success", "1 when the last restore drill of the source's backups "
                                    "passed, 0 when it failed"),
        "last_drill_timestamp_seconds": gauge("last_drill_timestamp_seconds",
                                              "When the last restore drill of the source's backups ran (Unix time)"),
        "damaged_backups": gauge("damaged_backups", "Backups of the source that their last verification found "
                                 "damaged"),
        "last_verification_timestamp_seconds": gauge("last_verification_timestamp_seconds", "When a verification "
                                                      "last judged a backup of the source (Unix time)"),
    }
    for s in result.sources:
        labels = [s.family, s.instance, s.host or "", s.path or ""]
        facts = {"source_ok": 1.0 if s.ok else 0.0}
        if s.backup:
            finished = stamp_seconds(s.backup["finished"])
            facts |= {"last_backup_timestamp_seconds": finished, "last_backup_age_seconds": s.backup["age_seconds"]}
        if s.archive and s.archive["time"]:
            facts |= {"archive_timestamp_seconds": stamp_seconds(s.archive["time"]),
                      "archive_age_seconds": s.archive["age_seconds"]}
        if s.archive_lag_seconds is not None:
            facts["archive_lag_seconds"] = s.archive_lag_seconds
        if s.stream:
            facts["stream_up"] = 1.0 if s.stream["alive"] else 0.0
            if s.stream["last_commit"]:
                facts["stream_last_commit_timestamp_seconds"] = stamp_seconds(s.stream["last_commit"])
            if s.stream["lag_seconds"] is not None:
                facts["stream_lag_seconds"] = s.stream["lag_seconds"]
        if s.window is not None:
            facts["recovery_window_covered"] = 1.0 if s.window["covered"] else 0.0
        if s.drill:
            facts["last_drill_success"] = 1.0 if s.drill["status"] == "ok" else 0.0
            try:
                facts["last_drill_timestamp_seconds"] = stamp_seconds(s.drill["time"])
            except (TypeError, ValueError):
                pass  # a drill record of no readable time: its verdict still counts
        if s.verification:
            facts["damaged_backups"] = float(len(s.verification["damaged"]))
            try:
                facts["last_verification_timestamp_seconds"] = stamp_seconds(s.verification["time"])
            except (TypeError, ValueError):
                pass  # a verdict of no readable time: the damage it found still counts
        for name, value in facts.items():
            per_source[name].add_metric(labels, value)
    size = gauge("repository_bytes", "Bytes the repository holds, by kind", labels=("kind",))
    for kind, n in result.bytes.items():
        size.add_metric([kind], n)
    window = gauge("recovery_window_seconds", "The retention policy's recovery window", labels=())
    if result.policy_days is not None:
        window.add_metric([], result.policy_days * DAY)
    taken = gauge("status_timestamp_seconds", "When this status was taken (Unix time): a textfile's age",
                  labels=())
    taken.add_metric([], result.time)
    families = [*per_source.values(), size, window, taken]

    class Collected:
        def collect(self):
            return iter(families)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected())
    return generate_latest(registry).decode()


def write_textfile(path: Path, text: str) -> None:
    """Write the exposition where node exporter's textfile collector reads it: whole or not at all (a temporary
    file beside it, renamed over it), so that a scrape never reads half a file."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # not *.prom: the collector skips it
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def serve(host: str, port: int, scrape, ready=None) -> None:
    """Answer GET /metrics on host:port with `scrape()` (the exposition, computed anew for each scrape) until the
    process is stopped; `ready(address)` is called once it listens (the port it got for port 0). A scrape that
    fails answers 503 with the reason."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self._answer(404, "walvault status: the metrics are at /metrics\n")
                return
            try:
                body = scrape()
            except Exception as e:  # noqa: BLE001 - said to the scraper, which marks the target down
                self._answer(503, f"walvault status failed: {e}\n")
                return
            self._answer(200, body, "text/plain; version=0.0.4; charset=utf-8")

        def _answer(self, code: int, body: str, kind: str = "text/plain; charset=utf-8") -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # one line per scrape would drown stderr
            pass

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    with server_class((host, port), Handler) as server:
        if ready is not None:
            ready(server.server_address[:2])
        server.serve_forever()
