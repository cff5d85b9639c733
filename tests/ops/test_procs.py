"""ops/procs.py: free ports outside the range outgoing connections take their ports from, and
stopping a process group."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from contextlib import closing
from types import SimpleNamespace

import pytest

from ops import procs
from ops.procs import EPHEMERAL_RANGE, free_port, stop_group


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    low = int(EPHEMERAL_RANGE.read_text().split()[0])
    ports = [free_port() for _ in range(100)]

    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < low for port in ports)  # no client socket draws its port there
    for port in ports[:5]:
        with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
            sock.bind(("0.0.0.0", port))


def test_each_slice_of_the_range_draws_its_own_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    # n process trees on one host (the suite's xdist workers) draw from disjoint slices
    monkeypatch.setattr(procs, "_ephemeral_low", lambda: 32_000)
    drawn = {}
    for index in range(2):
        monkeypatch.setenv(procs.PORT_SLICE, f"{index}/2")
        drawn[index] = {free_port() for _ in range(50)}
    assert all(10_000 <= port < 21_000 for port in drawn[0])
    assert all(21_000 <= port < 32_000 for port in drawn[1])
    monkeypatch.setenv(procs.PORT_SLICE, "2/2")  # not a slice: the whole range
    assert procs._port_range() == (10_000, 32_000)


def test_a_port_held_by_a_listener_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held = listener.getsockname()[1]
        # A port this process never handed out and nothing on this machine holds: a fixed number
        # could be either (CI once drew 23456 earlier in the same test session).
        monkeypatch.setattr(procs, "_handed_out", set())
        spare = next(port for port in range(23_456, 24_000) if procs._bindable(port))
        proposals = iter([held, held, spare])
        monkeypatch.setattr(procs, "_pick", SimpleNamespace(randrange=lambda *_: next(proposals)))
        monkeypatch.setattr(procs, "_ephemeral_low", lambda: 32_768)

        assert free_port() == spare  # the listener's port, proposed twice, was refused


def test_stop_group_returns_once_its_own_child_exits_not_at_the_timeouts() -> None:
    # A child of this process that exits on SIGTERM stays a zombie until reaped: stop_group must
    # see it as gone, not wait out SIGTERM's and SIGKILL's timeouts (the demo stack's teardown
    # took 2 x 2 x 5 s for its two processes).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)  # fmt: skip
    started = time.monotonic()

    assert stop_group(child.pid, timeout_s=30.0)

    assert time.monotonic() - started < 15.0  # the bug waits 60 s; the fix a tenth of one
    assert child.poll() is not None
