"""Adversarial review of issue 25 (the limestone stream; segments superseded by archived xlogs): each test a
reproduction of a finding."""

from __future__ import annotations

import json

from conftest import new_repository, require_tarantool, run_cli
from test_stream import Streamer, _segments, instance  # noqa: F401 - instance: the fixture
from test_stream_supersede import _connect, _dump


@require_tarantool
def test_superseding_past_an_xlog_the_archive_lacks_keeps_the_end_reachable(instance, tmp_path):
    """The instance's garbage collection removed a sealed xlog before it was archived (the archive lagged two
    checkpoints): the stream's segments are then the only copy of its rows, and the next archived xlog holds the
    rows after it. Superseding the segments that xlog holds must not cut restore --to end short: before the
    archive it reached the stream's last commit, after it must still."""
    instance.eval("box.session.su('admin', function() box.cfg{checkpoint_count = 2} end)")
    repo = new_repository(tmp_path / "repo")
    backup = _connect(instance, "backup", str(instance.work_dir), "--repo", str(repo))
    assert backup.returncode == 0, backup.stderr
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(3)
    instance.eval("box.snapshot()")  # seals the xlog the backup copied open
    streamer.wait_stored(streamer.status()["segments"] + 3)
    instance.eval("box.snapshot()")  # seals the next; checkpoint_count 2: the first is deleted, never archived
    streamer.wait_stored(streamer.status()["segments"] + 3)
    instance.eval("paused = true")
    written = instance.eval("return box.info.vclock[1]")[0]
    while int(streamer.status()["vclock"].get("1", 0)) < written:
        streamer.wait_stored(streamer.status()["segments"] + 1)
    code, _out, err = streamer.stop()
    assert code == 0, err
    end = _segments(repo)[-1][1][1]
    assert end == written
    archived = run_cli("archive", instance.work_dir, "--repo", repo, "--json")
    assert archived.returncode == 0, archived.stdout + archived.stderr
    instance.kill()
    restored = run_cli("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    point = json.loads(restored.stdout)["point"]
    assert point["vclock"]["1"] == end, (point, json.loads(archived.stdout)["superseded"])
    assert _dump(tmp_path / "restored")["vclock"][1] == end
