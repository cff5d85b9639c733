"""gateway_load_bench: the CPU readings its per-request figures are built from."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.gateway_load_bench import cpu_delta, cpu_snapshot


def test_cpu_delta_sums_the_growth_of_every_process_alive_at_the_second_snapshot() -> None:
    before = {(10, 1.0): 2.0, (11, 1.0): 0.5}
    after = {(10, 1.0): 2.25, (11, 1.0): 0.75}
    assert cpu_delta(before, after) == pytest.approx(0.5)


def test_a_process_started_in_between_counts_from_zero() -> None:
    before = {(10, 1.0): 2.0}
    after = {(10, 1.0): 2.0, (12, 5.0): 0.3}
    assert cpu_delta(before, after) == pytest.approx(0.3)


def test_a_reused_pid_is_a_new_process_not_a_negative_delta() -> None:
    before = {(10, 1.0): 2.0}
    after = {(10, 9.0): 0.1}  # same pid, started later: the old process ended
    assert cpu_delta(before, after) == pytest.approx(0.1)


def test_snapshot_of_this_process_grows_with_the_cpu_it_burns() -> None:
    before = cpu_snapshot([os.getpid()])
    deadline = time.process_time() + 0.1
    while time.process_time() < deadline:
        pass
    after = cpu_snapshot([os.getpid()])
    assert cpu_delta(before, after) >= 0.05


def test_snapshot_skips_a_process_that_is_gone() -> None:
    assert cpu_snapshot([2**22 + 12345]) == {}
