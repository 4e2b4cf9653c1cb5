"""A job's plan: the JSON that says what to do, and the request (walcore.requests) it stands for.

    {"job": "verify" | "backup" | "limestone_state",
     "sources": [paths],                 verify: files and directories; backup, limestone_state: one directory
     "backup": id | "latest" | null,     verify: a backup of the repository instead of sources
     "repo": URL | null,                 the repository (verify: where the report and the ledger go)
     "repo_options": {...},              fsspec storage options (secrets: prefer the environment)
     "repo_key": passphrase | null,      an encrypted repository's key, for the driver (its executors get the
                                         repository's keys with their tasks): the plan file's, not WALVAULT_KEY
     "parquet": URL | null,              limestone_state: where the Parquet parts go
     "options": {...},                   the request's other fields (its dataclass says them: `option_kinds`)
     "output": dir | null}               where the job leaves what the command prints, and its exit code

With an `output` dir, the job exits 0 once the command's exit code is in `output/result.json`, and a plan given
as `@file` is removed then (it may hold credentials). `connect` is [user[:password]@]host:port; without a password
the driver's WALVAULT_PASSWORD gives it, as for the command line.
"""

from __future__ import annotations

import dataclasses
import json
import os

# The request fields a plan gives as keys of its own ("sources" fills the job's field of SOURCES); a job's options
# are the request's other fields, but for what only the command line's machine uses: its worker processes, and the
# file of --connect's password, read there.
KEYS = ("backup", "repo", "repo_options", "parquet")
NOT_OPTIONS = ("jobs", "password_file")
SOURCES = {"verify": "paths", "backup": "source", "limestone_state": "dir"}


def request_class(job: str):
    from walcore.requests import BackupRequest, StateRequest, VerifyRequest

    return {"verify": VerifyRequest, "backup": BackupRequest, "limestone_state": StateRequest}[job]


# What an option's value must be, by its field's annotation (a string: the requests' module postpones them); None
# is no option's value: a plan leaves out an option it does not give.
_KINDS = {"bool": bool, "int": int, "float": (int, float), "str": str}


def option_kinds(job: str) -> dict:
    """The options of a job's plan: {name: what its value must be (object: anything)}, in the request's order."""
    return {f.name: _KINDS.get(f.type.removesuffix(" | None"), object) for f in dataclasses.fields(request_class(job))
            if f.name not in (SOURCES[job], *KEYS, *NOT_OPTIONS)}


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


_TYPES = {"job": str, "sources": list, "backup": str, "repo": str, "repo_options": dict, "repo_key": str,
          "parquet": str, "options": dict, "output": str}


def _check(plan: dict, job: str) -> None:
    unknown = set(plan) - set(_TYPES)
    if unknown:
        raise PlanError(f"unknown plan keys: {', '.join(sorted(unknown))}")
    for key, kind in _TYPES.items():
        if plan.get(key) is not None and not isinstance(plan[key], kind):
            raise PlanError(f"{key}: a {kind.__name__}, not {type(plan[key]).__name__}")
    if plan.get("repo_key") is not None and not plan.get("repo"):
        raise PlanError("repo_key: a key without the repository")
    if plan.get("job", job) != job:
        raise PlanError(f"job: the plan is for {plan.get('job')!r}, given to the {job} job")
    if not all(isinstance(s, str) and s for s in plan.get("sources") or []):
        raise PlanError("sources: a list of paths")
    options, kinds = plan.get("options") or {}, option_kinds(job)
    if set(options) - set(kinds):
        raise PlanError(f"options: {job} takes {', '.join(kinds) or 'none'}")
    for key, value in options.items():
        kind = kinds[key]
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise PlanError(f"options.{key}: not a {getattr(kind, '__name__', 'number')}")
    if plan.get("output") is not None and not os.path.isdir(plan["output"]):
        raise PlanError(f"output: {plan['output']} is not a directory")


def request(plan: dict, job: str):
    """The request (walcore.requests) a plan stands for; PlanError naming the bad key."""
    _check(plan, job)
    sources = plan.get("sources") or []
    if job == "verify":
        if plan.get("backup") and sources:
            raise PlanError("backup: verify either sources or a backup, not both")
        if plan.get("backup") and not plan.get("repo"):
            raise PlanError("repo: verifying a backup needs the repository")
        if not sources and not plan.get("repo"):
            raise PlanError("sources: verify needs sources, or a repository")
    elif len(sources) != 1:
        raise PlanError(f"sources: {job} takes one source directory")
    if job == "backup" and not plan.get("repo"):
        raise PlanError("repo: a backup needs the repository")
    kind = request_class(job)
    fields = {f.name: f.type for f in dataclasses.fields(kind)}
    given = {key: plan.get(key) for key in KEYS if key in fields} | {"repo_options": plan.get("repo_options") or {}}
    many = fields[SOURCES[job]].startswith("list")  # verify's paths, or one directory
    return kind.from_json({SOURCES[job]: sources if many else sources[0], **given, **(plan.get("options") or {})})


def of_request(request) -> tuple[str, dict]:
    """The job and plan of a request (`walvault ... --spark`)."""
    job = next(job for job in SOURCES if isinstance(request, request_class(job)))
    fields = request.to_json()
    sources = fields[SOURCES[job]]
    plan = {"sources": sources if isinstance(sources, list) else [sources]}
    plan |= {key: fields[key] for key in KEYS if key in fields}
    plan["options"] = {k: fields[k] for k in option_kinds(job) if fields[k] is not None}
    return job, plan
