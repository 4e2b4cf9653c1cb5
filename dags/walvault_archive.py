"""walvault_archive: rotate limestone sources past their threshold, archive every sealed file of every configured
source, and verify what was archived now with the Spark verify job. A re-run of an interval changes nothing."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag, task

from walvault_provider.config import load
from walvault_provider.notifications import dag_callbacks
from walvault_provider.operators.spark import spark_job
from walvault_provider.operators.walvault import WalvaultArchiveOperator

CONFIG = load()


def verify_plan(archived: dict) -> dict[str, dict]:
    """The Spark verify job's plan: every file archived now; none, and the job is skipped."""
    from airflow.sdk.exceptions import AirflowSkipException

    if not archived["new"]:
        raise AirflowSkipException("nothing new was archived: nothing to verify")
    # Not scanned twice: a Tarantool file that archive scanned clean is hashed, and its SHA-256 finds archive's
    # verdict in the ledger (a file changed since is scanned again); limestone's are scanned. The report is kept
    # in the repository (reports/verify/).
    return {"verify": {"sources": archived["new"], "options": {"json": True}}}


def report(result: dict) -> dict:
    """What the Spark verify job found, every damaged file named (after a failed job too)."""
    files = result.get("files", [])
    damaged = [f for f in files if f.get("status") == "damaged"]
    lines = [f"{len(files)} files verified by Spark, {len(damaged)} damaged"]
    lines += [f"DAMAGED {f['path']}: {f['findings'][0]['code']} at {f['findings'][0]['offset']}: "
              f"{f['findings'][0]['message']}" for f in damaged if f.get("findings")]
    print("walvault verify of the files archived now\n" + "\n".join(f"  {line}" for line in lines))
    return {"files": len(files), "damaged": len(damaged)}


@dag(dag_id="walvault_archive", schedule=CONFIG.schedules["archive"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault", "archive", *CONFIG.families], doc_md=__doc__,
     description="Rotate limestone sources, archive every source's sealed WAL, verify what was archived with Spark",
     **dag_callbacks(CONFIG, CONFIG.runs.default_args("archive")), dagrun_timeout=CONFIG.runs.dagrun_timeout("archive"))
def walvault_archive():
    archived = WalvaultArchiveOperator(task_id="rotate_and_archive", fail_on_problems=False)
    verify = spark_job("verify", plan=verify_plan, plan_args=[archived.output], result=report,
                       conn_id=CONFIG.spark_connection, submit_task_id="verify_new_files", result_after_failure=True)

    @task(trigger_rule="none_failed")
    def outcome(archived: dict) -> None:
        """The run fails for what the archive could not do, once what it did archive is verified (not retried: the
        next run archives again)."""
        from airflow.sdk.exceptions import AirflowFailException

        if archived["problems"]:
            raise AirflowFailException(f"{len(archived['problems'])} problems: " + "; ".join(archived["problems"]))
        print("walvault archive: no problem")

    verify.done >> outcome(archived.output) >> verify.clean_up


walvault_archive()
