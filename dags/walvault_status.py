"""walvault_status: every 10 minutes (`schedules.status`), the status of every source in the repository (walvault
status), written as the Prometheus textfile `metrics.textfile` names for node exporter, then one check per
configured source, `freshness_<source>`, that fails with the alert as its cause while the source is stale: "no
verified backup of S for N hours", "archive of S behind by more than M minutes" (`freshness`: 26 hours and 60
minutes by default), and for a streamed source "stream of S is down" or "stream of S behind by more than N
seconds" (60). A stale source is mailed when it turns stale, and again every `freshness.remind_every_hours`
(4) while it stays so; the runs in between fail without mail. When every source is fresh again, the run's
success after a failed one sends the recovery mail. Runs never overlap and never catch up: a check is of now."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.walvault import WalvaultFreshnessOperator, WalvaultStatusOperator

CONFIG = load()


@dag(dag_id="walvault_status", schedule=CONFIG.schedules["status"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "status", *CONFIG.families], doc_md=__doc__,
     description="Each source's freshness: alerts on an old backup or a lagging archive; the Prometheus textfile",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("status")), dagrun_timeout=CONFIG.runs.dagrun_timeout("status"))
def walvault_status():
    status = WalvaultStatusOperator(task_id="status")
    WalvaultFreshnessOperator.per_source(CONFIG, "freshness", status=status.output)


walvault_status()
