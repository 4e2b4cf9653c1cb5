"""walvault_archive: rotate limestone sources past their threshold, archive every sealed file of every configured
source, and verify what was archived now with the Spark verify job. A re-run of an interval changes nothing."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag, task, teardown

from walvault_provider.config import load
from walvault_provider.operators.spark import WalvaultSparkSubmitOperator
from walvault_provider.operators.walvault import WalvaultArchiveOperator
from walvault_provider.spark import application

CONFIG = load()


@dag(dag_id="walvault_archive", schedule=CONFIG.schedules["archive"], start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["walvault"], doc_md=__doc__)
def walvault_archive():
    archived = WalvaultArchiveOperator(task_id="rotate_and_archive", fail_on_problems=False)

    @task
    def verify_plan(archived: dict, run_id=None) -> str:
        from airflow.sdk.exceptions import AirflowSkipException

        from walvault_provider.hooks.walvault import WalvaultRepoHook
        from walvault_provider.spark import check_connection, work_dir, write_plan

        check_connection(CONFIG.spark_connection)
        if not archived["new"]:
            raise AirflowSkipException("nothing new was archived: nothing to verify")
        # every file scanned again (`full`: the archive's own verdicts are not taken on trust); the report is
        # kept in the repository (reports/verify/), whose options (S3 credentials) only the plan file holds
        target = WalvaultRepoHook(load().repository_connection).target()
        return write_plan(work_dir(run_id, "verify"), {"job": "verify", "sources": archived["new"],
                                                       "repo": target.url, "repo_options": target.options,
                                                       "options": {"json": True, "full": True}})

    plan = verify_plan(archived.output)
    verify = WalvaultSparkSubmitOperator(task_id="verify_new_files", application=application("verify"),
                                 application_args=[plan], conn_id=CONFIG.spark_connection, name="walvault-verify")

    @task(trigger_rule="none_skipped")  # after a failed verify job too: it names every damaged file
    def report(plan: str) -> dict:
        import json

        from walvault_provider.spark import job_result

        code, out, err = job_result(plan)
        result = json.loads(out) if out.strip().startswith("{") else {}
        files = result.get("files", [])
        damaged = [f for f in files if f.get("status") == "damaged"]
        lines = [f"{len(files)} files verified by Spark, {len(damaged)} damaged"]
        lines += [f"DAMAGED {f['path']}: {f['findings'][0]['code']} at {f['findings'][0]['offset']}: "
                  f"{f['findings'][0]['message']}" for f in damaged if f.get("findings")]
        print("walvault verify of the files archived now\n" + "\n".join(f"  {line}" for line in lines))
        if code != 0:
            raise RuntimeError(f"verify exited {code}: {(err.strip().splitlines() or ['(no message)'])[-1]}")
        return {"files": len(files), "damaged": len(damaged)}

    @task(trigger_rule="none_failed")
    def outcome(archived: dict) -> None:
        """The run fails for what the archive could not do, once what it did archive is verified."""
        if archived["problems"]:
            raise RuntimeError(f"{len(archived['problems'])} problems: " + "; ".join(archived["problems"]))
        print("walvault archive: no problem")

    @teardown
    def clean_up(run_id=None, ti=None) -> dict:
        """Whatever happened: the run's verify job stopped if it still runs, then its work directory removed (a
        plan a failed job never read included); a job it had to stop fails this task (the run's state is its work
        tasks')."""
        from walvault_provider.spark import clean_up as clean_up_run

        return clean_up_run(run_id, ti)

    verified = report(plan)
    plan >> verify >> verified >> outcome(archived.output) >> clean_up()


walvault_archive()
