"""The documentation — README.md and the guide in docs/, a MkDocs site (mkdocs.yml) — cannot drift from the code.

- The site builds with `mkdocs build --strict`: no broken link or anchor, no page left out of the navigation.
- Every shell line of a code block is accounted for. A `walvault` command parses against the real command line
  (argparse's own parse, stopped before the command runs); a synopsis (`walvault backup SOURCE --repo URL
  [--type full|incremental] ...`) is parsed with every option it shows, its placeholders filled in.
- Every whole `walvault` command (no placeholder) is run, each page's in the order shown, in a scratch
  directory holding a copy of samples/, and must exit 0 — but for those NOT_RUN lists, with the reason.
- A `spark-submit` line's plan must load and stand for a walvault command that parses; a benchmark's or
  script's command line parses against its own argument parser; every other line is listed in OTHER_COMMANDS
  with the reason it is not run here; a file of the checkout that a line names exists.
- README.md's links into docs/ lead to pages and anchors of the built site.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import copy_tree, walvault_command

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Whole walvault commands shown but not run here, and why.
NOT_RUN = {
    "walvault verify samples --spark spark://127.0.0.1:7077":
        "needs the standalone cluster the lines before it start; tests/test_spark_submit.py runs the verify job "
        "on a standalone master and worker and compares it with the command",
}

# Shell lines that are not walvault commands, by their start, and why they are not run here.
OTHER_COMMANDS = {
    "scripts/setup": "installs Debian packages and the venv, then runs the main job (minutes); tests/test_dags.py "
                     "runs the DAGs of its pipeline",
    "scripts/test": "the whole test suite, this file included",
    "PYTHON=/path/to/python3.11 scripts/setup": "scripts/setup on another interpreter",
    ".venv/bin/python scripts/pipeline.py": "the main job scripts/setup runs (minutes, a real Tarantool and Airflow); "
                                            "tests/test_dags.py runs its DAGs",
    ".venv/bin/python -m pytest": "the test suite itself",
    "WALVAULT_NEMESIS_SCHEDULES=20 .venv/bin/python -m pytest": "the test suite itself, longer",
    ".venv/bin/spark-class": "starts a Spark master or worker that stays up (spark_jobs/cluster.py starts the same "
                             "for tests/test_spark_submit.py)",
    "export": "sets the environment of the lines after it",
    "kill %2 %1": "stops the jobs the lines before it started",
    "airflow db migrate": "Airflow against the configuration the lines before it export; tests/test_dags.py migrates "
                          "and runs the DAGs",
    "airflow dags test": "needs a configuration of your own (WALVAULT_CONFIG); tests/test_dags.py runs every DAG",
    "docker-compose": "needs a Docker engine, which does not run here; tests/test_compose.py validates "
                      "docker-compose.yml with docker-compose config -q",
    ".venv/bin/mkdocs": "serve stays up, build writes site/ into the checkout; test_site_builds builds it",
}

# Python scripts whose command lines shown are parsed by their own argument parser.
PARSED_SCRIPTS = {"bench/verify_tarantool.py", "bench/verify_limestone.py", "bench/backup.py",
                  "bench/verify_spark.py", "bench/airflow_pipeline.py", "bench/fuzz_scan.py", "bench/nemesis.py",
                  "scripts/ui.py", "bench/rpo.py"}

# What a synopsis's placeholder stands for when it is parsed.
PLACEHOLDERS = {"PATH": "samples", "SOURCE": "samples/tarantool/features", "URL": "var/repository",
                "BACKUP": "latest", "TARGET": "var/restored", "DIR": "samples/limestone/01-clean",
                "MASTER": "local[2]", "N": "7", "S": "10", "FILE": "password.txt", "TIME": "2026-01-01T00:00:00Z",
                "USER@HOST:PORT": "backup@127.0.0.1:3301", "K=V": "key=value", "HOST:PORT": "127.0.0.1:9477",
                "HOURS": "26", "MINUTES": "60", "B": "16777216", "TEXT": "kept for the audit"}
WALVAULT = ("walvault", ".venv/bin/walvault")


def shell_lines(page: Path) -> list[str]:
    """The command lines of a page's shell code blocks, continuation lines joined, comment lines left out."""
    lines, block, pending = [], None, ""
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            block = line[3:].strip() if block is None else None
            continue
        if block not in ("sh", "bash"):
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def all_lines() -> list[tuple[str, str]]:
    return [(page.relative_to(REPO).as_posix(), line) for page in PAGES for line in shell_lines(page)]


def words(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def is_synopsis(argv: list[str]) -> bool:
    return any(re.search(r"[\[\]|]|\.\.\.|^[A-Z][A-Z0-9_]*(=|$)|[A-Z]+@", w) for w in argv[1:])


def filled_in(argv: list[str]) -> list[str]:
    """A synopsis as a command line: every optional part taken, the first of alternatives, placeholders filled."""
    out = []
    for word in words(" ".join(argv[1:]).replace("[", "").replace("]", "").replace("...", "")):
        word = word.split("|")[0]
        if re.fullmatch(r"[A-Z][A-Z0-9_@:=]*", word):
            assert word in PLACEHOLDERS, f"a placeholder this test does not know: {word} (add it to PLACEHOLDERS)"
            word = PLACEHOLDERS[word]
        out.append(word)
    return out


def as_parsed(argv: list[str]) -> list[str]:
    """The arguments of a command line shown (argv[0] left out), a synopsis filled in."""
    return filled_in(argv) if is_synopsis(argv) else argv[1:]


def walvault_lines() -> list[tuple[str, list[str]]]:
    return [(page, words(line)) for page, line in all_lines() if line.split()[0] in WALVAULT]


class _Parsed(Exception):
    pass


def parse_walvault(argv: list[str], monkeypatch, capsys) -> None:
    """Parse a walvault command line with the real CLI's parser (through the `walvault` entry point), stopped as
    soon as it has parsed."""
    from walcore import cli

    parse_args = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
        patch.setattr(sys, "argv", ["walvault", *argv])
        try:
            cli.run()
        except _Parsed:
            return
        except SystemExit as e:
            assert e.code == 0, f"walvault {shlex.join(argv)} does not parse: {capsys.readouterr().err.strip()}"
            return  # --version, --help
    pytest.fail(f"walvault {shlex.join(argv)}: the command line was never parsed")


def test_site_builds(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # README.md is not part of the site, so the build does not see its links: check them against what it built.
    for target in re.findall(r"\]\((docs/[^)\s]+)\)", (REPO / "README.md").read_text()):
        path, _, anchor = target.partition("#")
        page = tmp_path / "site" / ("" if path == "docs/index.md" else Path(path).relative_to("docs").with_suffix(""))
        html = (page / "index.html").read_text()
        assert not anchor or f'id="{anchor}"' in html, f"README links to {target}: no such anchor"


def test_every_shell_line_is_accounted_for():
    for page, line in all_lines():
        argv = words(line)
        if argv[0] in WALVAULT or argv[0] == ".venv/bin/spark-submit":
            continue
        if argv[0] == ".venv/bin/python" and argv[1] in PARSED_SCRIPTS:
            continue
        assert any(line == start or line.startswith(start + " ") for start in OTHER_COMMANDS), \
            f"{page}: {line!r} is neither run, parsed nor listed in OTHER_COMMANDS with a reason"
        for word in argv:
            if re.match(r"(bench|scripts|spark_jobs|tests|dags|deploy|plugins)/", word):
                assert (REPO / word).exists(), f"{page}: {line!r} names {word}, which is not in the checkout"


def test_walvault_commands_parse(monkeypatch, capsys):
    lines = walvault_lines()
    assert len(lines) > 30
    for page, argv in lines:
        parse_walvault(as_parsed(argv), monkeypatch, capsys)


def test_spark_submit_plans_parse():
    from spark_jobs import plan

    submits = [(page, words(line)) for page, line in all_lines() if line.startswith(".venv/bin/spark-submit ")]
    assert submits
    for page, argv in submits:
        script = next(w for w in argv if w.startswith("spark_jobs/"))
        assert (REPO / script).is_file(), f"{page}: {script} is not in the checkout"
        request = plan.request(plan.load(argv[-1]), Path(script).stem)  # PlanError on a bad key or value
        assert request.problem() is None, f"{page}: {argv[-1]}: {request.problem()}"


def test_script_command_lines_parse():
    stop_after_parse = ("import argparse, runpy, sys\n"
                        "parse_args = argparse.ArgumentParser.parse_args\n"
                        "def parse_and_stop(self, *args, **kwargs):\n"
                        "    parse_args(self, *args, **kwargs)\n"
                        "    raise SystemExit(0)\n"
                        "argparse.ArgumentParser.parse_args = parse_and_stop\n"
                        "sys.argv = sys.argv[1:]\n"
                        "sys.path.insert(0, sys.argv[0].rpartition('/')[0])\n"
                        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
                        "sys.exit('the script ran without parsing its command line')\n")
    scripts = [(page, words(line)) for page, line in all_lines()
               if line.startswith(".venv/bin/python ") and words(line)[1] in PARSED_SCRIPTS]
    assert len(scripts) >= 8
    for page, argv in scripts:
        proc = subprocess.run([sys.executable, "-c", stop_after_parse, argv[1], *as_parsed(argv[1:])], cwd=REPO,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{page}: {shlex.join(argv)} does not parse: {proc.stderr[-2000:]}"


def whole_commands(page: str) -> list[list[str]]:
    return [argv for shown_on, argv in walvault_lines() if shown_on == page and not is_synopsis(argv)]


@pytest.mark.parametrize("page", [name for name in (page.relative_to(REPO).as_posix() for page in PAGES)
                                  if whole_commands(name)])
def test_walvault_commands_run(page, tmp_path):
    copy_tree(REPO / "samples", tmp_path / "samples")
    for argv in whole_commands(page):
        command = shlex.join(["walvault", *argv[1:]])
        if command in NOT_RUN:
            continue
        proc = subprocess.run([*walvault_command(), *argv[1:]], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"{page}: {command} exited {proc.returncode}: {proc.stderr[-2000:]}"
