"""Backing up a running Tarantool through box.backup.start()/stop() while it keeps writing (127.0.0.1 only)."""

from __future__ import annotations

import json

import tarantool_real as tr
from conftest import new_repository, require_tarantool, run_main
import test_tarantool_live
from test_tarantool_live import PASSWORD, USER, covers

pytestmark = require_tarantool
live = test_tarantool_live.live  # the writing instance on a loopback port (a fixture)


def _call_mark(live, key: int) -> None:
    """Commit a row the backup must hold (the instance's setuid function: our user may only execute)."""
    import tarantool

    conn = tarantool.Connection("127.0.0.1", live.port, user=USER, password=PASSWORD, fetch_schema=False)
    try:
        conn.call("mark", key)
    finally:
        conn.close()


def test_live_backup_restores_everything_committed_before_it_began(live, tmp_path):
    _call_mark(live, 999999)
    before = {int(k): v for k, v in live.eval("return box.info.vclock")[0].items()}
    repo = new_repository(tmp_path / "repo")
    proc = run_main("backup", live.work_dir, "--repo", repo, "--connect", live.uri, "--json")
    assert proc.returncode == 0, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["source"]["live"] is True
    assert result["source"]["connect"] == f"backup:***@127.0.0.1:{live.port}"
    assert not live.backup_pinned(), "box.backup.stop() was not called"
    after = {int(k): v for k, v in live.eval("return box.info.vclock")[0].items()}
    position = {int(k): v for k, v in result["position"]["vclock"].items()}
    assert covers(position, before) and covers(after, position)

    restored = tmp_path / "restored"
    assert run_main("restore", "latest", restored, "--repo", repo).returncode == 0
    dump = tr.dump_data_dir(restored)
    assert covers(dump["vclock"], before), (dump["vclock"], before)
    assert dump["vclock"] == position
    assert [999999, "marker"] in dump["spaces"]["mem"]
    assert len(dump["spaces"]["vin"]) > 0


def test_live_backup_of_another_instances_dir_is_refused(live, tmp_path):
    other = tmp_path / "other"
    tr.generate_instance(other, scale=1, snapshots=1)
    proc = run_main("backup", other, "--repo", new_repository(tmp_path / "repo"), "--connect", live.uri)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and PASSWORD not in proc.stderr
    assert not live.backup_pinned(), "box.backup.stop() must be called when the backup is refused"


def test_unreachable_instance_is_exit_2_without_the_password(tmp_path, real_instance):
    proc = run_main("backup", real_instance, "--repo", new_repository(tmp_path / "repo"), "--connect",
                   f"backup:{PASSWORD}@127.0.0.1:1")
    assert proc.returncode == 2
    assert PASSWORD not in proc.stderr and "Traceback" not in proc.stderr
