"""walvault_snapshot: store and verify a covering snapshot of every configured source (walvault snapshot), so that
retention has coverage to confirm."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.walvault import WalvaultSnapshotOperator

CONFIG = load()


@dag(dag_id="walvault_snapshot", schedule=CONFIG.schedules["snapshot"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "snapshot", *CONFIG.families], doc_md=__doc__,
     description="A verified covering snapshot of each source, the coverage retention relies on",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("snapshot")), dagrun_timeout=CONFIG.runs.dagrun_timeout("snapshot"))
def walvault_snapshot():
    WalvaultSnapshotOperator.per_source(CONFIG, "snapshot")


walvault_snapshot()
