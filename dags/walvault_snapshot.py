"""walvault_snapshot: store and verify a covering snapshot of a configured source (walvault snapshot), so that
retention has coverage to confirm. It runs when a source's backup asset updates (a backup of it recorded and
verified by walvault_backup) and snapshots the sources whose backups triggered it; each snapshot updates its
source's snapshot asset (walvault://REPO/SOURCE/snapshot, its metadata the snapshot's id, position and bytes), which
walvault_retention runs on. A manual run snapshots every source."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from walvault_provider.assets import data_schedule, source_assets
from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.walvault import WalvaultSnapshotOperator

CONFIG = load()


@dag(dag_id="walvault_snapshot", schedule=data_schedule(CONFIG, "snapshot"), start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "snapshot", *CONFIG.families], doc_md=__doc__,
     description="A verified covering snapshot of each source, the coverage retention relies on",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("snapshot")), dagrun_timeout=CONFIG.runs.dagrun_timeout("snapshot"))
def walvault_snapshot():
    for name, asset in source_assets(CONFIG, "snapshot").items():
        WalvaultSnapshotOperator(task_id=f"snapshot_{name}", source=name, outlets=[asset])


walvault_snapshot()
