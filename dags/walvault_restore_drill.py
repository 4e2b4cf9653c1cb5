"""walvault_restore_drill: weekly, restore the newest backup of each source into a scratch directory and prove it
(every hash; Tarantool started on it at the recorded vclock where installed; limestone's checks and recorded
counts). A failed drill marks the backup in `walvault backups`."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.walvault import WalvaultDrillOperator

CONFIG = load()


@dag(dag_id="walvault_restore_drill", schedule=CONFIG.schedules["restore_drill"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "restore-drill", *CONFIG.families], doc_md=__doc__,
     description="Restore the newest backup of each source into scratch and prove it",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("restore_drill")), dagrun_timeout=CONFIG.runs.dagrun_timeout("restore_drill"))
def walvault_restore_drill():
    WalvaultDrillOperator.per_source(CONFIG, "drill")


walvault_restore_drill()
