"""The database families walvault knows (Tarantool, limestone): which one a source directory is, and its plan."""

from __future__ import annotations

from pathlib import Path

from .findings import Refused


def plan_for(source: Path, connect: str | None = None, *, snapshot: bool = False, check_only: bool = False):
    """The family's plan for a source directory: what to store and how to verify it (with `check_only`, only that
    SOURCE is a directory of one of them)."""
    from .limestone.layout import is_limestone_dir
    from .tarantool.layout import discover

    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"{source}: {'not a directory' if source.exists() else 'no such directory'}")
    limestone = is_limestone_dir(source)
    if not limestone and not discover([source]).data_dirs:
        raise Refused(f"{source} is neither a Tarantool data dir nor a limestone log directory", "cannot_check")
    if check_only:
        return None
    if limestone:
        if connect:
            raise Refused("--connect is for a running Tarantool; a limestone directory is backed up from an "
                          "online-backup copy or a stopped datastore", "cannot_check")
        from .limestone.backup_plan import LimestonePlan

        return LimestonePlan(source)
    from .tarantool.backup_plan import TarantoolPlan

    return TarantoolPlan(source, connect, snapshot=snapshot)
