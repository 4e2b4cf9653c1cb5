"""The walvault_status DAG's judgement: freshness thresholds, stream and identity alerts, when an alert is mailed.

The DAG itself under `airflow dags test` (a stale source's check failing and mailing once, its recovery mailing,
the Prometheus textfile): test_dags' test_a_stale_source_fails_its_check_and_mails_once_and_its_recovery_mails,
in that file's AIRFLOW_HOME and loaded Airflow.
"""

from __future__ import annotations

import json
import shutil
import time

from conftest import TARANTOOL_FIXTURES, clock_at, copy_tree, new_repository, require_shared, run_main
from walvault_provider.config import load
from walvault_provider.operators.walvault import alert_state, judge

pytestmark = [require_shared]
DAY, HOUR = 86400, 3600
SOURCES = "sources: [{name: tt, family: tarantool, path: /x}]\n"


def test_freshness_and_textfile_defaults(tmp_path):
    path = tmp_path / "walvault.yaml"
    path.write_text(SOURCES)
    config = load(path)
    freshness = config.freshness
    assert (freshness.max_backup_age_hours, freshness.max_archive_lag_minutes, freshness.remind_every_hours) == (
        26, 60, 4), "walvault status's thresholds, and Alertmanager's repeat interval"
    assert config.textfile is None and config.schedules["status"] == "*/10 * * * *"
    path.write_text(SOURCES + "metrics: {textfile: prom/walvault.prom}\nfreshness: {max_archive_lag_minutes: 15}")
    config = load(path)
    assert config.textfile == tmp_path / "prom" / "walvault.prom" and config.freshness.max_archive_lag_minutes == 15


def _status_of(path, stream: dict | None) -> dict:
    """`walvault status --json` of one Tarantool source at `path` on this host, fresh but for its stream: `stream`."""
    from walcore.retention import iso

    now = 1_800_000_000.0
    source = {"family": "tarantool", "instance": "i1", "host": "h", "path": str(path.resolve()), "ok": True,
              "backup": {"id": "b1", "type": "full", "finished": iso(now - HOUR), "age_seconds": HOUR,
                         "position": {"vclock": {"1": 5}}},
              "archive": {"position": {"vclock": {"1": 90}}, "time": iso(now - 60), "files": 3, "age_seconds": 60},
              "stream": stream, "source": {"position": {"vclock": {"1": 90}}, "time": iso(now - 60), "instance": "i1"},
              "archive_lag_seconds": 0.0, "window": None, "drill": None, "verification": None, "problems": []}
    return {"time": iso(now), "sources": [source]}


def _stream(alive: bool, lag: float | None, last_commit: str | None = "2027-01-15T07:59:00Z") -> dict:
    return {"segments": 3 if last_commit else 0, "position": {"vclock": {"1": 90}} if last_commit else None,
            "last_commit": last_commit, "age_seconds": 3 * HOUR if last_commit else None, "alive": alive,
            "lease_renewed": "2027-01-15T07:59:50Z" if alive else None, "lag_seconds": lag}


def test_a_streamed_source_alerts_when_its_streamer_is_down_or_lags_not_when_its_source_is_idle(tmp_path):
    """The streamer's lease, renewed while it runs, says it is live: an idle source's newest segment may be hours
    old and the source fresh; a dead streamer (no live lease) alerts whatever its segments; a live one lagging
    its directory on this host by more than `max_stream_lag_seconds` (60 by default) alerts. A source the
    configuration does not stream is not judged by its stream."""
    freshness = load(_config(tmp_path, SOURCES)).freshness
    assert freshness.max_stream_lag_seconds == 60
    path = tmp_path / "tt"

    def judged(stream, **given):
        return judge("tt", path, _status_of(path, stream), given.pop("freshness", freshness), **given)

    assert judged(None) == judged(_stream(False, None)) == judged(None, streamed=False)
    assert "stream" not in judged(_stream(False, None))[0], "not streamed: its stream is not judged"
    alerts, lines = judged(_stream(True, 0.0), streamed=True)
    assert alerts == {}, "idle for three hours, its streamer live: fresh"
    assert "stream live (its lease renewed 2027-01-15T07:59:50Z), 3 segments stored" in lines
    assert "stream lags the source by 0s (alert after 60 seconds)" in lines
    assert judged(None, streamed=True)[0] == {"stream": "stream of tt is down: no live walvault stream renews its "
                                                        "lease; none of it is stored"}
    assert judged(_stream(False, 0.0), streamed=True)[0] == {
        "stream": "stream of tt is down: no live walvault stream renews its lease; its newest stored commit is of "
                  "2027-01-15T07:59:00Z"}
    assert judged(_stream(True, 120.0), streamed=True)[0] == {
        "stream": "stream of tt behind by more than 60 seconds: 2m00s behind (it reaches {'vclock': {'1': 90}})"}
    assert judged(_stream(True, 120.0), streamed=True,
                  freshness=load(_config(tmp_path, SOURCES + "freshness: {max_stream_lag_seconds: 300}")).freshness
                  )[0] == {}
    alerts, lines = judged(_stream(True, None, last_commit=None), streamed=True)
    assert alerts == {} and "stream lag not judged: the directory is not on this host, or its log does not say " \
        "its time" in lines


def _config(tmp_path, text: str):
    path = tmp_path / "walvault.yaml"
    path.write_text(text)
    return path


def test_a_stale_source_is_mailed_when_it_turns_stale_then_every_few_hours():
    """10-minute checks: the first stale one mails, the next ones do not until the reminder is due; a new kind of
    alert mails at once; fresh, the state is gone, and the next stale check mails again."""
    t0 = 1_800_000_000.0
    first = alert_state(None, ["backup"], t0, 4)
    assert first == {"kinds": ["backup"], "since": t0, "mailed": t0, "now": t0}
    state, mailed = first, []
    for check in range(1, 30):  # every 10 minutes for almost 5 hours
        state = alert_state(state, ["backup"], t0 + check * 600, 4)
        if state["mailed"] == state["now"]:
            mailed.append(check)
    assert mailed == [24] and state["since"] == t0, "one reminder, 4 hours after the first mail"
    worse = alert_state(state, ["archive", "backup"], state["now"] + 600, 4)
    assert worse["mailed"] == worse["now"], "a new alert is mailed at once"
    assert alert_state(worse, ["backup"], worse["now"] + 600, 4)["mailed"] == worse["mailed"], "fewer: no mail"
    fresh = alert_state(worse, [], worse["now"] + 600, 4)
    assert fresh["kinds"] == [] and fresh["since"] is None
    again = alert_state(fresh, ["archive"], fresh["now"] + 600, 4)
    assert again["mailed"] == again["now"] == again["since"]


def test_a_recreated_database_is_judged_as_the_instance_its_directory_holds_now(tmp_path):
    """A Tarantool data dir re-created at its path (another instance): the old instance's fresh backup does not
    make it fresh, until its own history is backed up and archived. A directory not on this host recorded as two
    instances is an alert of its own; a backup finished in the future is not fresh."""
    tt = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "tt")
    (tmp_path / "walvault.yaml").write_text(f"sources: [{{name: tt, family: tarantool, path: {tt}}}]\n")
    freshness = load(tmp_path / "walvault.yaml").freshness
    repo = new_repository(tmp_path / "repo")

    def judged() -> tuple[dict, list[str]]:
        status = json.loads(run_main("status", "--repo", repo, "--json").stdout)
        return judge("tt", tt, status, freshness)

    def backed_up() -> dict:
        assert run_main("archive", tt, "--repo", repo).returncode == 0
        return json.loads(run_main("backup", tt, "--repo", repo, "--json").stdout)

    old = backed_up()
    assert judged()[0] == {}
    shutil.rmtree(tt)
    copy_tree(TARANTOOL_FIXTURES / "concurrent", tt)
    alerts, lines = judged()
    assert set(alerts) == {"backup", "archive"}, alerts
    assert "none of instance aaaaaaaa-bbbb-4ccc-8ddd-000000000004, which the directory holds now," in alerts["backup"]
    assert "nothing of it is archived" in alerts["archive"]
    assert any(line.endswith("also recorded at its path: aaaaaaaa-bbbb-4ccc-8ddd-000000000001") for line in lines)
    new = backed_up()
    alerts, lines = judged()
    assert alerts == {} and any(line.startswith(f"backup {new['id']} ") for line in lines), (alerts, lines)
    with clock_at(time.time() - 2 * HOUR):
        alerts, _ = judged()
    assert "finished 1h59m in the future" in alerts["backup"] or "finished 2h00m in the future" in alerts["backup"]
    shutil.rmtree(tt)
    alerts, _ = judged()
    assert alerts["identity"] == (f"tt ({tt.resolve()}) is recorded as 2 instances (aaaaaaaa-bbbb-4ccc-8ddd-"
                                  "000000000001, aaaaaaaa-bbbb-4ccc-8ddd-000000000004) and is not on this host: "
                                  "which history is its own cannot be told")
    assert old["id"] != new["id"]
