"""A job's plan: the JSON that says what to do, and the walvault command line it stands for.

    {"job": "verify" | "backup" | "limestone_state",
     "sources": [paths],                 verify: files and directories; backup, limestone_state: one directory
     "backup": id | "latest" | null,     verify: a backup of the repository instead of sources
     "repo": URL | null,                 the repository (verify: where the report and the ledger go)
     "repo_options": {...},              fsspec storage options (secrets: prefer the environment)
     "parquet": URL | null,              limestone_state: where the Parquet parts go
     "options": {"full", "json", "progress", "type", "level", "wait", "connect"},
     "output": dir | null}               where the job leaves what the command prints, and its exit code
"""

from __future__ import annotations

import json

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


def to_argv(plan: dict, job: str) -> list[str]:
    """The walvault command line a plan stands for."""
    if plan.get("job", job) != job:
        raise PlanError(f"job: the plan is for {plan.get('job')!r}, given to the {job} job")
    unknown = set(plan) - {"job", "sources", "backup", "repo", "repo_options", "parquet", "options", "output"}
    if unknown:
        raise PlanError(f"unknown plan keys: {', '.join(sorted(unknown))}")
    sources = plan.get("sources") or []
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise PlanError("sources: a list of paths")
    options = plan.get("options") or {}
    if not isinstance(options, dict) or set(options) - set(OPTIONS[job]):
        raise PlanError(f"options: {job} takes {', '.join(OPTIONS[job]) or 'none'}")
    storage = [f"--repo-option={k}={json.dumps(v)}" for k, v in sorted((plan.get("repo_options") or {}).items())]
    argv = [JOBS[job]]
    if job == "verify":
        if plan.get("backup") and sources:
            raise PlanError("backup: verify either sources or a backup, not both")
        if plan.get("backup") and not plan.get("repo"):
            raise PlanError("repo: verifying a backup needs the repository")
        if not sources and not plan.get("repo"):
            raise PlanError("sources: verify needs sources, or a repository")
        argv += sources + ([plan["backup"]] if plan.get("backup") else [])
        argv += ["--full"] if options.get("full") else []
    else:
        if len(sources) != 1:
            raise PlanError(f"sources: {job} takes one source directory")
        argv += sources
    if job in ("verify", "backup"):
        if job == "backup" and not plan.get("repo"):
            raise PlanError("repo: a backup needs the repository")
        argv += ["--repo", plan["repo"], *storage] if plan.get("repo") else []
    if job == "backup":
        argv += ["--type", str(options.get("type", "full")), "--level", str(options.get("level", 3)),
                 "--wait", str(options.get("wait", 0))]
        argv += ["--connect", options["connect"]] if options.get("connect") else []
    if job == "limestone_state" and plan.get("parquet"):
        argv += ["--parquet", plan["parquet"], *storage]
    argv += ["--json"] if options.get("json") else []
    if "progress" in options:
        argv += ["--progress" if options["progress"] else "--no-progress"]
    return argv


def from_args(args) -> tuple[str, dict]:
    """The job and plan of a walvault command line given `--spark`."""
    from walcore.repository.storage import parse_options

    progress = getattr(args, "progress", None)
    options: dict = {"progress": bool(progress)} if progress is not None else {}
    plan: dict = {"repo_options": parse_options(getattr(args, "repo_option", []))}
    if args.command == "verify":
        job = "verify"
        paths = [str(p) for p in args.paths]
        names_backup = bool(args.repo) and len(paths) == 1 and _is_backup(paths[0])
        plan.update(sources=[] if names_backup else paths, backup=paths[0] if names_backup else None, repo=args.repo)
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


def _is_backup(text: str) -> bool:
    from walcore.repository import is_backup_id

    return text == "latest" or is_backup_id(text)
