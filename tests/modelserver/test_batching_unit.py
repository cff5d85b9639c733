"""Batcher behaviour with a stand-in servable: merging, slicing, padding, queue limits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from modelserver.batching import QUEUE_FULL, Batcher
from modelserver.errors import ServingError
from modelserver.servable import PredictPlan


class Doubler:
    """Answers y = 2·x and records each batch's shape; optionally slow."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.delay_s = delay_s
        self.lock = threading.Lock()

    def run(self, plan: PredictPlan) -> dict[str, np.ndarray]:
        with self.lock:
            self.shapes.append(plan.inputs["x"].shape)
        time.sleep(self.delay_s)
        return {"y": plan.inputs["x"] * 2}


class Gate(Doubler):
    """Holds every model call until ``release`` is set; ``started`` is set once one runs."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.seen: list[float] = []

    def run(self, plan: PredictPlan) -> dict[str, np.ndarray]:
        self.seen.extend(plan.inputs["x"].ravel().tolist())
        self.started.set()
        assert self.release.wait(20), "the test never released the model call"
        return super().run(plan)


def wait_until(check: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def settings(**overrides: Any) -> dict[str, Any]:
    base = {
        "max_batch_size": 8,
        "batch_timeout_micros": 50_000,
        "max_enqueued_batches": 4,
        "num_batch_threads": 1,
        "allowed_batch_sizes": [],
        "pad_variable_length_inputs": False,
    }
    return {**base, **overrides}


def plan(x: np.ndarray) -> PredictPlan:
    return PredictPlan("serving_default", {"x": x}, ["y"])


def test_concurrent_tasks_share_one_model_call_and_get_their_own_rows() -> None:
    servable, batcher = Doubler(), Batcher(settings())
    try:
        with ThreadPoolExecutor(4) as pool:
            outs = list(
                pool.map(
                    lambda i: batcher.run(servable, plan(np.full((1, 2), i, np.float32)))["y"],
                    range(4),
                )
            )
    finally:
        batcher.close()

    assert [o.tolist() for o in outs] == [[[2 * i, 2 * i]] for i in range(4)]
    assert len(servable.shapes) < 4


def test_allowed_batch_sizes_pad_the_batch_and_outputs_are_sliced_back() -> None:
    servable, batcher = Doubler(), Batcher(settings(allowed_batch_sizes=[4, 8]))
    try:
        out = batcher.run(servable, plan(np.ones((3, 1), np.float32)))
    finally:
        batcher.close()

    assert servable.shapes == [(4, 1)]
    assert out["y"].shape == (3, 1)


def test_variable_lengths_pad_with_the_first_element_or_fail_without_padding() -> None:
    def both(pad: bool) -> list[Any]:
        servable, batcher = Doubler(), Batcher(settings(pad_variable_length_inputs=pad))
        try:
            with ThreadPoolExecutor(2) as pool:
                futures = [
                    pool.submit(batcher.run, servable, plan(np.arange(1, n + 1)[None, :]))
                    for n in (2, 3)
                ]
                return [f.exception() or f.result()["y"].tolist() for f in futures]
        finally:
            batcher.close()

    padded = both(True)
    failed = both(False)

    # TF Serving pads with the tensor's first element: [1, 2] becomes [1, 2, 1].
    assert padded == [[[2, 4, 2]], [[2, 4, 6]]]
    assert all(isinstance(f, ServingError) and "padding is turned off" in f.message for f in failed)


def test_full_queue_is_unavailable() -> None:
    servable = Gate()
    batcher = Batcher(settings(max_batch_size=1, max_enqueued_batches=1, batch_timeout_micros=0))
    try:
        with ThreadPoolExecutor(4) as pool:
            first = pool.submit(batcher.run, servable, plan(np.ones((1, 1), np.float32)))
            assert servable.started.wait(10)  # the only batch thread is busy from here on
            rest = [
                pool.submit(batcher.run, servable, plan(np.ones((1, 1), np.float32)))
                for _ in range(3)
            ]
            wait_until(lambda: sum(f.done() for f in rest) >= 2)  # refused at once
            servable.release.set()
            errors = [f.exception() for f in rest]
            first.result()
    finally:
        servable.release.set()
        batcher.close()

    assert sum(isinstance(e, ServingError) and e.message == QUEUE_FULL for e in errors) == 2


def test_a_task_whose_caller_timed_out_before_its_batch_started_never_runs() -> None:
    servable = Gate()
    batcher = Batcher(settings(max_batch_size=1, batch_timeout_micros=0))
    try:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(batcher.run, servable, plan(np.full((1, 1), 1.0, np.float32)))
            assert servable.started.wait(10)
            with pytest.raises(ServingError, match="Deadline Exceeded"):
                batcher.run(servable, plan(np.full((1, 1), 2.0, np.float32)), timeout_s=0.2)
            servable.release.set()
            first.result()
        # Batches run in order: once a later call is answered, the withdrawn one would have run.
        batcher.run(servable, plan(np.full((1, 1), 3.0, np.float32)), timeout_s=10)
    finally:
        servable.release.set()
        batcher.close()

    assert servable.seen == [1.0, 3.0]


def test_a_timed_out_task_leaves_the_rest_of_its_batch_running() -> None:
    servable = Gate()
    batcher = Batcher(settings(max_batch_size=4, batch_timeout_micros=0))
    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(batcher.run, servable, plan(np.full((1, 1), 1.0, np.float32)))
            assert servable.started.wait(10)
            kept = pool.submit(batcher.run, servable, plan(np.full((1, 1), 2.0, np.float32)))
            wait_until(lambda: len(batcher._queues) == 1)  # queued behind the running batch
            with pytest.raises(ServingError, match="Deadline Exceeded"):
                batcher.run(servable, plan(np.full((1, 1), 3.0, np.float32)), timeout_s=0.2)
            servable.release.set()
            assert first.result()["y"].tolist() == [[2.0]]
            assert kept.result()["y"].tolist() == [[4.0]]
    finally:
        servable.release.set()
        batcher.close()

    assert servable.seen == [1.0, 2.0]


def test_oversized_and_scalar_tasks_are_rejected() -> None:
    batcher = Batcher(settings(max_batch_size=2))
    try:
        with pytest.raises(ServingError, match="Task size 3 is larger than maximum input batch"):
            batcher.run(Doubler(), plan(np.ones((3, 1), np.float32)))
        with pytest.raises(ServingError, match="at least one dimension"):
            batcher.run(Doubler(), plan(np.float32(1.0)))  # type: ignore[arg-type]
    finally:
        batcher.close()


def test_calls_with_different_output_filters_never_share_a_batch() -> None:
    class TwoOutputs(Doubler):
        def run(self, plan: PredictPlan) -> dict[str, np.ndarray]:
            out = {"y": plan.inputs["x"] * 2, "z": plan.inputs["x"] * 3}
            return {alias: out[alias] for alias in plan.output_aliases}

    servable, batcher = TwoOutputs(), Batcher(settings())
    try:
        with ThreadPoolExecutor(2) as pool:
            want_y = pool.submit(
                batcher.run, servable, PredictPlan("s", {"x": np.ones((1, 1))}, ["y"])
            )
            want_z = pool.submit(
                batcher.run, servable, PredictPlan("s", {"x": np.ones((1, 1))}, ["z"])
            )
            assert list(want_y.result()) == ["y"]
            assert list(want_z.result()) == ["z"]
    finally:
        batcher.close()
