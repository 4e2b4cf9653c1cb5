"""CI's share of the fault-injection suite (tests/nemesis.py, issue 22 section 7): the schedules that found defects
before, replayed as they were found, a short one over an encrypted repository whose key rotation is killed, and
the few whose plans inject every fault kind (the streamer's too) those leave out, over a local repository and S3.
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

# an encrypted repository (local: on S3 it would add minutes), its key rotation killed beside another command, then
# run again: a short plan
ENCRYPTED = [nemesis.encrypted_seed("local")]
# Schedules that found a defect of the fixed code, replayed as they were found. 5127: the second history's xlog,
# the only archived continuation of a gap in this history's archive, was restored as this one's. 1112: restore --to
# end took the backup that finished last by its host's clock (72 h ahead) for its base. 1012: the other history
# streamed on as this one's continuation; and under load, the harness's own misjudgment: a second streamer that
# took over after its 20 s wait was counted as refused, and a gap said by a streamer still running was not seen.
# All three were found before the copy steps joined the plans: replayed without them (`copy` is every other CI
# schedule's).
REGRESSIONS = [(5127, "local"), (1112, "local"), (1012, "local")]
# every fault kind the schedules above leave out (S3's stall and reset among them), the shortest plans among equals
COVERING = nemesis.covering_seeds(("local", "s3", "local"), given=ENCRYPTED + REGRESSIONS)


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
    plans = [nemesis.plan(seed, storage) for seed, storage in COVERING + ENCRYPTED]
    plans += [nemesis.plan(seed, storage, copies=False) for seed, storage in REGRESSIONS]
    assert set().union(*(p.fault_kinds() for p in plans)) == set(nemesis.FAULT_KINDS)
    assert {p.storage for p in plans} == {"local", "s3"}


def test_the_encrypted_schedule_kills_a_rotation_beside_another_command():
    (seed, storage), = ENCRYPTED
    rotations = [s for s in nemesis.plan(seed, storage).steps if s.kind == "key_rotate"]
    assert nemesis.plan(seed, storage).encrypted and [(s.fault, bool(s.b)) for s in rotations] == [("kill", True)]


@pytest.mark.parametrize("seed,storage,copies",
                         [pytest.param(seed, storage, True, id=f"{seed}-{storage}")
                          for seed, storage in _schedules() + ENCRYPTED]
                         + [pytest.param(seed, storage, False, id=f"{seed}-{storage}-as-found")
                            for seed, storage in REGRESSIONS])
def test_a_schedule_keeps_every_invariant(env, seed, storage, copies):
    out = nemesis.run_schedule(env, seed, storage, copies)
    report = "\n".join([nemesis.format_outcome(out), *(f"{v.kind}: {v.detail}" for v in out.violations),
                        *(["harness error: " + out.error] if out.error else []), "log:", *out.log])
    assert out.error is None, report
    assert out.operations > 0
    assert not out.violations, report
