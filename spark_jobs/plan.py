"""A job's plan: the JSON that says what to do, and the walvault command line it stands for.

    {"job": "verify" | "backup" | "limestone_state",
     "sources": [paths],                 verify: files and directories; backup, limestone_state: one directory
     "backup": id | "latest" | null,     verify: a backup of the repository instead of sources
     "repo": URL | null,                 the repository (verify: where the report and the ledger go)
     "repo_options": {...},              fsspec storage options (secrets: prefer the environment)
     "parquet": URL | null,              limestone_state: where the Parquet parts go
     "options": {"full", "json", "progress", "type", "level", "wait", "connect"},
     "output": dir | null}               where the job leaves what the command prints, and its exit code

With an `output` dir, the job exits 0 once the command's exit code is in `output/result.json`, and a plan given
as `@file` is removed then (it may hold credentials). `connect` is [user[:password]@]host:port: its password goes
to the command through the job's environment, never through the command line the plan stands for.
"""

from __future__ import annotations

import json
import os

from walcore.tarantool.live import split_password

JOBS = {"verify": "verify", "backup": "backup", "limestone_state": "state"}
OPTIONS = {"verify": ("full", "json", "progress"), "backup": ("type", "level", "wait", "connect", "json", "progress"),
           "limestone_state": ()}


class PlanError(ValueError):
    """A plan that does not say one thing to do: the message names the bad key."""


def load(text: str) -> dict:
    """A plan from its JSON text, or from `@path` naming a file holding it."""
    if text.startswith("@"):
        with open(text[1:], encoding="utf-8") as f:
            text = f.read()
    try:
        plan = json.loads(text)
    except ValueError as e:
        raise PlanError(f"the plan is not JSON: {e}") from None
    if not isinstance(plan, dict):
        raise PlanError("the plan is not a JSON object")
    return plan


_TYPES = {"job": str, "sources": list, "backup": str, "repo": str, "repo_options": dict, "parquet": str,
          "options": dict, "output": str}
_OPTION_TYPES = {"full": bool, "json": bool, "progress": bool, "type": str, "level": int, "wait": (int, float),
                 "connect": str}


def _check(plan: dict, job: str) -> None:
    unknown = set(plan) - set(_TYPES)
    if unknown:
        raise PlanError(f"unknown plan keys: {', '.join(sorted(unknown))}")
    for key, kind in _TYPES.items():
        if plan.get(key) is not None and not isinstance(plan[key], kind):
            raise PlanError(f"{key}: a {kind.__name__}, not {type(plan[key]).__name__}")
    if plan.get("job", job) != job:
        raise PlanError(f"job: the plan is for {plan.get('job')!r}, given to the {job} job")
    if not all(isinstance(s, str) and s for s in plan.get("sources") or []):
        raise PlanError("sources: a list of paths")
    options = plan.get("options") or {}
    if set(options) - set(OPTIONS[job]):
        raise PlanError(f"options: {job} takes {', '.join(OPTIONS[job]) or 'none'}")
    for key, value in options.items():
        kind = _OPTION_TYPES[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise PlanError(f"options.{key}: not a {getattr(kind, '__name__', 'number')}")
    if plan.get("output") is not None and not os.path.isdir(plan["output"]):
        raise PlanError(f"output: {plan['output']} is not a directory")


def to_argv(plan: dict, job: str) -> list[str]:
    """The walvault command line a plan stands for (options first, then `--` and the sources, so that no
    source can be taken for an option)."""
    _check(plan, job)
    sources = plan.get("sources") or []
    options = plan.get("options") or {}
    storage = [f"--repo-option={k}={json.dumps(v)}" for k, v in sorted((plan.get("repo_options") or {}).items())]
    flags: list[str] = []
    positional = list(sources)
    if job == "verify":
        if plan.get("backup") and sources:
            raise PlanError("backup: verify either sources or a backup, not both")
        if plan.get("backup") and not plan.get("repo"):
            raise PlanError("repo: verifying a backup needs the repository")
        if not sources and not plan.get("repo"):
            raise PlanError("sources: verify needs sources, or a repository")
        positional += [plan["backup"]] if plan.get("backup") else []
        flags += ["--full"] if options.get("full") else []
    elif len(sources) != 1:
        raise PlanError(f"sources: {job} takes one source directory")
    if job == "backup" and not plan.get("repo"):
        raise PlanError("repo: a backup needs the repository")
    if job in ("verify", "backup") and plan.get("repo"):
        flags += [f"--repo={plan['repo']}", *storage]
    if job == "backup":
        flags += [f"--type={options.get('type', 'full')}", f"--level={options.get('level', 3)}",
                  f"--wait={options.get('wait', 0)}"]
        flags += [f"--connect={split_password(options['connect'])[0]}"] if options.get("connect") else []
    if job == "limestone_state" and plan.get("parquet"):
        flags += [f"--parquet={plan['parquet']}", *storage]
    flags += ["--json"] if options.get("json") else []
    if "progress" in options:
        flags += ["--progress" if options["progress"] else "--no-progress"]
    return [JOBS[job], *flags, "--", *positional]


def connect_password(plan: dict) -> str | None:
    """The password in the plan's `connect` URI: the job hands it to the command through the environment
    (WALVAULT_PASSWORD), never through the command line to_argv builds."""
    connect = (plan.get("options") or {}).get("connect")
    return split_password(connect)[1] if connect else None


def from_args(args) -> tuple[str, dict]:
    """The job and plan of a walvault command line given `--spark`."""
    from walcore.cli import names_backup
    from walcore.repository.storage import parse_options

    progress = getattr(args, "progress", None)
    options: dict = {"progress": bool(progress)} if progress is not None else {}
    plan: dict = {"repo_options": parse_options(getattr(args, "repo_option", []))}
    if args.command == "verify":
        job = "verify"
        paths = [str(p) for p in args.paths]
        backup = bool(args.repo) and names_backup(args.paths)  # the command line said one BACKUP at most
        plan.update(sources=[] if backup else paths, backup=paths[0] if backup else None, repo=args.repo)
        options.update(full=args.full, json=args.json)
    elif args.command == "backup":
        job = "backup"
        plan.update(sources=[str(args.source)], repo=args.repo)
        options.update(type=args.type, level=args.level, wait=args.wait, json=args.json,
                       **({"connect": args.connect} if args.connect else {}))
    else:
        job = "limestone_state"
        plan.update(sources=[str(args.dir)], parquet=args.parquet)
        options = {}
    plan["options"] = options
    return job, plan

