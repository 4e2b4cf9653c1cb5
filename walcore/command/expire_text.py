"""How an expiry's plan or result is said, by the CLI (`walvault expire`) and the Airflow tasks alike: per
source its anchor or why it is uncovered, each deletion and its reason, what is kept and why."""

from __future__ import annotations

from collections import Counter

from .expire import ExpireResult, SourcePlan, iso

APPLY_HINT = "run with --apply to carry it out"


def render_source(s: SourcePlan) -> list[str]:
    anchor = s.anchor
    lines = [f"{s.family} {s.instance}: " + (f"anchor {anchor['name']} at {anchor['position']} ({anchor['time']})"
                                             if anchor else "UNCOVERED: no verified snapshot at or before the "
                                             "window's start; nothing of it is deleted")]
    if len(s.identities) > 1:  # a copy of the source beside it: each source identity has its own anchor
        lines += [f"  source {i['host']}:{i['path']}: " + (f"anchor {i['anchor']['name']}" if i["anchor"] else "UNCOVERED")
                  for i in s.identities]
    lines += [f"  {'deleted' if n < s.deleted else 'delete'}  {item.path}: {item.reason}"
              for n, item in enumerate(s.delete)]
    kept = sorted(Counter(k["reason"] for k in s.keep).items(), key=lambda kv: -kv[1])
    lines.append(f"  keep {len(s.keep)}: " + ", ".join(f"{n} {why}" for why, n in kept))
    if s.blocked:
        lines.append(f"  blocked: {s.blocked}")
    if s.stopped:
        lines.append(f"  STOPPED: {s.stopped}")
    return lines


def render(result: ExpireResult, apply_hint: str = APPLY_HINT) -> list[str]:
    """The whole report; `apply_hint`: how to carry out a plan (the CLI's flag, or a DAG's way)."""
    lines = [f"policy: keep every point of the last {result.days} days, as of {iso(result.as_of)}"]
    for s in result.sources:
        lines += render_source(s)
    if result.applied:
        lines.append(f"{result.deleted} deleted" + (f"; audit log {result.audit}" if result.audit else ""))
    else:
        lines.append(f"plan only: {sum(len(s.delete) for s in result.sources)} to delete, nothing was changed "
                     f"({apply_hint})")
    return lines
