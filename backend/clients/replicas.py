"""The model-server replicas an upstream target names, owned in one place for both transports.

A ``ReplicaSet`` knows who the replicas are (resolution, re-done in the background, never on the
request path and never under its lock), how to reach each one (a transport handle: a gRPC channel
or a REST base URL), what each one last reported (its AVAILABLE versions per model) and whether it
answers at all. Every call goes to one chosen replica:

- only to replicas that reported the version asked for AVAILABLE (before any replica has reported
  on a model, to any healthy one), round robin among them; a NOT_FOUND for a version another
  replica reported is retried there, so a replica still loading a version never fails a request;
- a replica that cannot be reached is skipped for ``down_s``; one that accepts connections but
  does not answer its status within ``status_deadline_s`` while another replica does is *hung*:
  it gets no call until it answers a status in time again, and the calls waiting on it are
  cancelled and retried on another replica (gRPC; a blocking REST call waits for its deadline);
- a saturated replica (its batch queue is full) is not failed over from: every replica serves the
  same load, so trying the others would only multiply the overload; the client gets a 503 with
  Retry-After;
- version states come from every replica in parallel under one deadline, whatever the number of
  hung replicas, and are merged (AVAILABLE only where every answering replica reports it);
- an exception of a client library (a closed channel, say) never leaves as anything but a
  gateway error.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from backend import metrics
from backend.errors import (
    GatewayError,
    Saturated,
    UpstreamTimeout,
    UpstreamUnavailable,
    VersionNotFound,
)
from modelformat.status import VersionStatus, merge_replicas

log = logging.getLogger(__name__)

H = TypeVar("H")  # a transport's handle on one replica
R = TypeVar("R")

NEVER = -float("inf")
# Models whose last status fan-out a set remembers the time of (the most recently asked): a name
# no model server serves is asked about too (GET /v1/models/<name>), and must not stay for good.
RECENT_MODELS = 256


class ReplicaHung(UpstreamUnavailable):
    """A call cancelled because its replica stopped answering (retried on another replica)."""


@dataclass(eq=False)
class Replica(Generic[H]):
    """One replica: its address, its handle, what it reported and its health."""

    address: str
    handle: H
    available: dict[str, frozenset[int]] = field(default_factory=dict)  # model -> versions
    answered_at: float = NEVER  # the last status answer within the deadline
    down_until: float = NEVER  # skipped until then (could not be reached)
    hung: bool = False  # accepts connections, answers nothing: skipped until a status answer
    inflight: set[Any] = field(default_factory=set)  # cancellable calls waiting on it
    probing: bool = False

    def healthy(self, now: float) -> bool:
        return not self.hung and self.down_until <= now


class ReplicaSet(Generic[H]):
    """The replicas of one target; see the module docstring."""

    def __init__(
        self,
        target: str,
        *,
        resolve: Callable[[], list[str]],
        connect: Callable[[str], H],
        disconnect: Callable[[H], None],
        status: Callable[[H, str, float], list[VersionStatus]],
        transport: str,
        status_deadline_s: float = 1.0,
        resolve_every_s: float = 5.0,
        resolve_timeout_s: float = 2.0,
        down_s: float = 1.0,
        retire_after_s: float = 30.0,
        retry_after_s: int = 1,
    ) -> None:
        self.target = target
        self.transport = transport
        self._resolve = resolve
        self._connect = connect
        self._disconnect = disconnect
        self._status = status
        self.status_deadline_s = status_deadline_s
        self.resolve_every_s = resolve_every_s
        self.resolve_timeout_s = resolve_timeout_s
        self.down_s = down_s
        self.retire_after_s = retire_after_s
        self.retry_after_s = retry_after_s
        self._replicas: dict[str, Replica[H]] = {}
        self._retired: list[tuple[float, Replica[H]]] = []
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._resolved_at = NEVER
        self._resolving: threading.Thread | None = None
        self._resolved = threading.Event()
        self._resolve_error = ""
        # model -> when its states were last asked for / the last status fan-out ended (bounded)
        self._refreshed: OrderedDict[str, float] = OrderedDict()
        self._answered: OrderedDict[str, float] = OrderedDict()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    # -- membership ----------------------------------------------------------------------------

    def members(self) -> list[Replica[H]]:
        """Return the replicas now; re-resolve in the background when the answer is old.

        Only the very first call waits for a resolution, and at most ``resolve_timeout_s``.
        """
        now = time.monotonic()
        with self._lock:
            if now - self._resolved_at >= self.resolve_every_s and self._resolving is None:
                self._resolved_at = now
                self._resolving = threading.Thread(
                    target=self._resolve_once, name="resolve", daemon=True
                )
                self._resolving.start()
            members = list(self._replicas.values())
        if members:
            return members
        self._resolved.wait(self.resolve_timeout_s)
        with self._lock:
            members = list(self._replicas.values())
        if not members:
            reason = self._resolve_error or f"no answer within {self.resolve_timeout_s:g}s"
            raise UpstreamUnavailable(
                f"model server {self.target}: {reason}", retry_after_s=self.retry_after_s
            )
        return members

    def _resolve_once(self) -> None:
        """Look the target up (outside the lock: DNS may be slow) and apply the answer."""
        try:
            addresses = self._resolve()
            error = ""
        except Exception as exc:  # (a resolver's failure keeps the last answer)
            addresses, error = [], str(exc)
        now = time.monotonic()
        closing: list[Replica[H]] = []
        with self._lock:
            self._resolving = None
            self._resolve_error = error
            if addresses and not self._closed:
                for gone in set(self._replicas) - set(addresses):
                    # Not closed yet: a call may still hold its handle (closing a gRPC channel
                    # under a call raises in the caller); closed once nothing can.
                    self._retired.append((now, self._replicas.pop(gone)))
                for address in addresses:
                    if address not in self._replicas:
                        self._replicas[address] = Replica(address, self._connect(address))
            while self._retired and now - self._retired[0][0] >= self.retire_after_s:
                closing.append(self._retired.pop(0)[1])
        if error:
            log.warning("cannot resolve %s (%s); keeping %d replicas", self.target, error,
                        len(self._replicas))  # fmt: skip
        for replica in closing:
            self._disconnect(replica.handle)
        self._resolved.set()

    # -- version states ------------------------------------------------------------------------

    def status(self, model: str, deadline: float | None = None) -> list[VersionStatus]:
        """Return ``model``'s version states merged over the replicas that answer in time.

        Every replica is asked at once and the answers are awaited ``status_deadline_s`` in all
        (or until ``deadline``, a request's, when that comes first)
        (not at all for replicas already known to hang, unless every replica is: their answer, if
        it comes in time, clears them in the background). A replica that is unreachable or too
        slow is left out, and a slow one is marked hung when another answered; when none answers,
        the first replica's error is raised, and any other error (an unknown model, say) is
        raised as it is.
        """
        members = self.members()
        now = time.monotonic()
        with self._lock:
            _note(self._refreshed, model, now)
        within = self.status_deadline_s
        if deadline is not None:
            within = max(0.0, min(within, deadline - now))
        pool = self._executor()
        asked: dict[Future[list[VersionStatus]], Replica[H]] = {}
        for replica in members:
            future = pool.submit(self._status, replica.handle, model, within)
            future.add_done_callback(functools.partial(self._record, replica, model))
            asked[future] = replica
        waiting = [f for f, r in asked.items() if not r.hung] or list(asked)
        wait(waiting, timeout=within + (0.05 if deadline is None else 0.0))
        now = time.monotonic()
        answers: list[list[VersionStatus]] = []
        errors: list[GatewayError] = []
        slow: list[Replica[H]] = []
        for future, replica in asked.items():
            if not future.done():
                if future in waiting:
                    slow.append(replica)
                continue
            try:
                answers.append(future.result())
            except UpstreamTimeout as exc:
                errors.append(exc)
                slow.append(replica)
            except GatewayError as exc:
                errors.append(exc)
                if isinstance(exc, UpstreamUnavailable):
                    self._mark_down(replica, now)
            except Exception as exc:  # (a client library's own failure)
                errors.append(self._unmapped(exc))
                self._mark_down(replica, now)
        if slow:
            if answers and within >= self.status_deadline_s:
                # others answered in time (the full status deadline): these hang, the
                # service is not just slow
                for replica in slow:
                    self._mark_hung(replica)
            errors.append(
                UpstreamTimeout(f"{len(slow)} model server replicas did not answer in time")
            )
        with self._lock:
            _note(self._answered, model, time.monotonic())
        for error in errors:
            if not isinstance(error, UpstreamUnavailable | UpstreamTimeout):
                raise error
        if not answers:
            raise errors[0] if errors else UpstreamUnavailable("no model server replica is known")
        return merge_replicas(answers)

    def _record(self, replica: Replica[H], model: str, future: Future[list[VersionStatus]]) -> None:
        """Remember what a replica answered (its call has the status deadline: an answer at all
        came in time, so a hung replica that answers is back)."""
        if future.cancelled() or future.exception() is not None:
            return
        states = future.result()
        replica.available[model] = frozenset(s.version for s in states if s.state == "AVAILABLE")
        replica.answered_at = time.monotonic()
        replica.hung = False

    def refresh_in_background(self, model: str, every_s: float) -> None:
        """Ask every replica for ``model``'s states if nobody did in ``every_s`` (non-blocking):
        requests naming a label or version never need the merged status, but picks need each
        replica's versions."""
        now = time.monotonic()
        with self._lock:
            if now - self._refreshed.get(model, NEVER) < every_s:
                return
            _note(self._refreshed, model, now)
        self._executor().submit(self._quiet_status, model)

    def _quiet_status(self, model: str) -> None:
        with contextlib.suppress(Exception):  # a background refresh; the next call reports
            self.status(model)

    # -- calls ---------------------------------------------------------------------------------

    def call(
        self,
        model: str,
        version: int | None,
        fn: Callable[[Replica[H], float], R],
        deadline: float,
    ) -> R:
        """Run ``fn(replica, seconds_left)`` on a chosen replica, failing over where it is safe."""
        tried: set[str] = set()
        last: GatewayError | None = None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise last or UpstreamTimeout("the model server did not answer in time")
            replica = self._pick(model, version, tried)
            if replica is None:
                if last is not None:
                    raise last
                raise UpstreamUnavailable(
                    f"no model server replica of {self.target} can serve {model!r}"
                    + (f" version {version}" if version is not None else ""),
                    retry_after_s=self.retry_after_s,
                )
            tried.add(replica.address)
            try:
                return fn(replica, remaining)
            except Saturated:
                raise  # every replica carries the same load: failing over multiplies it
            except UpstreamUnavailable as exc:
                if not isinstance(exc, ReplicaHung):
                    self._mark_down(replica, time.monotonic())
                last = exc
            except VersionNotFound as exc:
                if version is None:
                    raise
                if not self._reported(model, version, tried) and not self._fresh(model):
                    # Nobody else is known to have it, and what we know is old or nothing (a
                    # first request naming a version): ask every replica now, within the
                    # status deadline (and the call's), before deciding it is the caller's 404.
                    with contextlib.suppress(GatewayError):
                        self.status(model, deadline)
                replica.available[model] = replica.available.get(model, frozenset()) - {version}
                if not self._reported(model, version, tried):
                    raise
                last = exc
            except GatewayError:
                raise
            except Exception as exc:  # (a client library's own failure: never a 500)
                self._mark_down(replica, time.monotonic())
                last = self._unmapped(exc)
            metrics.child(metrics.REPLICA_FAILOVERS, self.transport, last.code).inc()

    def _fresh(self, model: str) -> bool:
        """Return True if every replica's states for ``model`` came in within the last second."""
        return time.monotonic() - self._answered.get(model, NEVER) < 1.0

    def _reported(self, model: str, version: int, exclude: set[str]) -> bool:
        with self._lock:
            return any(
                version in r.available.get(model, ())
                for a, r in self._replicas.items()
                if a not in exclude
            )

    def _pick(self, model: str, version: int | None, exclude: set[str]) -> Replica[H] | None:
        now = time.monotonic()
        candidates = [r for r in self.members() if r.address not in exclude]
        healthy = [r for r in candidates if r.healthy(now)]
        pool = healthy
        if version is not None:
            having = [r for r in healthy if version in r.available.get(model, ())]
            known = [r for r in healthy if model in r.available]
            # Only replicas that reported the version; before any has reported on the model
            # (or when none reports it: the caller's 404 comes from the model server), any.
            pool = (
                having
                or [r for r in healthy if model not in r.available]
                or (healthy if not known or not self._reported(model, version, set()) else [])
            )
        if not pool and not healthy:
            # Every replica is down or hung: try one that was only unreachable (it may be back);
            # never a hung one (the call would wait for its deadline).
            pool = [r for r in candidates if not r.hung]
        if not pool:
            return None
        pool.sort(key=lambda r: r.address)
        return pool[next(self._turn) % len(pool)]

    # -- health --------------------------------------------------------------------------------

    def watch(self, replica: Replica[H], call: Any) -> None:
        """Remember a cancellable call waiting on ``replica`` (cancelled if it hangs)."""
        with self._lock:
            replica.inflight.add(call)

    def unwatch(self, replica: Replica[H], call: Any) -> None:
        with self._lock:
            replica.inflight.discard(call)

    def suspect(self, replica: Replica[H], model: str) -> None:
        """A call is waiting long on ``replica``: ask its status (in the background) and mark
        it hung if it does not answer in time while another replica answered lately."""
        with self._lock:
            if replica.probing or replica.hung:
                return
            replica.probing = True
        self._executor().submit(self._probe, replica, model)

    def _probe(self, replica: Replica[H], model: str) -> None:
        try:
            try:
                self._status(replica.handle, model, self.status_deadline_s)
            except (UpstreamTimeout, UpstreamUnavailable):
                now = time.monotonic()
                others = [
                    r for r in self._replicas.values()
                    if r is not replica and now - r.answered_at < 5 * self.status_deadline_s + 2
                ]  # fmt: skip
                if others:
                    self._mark_hung(replica)
            except Exception:  # (an answer, even an error, is not a hang)
                pass
        finally:
            replica.probing = False

    def _mark_down(self, replica: Replica[H], now: float, hung: bool = False) -> None:
        replica.down_until = now + self.down_s
        if hung:
            self._mark_hung(replica)

    def _mark_hung(self, replica: Replica[H]) -> None:
        with self._lock:
            if not replica.hung:
                log.warning("model server replica %s does not answer: no calls until it does",
                            replica.address)  # fmt: skip
                metrics.child(metrics.REPLICA_HUNG, self.transport).inc()
            replica.hung = True
            waiting = list(replica.inflight)
        for call in waiting:
            call.cancel()

    def _unmapped(self, exc: Exception) -> UpstreamUnavailable:
        return UpstreamUnavailable(
            f"model server call failed: {type(exc).__name__}: {exc}",
            retry_after_s=self.retry_after_s,
        )

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="replicas")
            return self._pool

    def addresses(self) -> list[str]:
        """Return the replicas' addresses (resolving first if none is known yet)."""
        return [r.address for r in self.members()]

    def close(self) -> None:
        """Close every handle, retired ones included."""
        with self._lock:
            self._closed = True
            replicas = list(self._replicas.values()) + [r for _, r in self._retired]
            self._replicas.clear()
            self._retired.clear()
            pool, self._pool = self._pool, None
        for replica in replicas:
            self._disconnect(replica.handle)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _note(times: OrderedDict[str, float], model: str, now: float) -> None:
    """Keep ``now`` as ``model``'s time in ``times``, forgetting the oldest past RECENT_MODELS
    (a forgotten model only looks never asked: its next look-up asks)."""
    times.pop(model, None)
    times[model] = now
    while len(times) > RECENT_MODELS:
        times.popitem(last=False)
