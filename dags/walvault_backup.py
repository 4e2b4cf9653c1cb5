"""walvault_backup: a full or incremental backup of a configured source with the Spark backup job, then its record
and its verification in the repository. From the UI: the trigger form picks the source, the type, whether to
verify after, and the Spark master. On schedule: every source, incremental unless its newest full backup is
`backup.full_every_days` old (or there is none), each in a group of its own (one source's failure does not stop
the others'). A scheduled run that starts more than `schedules.late_after_minutes` after its time (the catch-up
Airflow creates at once on unpause, or after the scheduler was down) backs up nothing: nobody asked for it now.
Runs never overlap: one at a time; a backup whose source's lease another command holds waits
`runs.lease_wait_minutes`, then its task is retried (a waiting task holds a worker slot, one waiting to retry none).
The Spark task fails when walvault does (exit 1 or 2), its log ending with the cause; the teardown stops the run's
jobs still running before it removes their directory, and records the backups they committed. Each source's backup,
recorded and verified, updates that source's backup asset (walvault://REPO/SOURCE/backup, its metadata the backup's
id, type, position and bytes), which walvault_snapshot runs on; a source whose backup failed updates nothing. A
source with a second repository (`copy_to` in the configuration) has its verified backup copied there (`walvault
copy`: the backup with its parent chain, every object checked at the destination)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag, task

from walvault_provider.assets import BACKUPS_ALIAS
from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.spark import PLAN_LABEL, PLAN_LABEL_TEMPLATE, spark_job
from walvault_provider.operators.walvault import (WalvaultCopyOperator, WalvaultVerifyOperator,
                                                   scheduled_backup_type)

CONFIG = load()
NAMES = [s.name for s in CONFIG.sources]


def plan(params=None, dag_run=None) -> dict[str, dict]:
    """One Spark plan per source to back up; a running Tarantool's password only in the plan file."""
    from airflow.sdk.exceptions import AirflowSkipException

    from walvault_provider.hooks.tarantool import TarantoolHook
    from walvault_provider.hooks.walvault import WalvaultRepoHook
    from walvault_provider.operators.walvault import late_minutes

    config = load()
    late = late_minutes(dag_run, config.late_after_minutes)
    if late is not None:  # nobody asked for it now: unpausing must not start a backup of every source
        raise AirflowSkipException(f"a catch-up run started {late:.0f} minutes late: no backup; the next on-time "
                                   "run backs up every source")
    manual = dag_run.run_type == "manual"
    sources = [config.source(params["source"])] if manual else list(config.sources)
    # missing and not to be created: said here
    repo = WalvaultRepoHook(config.repository_connection).repository(create=config.repository_create)
    plans = {}
    for source in sources:
        kind = params["type"] if manual else scheduled_backup_type(repo, source.path, config.full_every_days)
        options = {"type": kind, "json": True, "wait": config.runs.lease_wait}
        if source.connection:  # a running Tarantool: its checkpoint pinned by box.backup.start()
            options["connect"] = TarantoolHook(source.connection).uri()
        # named by its source: the name labels the plan's mapped tasks (the UI, a failure's mail)
        plans[source.name] = {"sources": [str(source.path)], "options": options}
    return plans


def record(result: dict) -> dict:
    """The backup the job made (the Spark task failed, naming the cause, if it made none), its warnings first."""
    from walvault_provider.notes import warnings_of
    from walvault_provider.operators.walvault import log_warnings

    warnings = "".join(f"\n  {line}" for line in log_warnings(warnings_of(result)))
    print(f"walvault backup {result['id']} ({result['type']}) of {result['family']} "
          f"{result['source']['instance']}{warnings}\n  {result['files']} files, {result['bytes']:,} bytes, "
          f"{result['stored_bytes']:,} stored; restores to {result['position']}")
    return result


@task(outlets=[BACKUPS_ALIAS], trigger_rule="none_failed", map_index_template=PLAN_LABEL_TEMPLATE)
def publish(recorded: dict, *, outlet_events=None) -> None:
    """The source's backup asset updated, its metadata what the backup is: after the backup's record and its
    verification (or verify unticked); a failed backup, record or verification updates nothing. Through an alias:
    a mapped task's outlets are every source's assets, an alias event names this source's alone."""
    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import AirflowFailException

    from walvault_provider.assets import create_asset

    config = load()
    name = next((s.name for s in config.sources if str(s.path.resolve()) == recorded["source"]["path"]), None)
    if name is None:
        raise AirflowFailException(f"the backup {recorded['id']} is of {recorded['source']['path']}, no configured "
                                   "source's directory: no asset updated")
    get_current_context()[PLAN_LABEL] = name  # its label in the UI
    outlet_events[BACKUPS_ALIAS].add(
        create_asset(repository=config.repository_connection, source=name, kind="backup"),
        extra={"source": name, "id": recorded["id"], "type": recorded["type"], "position": recorded["position"],
               "bytes": recorded["bytes"], "stored_bytes": recorded["stored_bytes"]})


def _verified(recorded):
    """The backup verified, then published, and copied when a second repository is configured (`copy_to`)."""
    verify = WalvaultVerifyOperator(task_id="verify", enabled="{{ params.verify }}", backup_id=recorded)
    verify >> publish(recorded)
    if any(s.copy_to for s in CONFIG.sources):  # a source without one skips its copy
        verify >> WalvaultCopyOperator(task_id="copy", backup_id=recorded, trigger_rule="none_failed")
    return verify


@dag(dag_id="walvault_backup", schedule=CONFIG.schedules["backup"], start_date=datetime(2026, 1, 1), catchup=False,
     max_active_runs=1, tags=["walvault", "backup", *CONFIG.families], doc_md=__doc__,
     description="Full or incremental backup of each source with Spark, recorded and verified in the repository",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("backup")), dagrun_timeout=CONFIG.runs.dagrun_timeout("backup"),
     params={"source": Param(NAMES[0], enum=NAMES, description="the configured source to back up (a scheduled "
                             "run backs up every source)"),
             "type": Param("full", enum=["full", "incremental"], description="full, or incremental on the newest "
                           "full backup of the source"),
             "verify": Param(True, type="boolean", description="verify the backup in the repository after"),
             "spark": Param(CONFIG.spark_connection, enum=list(CONFIG.spark_connections),
                            description="the Spark master: the Airflow connection to submit to (local[2] or a "
                            "standalone master)")})
def walvault_backup():
    # each source in a group of its own, its backup verified in the repository after its record, then published
    backup = spark_job("backup", plan=plan, result=record, conn_id="{{ params.spark }}", group_id="backup_source",
                       then=lambda recorded: _verified(recorded))
    backup.done >> backup.clean_up


walvault_backup()
