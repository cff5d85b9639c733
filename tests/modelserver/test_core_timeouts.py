"""Timed calls (REST's --rest_api_timeout_in_ms): bounded, and dropped if not started in time."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
import pytest

from modelserver.core import Core
from modelserver.errors import ServingError
from modelserver.metrics import Metrics
from modelserver.servable import PredictPlan


class GatedServable:
    """Stands in for a loaded version: every call waits for ``release`` and records its x."""

    version = 1

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.seen: list[float] = []

    def plan(self, signature: str, inputs: dict[str, np.ndarray], _filter: Any) -> PredictPlan:
        return PredictPlan(signature, dict(inputs), ["y"])

    def run(self, plan: PredictPlan) -> dict[str, np.ndarray]:
        self.seen.append(float(plan.inputs["x"].ravel()[0]))
        self.started.set()
        assert self.release.wait(20), "the test never released the model call"
        return {"y": plan.inputs["x"]}


def wait_until(check: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def submitted(core: Core) -> int:
    """Return how many calls reached the timed pool (counted by the fixture's wrapper)."""
    return len(core.submitted)  # type: ignore[attr-defined]


@pytest.fixture()
def one_worker() -> Iterator[tuple[Core, GatedServable]]:
    core = Core(None, Metrics(), None, timed_workers=1)  # type: ignore[arg-type]
    # Observe (not replace) submissions: a queued call shows nowhere else.
    submit, core.submitted = core._timed.submit, []  # type: ignore[attr-defined]
    core._timed.submit = lambda *a: core.submitted.append(a) or submit(*a)  # type: ignore
    servable = GatedServable()
    yield core, servable
    servable.release.set()
    core.close()


def call(core: Core, servable: GatedServable, x: float, timeout_s: float) -> Any:
    inputs = {"x": np.full((1, 1), x, np.float32)}
    return core.run_on(servable, "serving_default", inputs, (), timeout_s)  # type: ignore[arg-type]


def test_a_call_not_started_when_its_caller_times_out_never_runs(
    one_worker: tuple[Core, GatedServable],
) -> None:
    core, servable = one_worker
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(call, core, servable, 1.0, 20)
        assert servable.started.wait(10)  # the only worker is busy from here on

        with pytest.raises(ServingError) as info:
            call(core, servable, 2.0, 0.2)  # queued behind it, then given up on
        servable.release.set()
        running.result()
    call(core, servable, 3.0, 20)  # the pool runs in order: 2.0 would have run before this

    assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert servable.seen == [1.0, 3.0]


def test_calls_past_twice_the_workers_are_unavailable_not_queued(
    one_worker: tuple[Core, GatedServable],
) -> None:
    core, servable = one_worker
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(call, core, servable, 1.0, 20)
        assert servable.started.wait(10)
        queued = pool.submit(call, core, servable, 2.0, 20)
        wait_until(lambda: submitted(core) == 2)  # it holds the second slot, waiting its turn

        with pytest.raises(ServingError) as info:
            call(core, servable, 3.0, 20)
        servable.release.set()
        running.result()
        queued.result()

    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert servable.seen == [1.0, 2.0]
