"""The Airflow UI as people use it: api-server, scheduler and dag-processor on 127.0.0.1 (scripts/devenv.py)
over a real PostgreSQL started for this module, real sources of both families and a repository on a local path.
Two backups run, both started at the module's start: one through the UI in a real headless Chromium (login, the
DAG page, the trigger form), which succeeds, and one through the REST API (token auth) of a source walvault
refuses, which fails. Both go through the scheduler, LocalExecutor and Spark on local[2]; what they did is checked
in the repository, through the API (task states, the record and verify tasks' XComs, the run's note) and on the
UI's pages. (A tarantool source's backups through walvault_backup: tests/test_dags.py.)"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
import requests
import yaml

from conftest import REPO, airflow_sources, copy_limestone_fixture, new_repository, require_limestone, require_tarantool, run_cli
from devenv import UI, environment, migrate
from spark_jobs.cluster import free_port

pytestmark = [require_tarantool, require_limestone]

DAG = "walvault_backup"
RUN_TIMEOUT = 600
SETUP_HINT = "run scripts/setup (it installs postgresql, chromium and chromium-driver)"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT = REPO / "bench" / "out" / "ui" / "walvault_backup_run.png"


def _tail(text: str, lines: int = 30, width: int = 400) -> str:
    """The last lines, each cut to `width` characters (Spark's and Airflow's log lines can be very long)."""
    return "\n".join(line if len(line) <= width else line[:width] + " [...]" for line in text.splitlines()[-lines:])


# -- PostgreSQL: a cluster of this module's own, on 127.0.0.1 and a socket directory in tmp

class Postgres:
    def __init__(self):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
        if not found:
            pytest.fail(f"PostgreSQL's server is not installed (no /usr/lib/postgresql/*/bin/initdb): {SETUP_HINT}")
        self.bin = Path(found[-1]).parent
        # as root, the cluster is the postgres user's (initdb refuses root), in a directory it can reach: pytest's
        # tmp dir (/tmp/pytest-of-root, mode 0700) is not one
        self.as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.root = Path(tempfile.mkdtemp(prefix="walvault-test-pg-"))
        self.data, self.sockets, self.log = self.root / "data", self.root / "sockets", self.root / "postgres.log"
        self.user, self.password, self.port = "walvault", secrets.token_urlsafe(18), free_port()
        self.started = False

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.as_owner, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        return proc

    def start(self) -> Postgres:
        self.sockets.mkdir()
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if self.as_owner:
            for p in (self.root, self.sockets, pwfile):
                shutil.chown(p, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", self.user, f"--pwfile={pwfile}",
                  "-A", "scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        self.started = True  # pg_ctl stop is harmless when it did not start
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.sockets} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60",
                  "-o", options, "start")
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password,
                                dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE airflow")
        finally:
            conn.close()
        return self

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://{self.user}:{self.password}@127.0.0.1:{self.port}/airflow"

    def stop(self) -> None:
        try:
            if self.started:
                proc = subprocess.run([*self.as_owner, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                                       "-w", "-t", "60", "stop"], capture_output=True, text=True, timeout=90)
                pid_file = self.data / "postmaster.pid"
                if proc.returncode != 0 and pid_file.exists():  # pg_ctl could not stop it: the postmaster by pid
                    with contextlib.suppress(OSError, ValueError):
                        os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


# -- the stack: PostgreSQL, three sources, the configuration, a repository, and the UI's three processes

@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui")
    # no cron schedules: unpausing walvault_backup must not start a scheduled run of every source beside the
    # triggered ones (catchup=False still runs the latest interval); snapshot and retention follow the data as
    # shipped (the Assets view's chain), paused, so that a backup queues no run of them
    tt, ls, config = airflow_sources(root, "{archive: null, backup: null, restore_drill: null}")
    # and `broken`, a copy of ls whose first pwal is broken where its first entry must start: walvault refuses to
    # back it up (exit 1), without touching ls, so that its failed run may go on beside ls's own
    broken = copy_limestone_fixture("20-random-small", root / "sources", "broken")
    broken_pwal = sorted(broken.glob("pwal_????"))[0]
    kept = broken_pwal.read_bytes()
    broken_pwal.write_bytes(bytes([kept[0] ^ 0xFF, kept[1] ^ 0xFF]) + kept[2:])
    settings = yaml.safe_load(config.read_text())
    settings["sources"].append({**next(s for s in settings["sources"] if s["name"] == "ls"), "name": "broken",
                                "path": str(broken)})
    config.write_text(yaml.safe_dump(settings))
    repo = root / "repo"
    with contextlib.ExitStack() as cleanup:
        pg = Postgres()
        cleanup.callback(pg.stop)
        pg.start()
        env = environment(root / "home", config=config, repository=str(repo), work_dir=root / "work",
                          database=pg.url, api_port=free_port())
        # the api-server (one process) answers the browser's pages and the tasks' execution API at once: on a
        # loaded machine a task's call waited there over the 5 s default, and the task was killed before it ran
        env["AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT"] = "30"
        migrate(env)
        ui = UI(env, root / "logs")
        cleanup.callback(ui.stop)
        ui.start()
        yield {"ui": ui, "url": ui.url, "password": ui.admin_password(), "repo": repo, "root": root, "pg": pg,
               "broken": broken, "broken_pwal": broken_pwal.name}


class Api:
    """The REST API with a JWT from /auth/token."""

    def __init__(self, stack):
        self.url, self.log_dir, self.work_dir = stack["url"], stack["ui"].log_dir, stack["root"] / "work"
        self.session = requests.Session()
        r = self.session.post(f"{self.url}/auth/token", json={"username": "admin", "password": stack["password"]},
                              timeout=30)
        assert r.status_code in (200, 201), f"POST /auth/token: {r.status_code} {r.text}"
        self.token = r.json()["access_token"]
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    def call(self, method: str, path: str, expect=(200,), **kwargs):
        r = self.session.request(method, f"{self.url}/api/v2{path}", timeout=60, **kwargs)
        assert r.status_code in expect, f"{method} /api/v2{path}: {r.status_code} {r.text[:2000]}"
        return r.json()

    def unpause(self, dag_id: str) -> None:
        assert self.call("PATCH", f"/dags/{dag_id}", json={"is_paused": False})["is_paused"] is False

    def trigger(self, dag_id: str, conf: dict) -> str:
        run = self.call("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        return run["dag_run_id"]

    def run_path(self, dag_id: str, run_id: str) -> str:
        return f"/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.call("GET", f"{self.run_path(dag_id, run_id)}/taskInstances")["task_instances"]

    def task_log(self, dag_id: str, run_id: str, ti: dict, lines: int = 40) -> str:
        r = self.session.get(f"{self.url}/api/v2{self.run_path(dag_id, run_id)}/taskInstances/{ti['task_id']}/logs/"
                             f"{max(ti['try_number'], 1)}", params={"map_index": ti["map_index"], "full_content": True},
                             headers={"Accept": "application/json"}, timeout=60)
        if r.status_code != 200:
            return f"(log: {r.status_code} {r.text[:500]})"
        text = []
        for c in r.json()["content"]:
            if isinstance(c, str):
                text.append(c)
                continue
            text.append(f"{c.get('level', '')} {c.get('event', '')}")
            for error in c.get("error_detail") or []:  # the exception of a failed task is here, not in `event`
                text += [line[:1000] for line in f"{error.get('exc_type')}: {error.get('exc_value')}".splitlines()[:3]]
        return _tail("\n".join(text), lines)

    def diagnose(self, dag_id: str, run_id: str, show=("failed", "up_for_retry")) -> str:
        """The task instances' states, the logs of those in a state of `show`, the scheduler's log."""
        out = []
        try:
            tis = self.task_instances(dag_id, run_id)
            out.append("task instances: " + ", ".join(f"{t['task_id']}[{t['map_index']}]={t['state']}" for t in tis))
            for ti in tis:
                if ti["state"] in show:
                    out.append(f"--- log of {ti['task_id']}[{ti['map_index']}] ({ti['state']}):\n"
                               + self.task_log(dag_id, run_id, ti))
        except (AssertionError, requests.RequestException) as e:
            out.append(f"(task instances not read: {e})")
        # what the Spark jobs' walvault commands printed on stderr (spark_jobs/job.py keeps it beside the plan)
        for stderr in sorted(self.work_dir.glob("*/output/stderr")):
            if stderr.stat().st_size:
                out.append(f"--- {stderr}:\n" + _tail(stderr.read_text(errors="replace"), 10))
        scheduler_log = self.log_dir / "scheduler.log"
        if scheduler_log.exists():
            out.append(f"--- {scheduler_log}:\n" + _tail(scheduler_log.read_text(errors="replace"), 20))
        return "\n".join(out)

    def wait_finished(self, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
        """The run once it succeeded or failed."""
        deadline = time.monotonic() + timeout
        while (run := self.call("GET", self.run_path(dag_id, run_id)))["state"] not in ("success", "failed"):
            if time.monotonic() > deadline:
                pytest.fail(f"run {run_id} still {run['state']} after {timeout} s\n"
                            f"{self.diagnose(dag_id, run_id, ('running', 'failed'))}")
            time.sleep(0.5)
        return run

    def wait_success(self, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT) -> dict:
        run = self.wait_finished(dag_id, run_id, timeout)
        if run["state"] == "failed":
            pytest.fail(f"run {run_id} failed\n{self.diagnose(dag_id, run_id)}")
        return run


def _backups(repo: Path) -> list[dict]:
    proc = run_cli("backups", "--repo", repo, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)["backups"]


# -- a real browser: Debian's chromium, headless, through chromedriver, logged in once for the module

@pytest.fixture(scope="module")
def browser(stack, tmp_path_factory):
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{path} not found: {SETUP_HINT}")
    from selenium import webdriver
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    scratch = tmp_path_factory.mktemp("chromium")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    # without the networking flags it keeps trying hosts this machine cannot reach
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                 f"--user-data-dir={scratch / 'profile'}", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(scratch / "chromedriver.log")),
                              options=options)
    try:
        try:
            _log_in(driver, WebDriverWait(driver, 60), stack)
        except TimeoutException as e:
            pytest.fail(f"the login page did not do as expected: {e.msg} {_page_dump(driver, scratch, 'login')}")
        yield driver
    finally:
        driver.quit()


def _log_in(driver, wait, stack) -> None:
    """The login page, as admin (a TimeoutException where it does not answer as expected)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    driver.get(f"{stack['url']}/auth/login")
    wait.until(EC.visibility_of_element_located((By.NAME, "username"))).send_keys("admin")
    driver.find_element(By.NAME, "password").send_keys(stack["password"])
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: "/auth/login" not in d.current_url)


def _page_dump(driver, tmp_path: Path, name: str) -> str:
    """The page's HTML and a screenshot in tmp_path, named for a failure's message."""
    path = tmp_path / f"{name}.html"
    path.write_text(driver.page_source)
    driver.save_screenshot(str(path.with_suffix(".png")))
    return f"(page at {driver.current_url}: {path} and its .png)"


def _trigger_from_the_form(driver, url: str, source: str) -> str:
    """A run of walvault_backup from its DAG page's trigger form, `source` picked, the rest as the form has it;
    its run id, from the run's page the UI goes to (a TimeoutException where the UI does not answer as expected)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 60)
    driver.get(f"{url}/dags/{DAG}")
    wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "[data-testid=trigger-dag-button]"))).click()
    wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, "[data-scope=dialog][data-part=content]")))
    # the source param (an enum) is a select box: a real mouse click opens it, a plain one is intercepted
    box = wait.until(EC.visibility_of_element_located((By.ID, "element_source")))
    ActionChains(driver).move_to_element(box).click().perform()
    wait.until(EC.element_to_be_clickable((By.XPATH, f"//*[@role='option' and normalize-space()='{source}']"))).click()
    wait.until(lambda d: d.find_element(By.NAME, "element_source").get_attribute("value") == source)
    assert driver.find_element(By.NAME, "element_type").get_attribute("value") == "full"
    driver.find_element(By.CSS_SELECTOR, "[data-testid=trigger-dag-submit]").click()
    wait.until(lambda d: f"/dags/{DAG}/runs/" in d.current_url)
    return unquote(driver.current_url.split(f"/dags/{DAG}/runs/", 1)[1].split("?")[0].rstrip("/"))


@pytest.fixture(scope="module", autouse=True)
def runs(stack, browser, tmp_path_factory):
    """The module's two runs of walvault_backup, started before any test waits on one: `failed`, of the broken
    source, through the REST API, and `ui`, of ls, from the trigger form in the browser (None and `ui_error` when
    the form did not do as expected). max_active_runs=1 queues the second; the tests' browser work (the connection
    form first) goes on meanwhile. A run each costs a Spark job and the scheduler's rounds: the checks share them."""
    from selenium.common.exceptions import TimeoutException

    api = Api(stack)
    api.unpause(DAG)  # the form's own "unpause on trigger" is not what is tested here
    failed = api.trigger(DAG, {"source": "broken", "type": "full", "verify": True, "spark": "spark_default"})
    try:
        return {"failed": failed, "ui": _trigger_from_the_form(browser, stack["url"], "ls"), "ui_error": None}
    except (TimeoutException, AssertionError) as e:  # said by the test of that run: the others go on
        error = f"{e} {_page_dump(browser, tmp_path_factory.mktemp('trigger'), 'trigger')}"
        return {"failed": failed, "ui": None, "ui_error": error}


def _xcom(api: Api, run_id: str, task_id: str):
    value = api.call("GET", f"{api.run_path(DAG, run_id)}/taskInstances/{task_id}/xcomEntries/return_value",
                     params={"map_index": 0})["value"]
    return json.loads(value) if isinstance(value, str) else value


def _ui_run(api: Api, runs: dict) -> dict:
    """The run triggered from the form, once it succeeded."""
    if runs["ui"] is None:
        pytest.fail(f"the trigger form did not do as expected: {runs['ui_error']}")
    return api.wait_success(DAG, runs["ui"])


def test_a_repository_connection_from_the_form_and_its_test_button(stack, browser, tmp_path):
    """Admin > Connections > Add: the walvault_repo type shows walvault's fields (S3's keys as login and password, no
    host, port or schema; the repository URL and storage options under Extra Fields), the form stores the URL in
    the extra, and the row's Test button answers what the hook says: the repository and its format, or why a path
    holds none. (First in the module: the runs go on meanwhile; its repository is its own, not theirs.)"""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    api, url, driver, repo = Api(stack), stack["url"], browser, new_repository(tmp_path / "repo")
    wait, key_wait = WebDriverWait(driver, 60), WebDriverWait(driver, 10, poll_frequency=0.02)

    def shown_labels() -> set[str]:
        return {label.text.splitlines()[0] for label in driver.find_elements(By.TAG_NAME, "label")
                if label.is_displayed() and label.text.strip()}

    def add(conn_id: str, repo_url: str) -> tuple[set[str], set[str]]:
        """The connection added through the form; the labels it showed: with the standard fields, with the extra."""
        driver.get(f"{url}/connections")
        wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Add Connection']"))).click()
        wait.until(EC.visibility_of_element_located((By.NAME, "connection_id"))).send_keys(conn_id)
        # the type is a react-select: what is typed filters its options, one of which is clicked
        wait.until(EC.visibility_of_element_located(
            (By.CSS_SELECTOR, "[data-scope=dialog][data-part=content] input[role=combobox]"))
        ).send_keys("walvault repository")
        wait.until(EC.element_to_be_clickable(
            (By.XPATH, "//*[@role='option' and normalize-space()='walvault repository']"))).click()
        wait.until(EC.visibility_of_element_located((By.NAME, "login")))
        standard = shown_labels()
        # the extra fields are an accordion item of their own, closed until opened (it closes the standard one)
        wait.until(EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Extra Fields']"))).click()
        field = wait.until(EC.visibility_of_element_located((By.ID, "element_url")))
        wait.until(EC.text_to_be_present_in_element((By.ID, "element_options"), "{}"))  # its JSON editor mounted
        extra = shown_labels()
        # a key at a time, each awaited in the field: typed at once, a key of a long path now and then went missing
        for typed in range(1, len(repo_url) + 1):
            field.send_keys(repo_url[typed - 1])
            key_wait.until(lambda _, prefix=repo_url[:typed]: field.get_attribute("value") == prefix)
        driver.find_element(By.XPATH, "//button[normalize-space()='Save']").click()
        wait.until(EC.visibility_of_element_located((By.XPATH, f"//td[normalize-space()='{conn_id}']")))
        # Airflow 3.3.2's Test button sends port Number(null) = 0 for a connection without one, and its API refuses
        # a port other than the stored one (400, apache/airflow#73298, fixed after 3.3.2): stored as 0 until then
        api.call("PATCH", f"/connections/{conn_id}", params={"update_mask": "port"},
                 json={"connection_id": conn_id, "conn_type": "walvault_repo", "port": 0})
        return standard, extra

    def test_answer(conn_id: str) -> str:
        """What the row's Test button answers: the toast's title and message."""
        driver.get(f"{url}/connections")
        button = (By.XPATH, f"//tr[td[normalize-space()='{conn_id}']]//button[@aria-label='Test Connection']")

        def clicked(d) -> bool:
            (found := EC.element_to_be_clickable(button)(d)) and found.click()
            return bool(found)

        # the list may render its rows again between the button's lookup and its click: looked up again then
        WebDriverWait(driver, 60, ignored_exceptions=[StaleElementReferenceException]).until(clicked)
        toast = (By.XPATH, "//*[@data-scope='toast' and @data-part='root']")

        def answered(d) -> str | bool:  # the toast shows its title before its description: both are waited for
            found = EC.visibility_of_element_located(toast)(d)
            return bool(found) and "\n" in found.text and found.text

        return WebDriverWait(driver, 60, ignored_exceptions=[StaleElementReferenceException]).until(answered)

    bad = tmp_path / "no-repository"
    try:
        standard, extra = add("walvault_repo_ui", str(repo))
        answer = test_answer("walvault_repo_ui")
        add("walvault_repo_ui_bad", str(bad))
        refused = test_answer("walvault_repo_ui_bad")
    except TimeoutException as e:
        pytest.fail(f"the connection form did not do as expected: {e.msg} {_page_dump(driver, tmp_path, 'conn')}")
    assert {"S3 access key id", "S3 secret access key"} <= standard, standard
    assert not {"Host", "Port", "Schema", "Login", "Password"} & standard, standard
    assert {"Repository URL", "Storage options"} <= extra, extra
    assert answer == f"Test Connection Successful\nwalvault repository {repo} (format 1)", answer
    assert refused.startswith(f"Test Connection Failed\n{bad} ") and "holds no walvault repository" in refused, refused
    stored = api.call("GET", "/connections/walvault_repo_ui")
    assert stored["conn_type"] == "walvault_repo" and json.loads(stored["extra"])["url"] == str(repo), stored


def test_backup_triggered_from_the_ui_in_a_browser(stack, browser, runs, tmp_path):
    """The run the form triggered: each task succeeded (the API and the run's page say so), the repository holds
    its full backup, intact, and the record and verify tasks' XComs name it."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    api, url, driver, repo = Api(stack), stack["url"], browser, stack["repo"]
    run = _ui_run(api, runs)
    run_id = run["dag_run_id"]
    assert run["conf"]["source"] == "ls" and run["conf"]["type"] == "full" and run["conf"]["verify"] is True, run
    assert run["run_type"] == "manual" and run["triggered_by"] == "ui", run
    states = {(t["task_id"], t["map_index"]): t["state"] for t in api.task_instances(DAG, run_id)}
    assert states == {("plan", -1): "success", ("backup_source.spark_backup", 0): "success",
                      ("backup_source.record", 0): "success", ("backup_source.verify", 0): "success",
                      ("backup_source.publish", 0): "success", ("clean_up", -1): "success"}, states

    # the run page shows the run and each of its tasks in success
    driver.get(f"{url}/dags/{DAG}/runs/{quote(run_id, safe='')}")
    header = (f"//h2[contains(normalize-space(), '{run_id}')]"
              "/following-sibling::*[@data-testid='state-badge']")
    wait = WebDriverWait(driver, 60)
    try:
        wait.until(EC.text_to_be_present_in_element((By.XPATH, header), "Success"))
        wait.until(lambda d: len([b for b in d.find_elements(By.CSS_SELECTOR, "td [data-testid=state-badge]")
                                  if b.text.strip() == "Success"]) == 6)
    except TimeoutException:
        pytest.fail(f"the run page does not show the run and its 6 tasks in success "
                    f"{_page_dump(driver, tmp_path, 'run')}")
    shot = tmp_path / "walvault_backup_run.png"
    assert driver.save_screenshot(str(shot)) and shot.stat().st_size > 0
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    backups = [b for b in _backups(repo) if b["family"] == "limestone"]
    assert [(b["type"], b["status"]) for b in backups] == [("full", "ok")], backups
    proc = run_cli("verify", "--repo", repo, "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["intact"] is True, proc.stdout + proc.stderr
    # what the record and verify tasks returned, as the UI shows them: their XComs, map index 0
    recorded = _xcom(api, run_id, "backup_source.record")
    assert recorded["id"] == backups[0]["id"] and recorded["family"] == "limestone" and recorded["type"] == "full", \
        recorded
    verified = _xcom(api, run_id, "backup_source.verify")
    assert verified["id"] == backups[0]["id"] and verified["objects"] > 0, verified


def test_the_assets_view_shows_backup_then_snapshot_then_retention(stack, browser, runs, tmp_path):
    """A source's backup asset in the Assets view: its graph links walvault_backup (through the alias its publish
    task adds the source's event by), the asset, walvault_snapshot scheduled on it, the snapshot asset and
    walvault_retention scheduled on that. The alias resolves with the first backup: the form's run of ls."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    api, url, driver = Api(stack), stack["url"], browser
    backed_up = _ui_run(api, runs)
    uri = "walvault://walvault_repo/ls/backup"
    (asset,) = api.call("GET", "/assets", params={"uri_pattern": uri})["assets"]
    (event, *_) = api.call("GET", "/assets/events", params={"asset_id": asset["id"], "order_by": "-timestamp"}
                           )["asset_events"]
    assert event["source_dag_id"] == DAG and event["source_run_id"] == backed_up["dag_run_id"], event
    assert event["extra"]["source"] == "ls" and event["extra"]["id"], event
    assert [d["dag_id"] for d in asset["scheduled_dags"]] == ["walvault_snapshot"], asset

    wait = WebDriverWait(driver, 60)
    chain = ("walvault_backup", "walvault_snapshot", "walvault_retention")
    try:
        driver.get(f"{url}/assets/{asset['id']}")
        wait.until(lambda d: all(name in d.find_element(By.TAG_NAME, "body").text for name in chain))
    except TimeoutException:
        path = tmp_path / "assets.png"
        driver.save_screenshot(str(path))
        pytest.fail(f"the Assets view of {uri} does not show {' -> '.join(chain)} (page: {path})\n"
                    + driver.find_element(By.TAG_NAME, "body").text[:3000])


def test_a_failed_backup_shows_its_failed_task_by_source_with_its_cause(stack, browser, runs, tmp_path):
    """A backup, triggered through the REST API, of a source walvault refuses (a limestone pwal broken where its
    first entry must start: exit 1, no retry): the run's note names the failed task by its source and the cause;
    the run page lists the failed task under its source's label, and the task's page, reached from there, shows
    the cause in its log."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    api, url, driver, run_id = Api(stack), stack["url"], browser, runs["failed"]
    run = api.wait_finished(DAG, run_id)
    assert run["state"] == "failed", api.diagnose(DAG, run_id)
    assert run["run_type"] == "manual" and run["triggered_by"] == "rest_api", run
    states = {(t["task_id"], t["rendered_map_index"]): t["state"] for t in api.task_instances(DAG, run_id)}
    assert states[("backup_source.spark_backup", "broken")] == "failed", states
    broken = stack["broken"]
    cause = f"walvault exited 1: walvault: not backed up: {broken} is repairable"
    note = run["note"] or ""
    failed = next((line for line in note.splitlines()
                   if line.startswith("- FAILED backup_source.spark_backup [broken]: ")), "")
    assert f"AirflowFailException: {cause}" in failed and f"{stack['broken_pwal']}: broken_tail at 0" in failed, note

    wait = WebDriverWait(driver, 60)
    row = "//tr[td[normalize-space()='backup_source.spark_backup'] and td[normalize-space()='broken']]"
    try:
        driver.get(f"{url}/dags/{DAG}/runs/{quote(run_id, safe='')}")
        wait.until(EC.text_to_be_present_in_element((By.XPATH, f"{row}//*[@data-testid='state-badge']"), "Failed"))
        wait.until(EC.element_to_be_clickable((By.XPATH, f"{row}/td[normalize-space()='broken']//a"))).click()
        header = "//h2[normalize-space()='backup_source.spark_backup [broken]']"
        wait.until(EC.text_to_be_present_in_element(
            (By.XPATH, f"{header}/following-sibling::*[@data-testid='state-badge']"), "Failed"))
        # the log, shown first, ends with the task's exception: walvault's own line
        wait.until(EC.text_to_be_present_in_element(
            (By.CSS_SELECTOR, "[data-testid=summary-AirflowFailException]"), cause))
    except TimeoutException as e:
        pytest.fail(f"the failed run's pages do not show it: {e.msg} {_page_dump(driver, tmp_path, 'failed')}")
