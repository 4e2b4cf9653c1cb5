"""walvault's Spark jobs as Airflow tasks: the submit operator, and spark_job(), the tasks every DAG running a job
has (its plan written, the job submitted, its result read, the run's teardown), so that a DAG says only what to
plan and what the result means.

Importing this module has no side effects.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import task, task_group, teardown
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ..hooks.walvault import without_connection_keys
from .walvault import reason_kept, with_provider_defaults


# walcore's LeaseBusy as the command's last line says it: exit 1 as any refusal, but another command of the source
# holds its lease, which passes: retried, unlike a verdict.
_LEASE_HELD = re.compile(r" is held by .*: another .* of this source is running$")


def job_failure(job: str, code: int, last_line: str) -> AirflowException:
    """What a walvault command's exit fails a task with: exit 1, a verdict (damage, a refusal), AirflowFailException,
    which no retry follows; exit 2 (could not check: the repository, a Tarantool unreachable) or a lease held,
    AirflowException, retried as the DAG's default_args say."""
    message = f"{job} exited {code}: {last_line}"
    return AirflowFailException(message) if code == 1 and not _LEASE_HELD.search(last_line) \
        else AirflowException(message)


PLAN_LABEL = "walvault_plan"  # the context key a job's tasks set to their plan's name, a mapped task's label
PLAN_LABEL_TEMPLATE = f"{{{{ {PLAN_LABEL} }}}}"


def label_plan(context, plan_arg: str) -> None:
    """Give a job's task its plan's name (the source a backup plan is named by): its map_index_template renders it,
    after the task ran or failed, as its label in the UI and in its failure mail."""
    from ..spark import plan_name

    context[PLAN_LABEL] = plan_name(context["run_id"], plan_arg)


class WalvaultSparkSubmitOperator(SparkSubmitOperator):
    """A walvault Spark job (its `@plan` the one application argument), whose task fails when the walvault command
    did: exit 1 (a verdict: damage, a refusal) fails it without a retry, exit 2 (could not check) or a lease held
    fails it to be retried; either way the log ends with the command's own last lines. Its connection is
    templated, so that a run's params choose the Spark master (`conn_id="{{ params.spark }}"`). Killed (a run
    marked failed or stopped), it stops spark-submit with every process under it (the JVM, the Python driver and
    workers).

    Templated: `conn_id` (as `_conn_id`) and SparkSubmitOperator's own fields (`application_args`, the plan file)."""

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "_conn_id")

    def __init__(self, **kwargs):
        super().__init__(**with_provider_defaults(type(self), kwargs))

    def execute(self, context):
        from ..spark import job_result

        with reason_kept(context):
            label_plan(context, self.application_args[0])
            with without_connection_keys():  # the job's key is its plan's, whatever an earlier task left
                super().execute(context)
            code, _out, err = job_result(self.application_args[0])
            if code == 0:
                return
            tail = err.strip().splitlines()[-10:] or ["(the command printed nothing on stderr)"]
            self.log.error("the %s job's walvault command exited %d; its last lines:\n%s", self.name, code,
                           "\n".join(f"  {line}" for line in tail))
            raise job_failure("walvault", code, tail[-1].strip())

    def on_kill(self) -> None:
        from spark_jobs.submit import stop_tree

        submitted = getattr(self._hook, "_submit_sp", None) if self._hook is not None else None
        if submitted is not None and submitted.poll() is None:
            stop_tree(submitted.pid, timeout=5)
        super().on_kill()


@dataclass
class SparkJob:
    """The tasks spark_job() made: what the DAG's next task follows (`done`), and the run's teardown (`clean_up`),
    which the DAG puts last."""
    done: Any
    clean_up: Any


def spark_job(job: str, *, plan: Callable[..., dict[str, dict]], result: Callable[[dict], dict], conn_id: str,
              plan_args: Sequence = (), submit_task_id: str | None = None, group_id: str | None = None,
              result_after_failure: bool = False, then: Callable[[Any], Any] | None = None) -> SparkJob:
    """The tasks of the Spark job `job` (spark_jobs/<job>.py) in a DAG:

    - `plan(*plan_args, <context values it names>)`, a task named as the function: {work directory name: plan},
      each plan's "sources" and "options" (spark_jobs/plan.py); it may skip the run. Before it, the Spark
      connection `conn_id` (templated) must exist and be of type spark; after it, each plan gets its job and the
      repository (the `walvault_repo` connection's url and options) and goes to a file of its own, mode 0600 in
      the run's work directory: no option or credential reaches XCom or a command line, only `@<plan file>`.
    - `submit_task_id` (default `spark_<job>`): WalvaultSparkSubmitOperator on `conn_id`, which fails when the
      job's walvault command does.
    - `result(output)`, a task named as the function: `output` is what the job printed (JSON), `result` says it in
      the log and returns the task's XCom; the task fails when the job's command did. It runs after the submit
      task succeeded, or with `result_after_failure` after it failed too (a verify job's output names what it
      found damaged).
    - `then(result's output)`: tasks after the result (inside the group).
    - `clean_up`, the run's teardown (walvault_provider.spark.clean_up).

    With `group_id`, every plan gets a task group of its own (mapped: one plan's failure leaves the others' to
    finish); without, the plan task writes exactly one plan."""

    @functools.wraps(plan)  # the task takes plan's arguments and context values, and is named after it
    def write_plans(*args, **kwargs):
        from airflow.sdk import get_current_context

        from ..config import load
        from ..hooks.walvault import WalvaultRepoHook
        from ..spark import check_connection, work_dir, write_plan

        context = get_current_context()
        with reason_kept(context):
            check_connection(context["task"].render_template(conn_id, context))
            plans = plan(*args, **kwargs)
        target = WalvaultRepoHook(load().repository_connection).target()
        repo = {"repo": target.url, "repo_options": target.options} \
            | ({"repo_key": target.passphrase} if target.passphrase else {})
        written = [write_plan(work_dir(context["run_id"], name), {"job": job, **each, **repo})
                   for name, each in plans.items()]
        if group_id is not None:
            return [[arg] for arg in written]
        (arg,) = written
        return arg

    # one XCom value each (multiple_outputs=False): a dict returned is not split into keys as well
    @task(task_id=result.__name__, doc_md=result.__doc__, multiple_outputs=False,
          trigger_rule="none_skipped" if result_after_failure else "all_success",
          map_index_template=PLAN_LABEL_TEMPLATE if group_id is not None else None)
    def read_result(application_args: list[str]) -> dict:
        import json

        from airflow.sdk import get_current_context

        from ..spark import job_result

        context = get_current_context()
        label_plan(context, application_args[0])
        with reason_kept(context):
            code, out, err = job_result(application_args[0])
            returned = result(json.loads(out) if code == 0 or out.strip().startswith("{") else {})
            if code != 0:
                raise job_failure(job, code, (err.strip().splitlines() or ["(no message)"])[-1])
        return returned

    def submit_and_read(application_args):
        from ..spark import application

        submitted = WalvaultSparkSubmitOperator(task_id=submit_task_id or f"spark_{job}",
                                                application=application(job), application_args=application_args,
                                                conn_id=conn_id, name=f"walvault-{job}",
                                                map_index_template=PLAN_LABEL_TEMPLATE if group_id is not None
                                                else None)
        output = read_result(application_args)
        submitted >> output
        if then is not None:
            then(output)
        return output

    plans = task(write_plans, multiple_outputs=False)(*plan_args)
    if group_id is None:
        done = submit_and_read([plans])
    else:
        @task_group(group_id=group_id)
        def each_plan(application_args):
            """One plan's job, result and what follows it: a failure of one leaves the others' to finish."""
            submit_and_read(application_args)  # returning nothing: what follows the group follows all its tasks

        done = each_plan.expand(application_args=plans)

    @teardown
    @task(multiple_outputs=False)
    def clean_up(run_id=None, ti=None) -> dict:
        """Whatever happened: the run's jobs still running stopped (a run marked failed or stopped while its Spark
        job ran), the backups its jobs committed recorded (XCom `committed` and the log, read before anything is
        removed), then its work directories removed (a plan a failed job never read included). A job it had to
        stop fails this task. The run's state is its work tasks' (a teardown that decided it would make a failed
        run green): a job stopped under its task fails that task, so a stopped run never shows success."""
        from ..spark import clean_up as clean_up_run

        with reason_kept({"ti": ti}):
            return clean_up_run(run_id, ti)

    return SparkJob(done=done, clean_up=clean_up())

