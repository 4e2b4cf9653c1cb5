"""walvault_retention: the configured recovery window (30 days shipped): it confirms each source's coverage, then
expires what the anchor snapshot covers (walvault expire). `dry_run` shows the plan and deletes nothing; it is
true for a manual run unless unticked, false on schedule."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag

from walvault_provider.config import load
from walvault_provider.operators import WalvaultExpireOperator

CONFIG = load()


@dag(dag_id="walvault_retention", schedule=CONFIG.schedules["retention"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault"], doc_md=__doc__,
     params={"dry_run": Param(True, type="boolean", description="show the plan only; delete nothing")})
def walvault_retention():
    # A scheduled run applies the policy; a manual one applies it only when dry_run is unticked.
    WalvaultExpireOperator(task_id="expire",
                           dry_run="{{ params.dry_run if dag_run.run_type == 'manual' else False }}")


walvault_retention()
