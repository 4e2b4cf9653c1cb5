"""Pins, notes and retention by count: `walvault pin`/`unpin`, `backup --note KEY=VALUE`, `policy --keep-full N`.

One history of a Tarantool-format source (tests/test_retention_property.py's synthetic data dir, on its simulated
clock): a full backup F1, an incremental I1 on it, a snapshot S1, full backups F2 and F3. Judged a few days after
its last row under a one-day window, F3 anchors and is the newest backup: F1, I1, S1 and F2 would go. What must
never happen is proven on the repository's files; what must still work, by restoring.
"""

from __future__ import annotations

import json
import random
import shutil
import threading
import time
from pathlib import Path

import pytest

from conftest import RepoTarget, clock_at, run_main, tree_but_leases
from test_retention_property import DAY, T0, TarantoolSource, tarantool_state
from walcore.repository import Repository

INSTANCE = "0000aaaa-1111-4222-8333-444455556666"


def _json(proc) -> dict:
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _one_line_exit(proc, code: int, *fragments: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, proc.stderr


class History:
    """The history above, backed up into `target`; `states`: what each backup must restore."""

    def __init__(self, root: Path, target: RepoTarget):
        self.target, self.repo = target, target.repository()
        self.src = TarantoolSource(root / "src")
        rng, self.clock, self.ids, self.states = random.Random(26), [T0], {}, {}
        for name, extra in (("F1", ["--note", "ticket=OPS-26", "--note", "why=before the upgrade"]),
                            ("I1", ["--type", "incremental"]), ("S1", None), ("F2", []), ("F3", [])):
            self.src.write(rng, 3, self.clock)
            if extra is None:
                self.src.checkpoint(self.clock)
                made = _json(run_main("snapshot", self.src.root, *target.cli, "--json"))
            else:
                made = _json(run_main("backup", self.src.root, *target.cli, "--json", *extra))
            self.ids[name] = made["id"]
            self.states[made["id"]] = self.src.state_at_lsn(int(made["position"]["vclock"].get("1", 0)))
        self.as_of = self.clock[0] + 3 * DAY  # a one-day window starts after every row

    def run(self, *args: str):
        return run_main(*args, *self.target.cli)

    def expire(self, *args: str, apply: bool = True) -> dict:
        """expire --json with a one-day window as of `as_of` (an apply on a clock moved there)."""
        argv = ["expire", "--days", "1", "--as-of", f"@{self.as_of}", "--json", *args,
                *(["--apply"] if apply else [])]
        with clock_at(self.as_of if apply else time.time()):
            (source,) = _json(self.run(*argv))["sources"]
        assert source["stopped"] is None, source["stopped"]
        return source

    def listed(self) -> dict[str, dict]:
        return {b["id"]: b for b in _json(self.run("backups", "--json"))["backups"]}

    def restores(self, name: str, scratch: Path) -> None:
        backup_id = self.ids[name]
        scratch.mkdir(exist_ok=True)
        target = scratch / backup_id
        assert self.run("restore", backup_id, target).returncode == 0
        assert tarantool_state(target)[0] == self.states[backup_id], name
        shutil.rmtree(target)


@pytest.fixture
def local(tmp_path) -> History:
    return History(tmp_path, RepoTarget("local", str(tmp_path / "repo"), {}))


def _kept(source: dict) -> dict[str, str]:
    return {Path(k["path"]).name: k["reason"] for k in source["keep"] if k["kind"].startswith("backup")}


def _deleted(source: dict) -> set[str]:
    return {Path(d["path"]).name for d in source["delete"] if d["kind"].startswith("backup")}


# -- pins


def test_a_pin_survives_an_expiry_that_would_take_it_and_unpin_lets_it_go(local, tmp_path):
    h, ids = local, local.ids
    assert _deleted(h.expire(apply=False)) == {ids["F1"], ids["I1"], ids["S1"], ids["F2"]}
    pinned = _json(h.run("pin", ids["I1"], "--note", "kept for the audit", "--json"))
    assert pinned["pinned"] and pinned["pin"]["note"] == "kept for the audit"
    manifest = Path(h.target.url, "tarantool", INSTANCE, "backups", ids["I1"], "backup.manifest").read_bytes()
    source = h.expire()
    assert _kept(source)[ids["I1"]] == "pinned"
    assert _kept(source)[ids["F1"]] == f"in the parent chain of {ids['I1']}"
    assert _deleted(source) == {ids["S1"], ids["F2"]} and source["deleted"] == 2
    # the pin is an object of its own: the manifest is the one written by the backup
    assert Path(h.target.url, "tarantool", INSTANCE, "backups", ids["I1"], "backup.manifest").read_bytes() == manifest
    listed = h.listed()
    assert set(listed) == {ids["F1"], ids["I1"], ids["F3"]}
    assert listed[ids["I1"]]["pin"]["note"] == "kept for the audit" and listed[ids["F1"]]["pin"] is None
    assert "PINNED (kept for the audit)" in h.run("backups").stdout
    for name in ("F1", "I1", "F3"):
        h.restores(name, tmp_path / "restored")
    text = h.run("expire", "--days", "1", "--as-of", f"@{h.as_of}").stdout
    assert "1 pinned" in text and f"1 in the parent chain of {ids['I1']}" in text
    # unpinned, retention judges it again
    assert _json(h.run("unpin", ids["I1"], "--json"))["changed"] is True
    again = h.run("unpin", ids["I1"])
    assert again.returncode == 0 and "was not pinned: nothing changed" in again.stdout
    assert _deleted(h.expire()) == {ids["F1"], ids["I1"]}
    assert set(h.listed()) == {ids["F3"]}


def test_pin_and_unpin_on_every_storage(repo_target, tmp_path):
    h = History(tmp_path, repo_target)
    assert "PINNED" not in h.run("backups").stdout
    shown = h.run("pin", "latest", "--note", "release 2.11")
    assert shown.returncode == 0 and f"pinned backup {h.ids['F3']}" in shown.stdout
    repinned = _json(h.run("pin", h.ids["F2"], "--json"))  # a second pin, of another backup, without a note
    assert repinned["pin"]["note"] is None
    listed = h.listed()
    assert listed[h.ids["F3"]]["pin"]["note"] == "release 2.11" and listed[h.ids["F2"]]["pin"]["note"] is None
    plan = h.expire(apply=False)
    assert _kept(plan)[h.ids["F2"]] == "pinned" and _kept(plan)[h.ids["F3"]] == "pinned"
    assert _deleted(plan) == {h.ids["F1"], h.ids["I1"], h.ids["S1"]}
    assert _json(h.run("pin", h.ids["F2"], "--note", "again", "--json"))["pin"]["note"] == "again"  # replaced
    for backup_id in (h.ids["F2"], h.ids["F3"]):
        assert _json(h.run("unpin", backup_id, "--json"))["changed"] is True
    assert all(b["pin"] is None for b in h.listed().values())


def test_a_pin_of_a_backup_that_does_not_exist_exits_2_and_writes_nothing(local):
    before = tree_but_leases(Path(local.target.url))
    for command in ("pin", "unpin"):
        _one_line_exit(local.run(command, "20200101-000000F"), 2, f"not {command}ned: no backup 20200101-000000F")
        _one_line_exit(local.run(command, "nonsense"), 2, "no backup nonsense")
    for note in ("", "two\nlines", "x" * 257):
        _one_line_exit(local.run("pin", "latest", "--note", note), 2, "--note")
    assert tree_but_leases(Path(local.target.url)) == before


def test_a_pin_while_an_expiry_holds_the_source_is_refused_or_waits_never_lost(local):
    """pin takes the lease an expiry holds from its plan to its last deletion: refused while it is held (exit 1,
    nothing written), or with --wait taken once it is released, and then in the next expiry's plan."""
    h, repo = local, Repository(local.target.url)
    lease = repo.lease("tarantool", INSTANCE, "expire")
    try:
        refused = h.run("pin", h.ids["F1"])
        _one_line_exit(refused, 1, "not pinned:", "expire")
        assert h.listed()[h.ids["F1"]]["pin"] is None
        threading.Timer(1.0, lease.release).start()
        waited = h.run("pin", h.ids["F1"], "--wait", "30")
        assert waited.returncode == 0, waited.stderr
    finally:
        lease.release()
    assert _kept(h.expire())[h.ids["F1"]] == "pinned"
    assert h.ids["F1"] in h.listed()



def test_a_pin_or_unpin_whose_lease_was_broken_meanwhile_changes_nothing(local, monkeypatch):
    """A pin proves its lease right before it writes, as every commit point does: paused after it looked the backup
    up, its lease broken by an expiry on another host (which planned without the pin and may delete the backup),
    it must not write a pin nor say the backup is pinned (exit 1); an unpin likewise leaves the pin there."""
    import walcore.command.pin as pin_command

    h, lease = local, Path(local.target.url, "locks", f"tarantool-{INSTANCE}.lease")
    looked_up = pin_command._still_there

    def broken_meanwhile(repo, record):
        looked_up(repo, record)
        now = time.time()
        lease.write_text(json.dumps({"holder": "another expiry", "command": "expire", "host": "elsewhere",
                                     "pid": 4242, "taken": now, "expires": now + 3600}))

    assert _json(h.run("pin", h.ids["F2"], "--json"))["pinned"]
    before = tree_but_leases(Path(h.target.url))
    monkeypatch.setattr(pin_command, "_still_there", broken_meanwhile)
    for command, backup_id in (("pin", h.ids["F1"]), ("unpin", h.ids["F2"])):
        _one_line_exit(h.run(command, backup_id), 1, "lost")
        lease.unlink()
    monkeypatch.undo()
    assert tree_but_leases(Path(h.target.url)) == before
    listed = h.listed()
    assert listed[h.ids["F1"]]["pin"] is None and listed[h.ids["F2"]]["pin"] is not None


# -- notes


def test_notes_are_kept_in_the_manifest_and_listed(local):
    h = local
    listed = h.listed()
    assert listed[h.ids["F1"]]["notes"] == {"ticket": "OPS-26", "why": "before the upgrade"}
    assert listed[h.ids["F2"]]["notes"] == {}
    manifest = json.loads(Path(h.target.url, "tarantool", INSTANCE, "backups", h.ids["F1"],
                               "backup.manifest").read_text())
    assert manifest["notes"] == {"ticket": "OPS-26", "why": "before the upgrade"}
    # a backup without notes writes its manifest as before they existed
    assert "notes" not in json.loads(Path(h.target.url, "tarantool", INSTANCE, "backups", h.ids["F2"],
                                          "backup.manifest").read_text())
    line = next(row for row in h.run("backups").stdout.splitlines() if row.startswith(h.ids["F1"] + " "))
    assert line.endswith("notes: ticket=OPS-26, why=before the upgrade")
    made = h.run("backup", h.src.root, "--note", "release=2.11")
    assert made.returncode == 0 and "notes: release=2.11" in made.stdout


@pytest.mark.parametrize("notes, said", [
    (["ticket"], "is not KEY=VALUE"), (["=x"], "the key must be"), (["1st=x"], "the key must be"),
    (["k y=x"], "the key must be"), (["k=a", "k=b"], "given twice"), (["k="], "--note k is empty"),
    (["k=a\tb"], "control character"), (["k=" + "v" * 257], "longer than 256"),
    ([f"k{n}=v" for n in range(33)], "at most 32")], ids=range(9))
def test_a_bad_note_exits_2_and_backs_nothing_up(local, notes, said):
    before = tree_but_leases(Path(local.target.url))
    _one_line_exit(local.run("backup", local.src.root, *[a for n in notes for a in ("--note", n)]), 2, said)
    assert tree_but_leases(Path(local.target.url)) == before


# -- retention by count


def test_keep_full_keeps_the_newest_full_backups_whatever_the_window_says(local, tmp_path):
    h, ids = local, local.ids
    _one_line_exit(h.run("policy", "--keep-full", "2"), 2, "give --days N")
    assert _json(h.run("policy", "--days", "1", "--keep-full", "2", "--json"))["policy"]["keep_full"] == 2
    assert "and the newest 2 full backups of each source" in h.run("policy").stdout
    assert _json(h.run("policy", "--days", "2", "--json"))["policy"]["keep_full"] == 2  # kept as stored
    for wrong in ("-1", "10001"):
        _one_line_exit(h.run("policy", "--keep-full", wrong), 2, "--keep-full")
        _one_line_exit(h.run("expire", "--days", "1", "--keep-full", wrong), 2, "--keep-full")
    plan = _json(h.run("expire", "--as-of", f"@{h.as_of}", "--json"))  # the stored window (2) and count (2)
    assert plan["policy"] == {"days": 2, "keep_full": 2}
    source = h.expire()  # --days 1; the stored count
    assert _kept(source)[ids["F2"]] == "kept by count: one of the newest 2 full backups of its source"
    assert _deleted(source) == {ids["F1"], ids["I1"], ids["S1"]}
    h.restores("F2", tmp_path / "restored")
    # the stricter rule keeps: a window that keeps everything is not narrowed by a count
    assert _deleted(_json(h.run("expire", "--days", "36500", "--keep-full", "1", "--as-of", f"@{h.as_of}",
                                "--json"))["sources"][0]) == set()
    assert _deleted(h.expire("--keep-full", "0")) == {ids["F2"]}
    assert set(h.listed()) == {ids["F3"]}


def test_keep_full_counts_restorable_fulls_with_their_chains(local):
    """An incremental on a full the count keeps is judged by the window; a full the count keeps keeps its own."""
    h, ids = local, local.ids
    source = h.expire("--keep-full", "3", apply=False)
    assert {backup_id for backup_id, why in _kept(source).items() if why.startswith("kept by count")} \
        == {ids["F1"], ids["F2"]}  # F3 is kept as the newest backup first
    assert ids["I1"] in _deleted(source)
    h.run("pin", ids["I1"])
    assert _kept(h.expire("--keep-full", "3", apply=False))[ids["I1"]] == "pinned"


def test_the_retention_dag_shows_a_pinned_backup(local):
    """The retention DAG logs the plan as `walvault expire` says it and its run's note counts each reason."""
    from walcore.command.expire import expire, render
    from walvault_provider.notes import EXPLAIN

    h = local
    h.run("pin", h.ids["F1"], "--note", "legal hold")
    result = expire(h.repo, 1, keep_full=1, as_of=h.as_of)
    text = "\n".join(render(result))
    assert "1 pinned" in text and "and the newest 1 full backups of each source" in text
    (note,) = EXPLAIN["expire"](result.to_json())
    assert "1 pinned" in note
