"""Measure the RPO of `walvault stream`: a writing Tarantool killed, its data dir deleted, `restore --to end`.

    .venv/bin/python bench/rpo.py [--rates 1000,10000] [--statements 1,5] [--trials 20] [--segment-seconds 1] [--host-dies] [--dir DIR] [--json FILE] [--keep]
    .venv/bin/python bench/rpo.py --family limestone [--epochs-per-second 100] [--trials 20] [--segment-seconds 1] [--host-dies] [--dir DIR] [--json FILE] [--keep]

For each rate (transactions per second) and transaction size (statements per transaction), `--trials` times:
a fresh instance (bench/lua/rpo_writer.lua) commits at that rate; its base backup is taken through
box.backup.start(); `walvault stream` is attached (its status file says it streams, and a second passes); at a
random moment 2 to 6 s later the instance gets SIGKILL.
What it had committed is read from its own xlogs (the newest transaction's commit time: the instance
acknowledges a commit once its WAL holds it); its data dir is then deleted; the streamer, after another
segment interval, gets SIGTERM (with --host-dies it is killed with the instance and its spool deleted: one
host lost); `walvault restore latest --to end` rebuilds it. RPO = the commit time of the
newest transaction the instance acknowledged minus that of the newest one restored (0: nothing lost).

Per rate it also gives the streamer's CPU (user + system over the trial, as a share of one core) and peak RSS,
and the instance's write throughput with the streamer attached against without (the writer at full speed,
3 s each way, alternated). Targets (issue 25): RPO p99 <= 2 s at 1,000 tx/s and <= 5 s at 10,000 tx/s; the
throughput ratio >= 0.95; the streamer's CPU <= 10% of a core at 1,000 tx/s. This is a benchmark: it never
fails on figures. It exits 1 when a command fails.

`--family limestone`: a copy of the limestone fixture 01-clean, backed up; bench/limestone_writer.py commits
`--epochs-per-second` epochs (sessions on two channels, each epoch made durable in `epoch`, its time printed);
`walvault stream DIR` follows it; at a random moment 2 to 6 s later the writer gets SIGKILL (with --host-dies the
streamer too, in the same instant: the host lost; else the streamer gets another interval, then SIGTERM);
`restore latest --to end`. RPO = the time the writer saw its newest epoch durable minus that of the newest epoch
restored. Target: RPO <= S + 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from walcore.tarantool.check import file_verdict  # noqa: E402
from walcore.tarantool.times import row_times  # noqa: E402
from walcore.tarantool.xlog import scan_file  # noqa: E402

WALVAULT = [str(REPO / ".venv" / "bin" / "walvault")]
TARANTOOL = shutil.which("tarantool") or "tarantool"
WRITER = REPO / "bench" / "lua" / "rpo_writer.lua"
LIMESTONE_WRITER = REPO / "bench" / "limestone_writer.py"
LIMESTONE_FIXTURE = REPO.parent / "shared" / "fixtures" / "limestone" / "01-clean"
PASSWORD = "rpo-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def eval_lua(port: int, code: str):
    import tarantool

    conn = tarantool.Connection("127.0.0.1", port, user="bk", password=PASSWORD, fetch_schema=False,
                                connection_timeout=5, socket_timeout=30)
    try:
        return conn.eval(code).data
    finally:
        conn.close()


def start_instance(root: Path, rate: int, statements: int) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([TARANTOOL, str(WRITER), str(root / "instance"), str(port), PASSWORD, str(rate),
                             str(statements)], cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=open(root / "tarantool.log", "ab"))
    deadline = time.monotonic() + 30
    while True:
        try:
            if eval_lua(port, "return committed")[0] > 10:
                return proc, port
        except Exception:  # noqa: BLE001 - not listening yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"rpo: the instance did not start: {(root / 'tarantool.log').read_text()[-2000:]}")
        time.sleep(0.05)


def run(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
    proc = subprocess.run([*WALVAULT, *args], env=env, capture_output=True, text=True, timeout=600, **kwargs)
    if proc.returncode != 0:
        raise SystemExit(f"rpo: walvault {' '.join(args[:1])} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc


def newest_commit(wal_dir: Path) -> float:
    """The commit time of the newest transaction the instance's own xlogs hold."""
    newest = None
    for path in sorted(wal_dir.glob("*.xlog")):
        verdict = file_verdict(scan_file(path))
        if verdict.edge_blocks:
            times = row_times(path, edges=verdict.edge_blocks)
            if times:
                newest = times[1]
    if newest is None:
        raise SystemExit(f"rpo: no row in {wal_dir}")
    return newest


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def trial(root: Path, rate: int, statements: int, segment_seconds: float, rng: random.Random,
          host_dies: bool) -> dict:
    instance, port = start_instance(root, rate, statements)
    repo = root / "repo"
    try:
        run(["init", "--repo", str(repo)])
        run(["backup", str(root / "instance"), "--connect", f"bk@127.0.0.1:{port}", "--repo", str(repo)])
        env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
        streamer = subprocess.Popen([*WALVAULT, "stream", "--connect", f"repl@127.0.0.1:{port}", "--repo", str(repo),
                                     "--spool", str(root / "spool"), "--segment-seconds", str(segment_seconds),
                                     "--status", str(root / "stream.json")],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        attached(streamer, root / "stream.json", lambda status: status.get("connected"))
        cpu0, t0 = cpu_seconds(streamer.pid), time.monotonic()
        time.sleep(rng.uniform(2.0, 6.0))
        cpu = (cpu_seconds(streamer.pid) - cpu0) / (time.monotonic() - t0)
        rss = peak_rss_mb(streamer.pid)
        if host_dies:  # the streamer dies with the instance, its spool with it: what the repository holds counts
            streamer.send_signal(signal.SIGKILL)
        instance.send_signal(signal.SIGKILL)
        instance.wait()
        acknowledged = newest_commit(root / "instance")
        shutil.rmtree(root / "instance")
        stop_streamer(streamer, segment_seconds, host_dies)
        if host_dies:
            shutil.rmtree(root / "spool", ignore_errors=True)
        restored = json.loads(run(["restore", "latest", str(root / "restored"), "--repo", str(repo), "--to", "end",
                                   "--json"]).stdout)
        last = restored["point"]["last_time"]
        return {"rpo_s": max(0.0, acknowledged - last), "cpu_share": cpu, "rss_mb": rss}
    finally:
        if instance.poll() is None:
            instance.kill()
            instance.wait()


def attached(streamer: subprocess.Popen, status_file: Path, ready, timeout: float = 60.0) -> None:
    """Until the streamer's status file says it streams (`ready`), then one second more to catch up: the kill's
    random moment counts from there, not from a start-up that a loaded machine or a first stream's reading of the
    repository may make longer than the moment."""
    deadline = time.monotonic() + timeout
    while True:
        if streamer.poll() is not None:
            raise SystemExit(f"rpo: walvault stream exited {streamer.returncode}: {streamer.communicate()[1][-2000:]}")
        try:
            if ready(json.loads(status_file.read_text())):
                break
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"rpo: walvault stream did not start streaming in {timeout:g} s")
        time.sleep(0.05)
    time.sleep(1.0)


def stop_streamer(streamer: subprocess.Popen, segment_seconds: float, killed: bool) -> None:
    """Reap a streamer killed with its source, or give it another interval to store what is left, then SIGTERM."""
    if killed:
        streamer.wait()
        return
    time.sleep(segment_seconds + 0.5)
    streamer.send_signal(signal.SIGTERM)
    _out, err = streamer.communicate(timeout=120)
    if streamer.returncode != 0:
        raise SystemExit(f"rpo: walvault stream exited {streamer.returncode}: {err[-2000:]}")


def limestone_trial(root: Path, epochs_per_second: float, segment_seconds: float, rng: random.Random,
                    host_dies: bool) -> dict:
    source, repo, said = root / "source", root / "repo", root / "writer.out"
    shutil.copytree(LIMESTONE_FIXTURE, source)
    for path in [source, *source.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the shared fixtures are read-only
    run(["init", "--repo", str(repo)])
    run(["backup", str(source), "--repo", str(repo)])
    with open(said, "w") as out:
        writer = subprocess.Popen([sys.executable, str(LIMESTONE_WRITER), str(source), "--epochs-per-second",
                                   str(epochs_per_second)], stdout=out)
    streamer = subprocess.Popen([*WALVAULT, "stream", str(source), "--repo", str(repo), "--segment-seconds",
                                 str(segment_seconds), "--status", str(root / "stream.json")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        attached(streamer, root / "stream.json", lambda status: status.get("pieces"))
        cpu0, t0 = cpu_seconds(streamer.pid), time.monotonic()
        time.sleep(rng.uniform(2.0, 6.0))
        cpu = (cpu_seconds(streamer.pid) - cpu0) / (time.monotonic() - t0)
        rss = peak_rss_mb(streamer.pid)
        if host_dies:
            streamer.send_signal(signal.SIGKILL)
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        stop_streamer(streamer, segment_seconds, host_dies)
    finally:
        for proc in (writer, streamer):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    durable = {}  # epoch -> when the writer saw it durable (whole lines only: it may die in one)
    for line in said.read_text().splitlines(keepends=True):
        if line.endswith("\n"):
            epoch, when = line.split()
            durable[int(epoch)] = float(when)
    restored = json.loads(run(["restore", "latest", str(root / "restored"), "--repo", str(repo), "--to", "end",
                               "--json"]).stdout)
    epoch = restored["point"]["durable_epoch"]
    newest = max(durable)
    # an epoch of the fixture (before the writer) restored: everything the writer made durable is lost
    lost = durable[newest] - durable[epoch] if epoch in durable else durable[newest] - min(durable.values())
    return {"rpo_s": max(0.0, lost), "cpu_share": cpu, "rss_mb": rss, "epochs_lost": newest - epoch}


def throughput(root: Path, statements: int, attached: bool, seconds: float = 3.0) -> float:
    """Transactions per second of the writer at full speed, with or without a streamer attached."""
    instance, port = start_instance(root, 0, statements)
    streamer = None
    try:
        if attached:
            run(["init", "--repo", str(root / "repo")])
            env = {**os.environ, "WALVAULT_PASSWORD": PASSWORD}
            streamer = subprocess.Popen([*WALVAULT, "stream", "--connect", f"repl@127.0.0.1:{port}", "--repo",
                                         str(root / "repo"), "--spool", str(root / "spool")], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        before = eval_lua(port, "return committed")[0]
        time.sleep(seconds)
        return (eval_lua(port, "return committed")[0] - before) / seconds
    finally:
        if streamer is not None:
            streamer.send_signal(signal.SIGTERM)
            streamer.wait(timeout=60)
        instance.kill()
        instance.wait()


def limestone_rpo(args, base: Path, rng: random.Random) -> dict:
    trials = []
    for n in range(args.trials):
        root = base / f"limestone-{n}"
        root.mkdir(parents=True, exist_ok=True)
        trials.append(limestone_trial(root, args.epochs_per_second, args.segment_seconds, rng, args.host_dies))
        if not args.keep:
            shutil.rmtree(root)
    rpos = [t["rpo_s"] for t in trials]
    row = {"family": "limestone", "epochs_per_second": args.epochs_per_second, "trials": len(trials),
           "rpo_p50_s": statistics.median(rpos), "rpo_p99_s": p99(rpos), "rpo_max_s": max(rpos),
           "epochs_lost_max": max(t["epochs_lost"] for t in trials),
           "streamer_cpu_share": statistics.median(t["cpu_share"] for t in trials),
           "streamer_peak_rss_mb": max(t["rss_mb"] for t in trials)}
    print(f"limestone {args.epochs_per_second:g} epochs/s: RPO p50 {row['rpo_p50_s']:.3f} s, p99 "
          f"{row['rpo_p99_s']:.3f} s, max {row['rpo_max_s']:.3f} s (target <= {args.segment_seconds + 1:g} s); "
          f"streamer CPU {row['streamer_cpu_share']:.1%} of a core, peak RSS {row['streamer_peak_rss_mb']:.0f} MB",
          flush=True)
    return row


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="1000,10000", help="transactions per second, comma-separated")
    ap.add_argument("--statements", default="1,5", help="statements per transaction, comma-separated")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--segment-seconds", type=float, default=1.0)
    ap.add_argument("--host-dies", action="store_true", help="kill the streamer with the instance and delete its "
                    "spool (one host lost): the RPO is then what the repository held")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--json", type=Path, default=REPO / "bench" / "out" / "rpo.json")
    ap.add_argument("--keep", action="store_true", help="keep the last trial's files")
    ap.add_argument("--family", choices=("tarantool", "limestone"), default="tarantool")
    ap.add_argument("--epochs-per-second", type=float, default=100.0, help="limestone: the writer's rate")
    args = ap.parse_args()
    rng = random.Random(20261127)
    base = Path(args.dir or tempfile.mkdtemp(prefix="walvault-rpo-"))
    results = []
    if args.family == "limestone":
        results.append(limestone_rpo(args, base, rng))
    for statements in [int(s) for s in args.statements.split(",")] if args.family == "tarantool" else []:
        for rate in [int(r) for r in args.rates.split(",")]:
            trials = []
            for n in range(args.trials):
                root = base / f"r{rate}-s{statements}-{n}"
                root.mkdir(parents=True, exist_ok=True)
                trials.append(trial(root, rate, statements, args.segment_seconds, rng, args.host_dies))
                if not args.keep:
                    shutil.rmtree(root)
            rpos = [t["rpo_s"] for t in trials]
            row = {"rate": rate, "statements": statements, "trials": len(trials), "rpo_p50_s": statistics.median(rpos),
                   "rpo_p99_s": p99(rpos), "rpo_max_s": max(rpos),
                   "streamer_cpu_share": statistics.median(t["cpu_share"] for t in trials),
                   "streamer_peak_rss_mb": max(t["rss_mb"] for t in trials)}
            results.append(row)
            print(f"{rate:>6} tx/s x{statements}: RPO p50 {row['rpo_p50_s']:.3f} s, p99 {row['rpo_p99_s']:.3f} s, "
                  f"max {row['rpo_max_s']:.3f} s; streamer CPU {row['streamer_cpu_share']:.1%} of a core, peak RSS "
                  f"{row['streamer_peak_rss_mb']:.0f} MB", flush=True)
        pairs = []
        for n in range(2):  # alternated: without, with, without, with
            for attached in (False, True):
                root = base / f"throughput-s{statements}-{n}-{int(attached)}"
                root.mkdir(parents=True, exist_ok=True)
                pairs.append((attached, throughput(root, statements, attached)))
                shutil.rmtree(root)
        without = statistics.median(t for a, t in pairs if not a)
        attached = statistics.median(t for a, t in pairs if a)
        results.append({"statements": statements, "throughput_without_tps": without, "throughput_with_tps": attached,
                        "ratio": attached / without})
        print(f"full speed x{statements}: {without:,.0f} tx/s without the streamer, {attached:,.0f} with "
              f"({attached / without:.2f})", flush=True)
    if not args.keep and args.dir is None:
        shutil.rmtree(base, ignore_errors=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"family": args.family, "segment_seconds": args.segment_seconds,
                                     "host_dies": args.host_dies, "results": results}, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
