"""Benchmark `walvault backup` against `zstd -3 -T0` compressing the same files; incremental and restore.

    .venv/bin/python bench/backup.py [--size-mb 1100] [--rounds 3] [--wait-idle 120] [--dir DIR] [--json FILE] [--keep]

Generates (or reuses) >= size-mb MB (10**6 bytes) of real-format Tarantool files with
walcore.tarantool.writer.generate_wal (a snapshot and a chain of xlogs, the newest one open; plain and
zstd blocks), warms the page cache, then, every round, in this order:

  a. `zstd -3 -T0` compressing every file into a directory on the same filesystem as the repositories
     (what it reads and writes is what a backup reads and stores); then `sync` of its output, timed
     apart: zstd does not fsync, walvault does; then `zstd -d -T0` of that output (a restore's floor)
  b. `walvault archive` of the data dir into a fresh repository (it verifies every sealed file, stores
     it and records each verdict in the ledger by SHA-256), then `walvault backup` (full) into that same
     repository: the sealed files' verdicts come from the ledger, only the newest (open) xlog is scanned
  c. `walvault backup` (full) into a fresh repository: every file is verified; then the same into a fresh
     encrypted repository (docs/encryption.md): the cost of encryption, side by side (target <= 1.10x)
  d. `walvault backup --type incremental` with nothing new into repository (b): a backup's fixed cost (start-up,
     imports, lease, parent chain, manifest; target <= 0.1 s); then ~1% new data (--grow-percent): the newest
     xlog grows and is sealed, a new open xlog follows it
     (as Tarantool rotates its log); `walvault backup --type incremental` into repository (b)
  e. `walvault restore latest` from repository (b) (the incremental over the full) into an empty
     directory; every restored file's SHA-256 is compared with the source's

With `restic` installed (Debian's 0.14: encrypted, deduplicating, zstd), restic runs beside walvault on the same
files: a backup into a fresh repository after (c), a second backup after the growth of (d), and a restore of
that latest snapshot before (e), compared with the source file by file.

Every step is a subprocess timed by wall time (process start included), its peak RSS from
/usr/bin/time, its CPU time (user + system) from getrusage; `sync` runs (untimed) before each, so that no
step pays for another's writeback; with --wait-idle each step first waits for the machine to be idle
(other people's work on a shared VM otherwise lands on some steps and not others). After
the round the data dir is put back as generated (the grown xlog truncated, the new one removed).
Throughput is MB/s of source bytes: the data dir's bytes for zstd, archive and the full backups; the
bytes restored for restore; for the incremental, its time relative to the full backup's (target <= 5%).
The table gives each step's best and median run, its speed relative to zstd -3 -T0 (best over best, and
the median over rounds of the ratio within a round). Results also go to --json (default
bench/out/backup.json). This is a benchmark: it never fails on timings. It exits 1 when a walvault
command fails, or a restore does not equal the source byte for byte.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgpack

from walcore.repository import Repository
from walcore.tarantool.block import EOF_MAGIC
from walcore.tarantool.row import SPACE_ID
from walcore.tarantool.writer import REPLACE, TarantoolWriter, dml_header, file_name, generate_wal
from walcore.tarantool.xlog import scan_file

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/common.py
import common  # noqa: E402
from common import MB, WALVAULT  # noqa: E402

SEED = 1
INSTANCE = "00000000-0000-4000-8000-0000000000aa"  # generate_wal's default
SPACE = 512
ZSTD = shutil.which("zstd")

RESTIC = shutil.which("restic")
RESTIC_PASSWORD = "walvault bench restic password"

STEPS = {
    "zstd": "zstd -3 -T0",
    "unzstd": "zstd -d -T0 of zstd's output",
    "archive": "walvault archive (verify + store)",
    "ledger": "walvault backup, ledger on record",
    "full": "walvault backup, verification included",
    "encrypted": "walvault backup, encrypted repository",
    "restic_backup": "restic backup",
    "unchanged": "walvault backup --type incremental, nothing new",
    "incremental": "walvault backup --type incremental",
    "restic_incremental": "restic backup, after the growth",
    "restic_restore": "restic restore latest",
    "restore": "walvault restore (incremental + full)",
}
RESTIC_STEPS = ("restic_backup", "restic_incremental", "restic_restore")


# --------------------------------------------------------------------------- data


def prepare_data(root: Path, size_mb: int, file_mib: int) -> tuple[list[Path], dict]:
    """Files under root/tarantool (a .snap, then xlogs, the newest open), reused when the stamp matches.

    Returns the files and the stamp's "newest" record: the open xlog's name, size, first vclock and last
    LSN, which the growth of step (d) continues from and the revert after it goes back to.
    """
    data = root / "tarantool"
    want = {"size_mb": size_mb, "seed": SEED, "file_bytes": file_mib << 20}
    revert_growth(root, data)
    if stamp := common.reusable_stamp(root, data, want):
        return [data / name for name in stamp["files"]], stamp["newest"]
    clear_data(root)
    t0 = time.perf_counter()
    files = generate_wal(data, target_bytes=size_mb * MB, seed=SEED, file_bytes=file_mib << 20,
                         instance=INSTANCE)
    newest = files[-1]
    scan = scan_file(newest)
    if scan.findings or scan.meta is None or len(files) < 2:
        raise SystemExit(f"!! the generated data is not what this bench needs: {len(files)} files, "
                         f"{newest.name}: {scan.findings[:1]}")
    record = {"name": newest.name, "size": newest.stat().st_size, "first_lsn": scan.meta.vclock[1],
              "last_lsn": scan.span.lsns[1][1]}
    print(f"generated {len(files)} files in {data} in {time.perf_counter() - t0:.1f} s")
    common.write_stamp(root, want, files, newest=record)
    return files, record


def clear_data(root: Path) -> None:
    """Remove only what prepare_data and grow write."""
    common.clear_data(root, root / "tarantool",
                      lambda p: p.suffix in (".snap", ".xlog", ".inprogress", ".walvault-tmp"))


def revert_growth(root: Path, data: Path) -> None:
    """Put the data dir back as the stamp lists it: xlogs it does not list removed, the newest truncated."""
    stamp_path = root / common.STAMP
    if not stamp_path.exists() or not data.is_dir():
        return
    stamp = json.loads(stamp_path.read_text())
    newest = stamp.get("newest")
    if not newest:
        return
    for p in data.iterdir():
        if p.name not in stamp["files"] and p.suffix in (".xlog", ".walvault-tmp"):
            p.unlink()
    path = data / newest["name"]
    if path.is_file() and path.stat().st_size > newest["size"]:
        os.truncate(path, newest["size"])


class _Appender(TarantoolWriter):
    """Blocks appended to an existing xlog (Tarantool still writing to it), then its EOF marker (it rotates)."""

    def __init__(self, path: Path):  # not the parent's: that one writes a new file under a temporary name
        self.path = Path(path)
        self.f = open(self.path, "ab")
        self.packer = msgpack.Packer()

    def close(self, *, eof: bool = True) -> Path:
        if eof:
            self.f.write(EOF_MAGIC)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        return self.path


def grow(data: Path, newest: dict, nbytes: int) -> list[Path]:
    """About nbytes of new rows: a quarter appended to the open xlog, which is then sealed, the rest in a new
    open xlog after it (rows like generate_wal's: REPLACEs of [id, str, int, str], batches of 1-40
    transactions per block, some multi-statement). Returns the two files."""
    rng = random.Random(SEED + 1)
    words = [rng.randbytes(200).hex() for _ in range(64)]
    lsn = newest["last_lsn"]

    def block() -> list:
        nonlocal lsn
        rows = []
        for _ in range(rng.choice((1, 1, 2, 5, 20, 40))):
            statements = rng.choice((1, 1, 1, 3))
            lsn0 = lsn + 1
            for s in range(statements):
                lsn += 1
                key = rng.randrange(1 << 20)
                header = dml_header(REPLACE, lsn, 1, tsn=lsn0 if statements > 1 else None,
                                    commit=s == statements - 1)
                rows.append((header, {SPACE_ID: SPACE, 0x21: [key, words[key % 64][:rng.randint(8, 400)],
                                                              rng.getrandbits(40), words[(key * 7) % 64][:24]]}))
        return rows

    def fill(writer: TarantoolWriter, size: int) -> None:
        start = writer.f.tell()
        while writer.f.tell() - start < size:
            writer.write_block(block())

    old = data / newest["name"]
    with _Appender(old) as appender:
        fill(appender, nbytes // 4)
    start = {1: lsn}
    writer = TarantoolWriter(data / file_name(start, "xlog"), "XLOG", instance=INSTANCE, vclock=start,
                             prev_vclock={1: newest["first_lsn"]})
    fill(writer, nbytes - nbytes // 4)
    return [old, writer.close(eof=False)]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(common.CHUNK)
        while n := f.readinto(buf):
            h.update(memoryview(buf)[:n])
    return h.hexdigest()


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- one timed subprocess


BENCH_KEY = "walvault bench passphrase"


def init(repo: Path, *extra: str) -> Path:
    """`walvault init --repo REPO` (untimed: no other command creates a repository)."""
    subprocess.run([str(WALVAULT), "init", "--repo", str(repo), *extra], check=True, capture_output=True)
    return repo


def run(cmd: list[str], what: str) -> dict:
    """cmd as a subprocess after an (untimed) sync: wall time, exit code, peak RSS, stdout parsed as JSON."""
    os.sync()
    with tempfile.TemporaryDirectory(prefix="walvault-bench-") as tmp:
        rss_file = Path(tmp) / "rss"
        full = [str(common.GNU_TIME), "-f", "%M %U %S", "-o", str(rss_file), *cmd] if common.GNU_TIME.exists() \
            else cmd
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        seconds = time.perf_counter() - t0
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        # the last line: a command killed by a signal makes time(1) print a line before it
        rss = int(rss_file.read_text().split("\n")[-2].split()[0]) if common.GNU_TIME.exists() else None
    cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)  # the command's user + system CPU
    try:
        out = json.loads(proc.stdout) if proc.stdout.strip() else None
    except ValueError:
        out = None
    if proc.returncode:
        print(f"!! {what}: exit code {proc.returncode}: {proc.stderr.decode(errors='replace')[-2000:]}")
    return {"seconds": seconds, "cpu": cpu, "rc": proc.returncode, "rss": rss, "out": out}


def _cpu_busy(interval: float = 1.0) -> float:
    """The fraction of the machine's CPU time that was not idle over the next `interval` seconds (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields), fields[3] + fields[4]  # idle + iowait
    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    return 1 - (idle1 - idle0) / max(total1 - total0, 1)


def wait_idle(limit: float) -> float | None:
    """Wait (at most `limit` seconds) until the machine is at least 90% idle for a second: other people's work
    on a shared machine then weighs less on the step that follows. Returns how busy it was last (None: not asked)."""
    if limit <= 0 or not Path("/proc/stat").exists():
        return None
    deadline = time.monotonic() + limit
    while (busy := _cpu_busy()) > 0.10 and time.monotonic() < deadline:
        pass
    return busy


def walvault(*args: str) -> list[str]:
    return [str(WALVAULT), *args, "--json", "--no-progress"]


def step_result(r: dict, nbytes: int, **extra) -> dict:
    return {"runs": [r["seconds"]], "cpu_runs": [r["cpu"]], "bytes": nbytes, "exit_codes": [r["rc"]],
            "peak_rss_kib": r["rss"],
            "rss_runs_kib": [r["rss"]], **extra}


def manifest_counts(repo: Path, key: str | None = None) -> dict:
    """Of the latest backup in repo: files stored by it, referenced from its parent, and how each was checked."""
    files = Repository(str(repo), key=key).find("latest").manifest.files
    checked: dict[str, int] = {}
    for e in files:
        how = e.verification.get("checked_by", "?")
        checked[how] = checked.get(how, 0) + 1
    return {"own_files": sum(1 for e in files if e.reference is None),
            "referenced_files": sum(1 for e in files if e.reference is not None), "checked_by": checked}


# --------------------------------------------------------------------------- one round


class Round:
    """The steps of one round, in order; each returns one run's result (see common.interleave)."""

    def __init__(self, data: Path, paths: list[Path], newest: dict, scratch: Path, grow_bytes: int):
        self.data, self.paths, self.newest, self.scratch = data, paths, newest, scratch
        self.grow_bytes = grow_bytes
        self.nbytes = sum(p.stat().st_size for p in paths)
        self.bad: list[str] = []

    def steps(self, idle_wait: float) -> dict:
        def step(fn):
            def run_step() -> dict:
                busy = wait_idle(idle_wait)
                return {**fn(), "busy_before": [busy]}
            return run_step
        return {STEPS[k]: step(getattr(self, k)) for k in STEPS if RESTIC or k not in RESTIC_STEPS}

    def _check(self, name: str, r: dict) -> None:
        if r["rc"]:
            self.bad.append(f"{name}: exit code {r['rc']}")

    def zstd(self) -> dict:
        out = self.scratch / "zstd"
        out.mkdir()
        r = run([ZSTD, "-3", "-T0", "-q", "-f", "--output-dir-flat", str(out), *map(str, self.paths)], "zstd")
        written = tree_bytes(out)
        t0 = time.perf_counter()
        subprocess.run(["sync", *map(str, out.iterdir())], check=True)  # fsync every output file
        synced = r["seconds"] + time.perf_counter() - t0
        self._check("zstd", r)
        return step_result(r, self.nbytes, files=len(self.paths), stored_bytes=written, synced_runs=[synced])

    def unzstd(self) -> dict:
        """zstd's output decompressed (the floor of a restore: the same bytes, no hashes, no fsync)."""
        packed, out = self.scratch / "zstd", self.scratch / "unzstd"
        out.mkdir()
        try:
            r = run([ZSTD, "-d", "-T0", "-q", "-f", "--output-dir-flat", str(out), *map(str, packed.iterdir())],
                    "zstd -d")
            t0 = time.perf_counter()
            subprocess.run(["sync", *map(str, out.iterdir())], check=True)  # as durable as a restore's files
            synced = r["seconds"] + time.perf_counter() - t0
            self._check("zstd -d", r)
            return step_result(r, tree_bytes(out), files=len(self.paths), synced_runs=[synced])
        finally:
            shutil.rmtree(packed)
            shutil.rmtree(out)

    def _restic(self, *args: str) -> list[str]:
        return [RESTIC, "--repo", str(self.scratch / "repo-restic"), "--password-file", str(self.restic_key),
                "--quiet", "--no-cache", *args]

    def restic_backup(self) -> dict:
        """restic 0.14 (Debian's) into a fresh repository of format 2: encrypted, deduplicating, zstd (auto)."""
        self.restic_key = self.scratch / "restic.key"
        self.restic_key.write_text(RESTIC_PASSWORD + "\n")
        subprocess.run(self._restic("init", "--repository-version", "2"), check=True, capture_output=True)
        r = run(self._restic("backup", str(self.data)), "restic backup")
        self._check("restic backup", r)
        return step_result(r, self.nbytes, stored_bytes=tree_bytes(self.scratch / "repo-restic"))

    def restic_incremental(self) -> dict:
        before = tree_bytes(self.scratch / "repo-restic")
        r = run(self._restic("backup", str(self.data)), "restic backup (incremental)")
        self._check("restic incremental", r)
        return step_result(r, self.nbytes_grown, stored_bytes=tree_bytes(self.scratch / "repo-restic") - before)

    def restic_restore(self) -> dict:
        """The latest snapshot (the grown data dir) restored and compared with the source, file by file."""
        target = self.scratch / "restored-restic"
        try:
            r = run(self._restic("restore", "latest", "--target", str(target)), "restic restore")
            self._check("restic restore", r)
            restored = target / self.data.relative_to(self.data.anchor)  # restic restores the absolute path
            differ = [p.name for p in self.data.iterdir()
                      if not (restored / p.name).is_file() or sha256_file(restored / p.name) != sha256_file(p)]
            if differ:
                self.bad.append(f"restic restore: {len(differ)} files differ from the source: {differ[:5]}")
            return step_result(r, tree_bytes(target), files=len(list(restored.iterdir())))
        finally:
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(self.scratch / "repo-restic", ignore_errors=True)

    def archive(self) -> dict:
        self.repo_a = init(self.scratch / "repo-ledger")
        r = run(walvault("archive", str(self.data), "--repo", str(self.repo_a)), "walvault archive")
        self._check("archive", r)
        archived = r["out"]["stored"] if r["out"] else []
        return step_result(r, self.nbytes, files=len(archived), stored_bytes=tree_bytes(self.repo_a),
                           not_sealed=tuple(Path(p).name for p in (r["out"] or {}).get("not_sealed", [])))

    def _backup(self, name: str, repo: Path, *extra: str, key: str | None = None) -> dict:
        r = run(walvault("backup", str(self.data), "--repo", str(repo), *extra), f"walvault backup {name}")
        self._check(name, r)
        out = r["out"] or {}
        counts = manifest_counts(repo, key) if not r["rc"] else {}
        return step_result(r, self.nbytes, files=out.get("files"), stored_bytes=out.get("stored_bytes"), **counts)

    def ledger(self) -> dict:
        return self._backup("full, ledger on record", self.repo_a)

    def full(self) -> dict:
        self.repo_b = init(self.scratch / "repo-fresh")
        result = self._backup("full, verification included", self.repo_b)
        shutil.rmtree(self.repo_b)
        return result

    def encrypted(self) -> dict:
        key_file = self.scratch / "bench.key"  # the encrypted repository's key; a plain one takes none
        key_file.write_text(BENCH_KEY + "\n")
        repo = init(self.scratch / "repo-encrypted", "--encrypt", "--key-file", str(key_file))
        result = self._backup("full, encrypted repository", repo, "--key-file", str(key_file), key=BENCH_KEY)
        shutil.rmtree(repo)
        return result

    def unchanged(self) -> dict:
        """A backup's fixed cost (start-up, imports, lease, parent chain, manifest): an incremental with nothing new
        since its parent (target <= 0.1 s). The next step's incremental builds on it."""
        return {**self._backup("incremental, nothing new", self.repo_a, "--type", "incremental"), "bytes": self.nbytes}

    def incremental(self) -> dict:
        self.grown = grow(self.data, self.newest, self.grow_bytes)
        self.nbytes_grown = sum(p.stat().st_size for p in self.data.iterdir())
        return {**self._backup("incremental", self.repo_a, "--type", "incremental"), "bytes": self.nbytes_grown}

    def restore(self) -> dict:
        target = self.scratch / "restored"
        try:
            r = run(walvault("restore", "latest", str(target), "--repo", str(self.repo_a)), "walvault restore")
            self._check("restore", r)
            source = {p.name: p for p in self.data.iterdir()}
            restored = {p.name: p for p in target.iterdir()} if target.is_dir() else {}
            differ = sorted(set(source) ^ set(restored))
            differ += sorted(n for n in source.keys() & restored.keys()
                             if sha256_file(source[n]) != sha256_file(restored[n]))
            if differ:
                self.bad.append(f"restore: {len(differ)} files differ from the source: {differ[:5]}")
            return step_result(r, tree_bytes(target) if target.is_dir() else 0, files=len(restored),
                               equal=[not differ and not r["rc"]])
        finally:
            shutil.rmtree(target, ignore_errors=True)
            shutil.rmtree(self.repo_a, ignore_errors=True)
            revert_growth(self.data.parent, self.data)


# --------------------------------------------------------------------------- report


def summarize(name: str, r: dict, ref: dict) -> dict:
    best, median = min(r["runs"]), statistics.median(r["runs"])
    return {"step": name, **r, "best_s": best, "median_s": median, "mb_s": r["bytes"] / MB / best,
            "median_mb_s": r["bytes"] / MB / median,
            "x_zstd": min(ref["runs"]) / best, "median_x_zstd": common.median_ratio(ref["runs"], r["runs"]),
            "cpu_s": min(r["cpu_runs"])}


def print_table(results: list[dict]) -> None:
    head = (f"{'step':<42} {'best s':>7} {'median s':>8} {'MB/s':>6} {'x zstd':>6} {'median x zstd':>13} "
            f"{'CPU s':>6} {'stored MB':>9} {'peak RSS':>9}")
    print(head)
    print("-" * len(head))
    for r in results:
        stored = f"{r['stored_bytes'] / MB:,.0f}" if r.get("stored_bytes") is not None else "-"
        rss = f"{r['peak_rss_kib'] / 1024:.0f} MiB" if r.get("peak_rss_kib") else "-"
        print(f"{r['step']:<42} {r['best_s']:>7.2f} {r['median_s']:>8.2f} {r['mb_s']:>6.0f} {r['x_zstd']:>6.2f} "
              f"{r['median_x_zstd']:>13.2f} {r['cpu_s']:>6.2f} {stored:>9} {rss:>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mb", type=int, default=1100, help="data to generate, in 10**6 bytes (default 1100)")
    ap.add_argument("--file-mib", type=int, default=64, help="xlog size, in MiB (default 64, as Tarantool's)")
    ap.add_argument("--grow-percent", type=float, default=1.0,
                    help="new data before the incremental backup, in %% of the data dir (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every step, taken in turns (default 3)")
    ap.add_argument("--wait-idle", type=float, default=0, metavar="SECONDS",
                    help="before each step, wait up to this long for the machine to be >= 90%% idle (a shared "
                    "machine; default 0: do not wait)")
    common.add_data_args(ap, "backup")
    ap.set_defaults(json=common.REPO / "bench" / "out" / "backup.json")
    args = ap.parse_args()
    if ZSTD is None:
        print("!! the zstd command is not installed (apt-get install zstd)")
        return 2
    common.byte_compile()
    t_start = time.perf_counter()
    root = args.dir.resolve()
    root.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    paths, newest = prepare_data(root, args.size_mb, args.file_mib)
    data = root / "tarantool"
    nbytes = sum(p.stat().st_size for p in paths)
    grow_bytes = int(nbytes * args.grow_percent / 100)
    print(f"{len(paths)} files, {nbytes / MB:.1f} MB (+{grow_bytes / MB:.1f} MB before the incremental); "
          f"{common.cores_and_load(load_before)}")
    for p in paths:  # warm the page cache: every step reads the source from memory
        sha256_file(p)

    scratch = Path(tempfile.mkdtemp(prefix="scratch-", dir=root))  # same filesystem as the data
    try:
        rnd = Round(data, paths, newest, scratch, grow_bytes)
        measured = common.interleave(rnd.steps(args.wait_idle), args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        revert_growth(root, data)

    zstd = measured[STEPS["zstd"]]
    results = [summarize(name, r, zstd) for name, r in measured.items()]
    synced = summarize("zstd -3 -T0, then sync of its output", {**zstd, "runs": zstd["synced_runs"]}, zstd)
    results.insert(1, synced)
    unzstd_runs = measured[STEPS["unzstd"]]
    results.insert(3, summarize("zstd -d -T0, then sync of its output", {**unzstd_runs,
                                "runs": unzstd_runs["synced_runs"]}, zstd))
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - t_start

    by = {r["step"]: r for r in results}
    zstd_r, ledger, full, enc, inc, unchanged = (by[STEPS[k]] for k in ("zstd", "ledger", "full", "encrypted",
                                                                        "incremental", "unchanged"))
    ratios = {
        "ledger_x_zstd": ledger["x_zstd"], "ledger_x_zstd_median": ledger["median_x_zstd"],
        "ledger_x_zstd_synced": min(zstd["synced_runs"]) / ledger["best_s"],
        "ledger_x_zstd_cpu": zstd_r["cpu_s"] / ledger["cpu_s"],
        "full_x_zstd": full["x_zstd"], "full_x_zstd_median": full["median_x_zstd"],
        "full_x_zstd_cpu": zstd_r["cpu_s"] / full["cpu_s"],
        "encrypted_over_plain": enc["best_s"] / full["best_s"],
        "encrypted_over_plain_median": common.median_ratio(enc["runs"], full["runs"]),
        "incremental_over_full": inc["best_s"] / ledger["best_s"],
        "incremental_over_full_median": statistics.median(
            i / f for i, f in zip(inc["runs"], ledger["runs"], strict=True)),
        "unchanged_s": unchanged["best_s"], "unchanged_s_median": unchanged["median_s"],
    }
    restore, unzstd = by[STEPS["restore"]], by[STEPS["unzstd"]]
    ratios["restore_x_unzstd"] = unzstd["best_s"] / restore["best_s"]
    ratios["restore_x_unzstd_median"] = common.median_ratio(unzstd["runs"], restore["runs"])
    ratios["restore_x_unzstd_synced"] = min(unzstd["synced_runs"]) / restore["best_s"]
    if RESTIC:
        restic_b, restic_i, restic_r = (by[STEPS[k]] for k in RESTIC_STEPS)
        ratios |= {
            "full_x_restic": restic_b["best_s"] / full["best_s"],
            "full_x_restic_median": common.median_ratio(restic_b["runs"], full["runs"]),
            "incremental_x_restic": restic_i["best_s"] / inc["best_s"],
            "restore_x_restic": restic_r["best_s"] / restore["best_s"],
            "restore_x_restic_median": common.median_ratio(restic_r["runs"], restore["runs"]),
        }
    print()
    print_table(results)
    print(f"\ntotals: {len(paths)} files, {nbytes:,} bytes; zstd wrote {zstd['stored_bytes']:,}; "
          f"incremental after +{grow_bytes:,} bytes stored {inc['stored_bytes']:,} "
          f"(stored {inc.get('own_files')} files, referenced {inc.get('referenced_files')})")
    print(f"checked by, backup with the ledger: {ledger.get('checked_by')}; without: {full.get('checked_by')}")
    print(f"backup with the ledger / zstd -3 -T0: {ratios['ledger_x_zstd']:.2f}x best, "
          f"{ratios['ledger_x_zstd_median']:.2f}x median of rounds (target >= 0.8); against zstd + sync: "
          f"{ratios['ledger_x_zstd_synced']:.2f}x; by CPU time (zstd's over backup's): "
          f"{ratios['ledger_x_zstd_cpu']:.2f}x")
    print(f"backup with verification / zstd -3 -T0: {ratios['full_x_zstd']:.2f}x best, "
          f"{ratios['full_x_zstd_median']:.2f}x median of rounds; by CPU time: {ratios['full_x_zstd_cpu']:.2f}x")
    print(f"encrypted backup / plain backup (both verifying every file): {ratios['encrypted_over_plain']:.3f}x best, "
          f"{ratios['encrypted_over_plain_median']:.3f}x median of rounds (target <= 1.10)")
    print(f"incremental / full (ledger): {100 * ratios['incremental_over_full']:.1f}% best, "
          f"{100 * ratios['incremental_over_full_median']:.1f}% median of rounds (target <= 5%)")
    print(f"incremental with nothing new (the fixed cost): {ratios['unchanged_s']:.3f} s best, "
          f"{ratios['unchanged_s_median']:.3f} s median of rounds (target <= 0.1 s)")
    print(f"restore / zstd -d -T0 of the same files: {ratios['restore_x_unzstd']:.2f}x best, "
          f"{ratios['restore_x_unzstd_median']:.2f}x median of rounds (target >= 0.8); against zstd -d + sync: "
          f"{ratios['restore_x_unzstd_synced']:.2f}x")
    if RESTIC:
        print(f"against restic (> 1: walvault is faster): full backup {ratios['full_x_restic']:.2f}x best, "
              f"{ratios['full_x_restic_median']:.2f}x median; incremental {ratios['incremental_x_restic']:.2f}x; "
              f"restore {ratios['restore_x_restic']:.2f}x best, {ratios['restore_x_restic_median']:.2f}x median "
              "(target >= 1.5)")
    else:
        print("restic is not installed (apt-get install restic): its steps were left out")
    print(f"MB = 10**6 bytes; {args.rounds} rounds; MB/s of source bytes (restore: bytes restored); "
          f"'x zstd' = speed relative to zstd -3 -T0 (> 1 is faster); wall times including process start; "
          f"CPU s = user + system CPU of the command's least run")
    print(common.load_line(load_before, load_after, elapsed))

    bad = rnd.bad
    for line in bad:
        print(f"\n!!!!!! {line} !!!!!!")
    zstd_version = subprocess.run([ZSTD, "--version"], capture_output=True, text=True).stdout.strip()
    common.write_json(args.json, {
        "data_dir": str(data), "files": len(paths), "bytes": nbytes, "grow_bytes": grow_bytes,
        "rounds": args.rounds, "cores": os.cpu_count(), "load_avg_before": load_before,
        "load_avg_after": load_after, "python": platform.python_version(), "zstd": zstd_version,
        "restic": subprocess.run([RESTIC, "version"], capture_output=True, text=True).stdout.strip() if RESTIC else None,
        "elapsed_s": elapsed, "results": results, "ratios": ratios, "problems": bad,
        "restore_equal": all(by[STEPS["restore"]]["equal"]),
    })

    if not args.keep:
        clear_data(root)
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
