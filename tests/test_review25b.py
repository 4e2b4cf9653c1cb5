"""Adversarial review of continuous archiving (issue 25): each test a finding's reproduction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import tarantool_real as tr  # noqa: F401 (the Tarantool of the real-instance tests)
from conftest import new_repository, require_tarantool
from test_stream import Streamer
from test_stream_sync import SyncInstance, _streaming, sync_instance  # noqa: F401 (a fixture)
from walcore.repository import Repository

_HOLD_LEASE = """
import sys, time
from walcore.repository import Repository
from walcore.repository.lease import acquire
repo = Repository(sys.argv[1], {})
acquire(repo.locks, repo._stream_lease_name("tarantool", sys.argv[2]), "stream", ttl=float(sys.argv[3]))
print("held", flush=True)
time.sleep(600)
"""


def test_a_stopped_streamer_that_no_longer_renews_its_lease_is_not_called_alive(tmp_path):
    """A streamer frozen by SIGSTOP (or wedged) on this host keeps its pid: its lease, no longer renewed, must stop
    calling it alive once expired (status and the stream freshness alert read stream_holder)."""
    repo_url = new_repository(tmp_path / "repo")
    instance = "00000000-0000-0000-0000-000000000001"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LEASE, str(repo_url), instance, "1"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        repo = Repository(str(repo_url), {})
        assert repo.stream_holder("tarantool", instance) is not None  # renewed: alive
        holder.send_signal(signal.SIGSTOP)
        time.sleep(2.5)  # more than its TTL of 1 s without a renewal
        assert repo.stream_holder("tarantool", instance) is None, "a frozen streamer is called alive"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
