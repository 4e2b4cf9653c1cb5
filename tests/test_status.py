"""walvault status: per source the newest good backup, the archive's reach and its lag behind the source, the
recovery window and the last drill, on real repositories of the shared fixtures; the Prometheus exposition read
back by prometheus_client's parser, and once by Debian's prometheus scraping `walvault status --serve`."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import (TARANTOOL_FIXTURES, clock_at, copy_limestone_fixture, copy_tree, new_repository,
                      require_limestone, require_shared, run_main, walvault_command)
from walcore.limestone.epoch import DURABLE_EPOCH, RECORD

pytestmark = [require_shared, require_limestone]
DAY, HOUR = 86400, 3600


def _json(proc) -> dict:
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def _status(repo, *args) -> tuple[int, dict]:
    proc = run_main("status", "--repo", repo, "--json", *args)
    return proc.returncode, _json(proc)


def _by_family(result: dict) -> dict[str, dict]:
    return {s["family"]: s for s in result["sources"]}


def _build(root: Path) -> dict:
    """A repository holding a Tarantool data dir's archive and full backup (its checkpoint the window's anchor)
    and a limestone directory's archive and snapshot, under a one-day policy."""
    tt = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", root / "tt")
    ls = copy_limestone_fixture("20-random-small", root, "ls")
    repo = new_repository(root / "repo")
    assert run_main("archive", tt, "--repo", repo).returncode == 0
    backup = _json(run_main("backup", tt, "--repo", repo, "--json"))
    assert run_main("rotate", ls).returncode == 0
    assert run_main("archive", ls, "--repo", repo).returncode == 0
    snapshot = _json(run_main("snapshot", ls, "--repo", repo, "--json"))
    assert run_main("policy", "--repo", repo, "--days", "1").returncode == 0
    return {"tt": tt, "ls": ls, "repo": repo, "backup": backup, "snapshot": snapshot, "done": time.time()}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict:
    """Shared by the tests that only read it."""
    return _build(tmp_path_factory.mktemp("status"))


def test_json_names_each_source_its_backup_archive_and_lag(history):
    code, result = _status(history["repo"])
    assert set(result) == {"repository", "time", "ok", "policy", "thresholds", "sources", "bytes", "warnings"}
    sources = _by_family(result)
    tt, ls = sources["tarantool"], sources["limestone"]
    assert tt["path"] == str(history["tt"].resolve()) and ls["path"] == str(history["ls"].resolve())
    assert tt["host"] == socket.gethostname()
    assert tt["backup"]["id"] == history["backup"]["id"] and tt["backup"]["type"] == "full"
    assert tt["backup"]["position"] == history["backup"]["position"]
    assert ls["backup"]["id"] == history["snapshot"]["id"] and ls["backup"]["position"] == {"epoch": 40}
    # every sealed file is archived: the archive reaches the sources' own newest positions, no lag
    assert tt["archive"]["position"] == tt["source"]["position"] == history["backup"]["position"]
    assert ls["archive"]["position"] == ls["source"]["position"] == {"epoch": 40}
    assert tt["archive_lag_seconds"] == ls["archive_lag_seconds"] == 0
    assert tt["archive"]["files"] > 1 and tt["drill"] is None and tt["verification"] is None
    assert tt["source"]["instance"] == tt["instance"] and ls["source"]["instance"] == ls["instance"]
    # The fixture's checkpoint was written days ago (by its rows' time): it anchors the one-day window now. The
    # limestone snapshot was built now: its window is not covered before a day has passed, so the exit is 1.
    assert tt["ok"] and tt["problems"] == [] and tt["window"]["covered"] is True
    assert tt["window"]["anchor"]["name"] == history["backup"]["id"]
    assert code == 1 and not result["ok"]
    assert ls["window"]["covered"] is False and ls["window"]["anchor"] is None
    assert ls["problems"] == [f"the recovery window of 1 days is not covered: no verified snapshot at or before its "
                              f"start ({ls['window']['start']})"]
    sizes = result["bytes"]
    stored = sum(p.stat().st_size for p in Path(history["repo"]).rglob("*") if p.is_file())
    assert sum(sizes.values()) == stored and sizes["backups"] > 0 and sizes["archive"] > 0
    assert sizes["metadata"] > 0 and sizes["reports"] == sizes["audit"] == 0


def test_ages_run_with_the_clock_and_the_window_is_covered_once_a_day_old(history):
    later = history["done"] + DAY + HOUR
    with clock_at(later):
        code, result = _status(history["repo"])
    assert code == 0 and result["ok"] and result["warnings"] == []
    tt, ls = _by_family(result)["tarantool"], _by_family(result)["limestone"]
    assert 25 * HOUR < tt["backup"]["age_seconds"] < 25 * HOUR + 60
    assert tt["window"]["covered"] and tt["window"]["anchor"]["name"] == history["backup"]["id"]
    assert ls["window"]["anchor"]["name"] == history["snapshot"]["id"]
    assert ls["window"]["anchor"]["position"] == {"epoch": 40}
    with clock_at(later):
        text = run_main("status", "--repo", history["repo"])
    assert text.returncode == 0 and f"{history['backup']['id']} (full), 1d01h old" in text.stdout
    assert f"covered by {history['backup']['id']}" in text.stdout
    # two days on, the backups are stale by the default (26 hours) and not by a longer threshold
    with clock_at(history["done"] + 2 * DAY):
        code, result = _status(history["repo"])
        assert _status(history["repo"], "--max-backup-age", "49")[0] == 0
    assert code == 1
    assert "is 2d00h old (more than 1d02h)" in _by_family(result)["tarantool"]["problems"][0]


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(metric, **labels) -> float:
    (found,) = [s.value for s in metric.samples if all(s.labels.get(k) == v for k, v in labels.items())]
    return found


def test_the_exposition_parses_and_says_what_the_json_says(history):
    with clock_at(history["done"] + DAY + HOUR):
        proc = run_main("status", "--repo", history["repo"], "--prometheus")
        _, result = _status(history["repo"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert proc.stdout.count("# HELP walvault_") == proc.stdout.count("# TYPE walvault_") >= 12
    families = _families(proc.stdout)
    assert all(f.type == "gauge" and f.documentation for f in families.values())
    tt = _by_family(result)["tarantool"]
    labels = {"family": "tarantool", "instance": tt["instance"], "host": tt["host"], "source": tt["path"]}
    assert {s.labels["family"] for s in families["walvault_last_backup_age_seconds"].samples} == {"tarantool",
                                                                                                  "limestone"}
    assert _value(families["walvault_last_backup_age_seconds"], **labels) == pytest.approx(
        tt["backup"]["age_seconds"], abs=5)
    assert _value(families["walvault_archive_lag_seconds"], **labels) == 0
    assert _value(families["walvault_recovery_window_covered"], **labels) == 1
    assert _value(families["walvault_source_ok"], **labels) == 1
    assert _value(families["walvault_recovery_window_seconds"]) == DAY
    for kind, n in result["bytes"].items():
        assert _value(families["walvault_repository_bytes"], kind=kind) == n
    assert "walvault_last_drill_success" in families and not families["walvault_last_drill_success"].samples


def test_a_streamer_is_live_while_its_lease_is_renewed_whatever_its_segments(tmp_path):
    """The stream lease, renewed by a live `walvault stream` however idle its source: held, the source's stream is
    live (its renewal time said) though it stored nothing yet; released at a stop, or another host's left without
    renewal past its expiry, no streamer runs. The text and the exposition (walvault_stream_up) say the same."""
    from walcore.repository import Repository
    from walcore.retention import iso

    tt = copy_tree(TARANTOOL_FIXTURES / "many-xlogs", tmp_path / "tt")
    repo = new_repository(tmp_path / "repo")
    assert run_main("archive", tt, "--repo", repo).returncode == 0
    (source,) = _status(repo)[1]["sources"]
    assert source["stream"] is None
    lease_path = repo / "locks" / f"tarantool-{source['instance']}.stream.lease"
    with Repository(str(repo)).stream_lease("tarantool", source["instance"]):
        renewed = iso(json.loads(lease_path.read_text())["taken"])
        (source,) = _status(repo)[1]["sources"]
        assert source["stream"] == {"segments": 0, "position": None, "last_commit": None, "age_seconds": None,
                                    "alive": True, "lease_renewed": renewed, "lag_seconds": None,
                                    "note": "rows of is_local spaces are not streamed: a restore takes them from "
                                            "the archived xlogs", "differs": []}
        assert f"  stream   no segment stored; streamer live (lease renewed {renewed})" in run_main(
            "status", "--repo", repo).stdout.splitlines()
        families = _families(run_main("status", "--repo", repo, "--prometheus").stdout)
        assert _value(families["walvault_stream_up"], instance=source["instance"]) == 1
        assert not families["walvault_stream_lag_seconds"].samples, "no segment: no lag to say"
    assert not lease_path.exists() and _status(repo)[1]["sources"][0]["stream"] is None
    now = time.time()
    elsewhere = {"holder": "h1", "generation": 1, "command": "stream", "host": "elsewhere.invalid", "pid": 4242,
                 "taken": now - 90, "expires": now - 30}
    lease_path.write_text(json.dumps(elsewhere))
    assert _status(repo)[1]["sources"][0]["stream"] is None, "not renewed past its expiry: its streamer is dead"
    lease_path.write_text(json.dumps({**elsewhere, "taken": now - 10, "expires": now + 50}))
    assert _status(repo)[1]["sources"][0]["stream"]["alive"] is True, "another host's, renewed: live"


def test_textfile_is_written_whole_beside_the_output(history, tmp_path):
    target = tmp_path / "walvault.prom"
    target.write_text("an old exposition\n")
    proc = run_main("status", "--repo", history["repo"], "--textfile", target)
    assert proc.returncode == 1 and "repository " in proc.stdout  # the text is printed as without it
    assert "walvault_repository_bytes" in _families(target.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["walvault.prom"]  # no temporary file left


def test_archive_lag_and_a_failed_drill_are_problems(tmp_path):
    built = _build(tmp_path)
    repo, ls = built["repo"], built["ls"]
    snapshot = built["snapshot"]["id"]
    assert run_main("drill", snapshot, "--repo", repo).returncode == 0
    # The source goes on past what is archived: its epoch file says epoch 45, written two hours after the
    # archived log's last rotation.
    rotated = max(float(p.name.split(".")[1]) / 1000 for p in ls.glob("epoch.*"))
    epoch = ls / "epoch"
    epoch.write_bytes(RECORD.pack(DURABLE_EPOCH, 45))
    os.utime(epoch, (rotated + 2 * HOUR, rotated + 2 * HOUR))
    with clock_at(built["done"] + DAY + HOUR):
        code, result = _status(repo)
        exposition = run_main("status", "--repo", repo, "--prometheus").stdout
    assert code == 1
    s = _by_family(result)["limestone"]
    assert s["source"]["position"] == {"epoch": 45} and s["archive"]["position"] == {"epoch": 40}
    assert s["archive_lag_seconds"] == pytest.approx(2 * HOUR, abs=1)
    assert s["drill"]["status"] == "ok" and s["drill"]["backup"] == snapshot
    assert s["problems"] == ["the archive is 2h00m behind the source (more than 1h00m): it reaches {'epoch': 40}, "
                             "the source {'epoch': 45}"]
    assert _by_family(result)["tarantool"]["ok"]
    assert _value(_families(exposition)["walvault_archive_lag_seconds"], family="limestone") == pytest.approx(
        2 * HOUR, abs=1)
    assert _value(_families(exposition)["walvault_last_drill_success"], family="limestone") == 1
    with clock_at(built["done"] + DAY + HOUR):
        assert _status(repo, "--max-archive-lag", "121")[0] == 0
    # A damaged object fails the next drill: the snapshot is no longer a good backup.
    victim = max(Path(repo).rglob(f"backups/{snapshot}/*.zst"), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x10
    victim.write_bytes(bytes(data))
    assert run_main("drill", snapshot, "--repo", repo).returncode == 1
    with clock_at(built["done"] + DAY + HOUR):
        code, result = _status(repo, "--max-archive-lag", "121")
    s = _by_family(result)["limestone"]
    assert code == 1 and s["drill"]["status"] == "failed" and s["backup"] is None
    assert s["problems"][0] == "no backup that restores (whole, and no failed drill or verification)"
    assert s["problems"][-1].startswith(f"the last drill (of backup {snapshot}, ") and victim.name in s["problems"][-1]


def test_a_backup_a_verification_found_damaged_is_not_good_nor_an_anchor_until_verified_again(tmp_path):
    """Bit rot in the repository, found by `verify --repo`: the backup is no longer what status calls the newest
    good one, nor what expire anchors the window on (nothing of the archive it covered goes), until a
    verification finds it intact again."""
    built = _build(tmp_path)
    repo, backup = built["repo"], built["backup"]["id"]
    assert run_main("verify", "--repo", repo).returncode == 0
    with clock_at(built["done"] + HOUR):
        _, result = _status(repo)
        covering = _json(run_main("expire", "--repo", repo, "--json"))
    tt = _by_family(result)["tarantool"]
    assert tt["ok"] and tt["backup"]["id"] == backup and tt["verification"]["damaged"] == []
    assert _tarantool_plan(covering)["anchor"] is not None and _deleted_archive(covering), \
        "the backup's checkpoint covers archived xlogs: the plan deletes them"
    victim = max(Path(repo).rglob(f"backups/{backup}/**/*.snap.zst"), key=lambda p: p.stat().st_size)
    intact = victim.read_bytes()
    damaged = bytearray(intact)
    damaged[len(damaged) // 2] ^= 0x10
    victim.write_bytes(bytes(damaged))
    assert run_main("verify", "--repo", repo).returncode == 1
    listed = [line for line in run_main("backups", "--repo", repo).stdout.splitlines() if line.startswith(backup)]
    assert len(listed) == 1 and "DAMAGED (verify " in listed[0]
    with clock_at(built["done"] + HOUR):
        code, result = _status(repo)
        exposition = run_main("status", "--repo", repo, "--prometheus").stdout
        uncovered = _json(run_main("expire", "--repo", repo, "--json"))
    tt = _by_family(result)["tarantool"]
    assert code == 1 and tt["backup"] is None and tt["window"]["covered"] is False
    assert [d["backup"] for d in tt["verification"]["damaged"]] == [backup]
    said = [p for p in tt["problems"] if p.startswith(f"the last verification of backup {backup} (")]
    assert len(said) == 1 and "found it damaged" in said[0] and victim.name in said[0]
    assert _value(_families(exposition)["walvault_damaged_backups"], family="tarantool") == 1
    assert _value(_families(exposition)["walvault_damaged_backups"], family="limestone") == 0
    assert _tarantool_plan(uncovered)["anchor"] is None and not _deleted_archive(uncovered)
    # mended (the bytes put back) and verified again: good again
    victim.write_bytes(intact)
    assert run_main("verify", "--repo", repo).returncode == 0
    with clock_at(built["done"] + HOUR):
        _, result = _status(repo)
    tt = _by_family(result)["tarantool"]
    assert tt["ok"] and tt["backup"]["id"] == backup and tt["verification"]["damaged"] == []


def _tarantool_plan(plan: dict) -> dict:
    (source,) = [s for s in plan["sources"] if s["family"] == "tarantool"]
    return source


def _deleted_archive(plan: dict) -> list[str]:
    return [d["path"] for d in _tarantool_plan(plan)["delete"] if "/archive/" in d["path"]]


def test_a_backup_finished_in_the_future_is_not_fresh(history):
    """A clock set wrong (or a forged manifest): a backup finished an hour after now says nothing of freshness."""
    with clock_at(history["done"] - HOUR):
        code, result = _status(history["repo"])
    tt = _by_family(result)["tarantool"]
    assert code == 1 and tt["backup"]["age_seconds"] == 0
    assert any(p.startswith(f"the newest backup that restores, {history['backup']['id']}, finished 5") and
               "in the future" in p for p in tt["problems"]), tt["problems"]


def test_a_directory_holding_another_instance_now_is_not_lagged_against_the_old_archive(tmp_path):
    """A database re-created at the same path: its log is another history, not the old instance's to lag."""
    built = _build(tmp_path)
    shutil.rmtree(built["tt"])
    copy_tree(TARANTOOL_FIXTURES / "concurrent", built["tt"])
    with clock_at(built["done"] + HOUR):
        _, result = _status(built["repo"])
    tt = _by_family(result)["tarantool"]
    assert tt["instance"] == "aaaaaaaa-bbbb-4ccc-8ddd-000000000001"
    assert tt["source"]["instance"] == "aaaaaaaa-bbbb-4ccc-8ddd-000000000004"
    assert tt["archive_lag_seconds"] is None and tt["ok"], tt["problems"]


@pytest.mark.parametrize("args, said", [
    (["--json", "--prometheus"], "--json and --prometheus: give one"),
    (["--serve", "localhost"], "--serve 'localhost' is not HOST:PORT (e.g. 127.0.0.1:9477)"),
    (["--serve", "127.0.0.1:9477", "--json"], "--serve answers scrapes; it takes no --json or --textfile"),
    (["--textfile", "/nonexistent/walvault.prom"], "--textfile /nonexistent/walvault.prom: its directory does not "
                                                   "exist"),
    (["--max-backup-age", "0"], "--max-backup-age must be a positive number"),
    (["--max-archive-lag", "nan"], "--max-archive-lag must be a positive number"),
])
def test_bad_input_is_one_line_and_exit_2(args, said, tmp_path):
    proc = run_main("status", "--repo", new_repository(tmp_path / "repo"), *args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"walvault: {said}\n")


def test_a_location_holding_no_repository_is_exit_2(tmp_path):
    proc = run_main("status", "--repo", tmp_path / "none")
    assert proc.returncode == 2 and proc.stdout == "" and len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("walvault: no status: ") and "is not a walvault repository" in proc.stderr


def test_an_empty_repository_is_ok_and_says_it_judges_no_window(tmp_path):
    code, result = _status(new_repository(tmp_path / "repo"))
    assert code == 0 and result["sources"] == [] and result["policy"] is None
    assert result["warnings"][0].startswith("no retention policy stored")


def test_an_unreadable_manifest_is_a_problem_of_its_instance(tmp_path):
    built = _build(tmp_path)
    backup = built["backup"]["id"]
    for manifest in Path(built["repo"]).rglob(f"backups/{backup}/backup.manifest*"):
        manifest.write_text("{}")
    with clock_at(built["done"] + DAY + HOUR):
        code, result = _status(built["repo"])
    tt = _by_family(result)["tarantool"]
    assert code == 1 and tt["backup"] is None and tt["window"]["covered"] is False
    assert tt["problems"][0].startswith(f"the manifest of backup {backup} cannot be read (")
    assert _by_family(result)["limestone"]["ok"]


def test_a_repository_on_s3_too(repo_target, tmp_path):
    """The bytes by kind come from the store's own listing: a local directory's, or S3's."""
    ls = copy_limestone_fixture("20-random-small", tmp_path, "ls")
    repo_target.repository()
    assert run_main("rotate", ls).returncode == 0
    assert run_main("archive", ls, *repo_target.cli).returncode == 0
    proc = run_main("status", *repo_target.cli, "--json")
    result = _json(proc)
    (source,) = result["sources"]
    assert source["archive"]["position"] == source["source"]["position"] == {"epoch": 40}
    assert source["problems"] == ["no backup that restores (whole, and no failed drill or verification)"]
    assert proc.returncode == 1 and result["bytes"]["archive"] > 0 and result["bytes"]["backups"] == 0


# -- Debian's prometheus scraping `walvault status --serve`


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(port: int, query: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as reply:
        answer = json.load(reply)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_the_served_metrics(history, tmp_path):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("Debian's prometheus is not installed: run scripts/setup")
    serve_port, prometheus_port = _free_port(), _free_port()
    served = subprocess.Popen([*walvault_command(), "status", "--repo", str(history["repo"]), "--serve",
                               f"127.0.0.1:{serve_port}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: walvault
    static_configs: [{{targets: ["127.0.0.1:{serve_port}"]}}]
""")
    prometheus = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                   f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert served.stderr.readline() == f"walvault: serving http://127.0.0.1:{serve_port}/metrics until stopped\n"
        expected = _status(history["repo"])[1]["bytes"]["archive"]
        deadline, found = time.monotonic() + 60, []
        while not found and time.monotonic() < deadline:
            time.sleep(1)
            try:
                found = _query(prometheus_port, 'walvault_repository_bytes{kind="archive"}')
            except OSError:  # not listening yet
                continue
        assert found, "prometheus stored no walvault_repository_bytes within a minute"
        (sample,) = found
        assert sample["metric"]["job"] == "walvault" and float(sample["value"][1]) == expected
        (up,) = _query(prometheus_port, 'up{job="walvault"}')
        assert up["value"][1] == "1"
        ages = _query(prometheus_port, "walvault_last_backup_age_seconds")
        assert {a["metric"]["family"] for a in ages} == {"tarantool", "limestone"}
    finally:
        for process in (prometheus, served):
            process.terminate()
            process.wait(timeout=30)
