"""The stream's segments superseded by the source's own archived xlogs (walcore/tarantool/supersede.py).

Against a real Tarantool 2.6 that keeps writing (tests/lua/stream_server.lua, whose every third transaction ends
with a statement on an is_local space): once the sealed xlog is archived, the segments whose rows it holds are gone,
a segment straddling its end stays; status and restore read no record of the older segments; a restore to the end
takes the local rows from the xlog; a restore that planned with segments an archive then superseded plans again and
restores all. A segment whose row differs from the xlog's is kept and said (archive exit 1, verify --repo, status)
and expire keeps it.
Without I/O: status's archive reach is component-wise.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import zstandard

from conftest import new_repository, require_tarantool, run_cli, walvault_command
from test_stream import PASSWORD, Streamer, _segments, instance  # noqa: F401 - instance: the fixture
from walcore.repository.manifest import FileEntry
from walcore.tarantool.meta import vclock_from_json

LOCAL_KEYS = range(1000, 1300)  # written to the is_local space before the checkpoint: only the xlog has them


def _entry(kind: str, name: str, first: dict, last: dict, times: list[float]) -> FileEntry:
    return FileEntry(name=name, kind=kind, size=1, sha256="0" * 64, stored=name, stored_size=1,
                     stored_sha256="0" * 64, reference=None, mutable=False,
                     range={"vclock": [first, last], "time": times}, verification={})


def test_the_archive_reach_is_component_wise_not_the_largest_sum():
    """A segment's component 0 is where its stream started: an xlog with many local rows has the larger sum,
    though the segment reaches further in the replicated components. The reach is both, component by component,
    and its time the segment's last commit."""
    from walcore.tarantool.family import Tarantool

    xlog = _entry("xlog", "archive/00000000000000000000.xlog", {}, {"0": 500, "1": 100}, [10.0, 20.0])
    segment = _entry("segment", "stream/00000000000000000110.xlog", {"0": 10, "1": 100}, {"0": 10, "1": 150},
                     [21.0, 30.0])
    rank, position, last = Tarantool().archive_reach(None, "instance", {}, [xlog, segment])
    assert position["vclock"] == {"0": 500, "1": 150} and rank == 650 and last == 30.0, position
    # of two as far in the replicated components, the one with local rows after them is the newest
    later = _entry("xlog", "archive/00000000000000000510.xlog", {"0": 500, "1": 100}, {"0": 520, "1": 150},
                   [20.0, 35.0])
    assert Tarantool().archive_reach(None, "instance", {}, [xlog, segment, later])[2] == 35.0


# -- against a real instance


def _connect(instance, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    return subprocess.run([*walvault_command(), *args, "--connect", f"bk@127.0.0.1:{instance.port}"], env=env,
                          capture_output=True, text=True, timeout=120)


def _checkpoint_with_local_rows(instance, repo: Path, tmp_path: Path) -> Streamer:
    """A backup, a stream, local rows, then a checkpoint (the xlog before it sealed: checkpoint_count 2 keeps
    it) and more segments after it; the writes paused and streamed whole."""
    instance.eval("box.session.su('admin', function() box.cfg{checkpoint_count = 2} end)")
    backup = _connect(instance, "backup", str(instance.work_dir), "--repo", str(repo))
    assert backup.returncode == 0, backup.stderr
    streamer = Streamer(instance, repo, tmp_path)
    streamer.start()
    streamer.wait_stored(3)
    instance.eval(f"box.session.su('admin', function() for i = {LOCAL_KEYS[0]}, {LOCAL_KEYS[-1]} do "
                  "box.space.loc:replace{i} end end)")
    streamer.wait_stored(streamer.status()["segments"] + 2)
    instance.eval("box.snapshot()")
    streamer.wait_stored(streamer.status()["segments"] + 3)
    instance.eval("paused = true")
    written = instance.eval("return box.info.vclock[1]")[0]
    streamer.wait_stored(streamer.status()["segments"] + 1)
    while int(streamer.status()["vclock"].get("1", 0)) < written:
        streamer.wait_stored(streamer.status()["segments"] + 1)
    code, _out, err = streamer.stop()
    assert code == 0, err
    return streamer


def _sealed_xlog_end(instance) -> int:
    """Replica 1's LSN at the end of the instance's sealed xlog (the one before the newest)."""
    from walcore.tarantool.check import file_verdict
    from walcore.tarantool.xlog import scan_file

    sealed = sorted((instance.work_dir / "wal").glob("*.xlog"))[-2]
    return file_verdict(scan_file(sealed)).end_vclock()[1]


@require_tarantool
def test_an_archived_xlog_supersedes_the_segments_whose_rows_it_holds(instance, tmp_path, monkeypatch):
    """The archive deletes every segment whose rows the sealed xlog holds (equal, byte for byte), keeps the one
    straddling its end and those after. status reads one segment's record; restore --to end reads only those past
    the archived log, and takes the local rows from the xlog: they come back."""
    from walcore.command.status import status
    from walcore.repository import Repository
    from walcore.restore_set import restore_into

    repo = new_repository(tmp_path / "repo")
    _checkpoint_with_local_rows(instance, repo, tmp_path)
    before = _segments(repo)
    xlog_end = _sealed_xlog_end(instance)
    assert any(last[1] <= xlog_end for _first, last in before) and before[-1][1][1] > xlog_end
    archived = run_cli("archive", instance.work_dir, "--repo", repo, "--json")
    assert archived.returncode == 0, archived.stdout + archived.stderr
    result = json.loads(archived.stdout)
    after = _segments(repo)
    assert not result["differs"] and len(result["superseded"]) == len(before) - len(after) > 0, result
    assert after == [s for s in before if s[1][1] > xlog_end], "a segment the xlog holds whole is left, or one " \
        "it does not hold whole is gone"
    assert len(list(repo.glob("tarantool/*/stream/*.xlog.zst"))) == len(after)
    # status reads the newest segment's record only; restore the records of the segments it follows
    repo_obj = Repository(str(repo), {})
    read: list[str] = []
    storage_class = type(repo_obj.storage)
    original = storage_class.read_bytes

    def counting(storage, name, *args, **kwargs):
        read.append(name)
        return original(storage, name, *args, **kwargs)

    monkeypatch.setattr(storage_class, "read_bytes", counting)
    (source,) = [s for s in status(repo_obj).sources if s.stream]
    assert source.stream["segments"] == len(after) and source.stream["note"], source.stream
    assert len([n for n in read if "/stream/" in n]) == 1, read
    assert source.archive["position"]["vclock"]["1"] == after[-1][1][1], source.archive
    read.clear()
    instance.kill()
    restored = restore_into(repo_obj, "latest", tmp_path / "restored", "end")
    followed = restored.point["segments"]
    stream_reads = [n for n in read if "/stream/" in n and n.endswith(".json")]
    assert followed <= len(stream_reads) <= followed + 1 and followed <= len(after), (followed, stream_reads)
    dumped = _dump(tmp_path / "restored")
    source_dump = _dump(instance.work_dir)
    assert dumped["vclock"][1] == source_dump["vclock"][1] == after[-1][1][1]
    assert dumped["spaces"]["mem"] == source_dump["spaces"]["mem"]
    local = {row[0] for row in dumped["spaces"]["loc"]}
    assert set(LOCAL_KEYS) <= local, "the local rows the archived xlog holds did not come back"


def _dump(work_dir: Path) -> dict:
    import tarantool_real as tr

    return tr.dump_data_dir(work_dir)


@require_tarantool
def test_a_restore_whose_segments_an_archive_superseded_meanwhile_plans_again(instance, tmp_path, monkeypatch):
    """An archive that looked before the restore pinned the source supersedes segments the restore listed: the
    restore plans again (the xlog now holds those rows) and restores to the same end, never less with success."""
    from walcore.command.archive import archive
    from walcore.repository import Repository
    from walcore.restore_set import restore_into

    repo = new_repository(tmp_path / "repo")
    _checkpoint_with_local_rows(instance, repo, tmp_path)
    end = _segments(repo)[-1][1][1]
    instance.kill()
    repo_obj = Repository(str(repo), {})
    storage_class = type(repo_obj.storage)
    original = storage_class.read_bytes
    gone: list[str] = []

    def superseding_meanwhile(storage, name, *args, **kwargs):
        if "/stream/" in name and not gone:
            gone.append(name)
            other = Repository(str(repo), {})
            monkeypatch.setattr(other, "restores_in_progress", lambda *_: [])  # it looked before the pin
            done = archive([instance.work_dir], other)
            assert done.superseded and not done.differs, done
        return original(storage, name, *args, **kwargs)

    monkeypatch.setattr(storage_class, "read_bytes", superseding_meanwhile)
    restored = restore_into(repo_obj, "latest", tmp_path / "restored", "end")
    assert gone and restored.point["vclock"]["1"] == end, restored.point
    dumped = _dump(tmp_path / "restored")
    assert dumped["vclock"][1] == end and set(LOCAL_KEYS) <= {row[0] for row in dumped["spaces"]["loc"]}


@require_tarantool
def test_a_segment_that_differs_from_the_archived_xlog_is_kept_and_said(instance, tmp_path):
    """One row of a stored segment changed (other bytes under its replica id and LSN): the archive exits 1 naming
    the segment and the row, keeps the segment (and supersedes the others); verify --repo and status say it."""
    from walcore.command import stream as stream_command
    from walcore.repository import Repository
    from walcore.repository.archive import RECORD_SUFFIX
    from walcore.tarantool.receiver import Transaction
    from walcore.tarantool.segments import Spool, file_rows

    repo = new_repository(tmp_path / "repo")
    _checkpoint_with_local_rows(instance, repo, tmp_path)
    xlog_end = _sealed_xlog_end(instance)
    records = sorted(repo.glob("tarantool/*/stream/*.zst.json"))
    victim = records[1]
    record = json.loads(victim.read_text())
    first, last = (vclock_from_json(v) for v in record["range"]["vclock"])
    assert last[1] <= xlog_end
    obj = Path(str(victim)[:-len(RECORD_SUFFIX)])
    plain = tmp_path / "victim.xlog"
    plain.write_bytes(zstandard.ZstdDecompressor().decompressobj().decompress(obj.read_bytes()))
    rows = [row for _header, row in file_rows(plain)]
    changed = next(i for i, row in enumerate(rows) if b"xxxx" in row)
    rows[changed] = rows[changed].replace(b"xxxx", b"xxxy", 1)
    victim.unlink()
    obj.unlink()
    instance_uuid = obj.parent.parent.name

    class Lease:
        def confirm(self):
            pass

    with Spool(tmp_path / "forged", instance_uuid) as spool:
        spool.append([Transaction(1, first[1] + 1, last[1], 1.7e9, rows)], last)
        stream_command._SegmentStore(Repository(str(repo), {}), instance_uuid, spool, Lease(),
                                     stream_command.StreamState("x"), print)._store(spool.seal())
    assert obj.exists() and victim.exists()
    archived = run_cli("archive", instance.work_dir, "--repo", repo)
    assert archived.returncode == 1, archived.stdout + archived.stderr
    row = f"1:{first[1] + 1 + changed}"
    assert f"DIFFERS: stream segment {obj.relative_to(repo)}, row {row}: the archived xlog holds other bytes" \
        in archived.stdout, archived.stdout
    assert obj.exists() and victim.exists(), "the differing segment is kept"
    assert not [s for s in _segments(repo) if s[1][1] <= xlog_end and s[0] != first], "the others are superseded"
    verified = run_cli("verify", "--repo", repo, "--json")
    assert verified.returncode == 1
    (found,) = [f for a in json.loads(verified.stdout)["archive"] for f in a["findings"]
                if f["code"] == "segment_differs"]
    assert found["file"] == str(obj.relative_to(repo)), found
    said = json.loads(run_cli("status", "--repo", repo, "--json").stdout)
    (source,) = [s for s in said["sources"] if s["stream"]]
    assert any(f"segment {obj.relative_to(repo)} differs" in p and row in p for p in source["problems"]), source
    later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 2 * 86400))
    planned = json.loads(run_cli("expire", "--repo", repo, "--days", "1", "--as-of", later, "--json").stdout)
    (kept,) = [k for src in planned["sources"] for k in src["keep"] if k["path"] == str(obj.relative_to(repo))]
    assert "holds other rows than this stream segment" in kept["reason"], kept
    again = run_cli("archive", instance.work_dir, "--repo", repo)  # said once: not compared again
    assert again.returncode == 0 and obj.exists(), again.stdout + again.stderr
