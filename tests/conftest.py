"""Shared test support: where the shared fixtures are, real Tarantool instances, the real CLI, the tiers.

Import the helpers with ``from conftest import SHARED, run_cli, ...`` (tests/ is on sys.path), and Airflow on one
machine with ``from devenv import ...`` (scripts/ too).

- ``SHARED``, ``TARANTOOL_FIXTURES``: ../shared and its real Tarantool sample files (read only:
  copy them before changing anything, see ``copy_tree``).
- ``require_shared``, ``require_tarantool``: skip marks (``pytestmark = require_shared``).
- ``run_cli(*args)``: run the installed ``walvault`` entry point in a subprocess; ``run_main``: the
  same result from walcore.cli.main called in the test's process (no interpreter start-up).
- fixtures ``real_instance`` / ``crashed_instance``: session-scoped data dirs written by a real
  Tarantool (clean shutdown / SIGKILL after the last write). Shared by every test: never modify
  them, copy them first.
- tiers: every test gets exactly one of the markers `unit`, `integration`, `system` (see TIERS below);
  `scripts/test --fast` runs the unit tier.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

# Airflow writes under AIRFLOW_HOME when it is first imported: the tests' own directory, never ~/airflow.
if "AIRFLOW_HOME" not in os.environ:
    import atexit
    import tempfile

    os.environ["AIRFLOW_HOME"] = tempfile.mkdtemp(prefix="walvault-test-airflow-")
    atexit.register(shutil.rmtree, os.environ["AIRFLOW_HOME"], True)

# The tests' JVMs (Spark drivers, a standalone master and worker) live seconds: the client compiler alone and the
# serial collector spare a third of their CPU (a trivial job measured here: 23 -> 15 CPU s) on a 2-core machine
# shared by two test workers. Spark's own launch scripts pass them on; nothing a test compares depends on them.
SPARK_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _jvm_opts in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_jvm_opts, SPARK_JVM_OPTS)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
if str(REPO / "scripts") not in sys.path:  # devenv: Airflow on one machine
    sys.path.append(str(REPO / "scripts"))

import tarantool_real  # noqa: E402  (stdlib only)

SHARED = Path(__file__).resolve().parents[2] / "shared"
TARANTOOL_FIXTURES = SHARED / "fixtures" / "tarantool"

require_shared = pytest.mark.skipif(
    not TARANTOOL_FIXTURES.is_dir(),
    reason=f"shared fixtures not found at {TARANTOOL_FIXTURES} (the repo expects ../shared beside it)")
LIMESTONE_FIXTURES = SHARED / "fixtures" / "limestone"
require_limestone = pytest.mark.skipif(
    not (LIMESTONE_FIXTURES / "README.md").is_file(), reason=f"limestone fixtures not found at {LIMESTONE_FIXTURES}")
require_tarantool = pytest.mark.skipif(
    tarantool_real.TARANTOOL is None,
    reason="real Tarantool not installed: `tarantool` is not on PATH (Debian: apt-get install -y tarantool)")

_ENTRY_POINT = Path(sys.executable).with_name("walvault")


def walvault_command() -> list[str]:
    """The installed `walvault` entry point (the venv's, else PATH's, else the same code via -c)."""
    if _ENTRY_POINT.exists():
        return [str(_ENTRY_POINT)]
    found = shutil.which("walvault")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; sys.argv[0] = 'walvault'; from walcore.cli import run; run()"]


def run_cli(*args, timeout: float = 300.0, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run `walvault ARGS...` and return the finished process (text stdout/stderr, never raises on rc)."""
    return subprocess.run([*walvault_command(), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, cwd=cwd or REPO)


def run_main(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """run_cli's result without its process: walcore.cli.main called in this one, on run_cli's empty stdin, its
    working directory and its text output (UTF-8 bytes decoded, newlines translated). No interpreter start-up
    (about a third of a CPU second a call): for the tests where the process boundary is not what is tested (no
    signal, no timeout, no clock moved, nothing read from the process's command line or environment)."""
    from walcore.cli import main

    out, err = io.BytesIO(), io.BytesIO()
    stdout = io.TextIOWrapper(out, encoding="utf-8", write_through=True)
    stderr = io.TextIOWrapper(err, encoding="utf-8", errors="backslashreplace", write_through=True)  # as sys.stderr
    stdin = sys.stdin
    sys.stdin = io.StringIO()
    environment = dict(os.environ)  # what the command sets there (--key-file's key) ends with it, as with a process
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), contextlib.chdir(cwd or REPO):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse: --help (0) and usage errors (2)
                code = e.code
    finally:
        sys.stdin = stdin
        if os.environ != environment:
            os.environ.clear()
            os.environ.update(environment)
    text = [b.getvalue().decode().replace("\r\n", "\n").replace("\r", "\n") for b in (out, err)]
    return subprocess.CompletedProcess(["walvault", *map(str, args)], code, *text)


def faketime_env(spec: str, **extra: str) -> dict[str, str]:
    """The environment of a process whose clock Debian's libfaketime moves by `spec` (faketime -f's syntax: "-40d",
    "+12.5s"). The library is preloaded directly rather than through the `faketime` wrapper: the wrapper names a
    semaphore after its pid and leaves it behind when killed, and a later wrapper with that pid then fails
    (sem_open: File exists)."""
    import glob

    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("Debian's faketime is not installed (no libfaketime.so.1): run scripts/setup")
    return {**os.environ, "LD_PRELOAD": found[0], "FAKETIME": spec, **extra}


def run_cli_at(when: float, *args, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """run_cli with the process's clock moved to `when` (Unix seconds) by Debian's faketime: how a test runs a
    command at another time than now (an expiry must not judge as of a time its clock has not reached)."""
    import time

    offset = when - time.clock_gettime(time.CLOCK_REALTIME)  # the host's clock, also while a test moves time.time
    return subprocess.run([*walvault_command(), *map(str, args)], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, cwd=REPO,
                          env=faketime_env(f"{offset:+.3f}s", TZ="UTC"))


@contextlib.contextmanager
def clock_at(when: float):
    """This process's clock (time.time) moved to `when`, running on from there: what faketime does to a
    subprocess, for a command called in-process (an expiry judging as of a simulated time)."""
    import time

    real = time.time
    offset = when - real()
    time.time = lambda: real() + offset
    try:
        yield
    finally:
        time.time = real


def copy_tree(src: Path, dst: Path) -> Path:
    """Copy a directory and make the copy writable (the shared fixtures are read-only)."""
    shutil.copytree(src, dst)
    for root, dirs, files in os.walk(dst):
        for name in dirs + files:
            p = Path(root) / name
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
    Path(dst).chmod(Path(dst).stat().st_mode | stat.S_IWUSR)
    return Path(dst)


@pytest.fixture(scope="session")
def real_instance(tmp_path_factory) -> Path:
    """A data dir written by real Tarantool and shut down cleanly (do not modify it).

    wal_max_size=16384 and scale=2: ~25 xlogs, 4 snapshots, vinyl runs; see tarantool_real.
    """
    if tarantool_real.TARANTOOL is None:
        pytest.skip("real Tarantool not installed: `tarantool` is not on PATH")
    return tarantool_real.generate_instance(tmp_path_factory.mktemp("real-instance"),
                                            wal_max_size=16384, scale=2)


@pytest.fixture(scope="session")
def crashed_instance(tmp_path_factory) -> Path:
    """Like real_instance, but Tarantool was SIGKILLed after its last write (do not modify it)."""
    if tarantool_real.TARANTOOL is None:
        pytest.skip("real Tarantool not installed: `tarantool` is not on PATH")
    return tarantool_real.generate_instance(tmp_path_factory.mktemp("crashed-instance"),
                                            wal_max_size=16384, scale=2, crash=True)


def limestone_readme_table() -> dict[str, dict]:
    """{dir: {status, exit, durable_epoch, max_appeared_epoch, count}} from the limestone fixtures' README:
    its table of `tglogutil inspect` results and, for 20-random-small, its prose."""
    text = (LIMESTONE_FIXTURES / "README.md").read_text()
    rows: dict[str, dict] = {}
    verdict = re.compile(r"(OK|auto-repairable|unrepairable) \((\d+)\),\s*(\d+),\s*(\d+),\s*(\d+)")
    for line in text.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = verdict.fullmatch(cells[-1])
        assert m, f"README row not understood: {line}"
        rows[cells[0].strip("`")] = {"status": m[1], "exit": int(m[2]), "durable_epoch": int(m[3]),
                                     "max_appeared_epoch": int(m[4]), "count": int(m[5])}
    m = re.search(r"`20-random-small/`.*?`tglogutil inspect`:\s*(OK|auto-repairable|unrepairable) \((\d+)\), "
                  r"durable (\d+), max appeared (\d+), ([\d,]+) put\+remove entries", text, re.S)
    assert m, "the README's prose about 20-random-small was not understood"
    rows["20-random-small"] = {"status": m[1], "exit": int(m[2]), "durable_epoch": int(m[3]),
                               "max_appeared_epoch": int(m[4]), "count": int(m[5].replace(",", ""))}
    return rows


def copy_limestone_fixture(name: str, tmp_path: Path, as_name: str | None = None) -> Path:
    """A writable copy of a limestone fixture directory, at tmp_path/<as_name or name>."""
    return copy_tree(LIMESTONE_FIXTURES / name, tmp_path / (as_name or name))


def run_root(tmp_path_factory) -> Path:
    """The run's base temporary directory, which xdist's workers share."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # a worker's base is popen-gwN under the run's
        root = root.parent
    return root


@pytest.fixture(scope="session", autouse=True)
def airflow_db_template(tmp_path_factory) -> Path:
    """Where devenv.migrate keeps the SQLite metadata database it migrates once for the whole run and copies for
    each new AIRFLOW_HOME after (WALVAULT_AIRFLOW_DB_TEMPLATE, inherited by the benches' processes too): the run's
    base temporary directory."""
    os.environ["WALVAULT_AIRFLOW_DB_TEMPLATE"] = str(run_root(tmp_path_factory) / "airflow-db-template")
    return run_root(tmp_path_factory) / "airflow-db-template"


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive(request, tmp_path_factory):
    """A class data sharing archive of what a Spark driver's JVM loads, made once a run for every later driver
    (SPARK_SUBMIT_OPTS names it, so Airflow's tasks and the benches inherit it): a driver maps those classes instead
    of loading and verifying them, a trivial job measured here 19 -> 11 CPU s. The first worker whose tests are not
    all unit tier has a trivial job dump its classes at exit, in the background; a driver that starts before the
    archive is in place runs as before (the JVM ignores a missing archive, silently). The dump is moved into place
    whole: a JVM that maps a partly written archive crashes."""
    if os.environ.get("SPARK_SUBMIT_OPTS") != SPARK_JVM_OPTS \
            or all(item.get_closest_marker("unit") for item in request.session.items):
        yield None  # the caller's own JVM options, or no Spark in this run
        return
    root = run_root(tmp_path_factory)
    archive = root / "spark-classes.jsa"
    os.environ["SPARK_SUBMIT_OPTS"] = f"{SPARK_JVM_OPTS} -XX:SharedArchiveFile={archive}"
    try:
        os.close(os.open(root / "spark-classes.lock", os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:  # another worker makes it
        yield archive
        return
    import threading

    from spark_jobs.submit import stop_tree
    from walcore.tarantool.writer import generate_wal

    work = root / "spark-classes"
    generate_wal(work / "wal", target_bytes=64 << 10, file_bytes=16 << 10)
    dumped = work / "classes.jsa"
    dump = subprocess.Popen(
        [*walvault_command(), "verify", str(work / "wal"), "--spark", "local[2]"], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, "SPARK_SUBMIT_OPTS": f"{SPARK_JVM_OPTS} -XX:ArchiveClassesAtExit={dumped}",
             "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})

    def put_in_place():
        if dump.wait() == 0 and dumped.exists():
            os.replace(dumped, archive)

    placer = threading.Thread(target=put_in_place, daemon=True)
    placer.start()
    yield archive
    if dump.poll() is None:  # this worker's tests ended first: no archive this run
        stop_tree(dump.pid)
    placer.join()


def airflow_sources(root: Path, schedules: str = "") -> tuple[Path, Path, Path]:
    """The sources and configuration of the DAG and UI tests: a data dir written by real Tarantool (`tt`), a
    writable copy of a real limestone fixture (`ls`, rotated at any size), a 30-day window, the Spark connections
    spark_default and spark_cluster, the repository created by the DAGs where there is none (as the embedded
    defaults say), and `schedules` (a YAML mapping; empty: the defaults). Returns (tt, ls, config file)."""
    tt = root / "sources" / "tt"
    tarantool_real.generate_instance(tt, wal_max_size=16384, scale=1, snapshots=2)
    ls = copy_limestone_fixture("20-random-small", root / "sources", "ls")
    config = root / "walvault.yaml"
    config.write_text(f"""
sources:
  - {{name: tt, family: tarantool, path: {tt}}}
  - {{name: ls, family: limestone, path: {ls}, rotate_min_bytes: 1}}
retention: {{days: 30}}
repository: {{create: true}}
spark: {{connections: [spark_default, spark_cluster]}}
{f"schedules: {schedules}" if schedules else ""}
""")
    return tt, ls, config


def last_run(env: dict, dag_id: str) -> tuple[str, str | None, list[tuple[str, int, str]]]:
    """The DAG's newest run as the metadata database (SQLite in AIRFLOW_HOME) holds it: its run_id, its note, and
    its XCom rows (task_id, map_index, key), sorted."""
    import sqlite3
    from contextlib import closing

    with closing(sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")) as db:
        run_id, note = db.execute("SELECT r.run_id, n.content FROM dag_run r LEFT JOIN dag_run_note n ON "
                                  "n.dag_run_id = r.id WHERE r.dag_id = ? ORDER BY r.id DESC LIMIT 1",
                                  (dag_id,)).fetchone()
        xcoms = db.execute("SELECT task_id, map_index, key FROM xcom WHERE dag_id = ? AND run_id = ?",
                           (dag_id, run_id)).fetchall()
    return run_id, note, sorted(xcoms)


def asset_events(env: dict) -> dict[str, list[dict]]:
    """The metadata database's asset events by asset URI, oldest first: the DAG that made each, and its metadata."""
    import json
    import sqlite3

    with contextlib.closing(sqlite3.connect(Path(env["AIRFLOW_HOME"]) / "airflow.db")) as db:
        rows = db.execute("SELECT asset.uri, asset_event.source_dag_id, asset_event.extra FROM asset_event "
                          "JOIN asset ON asset.id = asset_event.asset_id ORDER BY asset_event.id").fetchall()
    events: dict[str, list[dict]] = {}
    for uri, dag_id, extra in rows:
        events.setdefault(uri, []).append({"dag": dag_id, **json.loads(extra or "{}")})
    return events


def tree_snapshot(root: Path) -> dict:
    """Every path under root: kind, size, mode, mtime and (files) a hash of the bytes; equal
    snapshots taken before and after a command prove it wrote nothing there."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_dir():
                out[rel] = ("dir", st.st_mtime_ns, st.st_mode)
            else:
                out[rel] = ("file", st.st_size, st.st_mtime_ns, st.st_mode,
                            hashlib.sha256(p.read_bytes()).hexdigest())
    st = Path(root).stat()
    out["."] = ("dir", st.st_mtime_ns, st.st_mode)
    return out


def tree_but_leases(repo: Path) -> dict:
    """tree_snapshot of a repository but its leases: a command that takes and releases one (creating locks/) is
    seen to have written nothing else."""
    return {k: v for k, v in tree_snapshot(repo).items() if k not in (".", "locks") and not k.startswith("locks/")}


def append_vylog_records(vylog: Path, bodies: list[dict]) -> int:
    """Append one block holding the record bodies to a vylog, every byte before it kept, and leave the file
    open as a live one is; returns the block's offset."""
    import msgpack

    from walcore.tarantool.block import EOF_MAGIC, encode_fixheader

    data = vylog.read_bytes()
    if data.endswith(EOF_MAGIC):
        data = data[:-len(EOF_MAGIC)]
    payload = b"".join(msgpack.packb({0: 2}) + msgpack.packb(body) for body in bodies)
    vylog.write_bytes(data + encode_fixheader(False, payload) + payload)
    return len(data)


# -- repositories: the same tests over a local path and over S3 (moto's server on 127.0.0.1)


def new_repository(url, options: dict | None = None):
    """The repository `walvault init --repo URL` makes (done in process), for a test about something else: no
    command but init creates one. Returns `url`, to pass on as it was."""
    from walcore.repository import Repository

    Repository(str(url), options or {}, create=True)
    return url


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "walvault-test-key", "AWS_SECRET_ACCESS_KEY": "walvault-test-secret-value",
                  "AWS_DEFAULT_REGION": "us-east-1"}


# moto's threaded server, in a process of its own: in the test's process its request handling would wait for the GIL
# the test holds (and the test for it), every S3 request of a test polling the store paying for both. It ends when its
# stdin does: at the fixture's end, or with the test process however that ends.
_MOTO_SERVER = """
import logging, sys
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"""


@pytest.fixture(scope="session")
def s3_endpoint() -> str:
    """A real S3 HTTP API (moto's threaded server) on 127.0.0.1, in a process of its own; credentials in the
    environment."""
    for key, value in S3_CREDENTIALS.items():
        os.environ.setdefault(key, value)
    server = subprocess.Popen([sys.executable, "-c", _MOTO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    port = server.stdout.readline().strip()
    assert port.isdigit(), f"moto's server did not start (exit {server.poll()})"
    yield f"http://127.0.0.1:{port}"
    server.stdin.close()
    server.wait(timeout=60)


class RepoTarget:
    """Where a test's repository lives: `url` and `options` for Repository, `cli` for walvault's arguments;
    `encrypted`: made by `init --encrypt` (its key in WALVAULT_KEY, which subprocesses inherit)."""

    def __init__(self, kind: str, url: str, options: dict, encrypted: bool = False):
        self.kind, self.url, self.options, self.encrypted = kind, url, options, encrypted
        self._opened = None

    def storage(self):
        """The repository's storage as walvault reads it: an encrypted one's objects opened (its key derived once:
        a test polling the storage must not wait for scrypt at each look)."""
        from walcore.repository.storage import open_storage

        if not self.encrypted:
            return open_storage(self.url, self.options)
        if self._opened is None:
            self._opened = self.repository(create=False).storage
        return self._opened

    @property
    def cli(self) -> list[str]:
        args = ["--repo", self.url]
        for key, value in self.options.items():
            args += ["--repo-option", f"{key}={value}"]
        return args

    def repository(self, create: bool = True):
        from walcore.repository import Repository

        return Repository(self.url, self.options, create=create)


_bucket_counter = iter(range(1_000_000))


@pytest.fixture(params=["local", "s3"])
def repo_target(request, tmp_path) -> RepoTarget:
    """A fresh, empty repository: a local directory, then a bucket of the loopback S3 server."""
    if request.param == "local":
        return RepoTarget("local", str(tmp_path / "repo"), {})
    endpoint = request.getfixturevalue("s3_endpoint")
    import s3fs

    bucket = f"walvault-{os.getpid()}-{next(_bucket_counter)}"
    s3fs.S3FileSystem(endpoint_url=endpoint).mkdir(bucket)
    return RepoTarget("s3", f"s3://{bucket}/repo", {"endpoint_url": endpoint})


ENCRYPTION_KEY = "Xq7 test passphrase, not a real one Zr9"


def encrypted_target(target: RepoTarget, monkeypatch) -> RepoTarget:
    """`target` made an encrypted repository (init --encrypt), its key in WALVAULT_KEY for this test."""
    from walcore.repository import Repository

    monkeypatch.setenv("WALVAULT_KEY", ENCRYPTION_KEY)
    Repository.init(target.url, target.options, encrypt=True)
    return RepoTarget(target.kind, target.url, target.options, encrypted=True)


@pytest.fixture(params=["plain", "encrypted"])
def encryption(request) -> str:
    """Runs a test on a plain repository and on an encrypted one (with `encrypted_target`)."""
    return request.param


@pytest.fixture(params=["compiled", "pure"])
def scan_core(request, monkeypatch) -> str:
    """Runs a test once on each scan core (walcore.scancore): the compiled one, which must be built, and the
    pure-Python reference (WALVAULT_PURE=1, which the CLI's subprocesses and worker processes inherit)."""
    from walcore import scancore

    if request.param == "pure":
        monkeypatch.setenv("WALVAULT_PURE", "1")
    else:
        monkeypatch.delenv("WALVAULT_PURE", raising=False)
        assert scancore.compiled() is not None, "walcore._scan is not built (scripts/setup builds it)"
    return request.param


# -- tiers: what a test needs, so that `scripts/test --fast` (-m unit) runs in under a minute


TIERS = ("unit", "integration", "system")  # cheapest first; a test's tier is the costliest thing it needs

# Every test file's tier, for what its tests need beyond the rules of `tier_of` below: `unit` needs nothing but
# this process and the shared fixtures; `integration` a real Tarantool, the S3 server (moto), a local Spark or
# many subprocesses; `system` Airflow, PostgreSQL, a browser or a deployment. A new test file must be named here.
FILE_TIERS = {
    "test_airflow_config.py": "integration",
    "test_architecture.py": "unit",
    "test_archive.py": "integration",
    "test_backup_delta.py": "integration",  # a real Tarantool writing all the time
    "test_backup_failures.py": "integration",
    "test_backup_limestone.py": "integration",
    "test_backup_live.py": "integration",
    "test_backup_tarantool.py": "integration",
    "test_bench.py": "integration",
    "test_cli.py": "integration",  # the installed entry point in a subprocess, every test
    "test_compose.py": "system",
    "test_copy.py": "integration",  # a real Tarantool, moto's S3 server, copies killed in subprocesses
    "test_dags.py": "system",
    "test_dags_faults.py": "system",
    "test_docs.py": "integration",  # the site built by mkdocs, the docs' commands run on a copy of samples/
    "test_drill.py": "integration",
    "test_encryption.py": "integration",  # moto's S3, real Tarantool, walvault killed in a loop
    "test_encryption_attacks.py": "integration",  # many subprocesses
    "test_envelope.py": "unit",
    "test_freshness.py": "unit",
    "test_inputs.py": "integration",
    "test_lease_fencing.py": "integration",
    "test_limestone_commands.py": "integration",
    "test_limestone_compact.py": "unit",
    "test_limestone_fixtures.py": "unit",
    "test_limestone_random.py": "unit",
    "test_lineage.py": "integration",
    "test_nemesis.py": "integration",
    "test_object_lock.py": "integration",  # moto's S3 server with a lock-enabled bucket
    "test_notify.py": "unit",  # an SMTP server in this process
    "test_pins.py": "unit",  # in process; its S3 case is integration (tier_of)
    "test_redundancy_and_clock.py": "integration",
    "test_repository.py": "unit",
    "test_resources.py": "integration",
    "test_restore_pitr.py": "integration",
    "test_retention_limestone.py": "integration",
    "test_retention_property.py": "integration",  # in process, but whole random histories: some 50 CPU s
    "test_retention_tarantool.py": "integration",
    "test_review25b.py": "integration",  # adversarial review of the stream: real Tarantool, real processes
    "test_review25c.py": "integration",  # adversarial reproductions: a real Tarantool, the limestone fixtures
    "test_run_notes.py": "unit",
    "test_scan_core_limestone.py": "unit",
    "test_scan_core_tarantool.py": "unit",
    "test_scan_fuzz_regressions.py": "unit",
    "test_spark_jobs.py": "integration",
    "test_status.py": "unit",
    "test_stream_limestone.py": "unit",  # a writer process and the streamer in this one, on a fixture's copy
    "test_stream.py": "unit",  # the protocol without I/O; its real-instance tests are integration (a Tarantool)
    "test_streams.py": "integration",  # the supervisor of the configured streamers, against a real Tarantool
    "test_stream_sync.py": "unit",  # the receiver without I/O; its real-instance tests are integration
    "test_stream_supersede.py": "unit",  # the reach without I/O; its real-instance tests are integration
    "test_verdicts_retention.py": "integration",  # whole histories backed up, verified, expired and restored
    "test_spark_submit.py": "integration",
    "test_tarantool_cursor.py": "unit",
    "test_tarantool_damage.py": "unit",
    "test_tarantool_fixtures.py": "unit",
    "test_tarantool_layout.py": "unit",
    "test_tarantool_live.py": "integration",
    "test_tarantool_pitr.py": "integration",
    "test_tarantool_real.py": "integration",
    "test_tarantool_real_harness.py": "integration",
    "test_tarantool_vinyl.py": "unit",
    "test_tiers.py": "unit",
    "test_ui.py": "system",
}

# Tests costlier than their file's tier that no rule of `tier_of` sees (file::name, without parameters).
TEST_TIERS = {
    "test_bench.py::test_airflow_pipeline_bench_agrees": "system",
    "test_spark_submit.py::test_spark_flag_on_a_standalone_cluster_prints_what_the_command_prints": "system",
    "test_repository.py::test_unreachable_store_error_holds_no_secret_s3_only": "integration",  # S3 client retries
    "test_status.py::test_prometheus_scrapes_the_served_metrics": "system",  # Debian's prometheus
    "test_stream_limestone.py::test_expire_deletes_the_partials_a_snapshot_covers_and_verify_checks_them":
        "integration",  # the expiry's clock moved by Debian's faketime
}

# Fixtures that start a real Tarantool, the S3 server or Spark: a test using one is at least `integration`.
INTEGRATION_FIXTURES = {"real_instance", "crashed_instance", "s3_endpoint", "spark", "live"}


def tier_of(item: pytest.Item) -> str | None:
    """The costliest of: the file's tier, the test's own entry in TEST_TIERS, and `integration` for a test that
    needs a real Tarantool (require_tarantool) or uses an INTEGRATION_FIXTURES fixture or the S3 repo_target.
    None for a file FILE_TIERS does not name (test_tiers fails on it)."""
    path = Path(item.fspath)
    if path.name not in FILE_TIERS:
        return None
    needs = [FILE_TIERS[path.name], TEST_TIERS.get(f"{path.name}::{item.originalname}", "unit")]
    params = getattr(item, "callspec", None)
    if (require_tarantool.mark in item.iter_markers("skipif") or INTEGRATION_FIXTURES & set(item.fixturenames)
            or (params is not None and params.params.get("repo_target") == "s3")):
        needs.append("integration")
    return max(needs, key=TIERS.index)


ALL_ITEMS = pytest.StashKey[list]()


def pytest_configure(config):
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/conftest.py assigns it)")


# The files that take longest, longest first (seconds in a whole run on the 2-core VM, 2026-11-28, before the
# cuts of that day: test_nemesis 374, test_bench 318, test_ui 314, test_dags 278 before it took over test_notify's,
# test_freshness's and the provider's Airflow commands, test_backup_failures 210, test_spark_jobs 174,
# test_encryption 150, test_spark_submit 150, test_dags_faults 88), run before every other file: --dist loadfile
# hands each worker the next file in collection order, and one of these started last would run alone at the end
# while the other workers idle (scripts/test turns off xdist's own order, by test count, which put these files of
# few tests last).
SLOWEST_FILES = ("test_dags.py", "test_ui.py", "test_bench.py", "test_nemesis.py", "test_backup_failures.py",
                 "test_spark_jobs.py", "test_spark_submit.py", "test_encryption.py", "test_dags_faults.py")


def slowest_first(item: pytest.Item) -> int:
    name = Path(item.fspath).name
    return SLOWEST_FILES.index(name) if name in SLOWEST_FILES else len(SLOWEST_FILES)


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the markers are what it selects by
def pytest_collection_modifyitems(config, items):
    for item in items:
        if tier := tier_of(item):
            item.add_marker(tier)
    items.sort(key=slowest_first)  # stable: each file's tests keep their order
    config.stash[ALL_ITEMS] = list(items)
