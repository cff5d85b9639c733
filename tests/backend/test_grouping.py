"""Concurrent requests share upstream calls (backend/grouping.py).

The class is tested alone with a ``send`` that records its batches and can be held (the only way
to make calls overlap deterministically); then through a real gunicorn gateway and model server:
answers under concurrency equal the answers of the same texts sent alone, and calls were shared.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

from backend.errors import UpstreamTimeout, UpstreamUnavailable
from backend.grouping import UpstreamGroups
from tests.backend.conftest import EXITS, INTENT
from tests.backend.stack import Gateway


class Upstream:
    """A ``send`` that answers each row with its first input value (held while ``gate`` is
    clear), recording every batch it was sent."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.batches: list[np.ndarray] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Semaphore(0)
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, inputs: Mapping[str, np.ndarray], timeout_s: float) -> Any:
        with self.lock:
            self.batches.append(inputs["x"][:, 0].copy())
        self.entered.release()
        self.gate.wait(timeout_s)
        if self.fail is not None:
            raise self.fail
        return {"y": inputs["x"][:, :1] * 10, "z": inputs["x"][:, 0]}, 7


def _rows(*values: int) -> dict[str, np.ndarray]:
    return {"x": np.array([[v, 0] for v in values], np.int32)}


def _start(groups: UpstreamGroups, send: Upstream, inputs: dict[str, np.ndarray],
           pool: ThreadPoolExecutor, deadline_s: float = 10.0) -> Any:  # fmt: skip
    return pool.submit(groups.call, "kind", inputs, send, time.monotonic() + deadline_s)


def _held(groups: UpstreamGroups, send: Upstream, pool: ThreadPoolExecutor,
          rows: dict[str, np.ndarray]) -> Any:  # fmt: skip
    """Start a call of ``rows`` and return its future once it is held inside ``send``."""
    send.gate.clear()
    future = _start(groups, send, rows, pool)
    assert send.entered.acquire(timeout=5)
    return future


def _queued_behind_a_held_call(groups: UpstreamGroups, send: Upstream, pool: ThreadPoolExecutor,
                               first: dict[str, np.ndarray],
                               later: list[dict[str, np.ndarray]]) -> list[Any]:  # fmt: skip
    """Start ``first`` and hold it inside ``send``, queue ``later`` behind it, release the call;
    return the futures of all of them, ``first``'s first."""
    futures = [_held(groups, send, pool, first)]
    futures += [_start(groups, send, rows, pool) for rows in later]
    while len(groups._lanes["kind"].queue) < len(later):
        time.sleep(0.01)
    send.gate.set()
    return futures


def test_a_call_with_nothing_in_flight_goes_alone_at_once() -> None:
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), Upstream()
    outputs, served = groups.call("kind", _rows(3, 4), send, time.monotonic() + 5)
    assert served == 7 and outputs["z"].tolist() == [3, 4]
    assert [b.tolist() for b in send.batches] == [[3, 4]]
    assert not groups._lanes  # an idle kind is forgotten


def test_requests_arriving_during_a_call_share_the_next_one_and_get_their_own_rows() -> None:
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), Upstream()
    with ThreadPoolExecutor(8) as pool:
        later = [_rows(10 * i, 10 * i + 1) for i in range(1, 4)]
        futures = _queued_behind_a_held_call(groups, send, pool, _rows(1), later)
        answers = [f.result(timeout=5) for f in futures]
    assert [b.tolist() for b in send.batches] == [[1], [10, 11, 20, 21, 30, 31]]
    assert [a[0]["z"].tolist() for a in answers] == [[1], [10, 11], [20, 21], [30, 31]]
    assert [a[0]["y"].ravel().tolist() for a in answers[1:]] == [[100, 110], [200, 210],
                                                                 [300, 310]]  # fmt: skip
    assert {a[1] for a in answers} == {7}


def test_a_shared_call_never_exceeds_max_rows() -> None:
    groups, send = UpstreamGroups(max_rows=4, in_flight=1), Upstream()
    with ThreadPoolExecutor(8) as pool:
        later = [_rows(i, i, i) for i in range(1, 4)]
        for f in _queued_behind_a_held_call(groups, send, pool, _rows(0), later):
            f.result(timeout=5)
    assert [len(b) for b in send.batches] == [1, 3, 3, 3]  # 3 + 3 > 4: one request a call


def test_in_flight_calls_go_at_once_before_any_request_waits() -> None:
    groups, send = UpstreamGroups(max_rows=8, in_flight=2), Upstream()
    send.gate.clear()
    with ThreadPoolExecutor(4) as pool:
        both = [_start(groups, send, _rows(i), pool) for i in (1, 2)]
        assert send.entered.acquire(timeout=5) and send.entered.acquire(timeout=5)
        send.gate.set()
        assert [f.result(timeout=5)[0]["z"].tolist() for f in both] == [[1], [2]]


def test_a_failed_shared_call_fails_its_members_and_the_next_call_still_goes() -> None:
    error = UpstreamUnavailable("model server down")
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), Upstream(fail=error)
    with ThreadPoolExecutor(8) as pool:
        for f in _queued_behind_a_held_call(groups, send, pool, _rows(1), [_rows(2), _rows(3)]):
            with pytest.raises(UpstreamUnavailable):
                f.result(timeout=5)
    send.fail = None
    assert groups.call("kind", _rows(9), send, time.monotonic() + 5)[0]["z"].tolist() == [9]


def test_a_waiting_request_leaves_at_its_deadline_and_is_never_sent() -> None:
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), Upstream()
    with ThreadPoolExecutor(4) as pool:
        first = _held(groups, send, pool, _rows(1))
        started = time.monotonic()
        late = _start(groups, send, _rows(2), pool, deadline_s=0.3)
        with pytest.raises(UpstreamTimeout):
            late.result(timeout=5)
        assert time.monotonic() - started < 2
        send.gate.set()
        first.result(timeout=5)
    assert [b.tolist() for b in send.batches] == [[1]]
    assert not groups._lanes


# -- through the real stack --------------------------------------------------------------------

TEXTS = [
    "my card was charged twice", "where is my parcel", "reset my password please",
    "the app crashes", "refund", "hello there", "cancel my order now", "wrong item",
]  # fmt: skip


def _post(gateway: Gateway, model: str, body: dict[str, Any]) -> dict[str, Any]:
    response = requests.post(f"{gateway.url}/v1/models/{model}:classify", json=body, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _shared_calls(gateway: Gateway) -> tuple[float, float]:
    text = requests.get(f"{gateway.url}/metrics", timeout=10).text
    figures = {
        name: sum(
            float(v)
            for v in re.findall(rf"^gateway_upstream_group_requests_{name} (\S+)$", text, re.M)
        )
        for name in ("sum", "count")
    }
    return figures["sum"], figures["count"]


@pytest.mark.parametrize("model, extra", [(INTENT, {}), (EXITS, {"version": 2})])
def test_concurrent_answers_equal_answers_alone(
    grpc_gateway: Gateway, model: str, extra: dict[str, Any]
) -> None:
    speeds = [0.0, 0.5, 1.0, 0.2]  # tiny-exits v2: per-row speeds travel with their rows
    bodies = [
        {"texts": [text], "return_logits": True, **extra,
         **({"speed": speeds[i % 4]} if extra else {})}
        for i, text in enumerate(TEXTS)
    ]  # fmt: skip
    alone = [_post(grpc_gateway, model, body) for body in bodies]
    before = _shared_calls(grpc_gateway)
    with ThreadPoolExecutor(16) as pool:
        for _ in range(3):
            together = list(pool.map(lambda b: _post(grpc_gateway, model, b), bodies * 4))
            for answer, expected in zip(together, alone * 4, strict=True):
                got, want = answer["predictions"][0], expected["predictions"][0]
                assert got["label"] == want["label"]
                assert got.get("exit_layer") == want.get("exit_layer")
                np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
    requests_, calls = (a - b for a, b in zip(_shared_calls(grpc_gateway), before, strict=True))
    assert requests_ == 3 * 4 * len(TEXTS)  # every request went through a (shared) call
    assert calls < requests_  # 32 concurrent requests on 2 workers: some shared a call


def test_a_full_batch_goes_at_once_whatever_is_in_flight() -> None:
    groups, send = UpstreamGroups(max_rows=2, in_flight=1), Upstream()
    with ThreadPoolExecutor(4) as pool:
        first = _held(groups, send, pool, _rows(1))
        full = _start(groups, send, _rows(2, 3), pool)
        assert send.entered.acquire(timeout=5)  # sent while the first call is still held
        send.gate.set()
        assert full.result(timeout=5)[0]["z"].tolist() == [2, 3]
        first.result(timeout=5)


# -- issue 34: deadlines hold -----------------------------------------------------------------


class AnswersAtTheDeadline:
    """A ``send`` whose first call is held until released and whose later calls answer only at
    their timeout (a model server that is slower than every deadline), recording each call."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[list[int], float, float]] = []  # rows, timeout_s, deadline

    def __call__(self, inputs: Mapping[str, np.ndarray], timeout_s: float) -> Any:
        self.calls.append((inputs["x"][:, 0].tolist(), timeout_s, time.monotonic() + timeout_s))
        if len(self.calls) == 1:
            assert self.release.wait(10)
            return {"y": inputs["x"][:, :1]}, 7
        time.sleep(timeout_s)
        raise UpstreamTimeout("the model server did not answer in time")


def test_no_member_of_a_shared_call_waits_past_its_own_deadline() -> None:
    """The first queued request used to send the group with the latest member's deadline as
    the call's timeout, and so waited far past its own (about 2 x GATEWAY_TIMEOUT_S)."""
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), AnswersAtTheDeadline()
    finished: dict[str, float] = {}
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(groups.call, "kind", _rows(1), send, time.monotonic() + 10)
        while not send.calls:
            time.sleep(0.01)
        started = time.monotonic()
        deadlines = {"early": started + 0.8, "late": started + 2.0}
        futures = {}
        for name, value in (("early", 2), ("late", 3)):
            futures[name] = pool.submit(groups.call, "kind", _rows(value), send, deadlines[name])
            futures[name].add_done_callback(
                lambda _, name=name: finished.setdefault(name, time.monotonic())
            )
        while len(groups._lanes["kind"].queue) < 2:
            time.sleep(0.01)
        send.release.set()  # the queue goes as one call, which answers only at its timeout
        for future in futures.values():
            with pytest.raises(UpstreamTimeout):
                future.result(timeout=10)
        first.result(timeout=5)

    for name, deadline in deadlines.items():
        assert finished[name] <= deadline + 0.25, f"{name} waited past its deadline"
    rows, _, call_deadline = send.calls[1]
    assert rows == [2, 3]
    assert call_deadline <= deadlines["late"] + 0.05  # never beyond the latest member's own


def test_a_group_whose_members_are_all_past_their_deadline_is_not_sent() -> None:
    groups, send = UpstreamGroups(max_rows=8, in_flight=1), AnswersAtTheDeadline()
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(groups.call, "kind", _rows(1), send, time.monotonic() + 10)
        while not send.calls:
            time.sleep(0.01)
        late = [_start(groups, send, _rows(v), pool, deadline_s=0.3) for v in (2, 3)]
        while len(groups._lanes["kind"].queue) < 2:
            time.sleep(0.01)
        with groups._lock:  # they stay queued past their deadline (taken as the call returns)
            time.sleep(0.4)
            send.release.set()
        for future in late:
            with pytest.raises(UpstreamTimeout):
                future.result(timeout=5)
        first.result(timeout=5)
    assert [rows for rows, _, _ in send.calls] == [[1]]
