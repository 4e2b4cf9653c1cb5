"""A limestone writer for bench/rpo.py and tests/test_stream_limestone.py: sessions appended to an existing
limestone directory's active pwal files as limestone writes them (header, entries, end marker), each epoch made
durable in `epoch` once its sessions are flushed. Each durable epoch is printed with the time it became durable
("EPOCH UNIX-TIME", flushed) once `epoch` holds it. An entry is written in two halves flushed apart, and an epoch's
sessions are written a while before it is made durable: a SIGKILL at a random moment often leaves half an entry, a
nondurable session, or both.

    .venv/bin/python bench/limestone_writer.py DIR [--epochs-per-second N] [--channels C] [--entries E] [--epochs K] [--die-mid-entry K]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from walcore.limestone.follow import read_durable_epoch  # noqa: E402
from walcore.limestone.layout import kind_of  # noqa: E402
from walcore.limestone.manifest import MANIFEST_NAME, parse_manifest  # noqa: E402
from walcore.limestone.pwal import HEADERS, Entry, iter_entries  # noqa: E402
from walcore.limestone.writer import LogDir, put, snippet_end, snippet_header  # noqa: E402

STORAGE = 7


def highest_epoch(root: Path) -> int:
    """The highest epoch of the directory's snippets and epoch files (a new session must be past it)."""
    return max([e.epoch for p in root.iterdir() if kind_of(p.name) in ("pwal", "pwal_rotated")
                for e in iter_entries(p) if isinstance(e, Entry) and e.type in HEADERS]
               + [read_durable_epoch(root) or 0])


def session_entries(epoch: int, channel: int, entries: int, rng: random.Random) -> list[bytes]:
    return [put(STORAGE, f"e{epoch}-c{channel}-{i}".encode(), rng.randbytes(rng.randrange(8, 64)), (epoch, i))
            for i in range(entries)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--epochs-per-second", type=float, default=20.0)
    ap.add_argument("--channels", type=int, default=2)
    ap.add_argument("--entries", type=int, default=3, help="put entries per session")
    ap.add_argument("--epochs", type=int, default=0, help="stop after this many (default: never)")
    ap.add_argument("--die-mid-entry", type=int, default=0, metavar="K",
                    help="after K epochs, write half an entry of the next one and SIGKILL itself")
    args = ap.parse_args()
    version = parse_manifest((args.dir / MANIFEST_NAME).read_bytes()).persistent_format_version
    log = LogDir(args.dir, version=version, channels=args.channels, manifest=False)
    rng = random.Random()
    epoch, interval = highest_epoch(args.dir), 1.0 / args.epochs_per_second
    written = 0
    while not args.epochs or written < args.epochs:
        epoch += 1
        for channel, f in enumerate(log.channels):
            f.write(snippet_header(epoch))
            for entry in session_entries(epoch, channel, args.entries, rng):
                half = len(entry) // 2
                f.write(entry[:half])
                f.flush()
                if args.die_mid_entry and written == args.die_mid_entry:
                    os.kill(os.getpid(), signal.SIGKILL)
                f.write(entry[half:])
                f.flush()
            if log.end_markers:
                f.write(snippet_end(epoch))
            f.flush()
        time.sleep(interval * rng.random() / 2)  # written, not yet durable
        log.make_durable(epoch)
        print(epoch, f"{time.time():.6f}", flush=True)
        written += 1
        time.sleep(interval / 2)
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
