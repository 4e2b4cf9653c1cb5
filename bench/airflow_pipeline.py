"""Benchmark what Airflow adds to walvault: the DAG folder's parse time, and the archive-backup-verify pipeline
run by the DAGs (`airflow dags test`, Spark on local[2]) against the same commands run by hand.

    .venv/bin/python bench/airflow_pipeline.py [--size-mb 1100] [--rounds 3] [--parse-runs 5] [--alone-forked]
                                               [--dir DIR] [--json FILE] [--keep]

Part 1, the DAG folder's parse time (target < 1 s for the folder). --parse-runs times, a fresh interpreter (cold
imports of everything but Airflow itself, as in a dag-processor) imports airflow and DagBag (untimed), then times
`DagBag(dag_folder=<checkout>/dags)` with WALVAULT_CONFIG on this bench's configuration; every run must find the
six walvault_* DAGs and no import error. Reported: the folder's wall time (best, median) and each file's
duration from the DagBag's own stats (`dagbag_stats`: file, duration). The first file parsed pays for the imports
the files share (walvault_provider, the Spark provider), so that split says which file came first as much as
what it costs; so each file is also parsed alone, --parse-runs times in turns, each in a fresh interpreter
(the dag-processor parses every file in a process of its own): its "alone" time. With --alone-forked (the
tests' run) each file is parsed alone in a process forked from one interpreter that imported airflow and DagBag,
which is what the alone time leaves out anyway: the same figure without an interpreter's start per file.

Part 2, the pipeline on >= --size-mb MB (10**6 bytes) of real-format Tarantool files (walcore's generate_wal: a
snapshot and a chain of xlogs of Tarantool's 64 MiB, the newest open; generated once and reused while the stamp
beside the data dir matches). The page cache is warmed, then every round runs both paths side by side, each into
a fresh repository:

  CLI path      `walvault archive SRC --repo R --json`; `walvault verify --repo R` of the files archive stored
                now (what the archive DAG's Spark job checks: the Tarantool files by their verdicts in the ledger); `walvault backup SRC --repo R --json` (full, the sealed files'
                verdicts from the ledger archive filled); `walvault verify --repo R <backup id>`
  Airflow path  `airflow dags test walvault_archive` (archive task, then the Spark verify job of the files it
                stored); `airflow dags test walvault_backup --conf {"source": ..., "type": "full", "verify": true,
                "spark": "spark_default"}` (the Spark backup job, its record, then the repository verify) — one
                AIRFLOW_HOME migrated once (untimed), a configuration naming only the bench's source

Every step is a subprocess timed by wall time (process start included), `sync` (untimed) before each. Reported:
each step's best and median, each path's total per round (best, median, MB/s of the source's bytes), and the
Airflow path's overhead: seconds over the CLI path and the ratio airflow / CLI, for the whole pipeline and per DAG
(archive DAG against archive + verify of the files; backup DAG against backup + verify --repo), and where each
`airflow dags test` spent its time (start-up, each task, finish: from its log's "[DAG TEST]" lines). After each round
both repositories must hold the same archived files (name, size, SHA-256) and exactly one full backup, status ok
(`walvault backups --json`), with the same manifest files (name, size, SHA-256). Results also go to --json
(default bench/out/airflow_pipeline.json). This is a benchmark: it never fails on timings. It exits 1 when a
command fails or the two paths disagree.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from walcore.repository import Repository
from walcore.repository.archive import load_archived
from walcore.tarantool.writer import generate_wal

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
import common  # noqa: E402
from common import MB, WALVAULT  # noqa: E402

sys.path.append(str(common.REPO / "scripts"))  # scripts/devenv.py: Airflow on one machine
from devenv import environment, migrate  # noqa: E402

SEED = 1
SOURCE = "bench-tarantool"
DAGS = ("walvault_archive", "walvault_backup", "walvault_restore_drill", "walvault_retention", "walvault_snapshot",
        "walvault_status")
DAG_FOLDER = common.REPO / "dags"
PARSE_TARGET_S = 1.0
MARKER = "WALVAULT-BENCH-PARSE "  # Airflow logs to stdout: the child's result is the line after this marker
TIMEOUT = 1800

# what the child interpreter of part 1 runs: argv[1] is the DAG folder
PARSE_CHILD = f"""
import json, sys, time
t0 = time.perf_counter()
import airflow  # noqa: F401  untimed: a dag-processor has it loaded
from airflow.dag_processing.dagbag import DagBag
t1 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1])
t2 = time.perf_counter()
print({MARKER!r} + json.dumps({{
    "import_s": t1 - t0, "folder_s": t2 - t1, "dags": sorted(bag.dag_ids),
    "import_errors": {{str(k): str(v)[-2000:] for k, v in bag.import_errors.items()}},
    "files": [{{"file": s.file, "duration_s": s.duration.total_seconds(), "dag_num": s.dag_num,
               "task_num": s.task_num}} for s in bag.dagbag_stats]}}))
"""

# --alone-forked: what one child interpreter runs instead of a fresh one per file: airflow and DagBag imported once
# (untimed, as in PARSE_CHILD), then each file (argv[1:]) in a process forked from it, printing PARSE_CHILD's result
PARSE_ALONE_FORKED = f"""
import json, os, sys, time
import airflow  # noqa: F401
from airflow.dag_processing.dagbag import DagBag
for path in sys.argv[1:]:
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        t1 = time.perf_counter()
        bag = DagBag(dag_folder=path)
        t2 = time.perf_counter()
        print({MARKER!r} + json.dumps({{
            "path": path, "folder_s": t2 - t1, "dags": sorted(bag.dag_ids),
            "import_errors": {{str(k): str(v)[-2000:] for k, v in bag.import_errors.items()}}}}), flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
"""

STEPS = {  # name: (path, dag)
    "walvault archive": ("cli", "archive"),
    "walvault verify (the files archived now)": ("cli", "archive"),
    "walvault backup (full)": ("cli", "backup"),
    "walvault verify --repo R <backup id>": ("cli", "backup"),
    "airflow dags test walvault_archive": ("airflow", "archive"),
    "airflow dags test walvault_backup (full, verify)": ("airflow", "backup"),
}


# --------------------------------------------------------------------------- data


def prepare_data(root: Path, size_mb: int, file_bytes: int) -> list[Path]:
    """Files under root/tarantool (a .snap, then xlogs, the newest open), reused when the stamp matches."""
    data = root / "tarantool"
    want = {"size_mb": size_mb, "seed": SEED, "file_bytes": file_bytes}
    if stamp := common.reusable_stamp(root, data, want):
        return sorted(data / name for name in stamp["files"])
    clear_data(root)
    t0 = time.perf_counter()
    files = generate_wal(data, target_bytes=size_mb * MB, seed=SEED, file_bytes=file_bytes)
    print(f"generated {len(files)} files in {data} in {time.perf_counter() - t0:.1f} s")
    common.write_stamp(root, want, files)
    return sorted(files)


def clear_data(root: Path) -> None:
    """Remove only what prepare_data writes."""
    common.clear_data(root, root / "tarantool", lambda p: p.suffix in (".snap", ".xlog", ".inprogress"))


def warm(paths: list[Path]) -> None:
    for _ in common.chunks(paths):  # every step then reads the source from memory
        pass


# --------------------------------------------------------------------------- one timed subprocess


def run(cmd: list[str], what: str, env: dict | None = None) -> dict:
    """cmd as a subprocess after an (untimed) sync: wall time, CPU (user + system of the waited-for processes),
    exit code, peak RSS of the largest single process (/usr/bin/time %M), stdout and stderr."""
    os.sync()
    with tempfile.TemporaryDirectory(prefix="walvault-bench-") as tmp:
        rss_file = Path(tmp) / "rss"
        full = [str(common.GNU_TIME), "-f", "%M", "-o", str(rss_file), *cmd] if common.GNU_TIME.exists() else cmd
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=TIMEOUT)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, stdout, stderr = -9, e.stdout or b"", (e.stderr or b"") + f"\ntimed out after {TIMEOUT} s".encode()
        seconds = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:  # the last line: a command killed by a signal makes time(1) print a line before it
            rss = int(rss_file.read_text().split("\n")[-2].split()[0])
        except (OSError, ValueError, IndexError):
            rss = None
    out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
    if rc:
        print(f"!! {what}: exit code {rc}:\n{(out + err)[-3000:]}")
    return {"seconds": seconds, "cpu": (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), "rc": rc,
            "rss": rss, "stdout": out, "stderr": err, "started_at": started_at}


def json_out(r: dict) -> dict | None:
    try:
        return json.loads(r["stdout"]) if r["stdout"].strip() else None
    except ValueError:
        return None


_TASK_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z .*\[DAG TEST\] (starting|end) "
                        r"(?:task )?task_id=(\S+) map_index=(-?\d+)", re.M)


def task_times(r: dict) -> dict[str, float]:
    """Where an `airflow dags test` run's time went, from its log's "[DAG TEST] starting/end task" lines (UTC):
    "start-up" (process start to the first task), each task (mapped ones summed), "finish" (the last task's end
    to the process's exit). {} when the log has no such lines."""
    from datetime import datetime, timezone

    def stamp(text: str) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp()

    events = [(stamp(m[1]), m[2], m[3]) for m in _TASK_LINE.finditer(r["stdout"] + "\n" + r["stderr"])]
    if not events:
        return {}
    events.sort()
    times: dict[str, float] = {"start-up": events[0][0] - r["started_at"]}
    open_at: dict[str, float] = {}
    for at, what, task in events:
        if what == "starting":
            open_at[task] = at
        elif task in open_at:
            times[task] = times.get(task, 0.0) + at - open_at.pop(task)
    times["finish"] = r["started_at"] + r["seconds"] - events[-1][0]
    return times


def walvault(*args: str) -> list[str]:
    return [str(WALVAULT), *args, "--json", "--no-progress"]


# --------------------------------------------------------------------------- part 1: parse time


def parse_child(env: dict, path: Path, what: str) -> tuple[dict | None, list[str]]:
    """DagBag(dag_folder=path) in a fresh interpreter: what the child printed, and what is wrong with it."""
    r = run([sys.executable, "-c", PARSE_CHILD, str(path)], what, env)
    line = next((ln for ln in r["stdout"].splitlines() if ln.startswith(MARKER)), None)
    if r["rc"] or line is None:
        return None, [f"{what}: exit code {r['rc']}, no result: {(r['stdout'] + r['stderr'])[-500:]}"]
    got = {**json.loads(line[len(MARKER):]), "process_s": r["seconds"]}
    return got, [f"{what}: import errors {got['import_errors']}"] if got["import_errors"] else []


def parse_alone_forked(env: dict, names: list[str], k: int) -> tuple[dict[str, dict], list[str]]:
    """Each file alone, DagBag(dag_folder=file) in a process forked from one interpreter that imported airflow and
    DagBag: what the child printed per file, and what is wrong."""
    r = run([sys.executable, "-c", PARSE_ALONE_FORKED, *(str(DAG_FOLDER / n) for n in names)],
            f"parse run {k + 1} of each file alone, forked", env)
    got = {}
    for line in r["stdout"].splitlines():
        if line.startswith(MARKER):
            result = json.loads(line[len(MARKER):])
            got[Path(result["path"]).name] = result
    problems = [f"parse run {k + 1} of {n} alone, forked: no result: {(r['stdout'] + r['stderr'])[-500:]}"
                for n in names if n not in got]
    problems += [f"parse run {k + 1} of {n} alone, forked: import errors {g['import_errors']}"
                 for n, g in got.items() if g["import_errors"]]
    return got, problems


def parse_runs(env: dict, runs: int, alone_forked: bool = False) -> tuple[dict, list[str]]:
    """DagBag of the DAG folder, `runs` times, each in a fresh interpreter; then each file alone, `runs` times in
    turns, each in a fresh interpreter (as the dag-processor parses a file: in a process of its own, so that every
    file pays for the imports the files share), or, `alone_forked`, each in a process forked from one interpreter
    per turn that imported airflow (the same DagBag, timed alike, without an interpreter's start per file)."""
    problems, results = [], []
    for k in range(runs):
        got, bad = parse_child(env, DAG_FOLDER, f"parse run {k + 1} of the DAG folder")
        problems += bad
        if got is not None:
            if missing := sorted(set(DAGS) - set(got["dags"])):
                problems.append(f"parse run {k + 1}: DAGs missing: {missing}")
            results.append(got)
    if not results:
        return {"runs": [], "dags": [], "import_errors": None, "files": {}}, problems
    folder = [g["folder_s"] for g in results]
    stats_total = [sum(f["duration_s"] for f in g["files"]) for g in results]
    files: dict[str, dict] = {}
    for g in results:
        for f in g["files"]:
            files.setdefault(f["file"], {"runs": [], "dag_num": f["dag_num"], "task_num": f["task_num"],
                                         "alone_runs": []})
            files[f["file"]]["runs"].append(f["duration_s"])
    for k in range(runs):
        forked, bad = parse_alone_forked(env, list(files), k) if alone_forked else ({}, [])
        problems += bad
        for name, f in files.items():
            if alone_forked:
                got = forked.get(name)
            else:
                got, bad = parse_child(env, DAG_FOLDER / name, f"parse run {k + 1} of {name} alone")
                problems += bad
            if got is not None:
                f["alone_runs"].append(got["folder_s"])
                if not set(got["dags"]) & set(DAGS):
                    problems.append(f"parse run {k + 1} of {name} alone: no walvault DAG in it")
    for f in files.values():
        f.update(best_s=min(f["runs"]), median_s=statistics.median(f["runs"]))
        if f["alone_runs"]:
            f.update(alone_best_s=min(f["alone_runs"]), alone_median_s=statistics.median(f["alone_runs"]))
    summary = {
        "alone_forked": alone_forked,
        "runs": folder, "best_s": min(folder), "median_s": statistics.median(folder), "target_s": PARSE_TARGET_S,
        "stats_total_runs": stats_total, "stats_total_best_s": min(stats_total),
        "stats_total_median_s": statistics.median(stats_total),
        "alone_total_median_s": sum(f.get("alone_median_s", 0) for f in files.values()),
        "airflow_import_runs": [g["import_s"] for g in results], "process_runs": [g["process_s"] for g in results],
        "dags": results[0]["dags"], "import_errors": results[-1]["import_errors"],
        "files": dict(sorted(files.items(), key=lambda kv: -kv[1]["median_s"])),
    }
    return summary, problems


# --------------------------------------------------------------------------- part 2: one round


class Round:
    """Both paths once, each into a fresh repository, then the check that they agree."""

    def __init__(self, data: Path, scratch: Path, home: Path, config: Path, number: int):
        self.data, self.scratch, self.home, self.config, self.number = data, scratch, home, config, number
        self.repo_cli = scratch / f"repo-cli-{number}"
        self.repo_airflow = scratch / f"repo-airflow-{number}"
        self.problems: list[str] = []
        self.results: dict[str, dict] = {}

    def env(self) -> dict:
        return environment(self.home, config=self.config, repository=str(self.repo_airflow),
                           work_dir=self.scratch / "work")

    def _step(self, name: str, cmd: list[str], env: dict | None = None) -> dict:
        r = run(cmd, name, env)
        self.results[name] = r
        if r["rc"]:
            self.problems.append(f"round {self.number}: {name}: exit code {r['rc']}")
        return r

    def cli(self) -> None:
        # untimed: no other command creates a repository
        subprocess.run([str(WALVAULT), "init", "--repo", str(self.repo_cli)], check=True, capture_output=True)
        r = self._step("walvault archive", walvault("archive", str(self.data), "--repo", str(self.repo_cli)))
        stored = (json_out(r) or {}).get("stored", [])
        self.cli_stored = sorted(Path(p).name for p in stored)
        r = self._step("walvault verify (the files archived now)",
                       walvault("verify", *stored, "--repo", str(self.repo_cli)))
        report = json_out(r) or {}
        bad = [f["path"] for f in report.get("files", []) if f.get("status") != "ok"]
        if not stored or len(report.get("files", [])) != len(stored) or bad:
            self.problems.append(f"round {self.number}: walvault verify of the {len(stored)} archived files: "
                                 f"{len(report.get('files', []))} reported, not ok: {bad[:5]}")
        self.cli_verified = len(report.get("files", []))
        r = self._step("walvault backup (full)", walvault("backup", str(self.data), "--repo", str(self.repo_cli)))
        backup_id = (json_out(r) or {}).get("id", "latest")
        r = self._step("walvault verify --repo R <backup id>",
                       walvault("verify", "--repo", str(self.repo_cli), backup_id))
        if not (json_out(r) or {}).get("intact"):
            self.problems.append(f"round {self.number}: walvault verify --repo {backup_id}: not intact")

    def airflow(self) -> None:
        env = self.env()
        airflow_bin = str(Path(sys.executable).parent / "airflow")
        r = self._step("airflow dags test walvault_archive", [airflow_bin, "dags", "test", "walvault_archive"], env)
        r["tasks"] = task_times(r)
        log = r["stdout"] + r["stderr"]
        m = re.search(r"(\d+) files verified by Spark, (\d+) damaged", log)
        self.airflow_verified = int(m.group(1)) if m else None
        if "Traceback" in log or not m or m.group(2) != "0":
            self.problems.append(f"round {self.number}: the archive DAG's log has no clean Spark verify report "
                                 f"({m.group(0) if m else 'none'}; traceback: {'Traceback' in log})")
        conf = {"source": SOURCE, "type": "full", "verify": True, "spark": "spark_default"}
        r = self._step("airflow dags test walvault_backup (full, verify)",
                       [airflow_bin, "dags", "test", "walvault_backup", "--conf", json.dumps(conf)], env)
        r["tasks"] = task_times(r)
        log = r["stdout"] + r["stderr"]
        # the record task's line names the backup; the verify task's lines follow "walvault verify --repo"
        recorded = re.search(r"walvault backup (\S+) \(full\)", log)
        at = log.find("walvault verify --repo")
        m = recorded and at >= 0 and re.compile(rf"backup {re.escape(recorded.group(1))}: (\w+)").search(log, at)
        if "Traceback" in log or not m or m.group(1) != "ok":
            self.problems.append(f"round {self.number}: the backup DAG's log has no 'backup <id>: ok' from its "
                                 f"verify task (traceback: {'Traceback' in log})")

    def check(self) -> dict:
        """Both repositories: the same archived files and one full backup, ok, with the same files."""
        sides = {}
        for side, repo_path in (("cli", self.repo_cli), ("airflow", self.repo_airflow)):
            listed = run([str(WALVAULT), "backups", "--repo", str(repo_path), "--json"], f"walvault backups ({side})")
            backups = (json_out(listed) or {}).get("backups", [])
            archived, manifest = [], []
            if repo_path.is_dir():
                repo = Repository(str(repo_path))
                for family, instance in repo.sources():
                    archived += [(e.name, e.size, e.sha256) for e in load_archived(repo, family, instance)
                                 if e is not None]
                if len(backups) == 1:
                    manifest = [(e.name, e.size, e.sha256) for e in repo.find(backups[0]["id"]).manifest.files]
            sides[side] = {"archived": sorted(archived), "backups": backups, "manifest": sorted(manifest)}
            if len(backups) != 1 or backups[0]["type"] != "full" or backups[0]["status"] != "ok":
                self.problems.append(f"round {self.number}: {side} repository: backups "
                                     f"{[(b['type'], b['status']) for b in backups]}, not one full backup, ok")
        cli, af = sides["cli"], sides["airflow"]
        if cli["archived"] != af["archived"] or not cli["archived"]:
            self.problems.append(f"round {self.number}: archived files differ: CLI {len(cli['archived'])}, "
                                 f"Airflow {len(af['archived'])}: "
                                 f"{sorted(set(cli['archived']) ^ set(af['archived']))[:5]}")
        if [a[0] for a in cli["archived"]] != self.cli_stored:
            self.problems.append(f"round {self.number}: the CLI repository's archive is not what archive reported")
        if cli["manifest"] != af["manifest"] or not cli["manifest"]:
            self.problems.append(f"round {self.number}: the full backups' files differ: "
                                 f"{sorted(set(cli['manifest']) ^ set(af['manifest']))[:5]}")
        if self.airflow_verified != len(af["archived"]):
            self.problems.append(f"round {self.number}: the archive DAG verified {self.airflow_verified} files, "
                                 f"archived {len(af['archived'])}")
        return {"round": self.number,
                "archived_files": {s: len(v["archived"]) for s, v in sides.items()},
                "verified_files": {"cli": self.cli_verified, "airflow": self.airflow_verified},
                "backup_files": {s: [{"name": n, "size": z} for n, z, _ in v["manifest"]] for s, v in sides.items()},
                "backups": {s: [{k: b.get(k) for k in ("id", "type", "status", "files", "bytes", "stored_bytes")}
                                for b in v["backups"]] for s, v in sides.items()},
                "same_archive": cli["archived"] == af["archived"],
                "same_backup_files": cli["manifest"] == af["manifest"]}

    def cleanup(self) -> None:
        shutil.rmtree(self.repo_cli, ignore_errors=True)
        shutil.rmtree(self.repo_airflow, ignore_errors=True)
        shutil.rmtree(self.scratch / "work", ignore_errors=True)


# --------------------------------------------------------------------------- report


def summarize_runs(runs: list[float], nbytes: int | None = None) -> dict:
    best, median = min(runs), statistics.median(runs)
    out = {"runs": runs, "best_s": best, "median_s": median}
    if nbytes:
        out.update(mb_s=nbytes / MB / best, median_mb_s=nbytes / MB / median)
    return out


def overhead(airflow: list[float], cli: list[float]) -> dict:
    """Airflow over the CLI: seconds more and the ratio, best over best and the median over rounds."""
    return {"airflow_best_s": min(airflow), "cli_best_s": min(cli),
            "extra_s": min(airflow) - min(cli), "ratio": min(airflow) / min(cli),
            "extra_median_s": statistics.median(a - c for a, c in zip(airflow, cli, strict=True)),
            "ratio_median": statistics.median(a / c for a, c in zip(airflow, cli, strict=True))}


def print_parse(parse: dict) -> None:
    if not parse["runs"]:
        print("DAG folder parse: no run gave a result")
        return
    print(f"DAG folder parse, DagBag({DAG_FOLDER}) in a fresh interpreter after `import airflow`, "
          f"{len(parse['runs'])} runs: best {parse['best_s']:.3f} s, median {parse['median_s']:.3f} s "
          f"(target < {PARSE_TARGET_S:.0f} s: {'met' if parse['median_s'] < PARSE_TARGET_S else 'NOT met'}); "
          f"sum of the per-file stats: best {parse['stats_total_best_s']:.3f} s; "
          f"`import airflow` first: median {statistics.median(parse['airflow_import_runs']):.2f} s; "
          f"whole process: median {statistics.median(parse['process_runs']):.2f} s")
    head = (f"{'file':<28} {'best s':>7} {'median s':>8} {'alone best s':>12} {'alone median s':>14} {'DAGs':>4} "
            f"{'tasks':>5}")
    print(head)
    print("-" * len(head))
    for name, f in parse["files"].items():
        alone = (f"{f['alone_best_s']:>12.3f} {f['alone_median_s']:>14.3f}" if "alone_best_s" in f
                 else f"{'-':>12} {'-':>14}")
        print(f"{name:<28} {f['best_s']:>7.3f} {f['median_s']:>8.3f} {alone} {f['dag_num']:>4} {f['task_num']:>5}")
    print(f"'best s', 'median s': the file's duration in the DagBag's stats of the folder's parse; 'alone': "
          f"DagBag of the file alone in {'a process forked from one' if parse['alone_forked'] else 'a fresh'} "
          f"interpreter (sum of the medians "
          f"{parse['alone_total_median_s']:.3f} s)")
    print(f"DAGs: {', '.join(parse['dags'])}; import errors: {parse['import_errors'] or 'none'}")


def print_pipeline(steps: list[dict], paths: dict, over: dict) -> None:
    head = f"{'step':<50} {'best s':>7} {'median s':>8} {'MB/s':>6} {'CPU s':>6} {'peak RSS':>9}"
    print(head)
    print("-" * len(head))
    for s in steps:
        rss = f"{s['peak_rss_kib'] / 1024:.0f} MiB" if s.get("peak_rss_kib") else "-"
        print(f"{s['step']:<50} {s['best_s']:>7.2f} {s['median_s']:>8.2f} {s['mb_s']:>6.0f} {s['cpu_s']:>6.1f} "
              f"{rss:>9}")
    print("-" * len(head))
    for name, p in paths.items():
        print(f"{'total, ' + name + ' path':<50} {p['best_s']:>7.2f} {p['median_s']:>8.2f} {p['mb_s']:>6.0f}")
    print()
    for s in steps:
        for k, tasks in enumerate(s.get("tasks_runs", []), 1):
            print(f"{s['step']}, round {k}, from its log: "
                  + (", ".join(f"{t} {v:.1f} s" for t, v in tasks.items()) or "no task lines"))
    print()
    for name, o in over.items():
        print(f"Airflow over CLI, {name}: +{o['extra_s']:.1f} s, {o['ratio']:.2f}x (best over best); "
              f"+{o['extra_median_s']:.1f} s, {o['ratio_median']:.2f}x (median of rounds)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1100, help="data to generate, in 10**6 bytes (default 1100)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both paths (default 3)")
    ap.add_argument("--parse-runs", type=int, default=5, help="fresh interpreters parsing the DAG folder (default 5)")
    ap.add_argument("--alone-forked", action="store_true",
                    help="parse each file alone in a process forked from one interpreter that imported airflow, "
                    "not in a fresh interpreter per file (the same DagBag, timed alike; for the tests: minutes "
                    "less on a loaded machine)")
    ap.add_argument("--file-mib", type=float, default=64,
                    help="xlog size in MiB (default 64, Tarantool's; smaller data gets files of 1/8 of it, so that "
                    "there are several)")
    common.add_data_args(ap, "airflow_pipeline")
    ap.set_defaults(json=common.REPO / "bench" / "out" / "airflow_pipeline.json")
    args = ap.parse_args()

    t_start = time.perf_counter()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    file_bytes = int(min(args.file_mib * (1 << 20), max(64 << 10, args.size_mb * MB // 8)))
    paths = prepare_data(root, args.size_mb, file_bytes)
    data = root / "tarantool"
    nbytes = sum(p.stat().st_size for p in paths)
    print(f"{len(paths)} files, {nbytes / MB:.1f} MB; {common.cores_and_load(load_before)}")

    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))  # same filesystem as the data
    problems: list[str] = []
    measured: dict[str, dict] = {name: {"runs": [], "cpu_runs": [], "rss_runs_kib": [], "exit_codes": []}
                                 for name in STEPS}
    agreement = []
    try:
        home, config = scratch / "airflow", scratch / "walvault.yaml"
        config.write_text(f"# bench/airflow_pipeline.py: the bench's one source\n"
                          f"repository: {{connection: walvault_repo, create: true}}\n"
                          f"sources:\n  - {{name: {SOURCE}, family: tarantool, path: {json.dumps(str(data))}}}\n"
                          f"retention: {{days: 30}}\nspark: {{connections: [spark_default]}}\n")
        env = environment(home, config=config, repository=str(scratch / "unused"), work_dir=scratch / "work")
        t0 = time.perf_counter()
        migrate(env)
        migrate_s = time.perf_counter() - t0

        parse, bad = parse_runs(env, args.parse_runs, args.alone_forked)
        problems += bad

        warm(paths)
        for k in range(1, args.rounds + 1):
            rnd = Round(data, scratch, home, config, k)
            try:
                rnd.cli()
                rnd.airflow()
                agreement.append(rnd.check())
            finally:
                rnd.cleanup()
            problems += rnd.problems
            for name, r in rnd.results.items():
                m = measured[name]
                m["runs"].append(r["seconds"])
                m["cpu_runs"].append(r["cpu"])
                m["rss_runs_kib"].append(r["rss"])
                m["exit_codes"].append(r["rc"])
                if "tasks" in r:
                    m.setdefault("tasks_runs", []).append(r["tasks"])
            print(f"round {k}: " + ", ".join(f"{name} {r['seconds']:.1f} s" for name, r in rnd.results.items()))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    steps = []
    for name, m in measured.items():
        path, dag = STEPS[name]
        rss = [x for x in m["rss_runs_kib"] if x is not None]
        steps.append({"step": name, "path": path, "dag": dag, **m, **summarize_runs(m["runs"], nbytes),
                      "cpu_s": min(m["cpu_runs"]), "peak_rss_kib": max(rss) if rss else None})

    def per_round(path: str, dag: str | None = None) -> list[float]:
        return [sum(measured[n]["runs"][i] for n, (p, d) in STEPS.items() if p == path and dag in (None, d))
                for i in range(args.rounds)]

    paths_total = {p: summarize_runs(per_round(p), nbytes) for p in ("cli", "airflow")}
    over = {"whole pipeline": overhead(per_round("airflow"), per_round("cli")),
            "archive DAG vs archive + verify of the files": overhead(per_round("airflow", "archive"),
                                                                      per_round("cli", "archive")),
            "backup DAG vs backup + verify --repo": overhead(per_round("airflow", "backup"),
                                                              per_round("cli", "backup"))}
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - t_start

    print()
    print_parse(parse)
    print()
    print_pipeline(steps, paths_total, over)
    print(f"\n{len(paths)} files, {nbytes:,} bytes; archived by both paths: "
          f"{[a['archived_files'] for a in agreement]}; backup files: "
          f"{[len(a['backup_files']['cli']) for a in agreement]}; the same in both repositories every round: "
          f"{all(a['same_archive'] and a['same_backup_files'] for a in agreement)}")
    print(f"MB = 10**6 bytes; {args.rounds} rounds; MB/s of the source's bytes; wall times including process "
          f"start; CPU s = user + system of the waited-for processes, least run; Spark on local[2]; "
          f"airflow db migrate (untimed) {migrate_s:.1f} s")
    print(common.load_line(load_before, load_after, elapsed))
    for line in problems:
        print(f"\n!!!!!! {line} !!!!!!")

    common.write_json(args.json, {
        "data_dir": str(data), "files": len(paths), "bytes": nbytes, "size_mb": args.size_mb,
        "file_bytes": file_bytes, "rounds": args.rounds, "parse_runs": args.parse_runs, "cores": os.cpu_count(),
        "load_avg_before": load_before, "load_avg_after": load_after, "python": platform.python_version(),
        "elapsed_s": elapsed, "migrate_s": migrate_s, "parse": parse, "steps": steps, "paths": paths_total,
        "overhead": over, "agreement": agreement, "problems": problems,
    })

    if not args.keep:
        clear_data(root)
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
