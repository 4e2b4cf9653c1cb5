"""walvault_backup: a full or incremental backup of a configured source with the Spark backup job, then its record
and its verification in the repository. From the UI: the trigger form picks the source, the type, whether to
verify after, and the Spark master. On schedule: every source, incremental unless its newest full backup is
`backup.full_every_days` old (or there is none), each in a group of its own (one source's failure does not stop
the others'). A scheduled run that starts more than `schedules.late_after_minutes` after its time (the catch-up
Airflow creates at once on unpause, or after the scheduler was down) backs up nothing: nobody asked for it now.
Runs never overlap: one at a time, and each backup waits up to an hour for its source's lease. The Spark task
fails when walvault does (exit 1 or 2), its log ending with the cause; the teardown stops the run's jobs still
running before it removes their directory, and records the backups they committed."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Param, dag, task, task_group, teardown

from walvault_provider.config import load
from walvault_provider.operators.spark import WalvaultSparkSubmitOperator
from walvault_provider.operators.walvault import LEASE_WAIT, WalvaultVerifyOperator, scheduled_backup_type
from walvault_provider.spark import application

CONFIG = load()
NAMES = [s.name for s in CONFIG.sources]


@dag(dag_id="walvault_backup", schedule=CONFIG.schedules["backup"], start_date=datetime(2026, 1, 1), catchup=False,
     max_active_runs=1, tags=["walvault"], doc_md=__doc__,
     params={"source": Param(NAMES[0], enum=NAMES, description="the configured source to back up (a scheduled "
                             "run backs up every source)"),
             "type": Param("full", enum=["full", "incremental"], description="full, or incremental on the newest "
                           "full backup of the source"),
             "verify": Param(True, type="boolean", description="verify the backup in the repository after"),
             "spark": Param(CONFIG.spark_connection, enum=list(CONFIG.spark_connections),
                            description="the Spark master: the Airflow connection to submit to (local[2] or a "
                            "standalone master)")})
def walvault_backup():
    @task
    def plan(params=None, dag_run=None, run_id=None) -> list[list[str]]:
        """One Spark plan per source to back up; the repository's options and a running Tarantool's password only
        in the plan file (mode 0600, removed by the job once its result is written)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from walvault_provider.hooks.walvault import WalvaultRepoHook, tarantool_uri
        from walvault_provider.operators.walvault import late_minutes
        from walvault_provider.spark import check_connection, work_dir, write_plan

        config = load()
        late = late_minutes(dag_run, config.late_after_minutes)
        if late is not None:  # nobody asked for it now: unpausing must not start a backup of every source
            raise AirflowSkipException(f"a catch-up run started {late:.0f} minutes late: no backup; the next on-time "
                                       "run backs up every source")
        check_connection(params["spark"])
        hook = WalvaultRepoHook(config.repository_connection)
        target = hook.target()
        manual = dag_run.run_type == "manual"
        sources = [config.source(params["source"])] if manual else list(config.sources)
        repo = hook.repository(create=config.repository_create)  # missing and not to be created: said here
        args = []
        for source in sources:
            kind = params["type"] if manual else scheduled_backup_type(repo, source.path, config.full_every_days)
            options = {"type": kind, "json": True, "wait": LEASE_WAIT}
            if source.connection:  # a running Tarantool: its checkpoint pinned by box.backup.start()
                options["connect"] = tarantool_uri(source.connection)
            args.append([write_plan(work_dir(run_id, f"backup-{source.name}"),
                                    {"job": "backup", "sources": [str(source.path)], "repo": target.url,
                                     "repo_options": target.options, "options": options})])
        return args

    @task
    def record(plan_args: list[str]) -> dict:
        """The backup the job made (the Spark task failed, naming the cause, if it made none)."""
        import json

        from walvault_provider.spark import job_result

        _code, out, _err = job_result(plan_args[0])
        result = json.loads(out)
        print(f"walvault backup {result['id']} ({result['type']}) of {result['family']} "
              f"{result['source']['instance']}\n  {result['files']} files, {result['bytes']:,} bytes, "
              f"{result['stored_bytes']:,} stored; restores to {result['position']}")
        return result

    @task_group
    def backup_source(plan_args: list[str]):
        """One source's backup, record and verification: a failure of one source leaves the others' to finish."""
        submitted = WalvaultSparkSubmitOperator(task_id="spark_backup", application=application("backup"),
                                                application_args=plan_args, conn_id="{{ params.spark }}",
                                                name="walvault-backup")
        recorded = record(plan_args)
        submitted >> recorded
        WalvaultVerifyOperator(task_id="verify", enabled="{{ params.verify }}", backup_id=recorded["id"])

    @teardown
    def clean_up(run_id=None, ti=None) -> dict:
        """Whatever happened: the run's jobs still running stopped (a run marked failed or stopped while its Spark
        job ran), the backups its jobs committed recorded (XCom `committed` and the log, read before anything is
        removed), then its work directories removed (a plan a failed job never read included). A job it had to
        stop fails this task. The run's state is its work tasks' (a teardown that decided it would make a failed
        run green): a job stopped under its task fails that task, so a stopped run never shows success."""
        from walvault_provider.spark import clean_up as clean_up_run

        return clean_up_run(run_id, ti)

    backup_source.expand(plan_args=plan()) >> clean_up()


walvault_backup()
