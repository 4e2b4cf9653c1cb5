"""Every input kept in tests/data/fuzz/ goes through the fuzzer's differential check (check_input of
bench/fuzz_scan.py) on the normal build, without sanitizers: the compiled scan core and the pure-Python reference
must give the same span and findings for it, and neither may raise.

The inputs are hand-made hostile ones (`bench/fuzz_scan.py --write-hostile tests/data/fuzz` writes them) and the
fuzzer's findings, kept in the "whole" form (7 bytes of settings, then the file itself) so that they need no
fixture. The limestone ones (limestone-*) are in the limestone whole form (PwalCase: durable epoch, the compiled
walk's buffer size, blob files, then the pwal file), checked with scan_pwal on both cores.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import fuzz_scan  # noqa: E402
from walcore import scancore  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "fuzz"
INPUTS = sorted(p.name for p in DATA.iterdir() if p.is_file())

# The first four below were differences the fuzzer's check found, all fixed: an ext of a negative type
# (msgpack refuses it; the C walk took it), a negative lsn in a later row of a non-xlog block (the pure fast walk
# let it into the span), rows ending inside a row (the pure fast walk carried the half row into the next block),
# a bool lsn (kept as True by the pure fast walk, as 1 by the compiled core).
FIXED = ("negative-ext-body", "negative-ext-header", "negative-lsn-snap", "partial-row",
         "fuzz-partial-row-mutated-xlog", "lsn-bool")


def test_inputs_are_there():
    assert len(INPUTS) >= 10 and set(FIXED) <= set(INPUTS)
    assert sum(name.startswith("limestone-") for name in INPUTS) >= 4


def test_limestone_inputs_reach_the_compiled_walk():
    """The limestone inputs are pwal files checked on both cores: walcore.limestone.scan calls the compiled
    limestone_scan, and each limestone input is in the limestone whole form."""
    assert fuzz_scan.limestone_fuzzed()
    for name in INPUTS:
        data = (DATA / name).read_bytes()
        if name.startswith("limestone-"):
            assert fuzz_scan.input_mode(data) == "limestone-whole", name


@pytest.mark.parametrize("name", INPUTS)
def test_cores_agree(name, tmp_path):
    assert scancore.compiled() is not None, "walcore._scan is not built"
    fuzz_scan.check_input((DATA / name).read_bytes(), workdir=tmp_path)
