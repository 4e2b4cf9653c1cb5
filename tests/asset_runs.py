"""An asset-triggered DAG run under `airflow dags test`: the run the scheduler creates when assets update, with its
consumed asset events, against the real metadata database. `airflow dags test` itself always makes a manual run;
here its run is made as the scheduler makes an asset-triggered one (run type, no logical date, the events consumed),
and everything else (the DAG parsed and synced, its tasks run through the execution API) is `airflow dags test`'s
own. Import it as `from asset_runs import asset_triggered_test` (tests/ is on sys.path).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime

from forked_airflow import airflow

# run in the command's process before Airflow's CLI; PARAMETERS: [uris, made_by, at] as JSON
_PRELUDE = r"""
import json
from datetime import datetime

import airflow.models.dagrun as dagrun_module

uris, made_by, at = json.loads(PARAMETERS)


def asset_triggered(*, dag, run_after, conf, session, **_):
    from sqlalchemy import select

    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType

    started = datetime.fromisoformat(at) if at else run_after
    events = []
    for uri in uris:
        asset = session.scalar(select(AssetModel).where(AssetModel.uri == uri))
        if made_by == "newest":  # the newest event the asset has (a DAG's task made it)
            events.append(session.scalar(select(AssetEvent).where(AssetEvent.asset_id == asset.id)
                                         .order_by(AssetEvent.id.desc()).limit(1)))
            continue
        # an event as `made_by` makes it (of a stored backup or snapshot; by hand: no source DAG, no metadata), one
        # minute before the run starts
        from datetime import timedelta
        by_hand = made_by == "hand"
        event = AssetEvent(asset_id=asset.id, source_dag_id=None if by_hand else made_by,
                           extra={} if by_hand else {"id": "made-by-the-test"},
                           timestamp=started - timedelta(minutes=1))
        session.add(event)
        events.append(event)
    run = dag.create_dagrun(
        run_id=DagRun.generate_run_id(run_type=DagRunType.ASSET_TRIGGERED, logical_date=None, run_after=started),
        logical_date=None, data_interval=None, run_after=started, conf=conf, run_type=DagRunType.ASSET_TRIGGERED,
        state=DagRunState.RUNNING, triggered_by=DagRunTriggeredByType.ASSET, start_date=started, session=session)
    run.consumed_asset_events.extend(events)
    session.commit()
    print(f"asset-triggered run {run.run_id} consumed {[e.id for e in events]}", flush=True)
    return run


dagrun_module.get_or_create_dagrun = asset_triggered
"""


def asset_triggered_test(env: dict[str, str], dag_id: str, uris: list[str], made_by: str = "newest",
                         at: datetime | None = None, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`airflow dags test DAG_ID` as an asset-triggered run consuming one event of each asset in `uris`: its newest
    (`made_by="newest"`), or a new one as the DAG `made_by` makes it (`"hand"`: by hand, no source DAG). `at`: the
    run's start (now without it), for a run of another day."""
    parameters = json.dumps([uris, made_by, at.isoformat() if at else None])
    return airflow(env, "dags", "test", dag_id, prelude=_PRELUDE.replace("PARAMETERS", repr(parameters)),
                   timeout=timeout)
