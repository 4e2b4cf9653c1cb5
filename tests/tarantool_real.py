"""Test support: drive a *real* Tarantool (Debian's 2.6.0) from Python.

Standard library only. Every function runs ``tarantool <script.lua>`` from
``tests/lua/`` in a subprocess with a timeout and raises :class:`TarantoolError`
(carrying Tarantool's stderr/log) when Tarantool fails.

- :func:`generate_instance` writes a real data dir (memtx/ wal/ vinyl/) with a
  workload covering what a WAL backup tool must handle.
- :func:`xlog_pairs_rows`, :func:`xlog_pairs_summary` report what Tarantool's
  own reader, ``require('xlog').pairs()``, sees in one file.
- :func:`start_recovery` starts Tarantool on a data dir and reports whether it
  came up, its vclock and row counts per user space.
- :func:`time_xlog_pairs` times ``xlog.pairs()`` over files, inside Lua.

Facts measured on tarantool 2.6.0 (see also shared/docs/tarantool-files.md):

- ``os.exit(0)`` *and* ``os.exit(1)`` shut down cleanly: the newest xlog gets its
  EOF marker and a new empty xlog (meta + EOF marker) named after the final
  vclock sum is created. Only SIGKILL leaves the newest xlog without EOF marker.
- ``xlog.pairs()`` yields ``(row.lsn, {HEADER=..., BODY=...})``; the first value
  is 0 when the row header has no lsn (first snapshot row, every .vylog row,
  .index rows, .run ROWINDEX rows) while ``HEADER.lsn`` is then nil.
  HEADER has ``lsn, type, replica_id, group_id, tsn, commit, timestamp`` only
  when present: ``tsn`` only in multi-statement transactions (already decoded:
  ``lsn - raw``, wrap-around handled), ``commit`` only as ``true`` on the last
  row of a multi-statement transaction (nil elsewhere), ``replica_id`` nil for
  local-space rows (``group_id`` 1) and snapshot rows. BODY.tuple/BODY.key are
  box.tuple cdata; for UPDATE, BODY.tuple holds the update operations.
- The default ``checkpoint_count = 2`` makes ``box.snapshot()`` delete older
  .snap/.xlog/vinyl files; the scripts here set ``checkpoint_count = 1000`` and
  ``checkpoint_interval = 0`` so every file stays and nothing happens on its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TARANTOOL = shutil.which("tarantool")

LUA_DIR = Path(__file__).resolve().parent / "lua"
DEFAULT_TIMEOUT = 120.0
MANIFEST_NAME = "workload.json"

# TSV columns written by lua/xlog_read.lua (mode `rows`)
ROW_KEYS = ("lsn", "type", "replica_id", "group_id", "tsn", "commit", "space_id", "tuple_len")


class TarantoolError(RuntimeError):
    """Tarantool failed, timed out, or is not installed."""

    def __init__(self, message: str, *, returncode: int | None = None, log: str = ""):
        self.returncode = returncode
        self.log = log
        if log:
            message = f"{message}\n--- tarantool stderr/log (tail) ---\n{_tail(log)}"
        super().__init__(message)


def _tail(text: str, limit: int = 8000) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def _require_tarantool() -> str:
    exe = TARANTOOL or shutil.which("tarantool")
    if not exe:
        raise TarantoolError("tarantool is not on PATH (Debian: apt-get install -y tarantool)")
    return exe


def _run_lua(script: str, args: list[str], *, cwd: Path | None = None,
             timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess:
    """Run ``tarantool lua/<script> args...``; never raises on a non-zero exit."""
    exe = _require_tarantool()
    cmd = [exe, str(LUA_DIR / script), *args]
    try:
        return subprocess.run(cmd, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has already killed (SIGKILL) and reaped the child.
        out = exc.stderr or b""
        if isinstance(out, bytes):
            out = out.decode("utf-8", "replace")
        raise TarantoolError(f"tarantool {script} timed out after {timeout:g} s: {cmd}",
                             log=out) from None


def run_lua_code(code: str, *, cwd: Path, timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess:
    """Run a Lua script given as text with ``tarantool`` in ``cwd``; never raises on a non-zero exit."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", prefix="walvault-", delete=False) as f:
        f.write(code)
    try:
        return _run_lua(f.name, [], cwd=cwd, timeout=timeout)  # LUA_DIR / an absolute path is that path
    finally:
        os.unlink(f.name)


def _check(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise TarantoolError(f"{what} failed: tarantool exited with {proc.returncode}",
                             returncode=proc.returncode,
                             log=(proc.stderr or "") + (proc.stdout or ""))


# --------------------------------------------------------------------------- generate


def generate_instance(workdir: Path, *, wal_max_size: int | None = None, scale: int = 1,
                      crash: bool = False, snapshots: int = 3,
                      instance_uuid: str | None = None,
                      timeout: float = DEFAULT_TIMEOUT) -> Path:
    """Write a real Tarantool data dir under ``workdir`` and return ``workdir``.

    Layout: ``workdir/memtx`` (.snap), ``workdir/wal`` (.xlog), ``workdir/vinyl``
    (.vylog, ``<space_id>/<index_id>/*.run|*.index``) and ``workdir/workload.json``
    (see :func:`read_manifest`: row counts per space, final vclock, uuid, ...).

    Workload (lua/workload.lua): spaces 512 ``mem`` (memtx), 513 ``vin`` (vinyl),
    both pk unsigned + non-unique string ``sk``; 514 ``loc`` (memtx, is_local).
    ``snapshots + 1`` batches with a ``box.snapshot()`` (which dumps vinyl) after
    each but the last; vinyl compaction after the 2nd and later snapshots. Each
    batch: single-statement insert/update/replace/upsert/delete, multi-statement
    transactions mixing all of them over both engines, two transactions mixing a
    local and a global row, >2 KiB tuples (zstd-compressed WAL blocks), and 20
    fibers writing at once (several transactions per WAL block). ``scale``
    multiplies the row counts (scale=1, snapshots=3: ~2,700 WAL rows, ~0.4 s;
    scale=10: ~28k rows, ~1 s; scale=50: ~140k rows, ~4.5 s).

    Every checkpoint and xlog is kept (``checkpoint_count = 1000``).
    ``crash=True`` kills Tarantool with SIGKILL after the last write, so the
    newest xlog has no EOF marker; otherwise it exits via ``os.exit(0)``, which
    in 2.6 is a clean shutdown (EOF marker + a new empty xlog).
    ``instance_uuid=None`` lets Tarantool pick a random uuid. Row counts, keys,
    payloads are deterministic; LSN order within concurrent parts is not.
    """
    workdir = Path(workdir).resolve()
    dirs = {name: workdir / name for name in ("memtx", "wal", "vinyl")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
        if any(d.iterdir()):
            raise ValueError(f"{d} is not empty: generate_instance needs a fresh directory")
    manifest = workdir / MANIFEST_NAME
    if manifest.exists():
        manifest.unlink()
    cfg = {
        "memtx_dir": str(dirs["memtx"]),
        "wal_dir": str(dirs["wal"]),
        "vinyl_dir": str(dirs["vinyl"]),
        "work_dir": str(workdir),
        "manifest": str(manifest),
        "wal_max_size": wal_max_size,
        "scale": int(scale),
        "snapshots": int(snapshots),
        "crash": bool(crash),
        "instance_uuid": instance_uuid,
    }
    proc = _run_lua("workload.lua", [json.dumps(cfg)], cwd=workdir, timeout=timeout)
    expected_rc = -9 if crash else 0
    if proc.returncode != expected_rc or not manifest.exists():
        raise TarantoolError(
            f"workload in {workdir} failed: tarantool exited with {proc.returncode} "
            f"(expected {expected_rc}), manifest {'present' if manifest.exists() else 'missing'}",
            returncode=proc.returncode, log=(proc.stderr or "") + (proc.stdout or ""))
    return workdir


def read_manifest(workdir: Path) -> dict:
    """The ``workload.json`` written by :func:`generate_instance`.

    Keys: ``counts`` ({'mem': N, 'vin': N, 'loc': N}), ``vclock`` ({int: int},
    component 0 = local rows), ``vclock_sum``, ``instance_uuid``,
    ``replicaset_uuid``, ``replica_id``, ``version``, ``scale``, ``snapshots``,
    ``crash``, ``stats`` (transactions/rows/fibers/compactions done),
    ``space_ids``.
    """
    data = json.loads((Path(workdir) / MANIFEST_NAME).read_text())
    data["vclock"] = _int_map(data.get("vclock"))
    data["counts"] = _str_map(data.get("counts"))
    return data


def _int_map(obj) -> dict[int, int]:
    # Lua's json encodes an empty table as []
    return {int(k): int(v) for k, v in (obj or {}).items()} if isinstance(obj, dict) else {}


def _str_map(obj) -> dict[str, int]:
    return {str(k): int(v) for k, v in obj.items()} if isinstance(obj, dict) else {}


# --------------------------------------------------------------------------- xlog.pairs


def _parse_value(text: str):
    if text == "nil":
        return None
    if text == "true":
        return True
    if text == "false":
        return False
    try:
        return int(text)
    except ValueError:
        return text


def _xlog_read(mode: str, path: Path, timeout: float) -> str:
    """Run lua/xlog_read.lua in `mode` on one file; return what it wrote."""
    path = Path(path).resolve()
    if not path.is_file():
        raise FileNotFoundError(path)
    with tempfile.TemporaryDirectory(prefix="walvault-xlog-") as tmp:
        out = Path(tmp) / "out"
        proc = _run_lua("xlog_read.lua", [mode, str(path), str(out)], timeout=timeout)
        _check(proc, f"xlog.pairs({path})")
        return out.read_text(encoding="utf-8", errors="replace")


def xlog_pairs_rows(path: Path, *, timeout: float = DEFAULT_TIMEOUT) -> list[dict]:
    """Every row Tarantool's ``xlog.pairs(path)`` yields, in order.

    One dict per row: ``lsn`` (the iterator's first value: 0 when the header has
    no lsn), ``type`` (str, e.g. 'INSERT', 'RUNINFO'; an int for unknown
    types), ``replica_id``, ``group_id``, ``tsn``, ``commit`` (True or None),
    ``space_id`` and ``tuple_len`` (``#BODY.tuple`` else ``#BODY.key``; for
    UPDATE that is the number of update operations) -- None where xlog.pairs
    gives nil. This is the convention of
    shared/fixtures/tarantool/expected-xlog-pairs-rows.tsv (its columns 2-8).
    Works for .xlog .snap .vylog .run .index. Note that xlog.pairs silently
    stops at damage: it is a reference for valid files, not a validator.
    """
    text = _xlog_read("rows", path, timeout)
    return [dict(zip(ROW_KEYS, map(_parse_value, line.split("\t")))) for line in text.splitlines()]


def xlog_pairs_summary(path: Path, *, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """``{'rows', 'min_lsn', 'max_lsn', 'types'}`` as computed in Lua.

    Same computation as shared/fixtures/tarantool/expected-xlog-pairs-summary.jsonl:
    min/max over the iterator's lsn (so 0 for files whose rows carry no lsn),
    None for both when the file has no rows; ``types`` maps type name -> count.
    """
    data = json.loads(_xlog_read("summary", path, timeout))
    types = data.get("types")
    return {
        "rows": int(data["rows"]),
        "min_lsn": data.get("min_lsn"),
        "max_lsn": data.get("max_lsn"),
        "types": dict(types) if isinstance(types, dict) else {},
    }


def time_xlog_pairs(paths: list[Path], *, timeout: float = 600.0) -> dict:
    """Time reading every row of ``paths`` with ``xlog.pairs``, measured in Lua.

    The timed loop touches header and body like a consumer (counts rows, sums
    ``HEADER.lsn``, takes ``#BODY.tuple``). Process start and file listing are
    outside the timing. Returns ``{'seconds': float, 'rows': int, 'bytes': int,
    'lsn_sum': int}`` (bytes = total size of the files).
    """
    resolved = [Path(p).resolve() for p in paths]
    for p in resolved:
        if not p.is_file():
            raise FileNotFoundError(p)
        if "\n" in str(p):
            raise ValueError(f"newline in path: {p!r}")
    with tempfile.TemporaryDirectory(prefix="walvault-xlog-") as tmp:
        listing = Path(tmp) / "paths.txt"
        listing.write_text("".join(f"{p}\n" for p in resolved))
        out = Path(tmp) / "time.json"
        proc = _run_lua("xlog_read.lua", ["time", str(listing), str(out)], timeout=timeout)
        _check(proc, "xlog.pairs timing")
        data = json.loads(out.read_text())
    return {
        "seconds": float(data["seconds"]),
        "rows": int(data["rows"]),
        "bytes": int(data["bytes"]),
        "lsn_sum": int(data["lsn_sum"]),
    }


# --------------------------------------------------------------------------- recovery


@dataclass
class RecoveryResult:
    """What happened when Tarantool was started on a data dir.

    ``started``: box.cfg returned and the instance was running. ``vclock`` and
    ``counts`` (rows per user space, id >= 512, by name) are None unless it
    started. ``error``: the box.cfg error message when box.cfg raised (a
    panic leaves only ``log``). ``log``: everything Tarantool wrote to stderr
    (its log goes there).
    """

    returncode: int
    log: str
    started: bool = False
    vclock: dict[int, int] | None = None
    counts: dict[str, int] | None = None
    status: str | None = None
    instance_uuid: str | None = None
    error: str | None = None
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def stderr(self) -> str:
        return self.log

    @property
    def ok(self) -> bool:
        return self.started and self.returncode == 0


def start_recovery(workdir: Path, *, force_recovery: bool = False,
                   timeout: float = DEFAULT_TIMEOUT) -> RecoveryResult:
    """Start a fresh Tarantool on ``workdir/{memtx,wal,vinyl}``, report, exit cleanly.

    Does not raise when Tarantool refuses to start (that is a result: see
    ``returncode``/``started``/``log``); raises :class:`TarantoolError` only on
    a timeout or when tarantool is missing.

    Warning: starting modifies the data dir like any real start does (on the
    clean exit Tarantool closes the newest xlog with an EOF marker and leaves a
    new empty xlog). Run it on a copy when the files must stay as they were.
    Uses ``checkpoint_count = 1000`` and ``checkpoint_interval = 0`` so no file
    is garbage-collected and no checkpoint is made.
    """
    workdir = Path(workdir).resolve()
    with tempfile.TemporaryDirectory(prefix="walvault-recover-") as tmp:
        out = Path(tmp) / "result.json"
        cfg = {
            "memtx_dir": str(workdir / "memtx"),
            "wal_dir": str(workdir / "wal"),
            "vinyl_dir": str(workdir / "vinyl"),
            "work_dir": str(workdir),
            "force_recovery": bool(force_recovery),
            "out": str(out),
        }
        t0 = time.monotonic()
        proc = _run_lua("recover.lua", [json.dumps(cfg)], cwd=workdir, timeout=timeout)
        seconds = time.monotonic() - t0
        data = json.loads(out.read_text()) if out.exists() else {}
    log = (proc.stderr or "") + (proc.stdout or "")
    started = bool(data.get("started"))
    error = data.get("error")
    if not started and (error is None or error == "box.cfg did not return"):
        # a panic (e.g. "F> can't initialize storage: tx checksum mismatch")
        # ends the process inside box.cfg: take the last fatal/error log line
        error = _last_error_line(log) or error or f"tarantool exited with {proc.returncode}"
    return RecoveryResult(
        returncode=proc.returncode,
        log=log,
        started=started,
        vclock=_int_map(data.get("vclock")) if started else None,
        counts=_str_map(data.get("counts")) if started else None,
        status=data.get("status"),
        instance_uuid=data.get("instance_uuid"),
        error=error,
        seconds=seconds,
        extra={k: v for k, v in data.items()
               if k not in {"started", "vclock", "counts", "status", "instance_uuid", "error"}},
    )


def _last_error_line(log: str) -> str | None:
    lines = log.splitlines()
    for marker in (" F> ", " E> "):
        for line in reversed(lines):
            if marker in line:
                return line.split(marker, 1)[1].strip()
    return None


# --------------------------------------------------------------------------- backups


def _dirs_cfg(workdir: Path) -> dict:
    return {"memtx_dir": str(workdir / "memtx"), "wal_dir": str(workdir / "wal"), "vinyl_dir": str(workdir / "vinyl"),
            "work_dir": str(workdir)}


def write_more(workdir: Path, *, rows: int, snapshot: bool, seed: int, wal_max_size: int = 16384,
               crash: bool = False, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Write more to a data dir made by generate_instance (lua/more_writes.lua): memtx, vinyl and local rows,
    single and multi-statement transactions, with a snapshot half way when asked; SIGKILL at the end when
    `crash`."""
    workdir = Path(workdir).resolve()
    cfg = {**_dirs_cfg(workdir), "rows": rows, "snapshot": snapshot, "seed": seed, "wal_max_size": wal_max_size,
           "crash": crash}
    proc = _run_lua("more_writes.lua", [json.dumps(cfg)], cwd=workdir, timeout=timeout)
    if proc.returncode != (-9 if crash else 0):
        raise TarantoolError(f"more_writes in {workdir} failed: tarantool exited with {proc.returncode}",
                             returncode=proc.returncode, log=(proc.stderr or "") + (proc.stdout or ""))


def dump_data_dir(workdir: Path, *, timeout: float = DEFAULT_TIMEOUT) -> dict:
    """Start Tarantool on a copy of a data dir and return {"vclock": {int: int}, "spaces": {name: [rows]}} —
    every row of every user space in primary key order. Raises TarantoolError when it does not start."""
    workdir = Path(workdir).resolve()
    with tempfile.TemporaryDirectory(prefix="walvault-dump-") as tmp:
        copy = Path(tmp) / "data"
        shutil.copytree(workdir, copy)
        out = Path(tmp) / "dump.json"
        proc = _run_lua("dump.lua", [json.dumps({**_dirs_cfg(copy), "out": str(out)})], cwd=copy, timeout=timeout)
        data = json.loads(out.read_text()) if out.exists() else {}
    if not data.get("started"):
        raise TarantoolError(f"tarantool did not start on a copy of {workdir}: {data.get('error')}",
                             returncode=proc.returncode, log=(proc.stderr or "") + (proc.stdout or ""))
    return {"vclock": _int_map(data["vclock"]), "spaces": data["spaces"], "instance_uuid": data["instance_uuid"]}


__all__ = [
    "TARANTOOL",
    "TarantoolError",
    "RecoveryResult",
    "generate_instance",
    "read_manifest",
    "xlog_pairs_rows",
    "xlog_pairs_summary",
    "start_recovery",
    "time_xlog_pairs",
    "write_more",
    "dump_data_dir",
]
