"""A job's plan: the JSON that says what to do, and the request (walcore.requests) it stands for.

    {"job": "verify" | "backup" | "limestone_state",
     "sources": [paths],                 verify: files and directories; backup, limestone_state: one directory
     "backup": id | "latest" | null,     verify: a backup of the repository instead of sources
     "repo": URL | null,                 the repository (verify: where the report and the ledger go)
     "repo_options": {...},              fsspec storage options (secrets: prefer the environment)
     "parquet": URL | null,              limestone_state: where the Parquet parts go
     "options": {"full", "json", "progress", "type", "level", "wait", "connect"},
     "output": dir | null}               where the job leaves what the command prints, and its exit code

With an `output` dir, the job exits 0 once the command's exit code is in `output/result.json`, and a plan given
as `@file` is removed then (it may hold credentials). `connect` is [user[:password]@]host:port; without a password
the driver's WALVAULT_PASSWORD gives it, as for the command line.
"""

from __future__ import annotations

import json
import os

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


def request(plan: dict, job: str):
    """The request (walcore.requests) a plan stands for; PlanError naming the bad key."""
    from walcore.requests import BackupRequest, StateRequest, VerifyRequest

    _check(plan, job)
    sources = plan.get("sources") or []
    common = {"repo_options": plan.get("repo_options") or {}, **(plan.get("options") or {})}
    if job == "verify":
        if plan.get("backup") and sources:
            raise PlanError("backup: verify either sources or a backup, not both")
        if plan.get("backup") and not plan.get("repo"):
            raise PlanError("repo: verifying a backup needs the repository")
        if not sources and not plan.get("repo"):
            raise PlanError("sources: verify needs sources, or a repository")
        return VerifyRequest.from_json({"paths": sources, "backup": plan.get("backup"), "repo": plan.get("repo"),
                                        **common})
    if len(sources) != 1:
        raise PlanError(f"sources: {job} takes one source directory")
    if job == "backup":
        if not plan.get("repo"):
            raise PlanError("repo: a backup needs the repository")
        return BackupRequest.from_json({"source": sources[0], "repo": plan["repo"], **common})
    return StateRequest.from_json({"dir": sources[0], "parquet": plan.get("parquet"), **common})


def of_request(request) -> tuple[str, dict]:
    """The job and plan of a request (`walvault ... --spark`)."""
    from walcore.requests import BackupRequest, VerifyRequest

    fields = request.to_json()
    if isinstance(request, VerifyRequest):
        job = "verify"
        plan = {"sources": fields["paths"], "backup": fields["backup"], "repo": fields["repo"]}
    elif isinstance(request, BackupRequest):
        job = "backup"
        plan = {"sources": [fields["source"]], "repo": fields["repo"]}
    else:
        job = "limestone_state"
        plan = {"sources": [fields["dir"]], "parquet": fields["parquet"]}
    plan["repo_options"] = fields["repo_options"]
    plan["options"] = {k: fields[k] for k in OPTIONS[job] if fields.get(k) is not None}
    return job, plan
