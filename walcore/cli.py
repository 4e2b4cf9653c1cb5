"""walvault: the command line.

Exit codes, for every command: 0 done and intact; 1 findings (or, for repair and rotate, refused
because of what was found); 2 nothing could be checked or done (a path is missing or unreadable,
holds no WAL files, is in use by a running limestone, or the command line is wrong).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_FINDINGS, EXIT_CANNOT_CHECK = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse exits 2 on usage errors already; keep its message short
        self.print_usage(sys.stderr)
        self.exit(EXIT_CANNOT_CHECK, f"walvault: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="walvault", description="Check and keep the write-ahead logs of Tarantool and limestone.",
                     epilog="Exit codes: 0 intact/done, 1 findings, 2 cannot check.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_text in (("inspect", "list what is there: every file, its vclock or epochs, rows, ranges"),
                            ("verify", "check that every block, row, entry and chain link is intact")):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or directories")
        cmd.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="worker processes (default: one per core)")
        cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress lines on stderr (default: when stderr is a terminal)")
    cmd = sub.add_parser("rotate", help="detach a limestone directory's active pwal and epoch files",
                         description="Rename active pwal_NNNN files to pwal_NNNN.<ms14>.<n> and epoch to "
                         "epoch.<ms14>.<E>, only in a directory that verifies ok and no limestone holds.")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--min-bytes", type=int, default=1, metavar="N",
                     help="rotate only active pwal files of at least N bytes (default 1: every non-empty one)")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("repair", help="repair a crashed limestone directory (prints the plan unless --apply)",
                         description="Show, or with --apply carry out, what tglogutil repair does: detach active "
                         "files, cancel nondurable snippets, mark (or with --cut truncate, after saving) broken "
                         "tails.")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--apply", action="store_true", help="carry out the plan")
    cmd.add_argument("--cut", action="store_true",
                     help="with --apply: truncate broken tails (the cut bytes are saved to DIR.walvault-cut/)")
    cmd.add_argument("--json", action="store_true")
    cmd = sub.add_parser("state", help="print the durable state of a limestone directory (latest value per key)")
    cmd.add_argument("dir", type=Path, metavar="DIR")
    cmd.add_argument("--format", choices=("tsv",), default="tsv",
                     help="tsv: storage_id<TAB>key_hex<TAB>value_hex per live key, sorted")
    return parser


# What stderr says first when a command that writes or trusts a directory does not go ahead.
_NOT_DONE = {"rotate": "not rotated", "repair": "not repaired", "state": "no state"}


def main(argv: list[str] | None = None) -> int:
    from .findings import Refused
    from .limestone.layout import LiveError

    parser = _parser()
    args = parser.parse_args(argv)
    # A file name that is not valid UTF-8 must print (escaped) rather than end the run.
    sys.stdout.reconfigure(errors="backslashreplace")
    try:
        if args.command in ("inspect", "verify"):
            return _verify(args)
        if args.command == "rotate":
            return _rotate(args)
        if args.command == "repair":
            return _repair(args)
        return _state(args)
    except OSError as e:
        print(f"walvault: {_NOT_DONE.get(args.command, 'cannot check')}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    except LiveError as e:
        print(f"walvault: {_NOT_DONE[args.command]}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    except Refused as e:
        print(f"walvault: {_NOT_DONE[args.command]}: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK if e.status == "cannot_check" else EXIT_FINDINGS


def _verify(args) -> int:
    if args.jobs is not None and args.jobs < 1:
        print("walvault: --jobs must be at least 1", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    from .verify import verify_paths

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    report = verify_paths(args.paths, jobs=args.jobs, progress=progress)
    # An empty or wrong directory must not pass for an intact one: every path must hold a file that was checked
    # (found under it, or under where it leads: a file reached twice is listed once, under the first path).
    # A file of no kind (neither its name nor its meta says one) is not a WAL file.
    checked = [f.path for f in report.files if f.status != "in_progress" and f.kind] + [d.path for d in report.dirs]
    checked += [os.path.realpath(c) for c in checked]
    if empty := [p for p in args.paths if not any(Path(c).is_relative_to(q) for c in checked
                                                   for q in (p, os.path.realpath(p)))]:
        print(f"walvault: cannot check: no WAL files to check under {', '.join(map(str, empty))}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if args.json:
        _print_json(report.to_json())
    else:
        from .text import render

        sys.stdout.write(render(report, detailed=args.command == "inspect", base=_common_base(args.paths)))
    if not report.checkable:
        return EXIT_CANNOT_CHECK
    return EXIT_OK if report.intact else EXIT_FINDINGS


def _limestone_dir(path: Path) -> bool:
    from .limestone.layout import is_limestone_dir

    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such directory")
    if not is_limestone_dir(path):
        print(f"walvault: cannot check: {path} is not a limestone log directory", file=sys.stderr)
        return False
    return True


def _rotate(args) -> int:
    from .rotate import rotate

    if args.min_bytes < 0:
        print("walvault: --min-bytes must not be negative", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    result = rotate(args.dir, min_bytes=args.min_bytes)
    if args.json:
        _print_json(result.to_json())
    else:
        for old, new in result.renamed:
            print(f"rotated {old} -> {new}")
        for name, why in result.skipped:
            print(f"kept    {name}: {why}")
        if not result.renamed:
            print("nothing rotated")
    return EXIT_OK


def _repair(args) -> int:
    from .repair import apply_repair, plan_repair

    if args.cut and not args.apply:
        print("walvault: --cut goes with --apply (without --apply nothing is changed anyway)", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    plan = plan_repair(args.dir, cut=args.cut)
    if args.apply and plan.needed:
        plan = apply_repair(plan)
    if args.json:
        _print_json(plan.to_json())
    else:
        print(f"{plan.root}: {plan.status}")
        for f in plan.files:
            for action in f.actions(plan.cut):
                print(f"  {f.name}: {action}")
            if f.detach_to:
                print(f"  {f.name}: detached as {f.detach_to}")
        if plan.restore_catalog:
            print("  compaction_catalog: restore from compaction_catalog.back (the damaged one is saved)")
        for saved in plan.saved:
            print(f"  cut bytes saved in {saved}")
        if not plan.needed:
            print("nothing to repair")
        elif plan.left:
            print(f"repaired, but the repairs uncovered damage they cannot mend: {plan.left}")
        elif plan.applied:
            print("repaired")
        else:
            print("plan only: nothing was changed (run with --apply to carry it out)")
    return EXIT_OK if (plan.applied and not plan.left) or not plan.needed else EXIT_FINDINGS


def _state(args) -> int:
    from .limestone.state import format_tsv
    from .state import directory_state

    if not _limestone_dir(args.dir):
        return EXIT_CANNOT_CHECK
    sys.stdout.write(format_tsv(directory_state(args.dir)))
    return EXIT_OK


def _print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=1)
    sys.stdout.write("\n")


def _common_base(paths: list[Path]) -> Path | None:
    try:
        base = Path(os.path.commonpath([p.resolve() for p in paths]))
    except ValueError:
        return None
    return base if base.is_dir() else base.parent


def run() -> None:
    try:
        code = main()
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:
        code = EXIT_OK
    sys.exit(code)
