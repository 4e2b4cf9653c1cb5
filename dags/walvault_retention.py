"""walvault_retention: the configured recovery window (30 days shipped), in the mission's order, per configured
source: `confirm_<source>` finds the anchor (the verified snapshot retention relies on) and re-hashes its stored
bytes, then `expire_<source>` expires only that confirmed source (walvault expire). An uncovered source's confirm
is skipped and so is its expiry; an anchor that does not re-hash fails its confirm, and nothing of the source is
expired. Each log says it as the CLI does (why uncovered, what goes and why, what is kept and why).

It runs when a source's snapshot asset updates (walvault_snapshot made a snapshot of it), and deletes at most once
a day: what deletes is a manual run with `dry_run` unticked, or the day's first run (UTC) triggered by
walvault_snapshot's events, started within `schedules.late_after_minutes` of the newest. Each expire task keeps the
day record in its source's snapshot asset's state store, written before it deletes; a later asset-triggered run the
same day only plans, and so does one triggered by an asset event made by hand. A manual run with `dry_run` ticked
(the form's default) only plans. Its log says why.

For previews, the form also takes `days` (a recovery window other than the configured one) and `as_of` (the plan as
of that instant): plan only. A run that would apply and is given either fails at once, naming them, and deletes
nothing."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag

from walvault_provider.assets import data_schedule, source_assets
from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.walvault import WalvaultConfirmOperator, WalvaultExpireOperator

CONFIG = load()


@dag(dag_id="walvault_retention", schedule=data_schedule(CONFIG, "retention"), start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "retention", *CONFIG.families], doc_md=__doc__,
     description="Confirm each source's coverage, then expire what the recovery window no longer needs",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("retention")), dagrun_timeout=CONFIG.runs.dagrun_timeout("retention"),
     params={"dry_run": Param(True, type="boolean", description="show the plan only; delete nothing (a manual "
                              "run; the day's first run after a new snapshot applies the policy)"),
             "days": Param(None, type=["null", "number"], minimum=1, description="preview only: the plan under a "
                           f"recovery window of this many days instead of the configured {CONFIG.retention_days:g} "
                           "(with dry_run unticked the run refuses it)"),
             "as_of": Param(None, type=["null", "string"], description="preview only: the plan as of this instant, "
                            "ISO 8601 UTC such as 2026-11-01T04:00:00Z (with dry_run unticked the run refuses it)")})
def walvault_retention():
    # the form's days and as_of preview: retention_window() refuses them in a run that applies
    window = {"dry_run": "{{ params.dry_run }}", "days": "{{ params.days }}", "as_of": "{{ params.as_of }}"}
    snapshots = source_assets(CONFIG, "snapshot")
    for confirm in WalvaultConfirmOperator.per_source(CONFIG, "confirm", **window):
        # the inlet: the source's snapshot asset, whose state store keeps the day record
        WalvaultExpireOperator(task_id=f"expire_{confirm.source}", confirmed=confirm.output,
                               inlets=[snapshots[confirm.source]], **window)


walvault_retention()
