"""Adversarial review of issue 25 (the limestone stream; segments superseded by archived xlogs): each test a
reproduction of a finding."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

from conftest import (LIMESTONE_FIXTURES, copy_limestone_fixture, new_repository, require_tarantool, run_cli,
                      run_main)
from walcore.command.state import directory_state
from walcore.findings import Refused
from walcore.limestone import stream
from walcore.limestone.follow import read_durable_epoch
from walcore.limestone.writer import LogDir
from walcore.repository import Repository
from walcore.restore_set import restore_into
from test_stream import Streamer, _segments, instance  # noqa: F401 - instance: the fixture
from test_stream_limestone import _streaming, _write
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


# -- limestone


LIMESTONE_INSTANCE = "da4ca674-4dee-4657-8a6d-07391ed187e8"  # 01-clean's manifest


def _follow_once(repo, src, *, pins_seen: bool = True, instance: str = LIMESTONE_INSTANCE) -> dict:
    repository = Repository(str(repo))
    if not pins_seen:  # it looked for a restore's pin just before the restore pinned the source
        repository.restores_in_progress = lambda *_: []
    stop = threading.Event()
    stop.set()
    return stream.follow(repository, "limestone", src, instance, stop=stop, say=lambda _l: None).to_json()


def test_a_limestone_restore_whose_pieces_the_streamer_superseded_meanwhile_is_not_called_damaged(tmp_path,
                                                                                                  monkeypatch):
    """The streamer deletes a rotated generation's pieces once the archive holds the file; one that looked for a
    restore's pin just before the restore pinned the source deletes pieces the restore has just listed. The
    restore must then plan again (the archived file holds those bytes), as a Tarantool restore does, not fail
    calling the repository damaged."""
    src = copy_limestone_fixture("01-clean", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    assert run_main("backup", src, "--repo", repo).returncode == 0
    _write(src, 3)
    _follow_once(repo, src)
    assert run_main("rotate", src).returncode == 0
    assert run_main("archive", src, "--repo", repo).returncode == 0
    original = stream.streamed_log
    superseded = []

    def superseding_meanwhile(*args):
        listed = original(*args)
        superseded.append(_follow_once(repo, src, pins_seen=False)["superseded"])
        return listed

    monkeypatch.setattr(stream, "streamed_log", superseding_meanwhile)
    restored = restore_into(Repository(repo), "latest", tmp_path / "restored", "end")
    assert superseded and superseded[0] > 0
    assert restored.point["durable_epoch"] == read_durable_epoch(src)
    assert list(directory_state(tmp_path / "restored")) == list(directory_state(src))


def test_a_crash_repaired_as_limestone_repairs_it_is_followed_without_a_problem(tmp_path):
    """limestone killed mid-entry (02-unfinished: a nondurable session on channel 0, a half entry on channel 1),
    then `tglogutil repair` (03-unfinished-after-repair: the files renamed, both epoch-3 headers 2 -> 6 in place,
    the cut bytes left) and limestone started again: it records the canceled epoch as durable (the highest header
    epoch). Nothing durable was lost and limestone reads the directory: the stream must not call it a problem
    (exit 1, a file followed no further), nor after a restart of the streamer."""
    src = copy_limestone_fixture("02-unfinished", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    instance = json.loads((src / "limestone-manifest.json").read_text())["instance_uuid"]
    first = _follow_once(repo, src, instance=instance)
    assert first["durable_epoch"] == 2 and first["problems"] == []
    repaired = LIMESTONE_FIXTURES / "03-unfinished-after-repair"
    for path in sorted(repaired.glob("pwal_*")):
        os.rename(src / path.name.split(".")[0], src / path.name)  # the same inode: the streamer follows it
        with open(src / path.name, "r+b") as f:
            f.write(path.read_bytes())
    LogDir(src, channels=0, manifest=False).make_durable(3)  # limestone started again
    again = _follow_once(repo, src, instance=instance)
    assert again["durable_epoch"] == 3
    assert again["problems"] == [], again["problems"]
    assert _follow_once(repo, src, instance=instance)["problems"] == []  # started again inside the canceled snippet
    verified = run_main("verify", "--repo", repo)
    assert verified.returncode == 0, verified.stdout


def test_a_limestone_directory_restored_to_an_earlier_epoch_is_not_mixed_with_its_former_history(tmp_path):
    """A point-in-time restore's usual end: the directory is put back to an earlier epoch in place (the same
    instance UUID: its manifest is the backup's) and limestone writes another history from there, while the
    streamer runs as a service. restore --to end must give that history (or refuse), never the former history's
    streamed entries mixed into it, nor its durable epoch."""
    src = copy_limestone_fixture("01-clean", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    assert run_main("backup", src, "--repo", repo).returncode == 0
    _write(src, 3)
    assert _follow_once(repo, src)["durable_epoch"] == 6
    restored = run_main("restore", "latest", tmp_path / "earlier", "--repo", repo)  # the backup's epoch 3
    assert restored.returncode == 0, restored.stderr
    shutil.rmtree(src)
    (tmp_path / "earlier").rename(src)
    _write(src, 2)  # epochs 4 and 5 of another history
    assert read_durable_epoch(src) == 5
    try:  # the stream goes on with it, or stops as a Tarantool stream does (its instance behind what it holds)
        followed = _follow_once(repo, src)
    except Refused as e:
        assert "behind" in str(e)
    else:
        assert followed["durable_epoch"] == 5, followed
    assert run_main("backup", src, "--repo", repo).returncode == 0
    end = run_main("restore", "latest", tmp_path / "end", "--repo", repo, "--to", "end", "--json")
    if end.returncode == 0:
        assert json.loads(end.stdout)["point"]["durable_epoch"] == 5, end.stdout
        assert list(directory_state(tmp_path / "end")) == list(directory_state(src))
    else:
        assert "two histories" in end.stderr and len(end.stderr.splitlines()) == 1, end.stderr


def test_the_streamer_holds_no_pwal_file_the_directory_no_longer_has(tmp_path):
    """An operator's script deletes rotated pwal files (limestone's compaction folded them, or the archive's copy
    is enough): the streamer must let them go, not keep them open forever — their disk space is never freed while
    a descriptor holds them (a disk that fills up with files `du` does not see), and a descriptor is spent on each
    rotation."""
    def deleted_pwals() -> list[str]:
        held = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(src)) and "/pwal_" in target and target.endswith(" (deleted)"):
                held.append(target)
        return held

    src = copy_limestone_fixture("01-clean", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    status = tmp_path / "status.json"
    with _streaming(repo, src, 0.1, status):
        _write(src, 2)
        time.sleep(0.5)
        assert run_main("rotate", src).returncode == 0
        _write(src, 2)
        time.sleep(0.5)
        for rotated in src.glob("pwal_*.*"):
            rotated.unlink()  # never archived: the stream's pieces are the only copy, and they stay
        deadline = time.monotonic() + 10
        while deleted_pwals() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert deleted_pwals() == []


def test_a_new_pwal_file_reusing_a_superseded_files_inode_is_followed(tmp_path):
    """The archive holds the rotated files and the streamer superseded their pieces (their inodes are then 'done':
    never followed again); an operator deletes the archived files. ext4 gives a file created next the inode number
    just freed: the new active files limestone opens after the next rotation must be followed all the same, or
    their durable entries are never stored while the stream's durable epoch goes on (restore --to end claims it)."""
    def caught_up() -> bool:
        time.sleep(0.3)  # a tick or two after the writes
        return json.loads(status.read_text())["durable_epoch"] == read_durable_epoch(src)

    src = copy_limestone_fixture("01-clean", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    assert run_main("backup", src, "--repo", repo).returncode == 0
    aside = tmp_path / "aside"
    aside.mkdir()
    status = tmp_path / "status.json"
    with _streaming(repo, src, 0.1, status):
        for _round in range(3):
            _write(src, 2)
            assert caught_up()
            assert run_main("rotate", src).returncode == 0
            assert run_main("archive", src, "--repo", repo).returncode == 0
            deadline = time.monotonic() + 10
            while len(list(src.glob("pwal_*.*"))) > json.loads(status.read_text())["superseded"] - 3 * _round:
                assert time.monotonic() < deadline, "not superseded"
                time.sleep(0.1)
            for rotated in src.glob("pwal_*.*"):
                shutil.copy2(rotated, aside / rotated.name)  # kept aside for the comparison at the end
                rotated.unlink()  # the operator's clean-up: the inodes are freed
        _write(src, 2)
        assert caught_up()
    for rotated in aside.iterdir():  # back, for the source's state to compare with
        shutil.move(rotated, src / rotated.name)
    restored = run_main("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", "end", "--json")
    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["point"]["durable_epoch"] == read_durable_epoch(src)
    assert list(directory_state(tmp_path / "restored")) == list(directory_state(src))
