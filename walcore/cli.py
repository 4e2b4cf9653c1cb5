"""walvault: the command line.

Exit codes: 0 everything checked is intact; 1 there are findings; 2 nothing could be checked
(a path is missing or unreadable, holds no WAL files, or the command line is wrong).
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
                     epilog="Exit codes: 0 intact, 1 findings, 2 cannot check.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, help_text in (("inspect", "list what is there: every file, its vclock, rows and LSN ranges"),
                            ("verify", "check that every block, row and chain link is intact")):
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        cmd.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="files or directories")
        cmd.add_argument("--json", action="store_true", help="print one JSON object instead of text")
        cmd.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="worker processes (default: one per core)")
        cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                         help="progress lines on stderr (default: when stderr is a terminal)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        print("walvault: --jobs must be at least 1", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    from .verify import verify_paths

    progress = sys.stderr.isatty() if args.progress is None else args.progress
    try:
        report = verify_paths(args.paths, jobs=args.jobs, progress=progress)
    except OSError as e:
        print(f"walvault: cannot check: {e}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if not report.files and not report.dirs:
        # An empty or wrong directory must not pass for an intact one.
        print(f"walvault: cannot check: no WAL files under {', '.join(map(str, args.paths))}", file=sys.stderr)
        return EXIT_CANNOT_CHECK
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        from .text import render

        sys.stdout.write(render(report, detailed=args.command == "inspect", base=_common_base(args.paths)))
    if not report.checkable:
        return EXIT_CANNOT_CHECK
    return EXIT_OK if report.intact else EXIT_FINDINGS


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
