"""Compaction (walcore.limestone.compact): the compacted file and catalog it writes must give the same state as the
files they replace, be what limestone's reader accepts, and fold only what the fold rule allows.

The oracle is never compact's own walk: states come from walvault's state command on directories rebuilt from the
output (limestone's coverage rule: the catalog's DETACHED_PWAL files are left out, the compacted file is the base),
from limestone's own state of 20-random-small, from limestone's own compacted file of fixture 11, and for generated
workloads from the operation-level model of tests/limestone_model.py; compacted bytes are read back with its
independent parser.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from conftest import LIMESTONE_FIXTURES as FIXTURES
from conftest import copy_limestone_fixture, copy_tree, require_limestone, tree_snapshot
from limestone_bytes import walk
from limestone_model import (ADD, CLEAR, PUT, PUT_BLOB, REMOVE, REMOVE_STORAGE, T_HEADER, T_PUT, T_PUT_BLOB, Op,
                             _State, parse_pwal)
from walcore.command.state import directory_state
from walcore.limestone import compact as compact_module
from walcore.limestone import writer
from walcore.limestone.catalog import CATALOG_NAME, parse_catalog
from walcore.limestone.check import check_dir, prepare
from walcore.limestone.compact import (COMPACTED_NAME, ROTATED_PWAL, Compaction, check_compacted, compact,
                                       plan_fold)
from walcore.limestone.layout import blob_path
from walcore.limestone.pwal import ADD_STORAGE, CLEAR_STORAGE
from walcore.limestone.pwal import REMOVE_STORAGE as T_REMOVE_STORAGE
from walcore.limestone.state import build_state, format_tsv
from walcore.limestone.writer import LogDir

pytestmark = pytest.mark.usefixtures("scan_core")  # each test on both scan cores (compact scans its files)

# The README workload's final state (fixture 01-clean and its relatives).
FINAL = [(100, b"k1", b"v1-updated"), (200, b"a", b"alpha-3"), (200, b"b", b"beta"),
         (200, b"blobkey", b"row-with-blob"), (200, b"c", b"gamma")]
FIRST_MS = 1_900_000_000_000  # later than every rotated name in the fixtures


# --------------------------------------------------------------------------- helpers


def rows_of(root: Path) -> list[tuple[int, bytes, bytes]]:
    """The state of a directory as `walvault state` gives it."""
    return list(directory_state(root))


def le_sorted(rows) -> list:
    """Rows in a compacted file's order: storage_id as 8 little-endian bytes, then the key."""
    return sorted(rows, key=lambda r: r[0].to_bytes(8, "little") + r[1])


def compacted_rows(path: Path) -> list[tuple[int, bytes, bytes, int, tuple[int, ...]]]:
    """(storage, key, value, type, blob ids) of a compacted file, read by the tests' own parser."""
    toks, bad = parse_pwal(path.read_bytes())
    assert bad is None
    assert toks[0].type == T_HEADER and toks[0].epoch == 0
    assert all(t.type in (T_PUT, T_PUT_BLOB) and t.wv == (0, 0) for t in toks[1:])
    return [(t.storage, t.key, t.value, t.type, t.blobs) for t in toks[1:]]


def restored(src: Path, out: Path, result: Compaction, dest: Path) -> Path:
    """What a restore of the compaction gives: `src` without the pwal files the catalog now covers, and with the new
    compacted file and catalog instead of its own (manifest, epoch files, blobs and the unfolded pwal files kept)."""
    copy_tree(src, dest)
    for name in [*result.detached, COMPACTED_NAME, CATALOG_NAME, CATALOG_NAME + ".back"]:
        (dest / name).unlink(missing_ok=True)
    shutil.rmtree(dest / "data", ignore_errors=True)
    for name in (COMPACTED_NAME, CATALOG_NAME):
        shutil.copyfile(out / name, dest / name)
    return dest


def catalog_text(result: Compaction) -> str:
    return "".join(["COMPACTION_CATALOG_HEADER\n", f"COMPACTED_FILE {COMPACTED_NAME} 1\n",
                    *(f"DETACHED_PWAL {n}\n" for n in result.detached), f"MAX_EPOCH_ID {result.epoch}\n",
                    f"MAX_BLOB_ID {result.max_blob_id}\n", "COMPACTION_CATALOG_FOOTER\n"])


def check_output(out: Path, result: Compaction) -> list:
    """What holds for every compaction: a clean compacted file of `entries` entries whose blob ids are
    `blob_ids`, and the catalog limestone writes for it."""
    assert check_compacted(out / COMPACTED_NAME) == []
    rows = compacted_rows(out / COMPACTED_NAME)
    assert len(rows) == result.entries
    assert result.blob_ids == sorted({b for r in rows for b in r[4]})
    assert (out / CATALOG_NAME).read_text() == catalog_text(result)
    catalog = parse_catalog((out / CATALOG_NAME).read_bytes())
    assert catalog.compacted_files == {COMPACTED_NAME: 1}
    assert sorted(set(result.detached)) == result.detached == catalog.detached_pwals
    assert set(result.folded) <= set(result.detached)
    return rows


def split_into_rotated(root: Path, rng: random.Random, skip: set[str]) -> None:
    """Replace every pwal file of `root` (but the compacted file and `skip`) by rotated files of a few whole
    snippets each, named so that a channel's files keep their order (rotated before active)."""
    def order(p: Path):
        return p.name[:9], len(p.name) == 9, p.name

    ms = FIRST_MS
    files = sorted((p for p in root.iterdir() if p.name.startswith("pwal_") and p.name != COMPACTED_NAME
                    and p.name not in skip), key=order)
    for path in files:
        data = path.read_bytes()
        cuts = [off for off, t, _ in walk(data) if t in (2, 6)]
        bounds, i = [0], 0
        while (i := i + rng.randint(1, 5)) < len(cuts):
            bounds.append(cuts[i])
        bounds.append(len(data))
        for start, end in zip(bounds, bounds[1:]):
            (root / f"{path.name[:9]}.{ms:014d}.0").write_bytes(data[start:end])
            ms += 1
        path.unlink()


def detached_of(root: Path) -> set[str]:
    catalog = prepare(root).catalog
    return set(catalog.detached_pwals) if catalog else set()


def _clean_fixtures() -> list[str]:
    if not FIXTURES.is_dir():
        return []
    return [p.name for p in sorted(FIXTURES.iterdir()) if p.is_dir() and check_dir(p)[1].status == "ok"]


CLEAN = _clean_fixtures()


# --------------------------------------------------------------------------- 1. the real fixtures


@require_limestone
def test_clean_fixtures_are_the_expected_ones():
    assert {"01-clean", "10-backup-copy", "10-backup-source", "11-online-compaction",
            "13-v1-manifest-migrated-by-inspect", "20-random-small"} <= set(CLEAN)


@require_limestone
@pytest.mark.parametrize("name", CLEAN)
def test_fixture_fold_keeps_the_state(name, tmp_path):
    """Split into rotated files of a few snippets each (the channels' boundaries differ, so the fold rule has work),
    then folded from scratch, and step by step with previous= up to the durable epoch: every restored directory has
    the source's state."""
    src = copy_limestone_fixture(name, tmp_path, "src")
    detached = detached_of(src)
    split_into_rotated(src, random.Random(name), detached)
    expected = rows_of(src)
    assert expected == rows_of(FIXTURES / name)  # the split changed nothing limestone reads
    if name == "20-random-small":
        assert format_tsv(expected) == (FIXTURES / "20-random-small.state.tsv").read_text()
    durable = prepare(src).report.durable_epoch
    inputs = sorted(p for p in src.iterdir() if ROTATED_PWAL.fullmatch(p.name) and p.name not in detached)
    base = src if (src / COMPACTED_NAME).exists() else None
    before = tree_snapshot(src)

    whole = compact(inputs, durable, tmp_path / "whole", previous=base)
    rows = check_output(tmp_path / "whole", whole)
    assert whole.folded == [p.name for p in inputs] and whole.skipped == {}  # a clean directory folds whole
    assert [r[:3] for r in rows] == le_sorted(expected)  # nothing is left outside: the compacted file is the state
    again = restored(src, tmp_path / "whole", whole, tmp_path / "whole-restored")
    assert not any(ROTATED_PWAL.fullmatch(p.name) for p in again.iterdir())
    assert rows_of(again) == expected
    assert check_dir(again)[1].status == "ok"

    previous, left = base, inputs
    for step, epoch in enumerate(sorted({durable // 3, 2 * durable // 3, durable})):
        out = tmp_path / f"step{step}"
        result = compact(left, epoch, out, previous=previous)
        check_output(out, result)
        assert set(result.folded) | set(result.skipped) == {p.name for p in left}
        assert rows_of(restored(src, out, result, tmp_path / f"step{step}-restored")) == expected
        previous, left = out, [p for p in left if p.name not in result.folded]
    assert left == []
    assert tree_snapshot(src) == before  # compaction never writes into a source


@require_limestone
def test_fixture_11_same_as_limestones_compaction(tmp_path):
    """Folding fixture 11's three detached files up to epoch 4 (the epoch at its rotation) from scratch gives
    limestone's own compacted file and catalog, byte for byte."""
    src = FIXTURES / "11-online-compaction"
    theirs = parse_catalog((src / CATALOG_NAME).read_bytes())
    assert len(theirs.detached_pwals) == 3
    before = tree_snapshot(src)
    out = tmp_path / "out"
    result = compact([src / n for n in theirs.detached_pwals], 4, out)
    assert result == Compaction(folded=theirs.detached_pwals, detached=theirs.detached_pwals, epoch=4, max_blob_id=1,
                                blob_ids=[1], entries=5, skipped={}, reached=3)
    assert check_compacted(out / COMPACTED_NAME) == []
    assert check_compacted(src / COMPACTED_NAME) == []
    assert build_state([out / COMPACTED_NAME], 4, set()) == build_state([src / COMPACTED_NAME], 4, set()) == FINAL
    assert (out / COMPACTED_NAME).read_bytes() == (src / COMPACTED_NAME).read_bytes()
    assert (out / CATALOG_NAME).read_bytes() == (src / CATALOG_NAME).read_bytes()
    ours = copy_limestone_fixture("11-online-compaction", tmp_path, "ours")
    for name in (COMPACTED_NAME, CATALOG_NAME):
        shutil.copyfile(out / name, ours / name)
    assert rows_of(ours) == rows_of(src)
    assert tree_snapshot(src) == before


@require_limestone
def test_fixture_11_on_top_of_limestones_compaction(tmp_path):
    """previous= limestone's compacted file and catalog; the one pwal file it does not cover (rotated first) folds
    onto it."""
    src = copy_limestone_fixture("11-online-compaction", tmp_path, "src")
    expected = rows_of(src)
    assert expected == sorted(FINAL + [(200, b"after-compaction", b"ac")])
    rotated = src / f"pwal_0001.{FIRST_MS:014d}.0"
    (src / "pwal_0001").rename(rotated)
    theirs = parse_catalog((src / CATALOG_NAME).read_bytes())
    out = tmp_path / "out"
    result = compact([rotated], 9, out, previous=src)
    assert result == Compaction(folded=[rotated.name], detached=sorted(theirs.detached_pwals + [rotated.name]),
                                epoch=9, max_blob_id=1, blob_ids=[1], entries=6, skipped={}, reached=9)
    rows = check_output(out, result)
    assert [r[:3] for r in rows] == le_sorted(expected)
    assert rows_of(restored(src, out, result, tmp_path / "restored")) == expected
    with pytest.raises(ValueError, match="detached"):
        compact([src / theirs.detached_pwals[0]], 9, tmp_path / "again", previous=src)


# --------------------------------------------------------------------------- 3. generated workloads

STORAGES = (1, 5, 256, 300, 1 << 40)  # little-endian order: 1<<40, 256, 1, 5, 300
KEYS = (b"", b"\x00", b"\xff", b"\xff" * 9, b"k\x00z", b"\x00\xff\x00", b"a", b"ab", b"b")


def encode(op: Op) -> bytes:
    if op.kind in (PUT, PUT_BLOB):
        return writer.put(op.storage, op.key, op.value, op.wv, op.blobs)
    if op.kind == REMOVE:
        return writer.remove(op.storage, op.key, op.wv)
    kind = {CLEAR: CLEAR_STORAGE, ADD: ADD_STORAGE, REMOVE_STORAGE: T_REMOVE_STORAGE}[op.kind]
    return writer.storage_op(kind, op.storage, op.wv)


class Generated:
    """A limestone directory written with LogDir, each channel rotated at its own moments (so the files' epoch
    ranges interleave), every file rotated at the end; what went into which file is remembered for the model."""

    def __init__(self, root: Path, channels: int):
        self.root = root
        self.log = LogDir(root, channels=channels)
        self.minor = 0
        self.ms = FIRST_MS
        self.current: list[list] = [[] for _ in range(channels)]  # sessions of each channel's active file
        self.files: dict[str, list] = {}  # rotated name -> [(epoch, ops, canceled)]
        self.durable = 0

    def wv(self, epoch: int) -> tuple[int, int]:
        self.minor += 1
        return epoch, self.minor

    def session(self, channel: int, epoch: int, ops: list[Op], *, canceled: bool = False) -> None:
        if canceled:
            self.log.raw(channel, writer.snippet_header(epoch, canceled=True) + b"".join(map(encode, ops))
                         + writer.snippet_end(epoch))
        else:
            self.log.session(channel, epoch, [encode(op) for op in ops])
        for op in ops:
            for blob in op.blobs:
                path = blob_path(self.root, blob)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"blob %d" % blob)
        self.current[channel].append((epoch, ops, canceled))

    def make_durable(self, epoch: int) -> None:
        self.log.make_durable(epoch)
        self.durable = epoch

    def _rename(self, channel: int) -> None:
        name = f"pwal_{channel:04d}.{self.ms:014d}.0"
        self.ms += 1
        (self.root / f"pwal_{channel:04d}").rename(self.root / name)
        self.files[name] = self.current[channel]
        self.current[channel] = []

    def rotate(self, channel: int) -> None:
        self.log.channels[channel].close()
        self._rename(channel)
        self.log.channels[channel] = open(self.root / f"pwal_{channel:04d}", "ab")

    def finish(self) -> None:
        self.log.close()
        for channel in range(len(self.current)):
            self._rename(channel)

    def applied(self, names) -> list[Op]:
        """The ops limestone applies from these files: durable, non-canceled sessions."""
        return [op for n in names for epoch, ops, canceled in self.files[n]
                if not canceled and epoch <= self.durable for op in ops]

    def epochs(self, name: str) -> list[int]:
        return [epoch for epoch, _, canceled in self.files[name] if not canceled]


def model(ops: list[Op]) -> _State:
    state = _State()
    for op in ops:
        state.apply(op)
    return state


def model_rows(state: _State) -> list[tuple[int, bytes, bytes]]:
    return sorted((s, k, v) for (s, k), v in state.rows().items())


def random_workload(root: Path, seed: int) -> Generated:
    rng = random.Random(seed)
    g = Generated(root, rng.randint(2, 4))
    storages = rng.sample(STORAGES, 3)
    keys = {s: rng.sample(KEYS, 5) + [rng.randbytes(rng.randint(1, 6)) for _ in range(2)] for s in storages}
    blobs = iter(range(1, 10_000))
    epochs = rng.randint(8, 14)
    durable = epochs - rng.randint(0, 2)
    for epoch in range(1, epochs + 1):
        for channel in range(len(g.current)):
            if rng.random() < 0.3:
                continue
            ops = []
            for _ in range(rng.randint(1, 5)):
                kind = rng.choice([PUT] * 6 + [PUT_BLOB] * 2 + [REMOVE] * 3 + [CLEAR, ADD, REMOVE_STORAGE])
                s = rng.choice(storages)
                k = rng.choice(keys[s])
                if kind in (PUT, PUT_BLOB):
                    ids = tuple(next(blobs) for _ in range(rng.randint(1, 2))) if kind == PUT_BLOB else ()
                    ops.append(Op(kind, s, k, rng.randbytes(rng.choice((0, 3, 40, 5000))), g.wv(epoch), ids))
                elif kind == REMOVE:
                    ops.append(Op(kind, s, k, b"", g.wv(epoch)))
                else:
                    ops.append(Op(kind, s, b"", b"", g.wv(epoch)))
            g.session(channel, epoch, ops, canceled=rng.random() < 0.1)
            if rng.random() < 0.25:
                g.rotate(channel)
        if epoch <= durable:
            g.make_durable(epoch)
    g.finish()
    return g


def largest_clean_cut(ranges: dict[str, list[int] | None], durable: int) -> int:
    """The highest epoch E <= durable that no file straddles (none has a snippet <= E and one > E)."""
    return next(e for e in range(durable, -2, -1)
                if all(r is None or r[1] <= e or r[0] > e for r in ranges.values()))


def check_generated(g: Generated, tmp_path: Path, epochs: list[int]) -> None:
    """Compact step by step (previous= the step before) up to each of `epochs`; after every step the restored
    directory has the source's state, the compacted file holds the model's state of the files folded so far,
    and the fold is the largest the rule allows."""
    src = g.root
    expected = model_rows(model(g.applied(sorted(g.files))))
    assert rows_of(src) == expected
    before = tree_snapshot(src)
    previous, left, folded_so_far = None, sorted(src / n for n in g.files), set()
    for step, epoch in enumerate(epochs):
        out = tmp_path / f"out{step}"
        result = compact(left, epoch, out, previous=previous)
        rows = check_output(out, result)
        folded_so_far |= set(result.folded)
        assert set(result.detached) == folded_so_far

        ranges = {p.name: [min(g.epochs(p.name)), max(g.epochs(p.name))] if g.epochs(p.name) else None
                  for p in left}
        cut = largest_clean_cut(ranges, epoch)
        assert result.folded == sorted(n for n, r in ranges.items() if r is None or r[1] <= cut)
        assert set(result.skipped) == {p.name for p in left} - set(result.folded)
        for name in result.skipped:
            assert min(g.epochs(name)) > result.epoch  # what is left out is newer than everything folded
            if max(g.epochs(name)) > epoch:
                assert result.skipped[name].startswith("not durable")
        assert all(e <= result.epoch for n in folded_so_far for e in g.epochs(n))

        ops = g.applied(sorted(folded_so_far))
        state = model(ops)
        live = state.rows()
        assert [r[:3] for r in rows] == le_sorted(model_rows(state))
        assert [r[3] for r in rows] == [T_PUT_BLOB if state.latest[r[:2]][1].blobs else T_PUT for r in rows]
        assert result.blob_ids == sorted({b for k in live for b in state.latest[k][1].blobs})
        assert result.max_blob_id == max((b for op in ops for b in op.blobs), default=0)

        assert rows_of(restored(src, out, result, tmp_path / f"restored{step}")) == expected
        previous, left = out, [p for p in left if p.name not in result.folded]
    assert tree_snapshot(src) == before


@pytest.mark.parametrize("seed", range(16))
def test_generated_workloads(seed, tmp_path, monkeypatch):
    if seed % 2:  # values copied in pieces, source files closed and reopened while the compacted file is written
        monkeypatch.setattr(compact_module, "_COPY_CHUNK", 7)
        monkeypatch.setattr(compact_module, "_OPEN_FILES", 2)
    g = random_workload(tmp_path / "src", seed)
    rng = random.Random(seed)
    steps = sorted({rng.randint(0, g.durable), rng.randint(0, g.durable), g.durable})
    check_generated(g, tmp_path, steps)
    # and in one go from scratch
    check_generated(g, tmp_path / "once", [g.durable])


def test_a_clear_left_outside_lowers_the_fold_epoch(tmp_path):
    """Channel 1 clears storage 7 at epoch 3 and holds a nondurable snippet (epoch 9 > 8), so its file never
    folds; channel 0 put k2 at epoch 5 after that clear. Folding k2 with write version 0 would let the clear drop
    it: only what precedes epoch 3 may fold."""
    g = Generated(tmp_path / "src", 2)
    g.session(0, 1, [Op(PUT, 7, b"k1", b"v1", g.wv(1)), Op(PUT, 8, b"k1", b"other", g.wv(1))])
    g.session(0, 2, [Op(PUT, 7, b"k3", b"canceled", g.wv(2))], canceled=True)
    g.session(0, 6, [Op(PUT, 7, b"k4", b"canceled", g.wv(6))], canceled=True)
    g.rotate(0)
    g.session(1, 3, [Op(CLEAR, 7, wv=g.wv(3))])
    g.session(0, 5, [Op(PUT, 7, b"k2", b"v2", g.wv(5))])
    g.rotate(0)
    g.session(1, 9, [Op(REMOVE, 7, b"k2", wv=g.wv(9))])  # never durable
    for epoch in range(1, 9):
        g.make_durable(epoch)
    g.finish()
    a0, a1, empty, b = sorted(g.files)  # channel 0: two rotated files and the empty active one; channel 1: one
    src = g.root
    assert rows_of(src) == [(7, b"k2", b"v2"), (8, b"k1", b"other")]

    out = tmp_path / "out"
    result = compact([src / n for n in g.files], 8, out)
    assert result.epoch == 2
    assert result.folded == [a0, empty]  # a0's canceled snippet of epoch 6 does not hold it back
    assert result.skipped == {a1: "holds epochs past 2 (from 5)",
                              b: "not durable: holds epoch 9, past the durable epoch 8"}
    assert rows_of(restored(src, out, result, tmp_path / "restored")) == rows_of(src)
    check_generated(g, tmp_path / "checked", [8])

    # The fold the rule prevents: a1 folded at version 0 (b not passed), b's clear drops k2.
    wrong = compact([src / a0, src / a1], 8, tmp_path / "wrong")
    assert wrong.folded == [a0, a1]
    assert rows_of(restored(src, tmp_path / "wrong", wrong, tmp_path / "wrong-restored")) == [(8, b"k1", b"other")]


def test_blobs_and_little_endian_order(tmp_path):
    """A put with blobs stays type 10 with its ids; MAX_BLOB_ID counts superseded blobs too; storage 256 sorts
    before storage 1 (little-endian bytes); a previous catalog's MAX_BLOB_ID and MAX_EPOCH_ID never go down."""
    g = Generated(tmp_path / "src", 1)
    big = bytes(range(256)) * 6000  # 1.5 MiB: copied in more than one piece
    g.session(0, 1, [Op(PUT_BLOB, 1, b"\xff", b"old", g.wv(1), (70, 71)), Op(PUT, 256, b"\x00", big, g.wv(1)),
                     Op(PUT_BLOB, 5, b"k", b"gone", g.wv(1), (90,))])
    g.session(0, 2, [Op(PUT_BLOB, 1, b"\xff", b"new", g.wv(2), (3, 4)), Op(REMOVE, 5, b"k", wv=g.wv(2)),
                     Op(PUT, 1, b"", b"empty key", g.wv(2))])
    g.rotate(0)
    g.session(0, 3, [Op(PUT, 1, b"\x00", b"late", g.wv(3))])
    g.make_durable(3)
    g.finish()
    first, second = sorted(g.files)
    out = tmp_path / "out"
    result = compact([g.root / first], 3, out)
    assert (result.max_blob_id, result.blob_ids, result.entries, result.epoch) == (90, [3, 4], 3, 3)
    assert compacted_rows(out / COMPACTED_NAME) == [(256, b"\x00", big, T_PUT, ()), (1, b"", b"empty key", T_PUT, ()),
                                                    (1, b"\xff", b"new", T_PUT_BLOB, (3, 4))]
    result2 = compact([g.root / second], 2, tmp_path / "out2", previous=out)
    assert (result2.folded, result2.epoch, result2.max_blob_id) == ([], 3, 90)  # epoch 3 is past 2: not durable
    assert (tmp_path / "out2" / COMPACTED_NAME).read_bytes() == (out / COMPACTED_NAME).read_bytes()
    result3 = compact([g.root / second], 3, tmp_path / "out3", previous=out)
    assert result3.folded == [second] and result3.detached == [first, second]
    assert [r[:3] for r in compacted_rows(tmp_path / "out3" / COMPACTED_NAME)] == le_sorted(rows_of(g.root))


# --------------------------------------------------------------------------- refusals and the empty case


def test_nothing_to_fold_still_writes(tmp_path):
    g = Generated(tmp_path / "src", 1)
    g.session(0, 4, [Op(PUT, 1, b"k", b"v", g.wv(4))])
    g.make_durable(3)
    g.finish()
    (name,) = g.files
    out = tmp_path / "out"
    result = compact([g.root / name], 3, out)
    assert result == Compaction([], [], 3, 0, [], 0, {name: "not durable: holds epoch 4, past the durable epoch 3"})
    assert (out / COMPACTED_NAME).read_bytes() == writer.snippet_header(0)
    assert (out / CATALOG_NAME).read_text() == ("COMPACTION_CATALOG_HEADER\nCOMPACTED_FILE pwal_0000.compacted 1\n"
                                                "MAX_EPOCH_ID 3\nMAX_BLOB_ID 0\nCOMPACTION_CATALOG_FOOTER\n")
    assert compact([], 0, tmp_path / "none") == Compaction([], [], 0, 0, [], 0, {})


def test_refusals(tmp_path):
    src = copy_limestone_fixture("11-online-compaction", tmp_path, "src")
    rotated = src / f"pwal_0001.{FIRST_MS:014d}.0"
    shutil.copyfile(src / "pwal_0001", rotated)
    out = tmp_path / "out"
    for bad, why in [(src / "pwal_0001", "pwal_0001: only rotated"), (src / COMPACTED_NAME, "only rotated"),
                     (src / "pwal_0000.01795335762261.0", "detached")]:
        with pytest.raises(ValueError, match=why):
            compact([bad], 9, out, previous=src)
    with pytest.raises(ValueError, match="given twice"):
        compact([rotated, rotated], 9, out, previous=src)
    for target in (src, tmp_path / "src" / "."):
        with pytest.raises(ValueError, match="source directory"):
            compact([rotated], 9, target, previous=src)
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(rotated, other / rotated.name)
    with pytest.raises(ValueError, match="source directory"):
        compact([other / rotated.name], 9, other)  # where an input lies
    with pytest.raises(ValueError, match="source directory"):
        compact([other / rotated.name], 9, src, previous=src)  # where the previous compaction lies
    lost = copy_limestone_fixture("11-online-compaction", tmp_path, "lost")
    (lost / COMPACTED_NAME).unlink()
    with pytest.raises(ValueError, match="lost"):
        compact([rotated], 9, out, previous=lost)
    broken = tmp_path / "broken"
    broken.mkdir()
    data = bytearray((src / "pwal_0000.01795335762261.0").read_bytes())
    data[[off for off, t, _ in walk(bytes(data)) if t == 1][1]] = 0  # a put inside a durable snippet
    (broken / rotated.name).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="cannot read it whole"):
        compact([broken / rotated.name], 9, out)
    assert not out.exists()


# --------------------------------------------------------------------------- 4. check_compacted

HEADER = writer.snippet_header(0)
A = writer.put(256, b"k", b"v", (0, 0))  # storage 256 (00 01 ...) sorts before storage 1 (01 00 ...)
B = writer.put(1, b"\x00", b"w", (0, 0))
C = writer.put(1, b"\xff", b"x", (0, 0), (4, 5))
GOOD = HEADER + A + B + C


@pytest.mark.parametrize("data,expected", [
    (GOOD, []),
    (HEADER, []),
    (HEADER + B + A, [("key_order", 9 + len(B))]),
    (HEADER + A + A, [("key_order", 9 + len(A))]),
    (HEADER + writer.put(1, b"\x00", b"w", (0, 0)) + writer.put(1, b"\x00\x00", b"w", (0, 0)), []),
    (HEADER + A + writer.remove(1, b"\x00", (0, 0)) + C, [("not_a_put", 9 + len(A))]),
    (HEADER + A + writer.storage_op(CLEAR_STORAGE, 1, (2, 0)) + C, [("not_a_put", 9 + len(A))]),
    (HEADER + writer.put(256, b"k", b"v", (3, 1)) + B, [("nonzero_version", 9)]),
    (HEADER + A + writer.put(1, b"\x00", b"w", (0, 1)), [("nonzero_version", 9 + len(A))]),
    (GOOD + writer.snippet_end(0), [("end_marker", len(GOOD))]),
    (writer.snippet_header(5) + A + B, [("header_epoch", 0)]),
    (A + B, [("missing_header", 0)]),
    (HEADER + A + HEADER + B, [("extra_header", 9 + len(A))]),
    (HEADER + A + writer.snippet_header(0, canceled=True) + B, [("extra_header", 9 + len(A))]),
    (GOOD[:-3], [("short_entry", 9 + len(A) + len(B))]),
    (HEADER + A + b"\x00" * 4, [("unknown_entry", 9 + len(A))]),
    (b"", [("missing_header", 0)]),
    (HEADER + B + writer.put(1, b"\x00", b"w", (7, 7)) + A,
     [("nonzero_version", 9 + len(B)), ("key_order", 9 + len(B)), ("key_order", 9 + 2 * len(B))]),
])
def test_check_compacted_findings(data, expected, tmp_path):
    path = tmp_path / COMPACTED_NAME
    path.write_bytes(data)
    findings = check_compacted(path)
    assert [(code, offset) for code, offset, _ in findings] == expected
    assert all("Key order violation" in message for code, _, message in findings if code == "key_order")


def test_previous_compacted_file_is_checked(tmp_path):
    prev = tmp_path / "prev"
    prev.mkdir()
    (prev / COMPACTED_NAME).write_bytes(HEADER + B + A)
    (prev / CATALOG_NAME).write_text("COMPACTION_CATALOG_HEADER\nCOMPACTED_FILE pwal_0000.compacted 1\n"
                                     "MAX_EPOCH_ID 0\nCOMPACTION_CATALOG_FOOTER\n")
    with pytest.raises(ValueError, match="key_order"):
        compact([], 0, tmp_path / "out", previous=prev)


# --------------------------------------------------------------------------- 5. plan_fold


@pytest.mark.parametrize("files,durable,expected", [
    ({"a": [1, 3], "b": [2, 5], "c": [6, 8]}, 8, (["a", "b", "c"], 8)),
    # c (to 12) is past the durable epoch: E drops below its 5, which leaves b (3..6) out, and E below 3
    ({"a": [1, 2], "b": [3, 6], "c": [5, 12]}, 10, (["a"], 2)),
    ({"a": [1, 4], "b": [3, 12]}, 10, ([], 0)),
    ({"a": [1, 11]}, 10, ([], 0)),  # nondurable: never folds
    ({"a": [11, 12], "b": [1, 5]}, 10, (["b"], 10)),  # a nondurable file newer than everything holds nothing back
    ({"a": None, "b": [4, 20]}, 10, (["a"], 3)),  # empty or canceled-only: folds
    ({"x": None}, 7, (["x"], 7)),
    ({"a": [1, 5], "b": [5, 11]}, 10, ([], 0)),  # a shared epoch: both stay
    ({"a": [1, 5], "b": [5, 5]}, 10, (["a", "b"], 10)),
    ({}, 4, ([], 4)),
])
def test_plan_fold(files, durable, expected):
    assert plan_fold(files, durable) == expected


def test_plan_fold_is_the_largest_clean_cut():
    rng = random.Random(7)
    for _ in range(3000):
        files = {}
        for n in range(rng.randint(0, 6)):
            lo = rng.randint(0, 15)
            files[f"f{n}"] = None if rng.random() < 0.1 else [lo, lo + rng.randint(0, 6)]
        durable = rng.randint(0, 15)
        names, epoch = plan_fold(files, durable)
        assert epoch == largest_clean_cut(files, durable), (files, durable)
        assert names == sorted(n for n, r in files.items() if r is None or r[1] <= epoch)
