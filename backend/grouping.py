"""Concurrent requests of one worker share upstream calls (issue 23: the gateway's CPU per request).

A gunicorn worker serves several requests at once (gthread). Each one-text request used to make
its own Predict call, and one gRPC call costs the gateway about as much CPU as the rest of the
request's own work (results/e2e_breakdown.md). ``UpstreamGroups`` lets requests that go to the
same model, version and signature (one length bucket) share a call: natural batching, no timer.

- A call with fewer than ``in_flight`` calls of its kind already running goes at once, alone:
  one client never waits, and an idle gateway adds no latency. A full batch (``max_rows``: a
  large request's chunks) has no room to share and always goes at once, as before.
- Calls that arrive while ``in_flight`` are running queue; when one returns, the thread that made
  it hands the queue (up to ``max_rows`` rows, whole requests) to the queued request with the
  latest deadline, which sends it as one call and gives every member its rows of the answer.
- No request waits past its own deadline, and a 504 means it passed: every member waits for its
  answer at most until its own deadline and then leaves with a timeout (the call goes on for the
  others); the sender is the member that may wait longest, and its call's timeout is what is
  left of its own deadline, never more; members already past their deadline when the call goes
  are left out of it, and a group whose members are all past theirs is not sent at all.
- A failed call fails every member with the same error (as TF Serving's own batching does).

Every output of a served signature is batch-major (TF Serving's batching splits answers along
the first dimension too), so a member's answer is its slice of the merged rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field

import numpy as np

from backend import metrics, timing, tracing
from backend.clients.base import Outputs
from backend.errors import UpstreamTimeout

Send = Callable[[Mapping[str, np.ndarray], float], tuple[Outputs, int]]


@dataclass(eq=False)
class _Member:
    """One request's rows waiting for (or leading) a shared call."""

    inputs: Mapping[str, np.ndarray]
    rows: int
    deadline: float
    ready: threading.Event | None = None  # made only when it queues: a lone call needs none
    group: list[_Member] | None = None  # set when this member must send the group
    result: tuple[Outputs, int] | None = None
    error: BaseException | None = None
    shared: int = 1  # requests in the call that answered it


@dataclass
class _Lane:
    """The calls of one kind (model, version, signature, shape) in one worker."""

    key: Hashable
    running: int = 0
    queue: list[_Member] = field(default_factory=list)


class UpstreamGroups:
    """Runs ``send`` for one request's batch, sharing the call with concurrent ones of its kind."""

    def __init__(self, max_rows: int, in_flight: int) -> None:
        self.max_rows = max_rows
        self.in_flight = in_flight
        self._lock = threading.Lock()
        self._lanes: dict[Hashable, _Lane] = {}

    def call(
        self,
        key: Hashable,
        inputs: Mapping[str, np.ndarray],
        send: Send,
        deadline: float,
        *,
        model: str = "",
    ) -> tuple[Outputs, int]:
        """Return (outputs for ``inputs``' rows, served version); ``send(batch, timeout_s)``
        makes one upstream call. Raises what the shared call raised, or UpstreamTimeout.
        A request that queues counts in ``gateway_requests_waiting{model}`` and its wait is
        its ``queue`` (part of its ``call`` stage: backend/timing.py)."""
        me = _Member(inputs, int(next(iter(inputs.values())).shape[0]), deadline)
        if me.rows >= self.max_rows:  # a full batch has no room to share: it goes at once
            metrics.UPSTREAM_GROUP_REQUESTS.observe(1)
            return send(inputs, deadline - time.monotonic())
        with self._lock:
            lane = self._lanes.get(key) or self._lanes.setdefault(key, _Lane(key))
            if lane.running < self.in_flight:
                lane.running += 1
                me.group = [me]
            else:
                me.ready = threading.Event()
                lane.queue.append(me)
        if me.group is None and not self._queued(lane, me, model):
            raise _late()
        if me.group is not None:
            self._lead(lane, me, me.group, send)
        tracing.annotate("gateway.group_requests", me.shared)  # on the upstream stage's span
        if me.error is not None:
            raise me.error
        assert me.result is not None
        return me.result

    def _queued(self, lane: _Lane, me: _Member, model: str) -> bool:
        """``_wait``, counted in the waiting gauge and timed as the request's queue stage."""
        waiting = metrics.child(metrics.WAITING, model)
        waiting.inc()
        try:
            with timing.stage("queue"):
                return self._wait(lane, me)
        finally:
            waiting.dec()

    def _wait(self, lane: _Lane, me: _Member) -> bool:
        """Wait until a call answered ``me`` or made it the next sender; False past its deadline."""
        assert me.ready is not None
        if me.ready.wait(max(0.0, me.deadline - time.monotonic())):
            return True
        with self._lock:
            if me in lane.queue:  # still waiting: leave the queue
                lane.queue.remove(me)
                return False
        # Taken into a group meantime: lead it if it is ours to send (its other members wait
        # on it), else the answer is on its way: report the timeout without waiting for it.
        return me.group is not None

    def _lead(self, lane: _Lane, sender: _Member, group: list[_Member], send: Send) -> None:
        """Send ``group`` as one call (``sender``: the member with the latest deadline, whose
        thread this is), give each member its rows, hand the queue on."""
        now = time.monotonic()
        live = [m for m in group if m.deadline > now]
        try:
            for member in group:
                if member.deadline <= now:  # already answered 504 (or about to): not sent
                    member.error = _late()
            if live:
                batch = (
                    live[0].inputs
                    if len(live) == 1
                    else {n: np.concatenate([m.inputs[n] for m in live]) for n in live[0].inputs}
                )
                metrics.UPSTREAM_GROUP_REQUESTS.observe(len(live))
                for member in live:
                    member.shared = len(live)
                outputs, served = send(batch, sender.deadline - now)
                if len(live) == 1:
                    live[0].result = (outputs, served)
                else:
                    start = 0
                    for member in live:
                        end = start + member.rows
                        member.result = ({k: v[start:end] for k, v in outputs.items()}, served)
                        start = end
        except BaseException as exc:  # every member gets the call's error, as TF Serving's batching
            for member in live:
                member.error = exc
        finally:
            following = self._next_group(lane)
            woken = [m for m in group if m is not sender]
            woken += [m for m in following if m.group is not None]  # the next sender
            for member in woken:
                assert member.ready is not None  # every member but a lone call's queued
                member.ready.set()

    def _next_group(self, lane: _Lane) -> list[_Member]:
        """Take the queue's first requests (≤ max_rows rows, at least one) as the next call,
        the one with the latest deadline made its sender under the lock (so a timeout can't
        orphan it)."""
        with self._lock:
            taken: list[_Member] = []
            rows = 0
            while lane.queue and (not taken or rows + lane.queue[0].rows <= self.max_rows):
                member = lane.queue.pop(0)
                taken.append(member)
                rows += member.rows
            if taken:
                max(taken, key=lambda m: m.deadline).group = taken
            else:
                lane.running -= 1
                if not lane.running:  # idle: forget it (versions come and go)
                    del self._lanes[lane.key]
            return taken


def _late() -> UpstreamTimeout:
    return UpstreamTimeout("the request ran past GATEWAY_TIMEOUT_S waiting for its call")
