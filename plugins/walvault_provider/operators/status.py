"""walvault status from Airflow (the walvault_status DAG): the repository's status taken once a run and written as
the Prometheus textfile the configuration names, then one freshness check per configured source that fails, with
the alert as its cause, while the source is stale: "no verified backup of S for N hours", "archive of S behind by
more than M minutes" (the `freshness` section's thresholds).

A check runs every few minutes, so a stale source fails run after run; its failure mail (walvault_provider.
notifications) goes out when the source turns stale or gets a new alert, and again every
`freshness.remind_every_hours` while it stays so: the runs in between fail without mail (FreshnessAlert.mail).
Each check keeps its alert state as the XCom `freshness_alert`, read by the next run's check of the source.

Importing this module has no side effects: the configuration is read and walcore is imported when a task runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from airflow.sdk.exceptions import AirflowFailException

from .walvault import _SourceOperator, _WalvaultOperator

ALERT_KEY = "freshness_alert"  # a check's alert state, for the next run's check of its source
HOUR, MINUTE = 3600.0, 60.0


class FreshnessAlert(AirflowFailException):
    """A source is stale: the check fails at once (a retry would find the same). `mail` False: the alert was
    mailed and its reminder is not due, so the failure callback sends nothing."""

    def __init__(self, message: str, *, mail: bool):
        super().__init__(message)
        self.mail = mail


class WalvaultStatusOperator(_WalvaultOperator):
    """Take the status of every source of the repository (walvault status, with the `freshness` thresholds) and
    write its Prometheus exposition, whole, to the `metrics.textfile` the configuration names (none: no file).
    The log ends with `walvault status`'s text. Returns the status as `walvault status --json` says it: what each
    source's freshness check judges.

    Templated: `config_path`."""

    def work(self, context):
        from walcore.command.status import exposition, write_textfile
        from walcore.frontend import outcome, status_lines
        from walcore.requests import StatusRequest
        from walcore.runner import LocalRunner

        config = self.load_config()
        repo, names_repo = self.repository(config)
        result = outcome(StatusRequest(max_backup_age=config.freshness.max_backup_age_hours,
                                       max_archive_lag=config.freshness.max_archive_lag_minutes, **names_repo),
                         LocalRunner())
        lines = [f"WARNING: {w}" for w in result.warnings] + status_lines(result)
        if config.textfile is not None:
            if not config.textfile.parent.is_dir():
                raise AirflowFailException(f"metrics.textfile: {config.textfile}: its directory does not exist")
            write_textfile(config.textfile, exposition(result))
            lines.append(f"written to {config.textfile}")
        self.summary(f"walvault status --repo {repo.display}", lines)
        return result.to_json()


class WalvaultFreshnessOperator(_SourceOperator):
    """Whether one configured source is fresh, by `status` (the WalvaultStatusOperator's result): its newest backup
    that restores (and whose last drill did not fail) is at most `freshness.max_backup_age_hours` old, and where
    its directory is on this host, the archive lags it by at most `freshness.max_archive_lag_minutes`. Stale: the
    task fails with the alerts as its cause (FreshnessAlert, mailed as `remind_every_hours` says). The source's
    other problems (its window, its last drill) are logged, not alerted: their DAGs say them.

    Templated: `config_path`, `source`, `status` (an XComArg: the task runs after it)."""

    template_fields: Sequence[str] = ("config_path", "source", "status")

    def __init__(self, *, status, **kwargs):
        super().__init__(**kwargs)
        self.status = status

    def work(self, context):
        import time

        config = self.load_config()
        source = config.source(self.source)
        alerts, lines = judge(source.name, source.path, self.status, config.freshness)
        ti = context["ti"]
        previous = ti.xcom_pull(task_ids=self.task_id, key=ALERT_KEY, include_prior_dates=True)
        state = alert_state(previous, sorted(alerts), time.time(), config.freshness.remind_every_hours)
        ti.xcom_push(key=ALERT_KEY, value=state)
        self.summary(f"walvault freshness of {source.name}: {'STALE' if alerts else 'fresh'}",
                     [f"ALERT: {a}" for a in alerts.values()] + lines)
        if alerts:
            raise FreshnessAlert("; ".join(alerts.values()) + stale_since(state),
                                 mail=state["mailed"] == state["now"])
        return {"source": source.name, "fresh": True}


def judge(name: str, path: Path, status: dict, freshness) -> tuple[dict[str, str], list[str]]:
    """({"backup" and/or "archive": the alert}, the lines that say why) of the configured source `name` at `path`,
    by a status result's JSON. The source is its directory, whichever host recorded its backups (a Spark worker)
    or its archive: its newest backup of them all, and the archive that reaches furthest."""
    from walcore.command.status import duration

    where = str(Path(path).resolve())
    entries = [s for s in status["sources"] if s["path"] == where]
    hours, minutes = freshness.max_backup_age_hours, freshness.max_archive_lag_minutes
    alerts, lines = {}, []
    newest = max((s["backup"] for s in entries if s["backup"]), key=lambda b: b["finished"], default=None)
    if newest is None:
        alerts["backup"] = f"no verified backup of {name} for {hours:g} hours: none in the repository restores"
    else:
        age = newest["age_seconds"]
        lines.append(f"backup {newest['id']} ({newest['type']}), finished {newest['finished']}, {duration(age)} "
                     f"old (alert after {hours:g} hours)")
        if age > hours * HOUR:
            alerts["backup"] = (f"no verified backup of {name} for {hours:g} hours: the newest, {newest['id']}, "
                                f"finished {duration(age)} ago")
    judged = [s for s in entries if s["archive_lag_seconds"] is not None]
    furthest = min(judged, key=lambda s: s["archive_lag_seconds"], default=None)
    if furthest is not None:
        lag = furthest["archive_lag_seconds"]
        lines.append(f"archive lags the source by {duration(lag)} (alert after {minutes:g} minutes)")
        if lag > minutes * MINUTE:
            alerts["archive"] = (f"archive of {name} behind by more than {minutes:g} minutes: {duration(lag)} "
                                 f"behind (it reaches {furthest['archive']['position']}, the source "
                                 f"{furthest['source']['position']})")
    elif any(s["source"] for s in entries) and not any(s["archive"] for s in entries):
        alerts["archive"] = f"archive of {name} behind by more than {minutes:g} minutes: nothing of it is archived"
    else:
        lines.append("archive lag not judged: the directory is not on this host, or its log does not say its time")
    # what the other DAGs alert on, for the whole picture
    lines += [f"also: the recovery window of {s['window']['days']:g} days is not covered" for s in entries
              if s["window"] and not s["window"]["covered"]]
    lines += [f"also: the last drill (of backup {s['drill']['backup']}) failed: {s['drill']['problem']}"
              for s in entries if s["drill"] and s["drill"]["status"] != "ok"]
    return alerts, lines


def alert_state(previous: dict | None, kinds: list[str], now: float, remind_every_hours: float) -> dict | None:
    """What a check keeps for the next (None: fresh), `previous` being what the last one kept: the alerts'
    `kinds`, since when the source is stale, when it was last mailed, and `now`. Mailed now (`mailed` == `now`):
    the source was fresh before, or it has an alert of a new kind, or it was last mailed `remind_every_hours`
    ago."""
    if not kinds:
        return None
    if previous is None or not set(kinds) <= set(previous["kinds"]) \
            or now - previous["mailed"] >= remind_every_hours * HOUR:
        mailed = now
    else:
        mailed = previous["mailed"]
    return {"kinds": kinds, "since": previous["since"] if previous else now, "mailed": mailed, "now": now}


def stale_since(state: dict) -> str:
    """What a failure's cause adds when the source was stale at the check before this one too."""
    from walcore.command.status import duration
    from walcore.retention import iso

    stale = state["now"] - state["since"]
    return f" (stale since the check of {iso(state['since'])}, {duration(stale)} ago)" if stale > 0 else ""
