"""walvault stream SOURCE: a limestone directory's durable part followed into the repository every few seconds.

The durable prefix is judged without I/O first (a header past the durable epoch, a session being written, a
damaged entry); then on a copy of a real limestone directory (the shared fixtures) that the project's writer
(bench/limestone_writer.py) keeps appending to: nondurable sessions never reach the repository, a rotation followed
by an archive supersedes the pieces, the writer killed mid-entry and `restore --to end` gives exactly the durable
entries, and the source is never written.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import (REPO, copy_limestone_fixture, new_repository, require_limestone, run_cli_at, run_main,
                      tree_snapshot)
from walcore.command.state import directory_state
from walcore.limestone.follow import durable_prefix, piece_findings, read_durable_epoch
from walcore.limestone.layout import blob_path
from walcore.limestone.pwal import Broken, iter_entries
from walcore.limestone import stream
from walcore.limestone.stream import EPOCH_KIND, PIECE_KIND, follow
from walcore.limestone.writer import LogDir, put, snippet_end, snippet_header
from walcore.repository import Repository
from walcore.repository.archive import stored_segments
from walcore.restore_set import restore_into

WRITER = REPO / "bench" / "limestone_writer.py"
INSTANCE = "da4ca674-4dee-4657-8a6d-07391ed187e8"  # 01-clean's manifest
FAMILY = "limestone"


# -- without I/O: the durable prefix


def _entries(tmp_path: Path, data: bytes, start: int = 0):
    path = tmp_path / "pwal_0000"
    path.write_bytes(data)
    return list(iter_entries(path, start=start))


def test_the_durable_prefix_stops_at_a_header_past_the_durable_epoch(tmp_path):
    one = snippet_header(5) + put(1, b"k", b"v", (5, 0)) + snippet_end(5)
    two = snippet_header(6) + put(1, b"k", b"w", (6, 0)) + snippet_end(6)
    prefix = durable_prefix(_entries(tmp_path, one + two), 0, None, 5)
    assert (prefix.end, prefix.epoch, prefix.epochs, prefix.problem) == (len(one), 5, (5, 5), None)
    assert durable_prefix(_entries(tmp_path, one + two), 0, None, 6).end == len(one + two)
    # from where the last walk stopped: only the bytes past it
    again = durable_prefix(_entries(tmp_path, one + two, len(one)), len(one), 5, 6)
    assert (again.end, again.epochs) == (len(one + two), (6, 6))


def test_a_session_being_written_is_left_out_whole(tmp_path):
    one = snippet_header(5) + put(1, b"k", b"v", (5, 0)) + snippet_end(5)
    for cut in (3, 9, 9 + 10):  # half a header, a header alone, half an entry of a later session
        data = one + (snippet_header(6) + put(1, b"k", b"w", (6, 0)))[:cut]
        prefix = durable_prefix(_entries(tmp_path, data), 0, None, 7 if cut == 9 else 5)
        assert prefix.end == len(one) + (9 if cut == 9 else 0) and prefix.problem is None


def test_a_cut_entry_inside_a_durable_snippet_is_a_problem_and_not_stored(tmp_path):
    one = snippet_header(5) + put(1, b"k", b"v", (5, 0))
    data = one + put(1, b"k2", b"v2", (5, 1))[:7]
    prefix = durable_prefix(_entries(tmp_path, data), 0, None, 5)
    assert prefix.end == len(one) and "cut off" in prefix.problem


def test_a_piece_must_start_at_a_header_and_hold_whole_entries(tmp_path):
    whole = snippet_header(5) + put(1, b"k", b"v", (5, 0)) + snippet_end(5)
    assert piece_findings(_entries(tmp_path, whole)) == []
    assert piece_findings(_entries(tmp_path, whole[:-3]))[0]["code"] == "short_entry"
    assert piece_findings(_entries(tmp_path, whole[9:]))[0]["code"] == "no_snippet_header"


def test_the_durable_epoch_is_the_highest_record_of_the_epoch_files(tmp_path):
    (tmp_path / "epoch").write_bytes(bytes([4]) + (7).to_bytes(8, "little") + bytes([4]) + b"\x09")  # a cut record
    (tmp_path / "epoch.01795335762261.9").write_bytes(bytes([4]) + (9).to_bytes(8, "little"))
    assert read_durable_epoch(tmp_path) == 9
    (tmp_path / "epoch.01795335762261.9").unlink()
    assert read_durable_epoch(tmp_path) == 7


# -- a directory followed


def _source(tmp_path: Path) -> tuple[Path, str]:
    src = copy_limestone_fixture("01-clean", tmp_path, "src")
    repo = str(new_repository(tmp_path / "repo"))
    assert run_main("backup", src, "--repo", repo).returncode == 0
    return src, repo


def _once(repo: str, src: Path, *, restoring: list[str] | None = None) -> dict:
    """One streamer run; `restoring`: the restores it finds in progress (None: those there are)."""
    repository = Repository(repo)
    if restoring is not None:
        repository.restores_in_progress = lambda *_: restoring
    stop = threading.Event()
    stop.set()  # one tick, and the last one
    return follow(repository, FAMILY, src, INSTANCE, stop=stop, say=lambda _line: None).to_json()


def _pieces(repo: str) -> list:
    return [e for e in stored_segments(Repository(repo), FAMILY, INSTANCE) if e.kind == PIECE_KIND]


def _stored_epochs(repo: str) -> list[int]:
    return [e.range["epochs"][1] for e in stored_segments(Repository(repo), FAMILY, INSTANCE) if e.kind == EPOCH_KIND]


def _piece_headers(repo_dir: Path, tmp_path: Path) -> set[int]:
    """The snippet epochs of every stored piece."""
    import zstandard

    found = set()
    for p in (repo_dir / "limestone" / INSTANCE / "stream").glob("pwal_*.partial.zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(p.read_bytes())
        found |= {e.epoch for e in _entries(tmp_path, data) if getattr(e, "type", None) in (2, 6)}
    return found


@require_limestone
def test_nondurable_sessions_never_reach_the_repository_and_unchanged_files_are_not_stored_again(tmp_path):
    src, repo = _source(tmp_path)
    log = LogDir(src, channels=2, manifest=False)
    log.session(0, 10, [put(7, b"a", b"1", (10, 0))])
    log.session(1, 10, [put(7, b"b", b"1", (10, 0))])
    log.make_durable(10)
    log.session(0, 11, [put(7, b"a", b"2", (11, 0))])  # written, not durable
    log.raw(1, snippet_header(12) + put(7, b"c", b"3", (12, 0))[:5])  # being written
    for f in log.channels:
        f.flush()
    state = _once(repo, src)
    assert state["durable_epoch"] == 10 and state["problems"] == []
    assert max(_piece_headers(tmp_path / "repo", tmp_path)) == 10
    assert _stored_epochs(repo) == [10]
    before = {e.stored for e in _pieces(repo)}
    assert _once(repo, src)["pieces"] == 0  # nothing grew: nothing stored, nothing rewritten
    assert {e.stored for e in _pieces(repo)} == before
    log.make_durable(11)
    log.close()
    assert _once(repo, src)["pieces"] == 1  # pwal_0000's session of epoch 11, after what was stored
    assert max(_piece_headers(tmp_path / "repo", tmp_path)) == 11 and _stored_epochs(repo) == [11]


@require_limestone
def test_a_blob_a_durable_entry_names_is_stored_before_it_and_restored(tmp_path):
    src, repo = _source(tmp_path)
    blob = blob_path(src, 742)
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(b"the blob's bytes")  # limestone writes a blob file before the entry naming it
    log = LogDir(src, channels=1, manifest=False)
    log.session(0, 10, [put(7, b"with-blob", b"v", (10, 0), (742,))])
    log.make_durable(10)
    log.close()
    _once(repo, src)
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")
    assert (tmp_path / "restored" / blob.relative_to(src)).read_bytes() == b"the blob's bytes"


@require_limestone
def test_a_rotated_file_archived_supersedes_its_pieces_and_the_end_is_still_restored(tmp_path):
    src, repo = _source(tmp_path)
    status = tmp_path / "status.json"
    with _streaming(repo, src, 0.1, status):
        _write(src, 4)
        _wait(lambda: status.exists() and json.loads(status.read_text())["durable_epoch"] == read_durable_epoch(src))
        rotated = {e.range["generation"] for e in _pieces(repo)}
        assert {g.split(".")[0] for g in rotated} == {"pwal_0000", "pwal_0001", "pwal_0002"}
        assert run_main("rotate", src).returncode == 0
        _write(src, 3)  # into the new active files
        assert run_main("archive", src, "--repo", repo).returncode == 0
        _wait(lambda: json.loads(status.read_text())["superseded"] >= 3)
        _wait(lambda: json.loads(status.read_text())["durable_epoch"] == read_durable_epoch(src))
    state = json.loads(status.read_text())
    assert state["problems"] == []
    # only the files opened after the rotation are left in the stream: the rotated ones are archived
    generations = {e.range["generation"] for e in _pieces(repo)}
    assert len(generations) == 3 and not generations & rotated
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")


@require_limestone
def test_a_file_written_and_rotated_between_two_ticks_is_followed_all_the_same(tmp_path):
    src, repo = _source(tmp_path)
    status = tmp_path / "status.json"
    with _streaming(repo, src, 3.0, status):
        _wait(lambda: status.exists())  # the first tick is done: the next comes in 3 s
        ticked = json.loads(status.read_text())["updated"]
        assert run_main("rotate", src).returncode == 0
        _write(src, 2)  # new files, rotated before the streamer saw them, then newer ones
        assert run_main("rotate", src).returncode == 0
        _write(src, 2)
        assert json.loads(status.read_text())["updated"] == ticked, "the machine is too slow for this test"
        _wait(lambda: json.loads(status.read_text())["durable_epoch"] == read_durable_epoch(src))
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")


@require_limestone
def test_pieces_left_unsuperseded_are_restored_once(tmp_path):
    """The rotated files archived and then taken from the source while no streamer ran: their generations' pieces
    stay in the stream, and a restore to the end finds their bytes in the archived files."""
    src, repo = _source(tmp_path)
    _write(src, 3)
    _once(repo, src)
    left = {e.range["generation"] for e in _pieces(repo)}
    assert run_main("rotate", src).returncode == 0
    assert run_main("archive", src, "--repo", repo).returncode == 0
    aside = tmp_path / "aside"
    aside.mkdir()
    for rotated in src.glob("pwal_*.*"):
        rotated.rename(aside / rotated.name)  # an operator's clean-up of archived files
    _write(src, 2)
    _once(repo, src)
    assert left <= {e.range["generation"] for e in _pieces(repo)}
    for rotated in aside.iterdir():  # back, for the source's state to compare with
        rotated.rename(src / rotated.name)
    result = run_main("restore", "latest", tmp_path / "restored", "--repo", repo, "--to", "end", "--json")
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)["point"]["notes"]
    assert sorted(n.split(" from ")[0] for n in said if "held by pwal_" in n) == sorted(left)
    assert sum("restored as" in n for n in said) == 3  # the files opened after the rotation
    _restored_equals_source(tmp_path / "restored", src)


@require_limestone
def test_the_writer_killed_mid_entry_restores_to_exactly_its_durable_entries_and_the_source_is_untouched(tmp_path):
    src, repo = _source(tmp_path)
    status = tmp_path / "status.json"
    with _streaming(repo, src, 0.2, status):
        writer = subprocess.run([sys.executable, WRITER, src, "--epochs-per-second", "40", "--die-mid-entry", "50"],
                                capture_output=True, text=True)
        assert writer.returncode == -signal.SIGKILL
        durable = read_durable_epoch(src)
        assert durable == int(writer.stdout.split()[-2])  # the last epoch the writer saw durable
        *_, last = iter_entries(src / "pwal_0000")
        assert isinstance(last, Broken) and last.code == "short_entry"  # its last entry is half written
        _wait(lambda: json.loads(status.read_text())["durable_epoch"] == durable)
        untouched = tree_snapshot(src)
        time.sleep(0.5)  # ticks with nothing new
    assert tree_snapshot(src) == untouched
    assert max(_piece_headers(tmp_path / "repo", tmp_path)) <= durable
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")


@require_limestone
def test_streaming_writes_nothing_into_the_source(tmp_path):
    src, repo = _source(tmp_path)
    LogDir(src, channels=1, manifest=False).session(0, 10, [put(7, b"a", b"1", (10, 0))])  # not durable
    before = tree_snapshot(src)
    _once(repo, src)
    _once(repo, src)
    assert tree_snapshot(src) == before


@require_limestone
def test_expire_deletes_the_partials_a_snapshot_covers_and_verify_checks_them(tmp_path):
    src, repo = _source(tmp_path)
    _once(repo, src)
    _write(src, 3)
    _once(repo, src)
    verified = json.loads(run_main("verify", "--repo", repo, "--json").stdout)
    (archive,) = [a for a in verified["archive"] if a["family"] == FAMILY]
    blobs = [e for e in stored_segments(Repository(repo), FAMILY, INSTANCE) if e.kind == "blob"]
    assert [e.name for e in blobs] == ["stream/blob/dir_01/0000000000000001.blob.partial"]  # 01-clean's, not archived
    assert archive["status"] == "ok" and archive["files"] == len(_pieces(repo)) + 1 + 1  # the pieces, epoch, blob
    assert verified["checked_by"]["scan"] == len(_pieces(repo))  # each piece read as whole entries
    assert run_main("rotate", src).returncode == 0
    assert run_main("archive", src, "--repo", repo).returncode == 0
    assert run_main("snapshot", src, "--repo", repo).returncode == 0  # folds every epoch the pieces hold
    as_of = int(time.time()) + 2 * 86400  # whole seconds: --as-of rounded up would be later than the process's now
    expired = run_cli_at(as_of, "expire", "--repo", repo, "--days", "1", "--as-of", f"@{as_of}", "--apply",
                         "--json")
    assert expired.returncode == 0, expired.stderr
    assert _pieces(repo) == [] and _stored_epochs(repo) == []
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")


@require_limestone
@pytest.mark.parametrize("by", ["count", "bytes"])
def test_folding_keeps_the_pieces_bounded_and_restore_to_end_exact(tmp_path, monkeypatch, by):
    """A file limestone never rotates: every tick stores a piece of each channel, and folding keeps fewer than
    FOLD_PIECES of each level in a generation (by count), or folds pieces once they hold FOLD_BYTES (by bytes),
    with every byte restored."""
    monkeypatch.setattr(stream, "FOLD_PIECES", 3 if by == "count" else 1000)
    monkeypatch.setattr(stream, "FOLD_BYTES", 64 << 20 if by == "count" else 2000)
    src, repo = _source(tmp_path)
    status = tmp_path / "status.json"
    with _streaming(repo, src, 0.02, status):
        subprocess.run([sys.executable, WRITER, src, "--epochs", "60", "--epochs-per-second", "20", "--channels", "3"],
                       check=True, capture_output=True)
        _wait(lambda: json.loads(status.read_text())["durable_epoch"] == read_durable_epoch(src))
    state = json.loads(status.read_text())
    assert state["problems"] == [] and state["folded"] > 0
    generations: dict[str, list] = {}
    for e in _pieces(repo):
        generations.setdefault(e.range["generation"], []).append(e)
    assert len(generations) == 3
    for pieces in generations.values():
        pieces.sort(key=lambda p: p.range["bytes"][0])
        assert [p.range["bytes"][0] for p in pieces] == [0] + [p.range["bytes"][1] for p in pieces[:-1]]
        levels = [p.range.get("level", 0) for p in pieces]
        if by == "count":
            assert all(levels.count(level) < 3 for level in levels), levels  # fewer than FOLD_PIECES of each level
            assert sorted(levels, reverse=True) == levels  # a run from the start: the oldest bytes the most folded
        else:  # each fold holds FOLD_BYTES and less than twice that; the pieces not folded, less than FOLD_BYTES
            assert all(2000 <= p.size < 4000 for p in pieces if p.range.get("level")), [p.size for p in pieces]
            assert sum(p.size for p in pieces if p.size < 2000) < 2000, [p.size for p in pieces]
    assert state["pieces"] > 2 * len(_pieces(repo))  # the test stored enough to fold
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")
    verified = run_main("verify", "--repo", repo, "--json")
    assert verified.returncode == 0, verified.stdout
    (archive,) = [a for a in json.loads(verified.stdout)["archive"] if a["family"] == FAMILY]
    assert archive["status"] == "ok" and archive["findings"] == []


@require_limestone
def test_a_fold_recorded_whose_pieces_were_not_deleted_restores_exactly_and_the_next_start_deletes_them(
        tmp_path, monkeypatch):
    """A fold is recorded, then a crash before its pieces are deleted (here: a restore in progress each time they
    would go, so the streamer stops with them deferred), and one piece's record deleted without its object (a
    crash mid-delete): the fold and the pieces it holds overlap; restore --to end takes the fold, verify finds the
    repository sound, and the next start deletes what the fold holds."""
    monkeypatch.setattr(stream, "FOLD_PIECES", 3)
    src, repo = _source(tmp_path)
    for _tick in range(4):
        _write(src, 1)
        _once(repo, src, restoring=["a restore"])
    pieces = _pieces(repo)
    folds = [p for p in pieces if p.range.get("level")]
    held = [p for p in pieces if any(_within(p, f) for f in folds)]
    assert len(folds) == 3 and len(held) == 3 * 3
    Repository(repo).storage.remove(held[0].stored + ".json")  # deleted as a delete does, record first
    _restore_to_end_equals_source(repo, src, tmp_path / "restored")
    verified = json.loads(run_main("verify", "--repo", repo, "--json").stdout)
    (archive,) = [a for a in verified["archive"] if a["family"] == FAMILY]
    assert archive["status"] == "ok", archive
    assert [f["code"] for f in archive["findings"]] == ["unrecorded_object"]
    assert _once(repo, src)["pieces"] == 0
    left = _pieces(repo)
    assert {p.stored for p in left} == {p.stored for p in pieces} - {p.stored for p in held}
    assert not [p for p in left if any(_within(p, f) for f in left)]
    _write(src, 1)
    _once(repo, src)
    _restore_to_end_equals_source(repo, src, tmp_path / "restored-again")


@require_limestone
@pytest.mark.parametrize("step", ["segment_records", "streamed_log"])
def test_a_restore_whose_pieces_were_folded_meanwhile_plans_again(tmp_path, monkeypatch, step):
    """The streamer folds and deletes pieces a restore has just listed (it looked for the restore's pin just
    before the restore pinned the source), before their records are read or after: the restore plans again and
    finds the fold."""
    src, repo = _source(tmp_path)
    for _tick in range(3):
        _write(src, 1)
        _once(repo, src)
    monkeypatch.setattr(stream, "FOLD_PIECES", 3)
    original, folded = getattr(stream, step), []

    def folding_meanwhile(*args):
        listed = original(*args)
        folded.append(_once(repo, src, restoring=[])["folded"])
        return listed

    monkeypatch.setattr(stream, step, folding_meanwhile)
    restored = restore_into(Repository(repo), "latest", tmp_path / "restored", "end")
    assert folded[0] == 3 * 3 and len(folded) == 2  # planned again once
    assert restored.point["durable_epoch"] == read_durable_epoch(src)
    _restored_equals_source(tmp_path / "restored", src)


def test_stream_takes_a_source_or_connect_exactly(tmp_path):
    repo = str(new_repository(tmp_path / "repo"))
    for args in ((), (tmp_path, "--connect", "bk@127.0.0.1:1")):
        result = run_main("stream", *args, "--repo", repo)
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
        assert "SOURCE" in result.stderr and "--connect" in result.stderr


# -- helpers


def _write(src: Path, epochs: int) -> None:
    subprocess.run([sys.executable, WRITER, src, "--epochs", str(epochs), "--epochs-per-second", "100",
                    "--channels", "3"], check=True, capture_output=True)


@contextlib.contextmanager
def _streaming(repo: str, src: Path, seconds: float, status: Path):
    """The streamer following `src` in a thread until the block ends."""
    stop = threading.Event()
    streamer = threading.Thread(target=follow, args=(Repository(repo), FAMILY, src, INSTANCE),
                                kwargs={"seconds": seconds, "status_file": status, "stop": stop,
                                        "say": lambda _line: None})
    streamer.start()
    try:
        yield
    finally:
        stop.set()
        streamer.join()


def _wait(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the stream")
        time.sleep(0.05)


def _within(piece, fold) -> bool:
    """Whether `fold` is another piece of the generation of `piece` holding its bytes' range."""
    (start, end), (fold_start, fold_end) = piece.range["bytes"], fold.range["bytes"]
    return (piece.stored != fold.stored and piece.range["generation"] == fold.range["generation"]
            and fold_start <= start and end <= fold_end)


def _restore_to_end_equals_source(repo: str, src: Path, target: Path) -> None:
    result = run_main("restore", "latest", target, "--repo", repo, "--to", "end", "--json")
    assert result.returncode == 0, result.stderr
    point = json.loads(result.stdout)["point"]
    assert point["durable_epoch"] == read_durable_epoch(src)
    _restored_equals_source(target, src)


def _restored_equals_source(target: Path, src: Path) -> None:
    assert read_durable_epoch(target) == read_durable_epoch(src)
    assert list(directory_state(target)) == list(directory_state(src))
    verified = run_main("verify", target)
    assert verified.returncode == 0, verified.stdout
