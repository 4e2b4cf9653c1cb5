"""CI's share of the fault-injection suite (tests/nemesis.py, issue 22 section 7): three schedules whose plans
together inject every fault kind (the streamer's too), over a local repository and S3, and a short one over an
encrypted repository whose key rotation is killed.
`WALVAULT_NEMESIS_SCHEDULES=N` runs N schedules (the covering ones first, then seeds from 1000); bench/nemesis.py
runs hundreds.

A failing schedule prints its violations and its operation log; replay it with
`bench/nemesis.py --seed SEED --schedules 1 --storage STORAGE`.
"""

from __future__ import annotations

import os

import pytest

import nemesis
from conftest import require_tarantool

pytestmark = require_tarantool

# two local schedules first: the streamer's faults are theirs
COVERING = nemesis.covering_seeds(("local", "local", "s3"))
# an encrypted repository (local: on S3 it would add minutes), its key rotation killed beside another command, then
# run again: a short plan
ENCRYPTED = [nemesis.encrypted_seed("local")]
# Schedules that found a defect of the fixed code, replayed as they were found. 5127: the second history's xlog,
# the only archived continuation of a gap in this history's archive, was restored as this one's. 1112: restore --to
# end took the backup that finished last by its host's clock (72 h ahead) for its base. 1012: the other history
# streamed on as this one's continuation; and under load, the harness's own misjudgment: a second streamer that
# took over after its 20 s wait was counted as refused, and a gap said by a streamer still running was not seen.
REGRESSIONS = [(5127, "local"), (1112, "local"), (1012, "local")]


def _schedules() -> list[tuple[int, str]]:
    count = int(os.environ.get("WALVAULT_NEMESIS_SCHEDULES", len(COVERING)))
    chosen = COVERING[:count]
    seed = 1000
    while len(chosen) < count:
        chosen.append((seed, ("local", "s3")[seed % 2]))
        seed += 1
    return chosen


@pytest.fixture(scope="module")
def env():
    shared = nemesis.Env()
    yield shared
    shared.close()


def test_the_ci_schedules_cover_every_fault_kind_and_both_storages():
    assert set().union(*(nemesis.plan(seed, storage).fault_kinds() for seed, storage in COVERING)) == \
        set(nemesis.FAULT_KINDS)
    assert {storage for _, storage in COVERING} == {"local", "s3"}


def test_the_encrypted_schedule_kills_a_rotation_beside_another_command():
    (seed, storage), = ENCRYPTED
    rotations = [s for s in nemesis.plan(seed, storage).steps if s.kind == "key_rotate"]
    assert nemesis.plan(seed, storage).encrypted and [(s.fault, bool(s.b)) for s in rotations] == [("kill", True)]


@pytest.mark.parametrize("seed,storage", _schedules() + ENCRYPTED + REGRESSIONS, ids=lambda v: str(v))
def test_a_schedule_keeps_every_invariant(env, seed, storage):
    out = nemesis.run_schedule(env, seed, storage)
    report = "\n".join([nemesis.format_outcome(out), *(f"{v.kind}: {v.detail}" for v in out.violations),
                        *(["harness error: " + out.error] if out.error else []), "log:", *out.log])
    assert out.error is None, report
    assert out.operations > 0
    assert not out.violations, report
