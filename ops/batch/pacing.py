"""The batch job's yield to online traffic: ``Yield``, which holds each call until the model server
has answered no one else for a window (its own request counter; probes where it has none), and
``Pacer``, AIMD on its own call latency against its quiet one, with an optional rate cap.

Pacer's rule: each call's latency per row-token (seconds per padded token it sent) is compared with
the job's quiet baseline (the lowest it has seen in its first calls, then the lowest of a slow
moving window). Above ``slow_ratio`` x the baseline, the model server is busy with someone else:
the job's duty cycle halves (it sleeps after each call so that calls fill ``duty`` of its time).
At or below it, the duty grows by ``step`` back to 1. A ``max_rows_per_s`` cap holds whatever
the latency says. Pure arithmetic on the clock the caller passes: unit-tested without servers.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Pacer:
    """AIMD duty cycle of the batch job's calls (1.0: back to back)."""

    slow_ratio: float = 1.5
    step: float = 0.1
    min_duty: float = 0.05
    max_rows_per_s: float = 0.0  # 0: no cap
    duty: float = 1.0
    baseline: float = 0.0  # seconds per token when quiet; 0 until the first call
    calls: int = 0

    def after_call(self, seconds: float, rows: int, tokens: int) -> float:
        """Return how long to sleep after a call of ``rows`` rows (``tokens`` padded tokens)
        that took ``seconds``; update the duty cycle by the rule above."""
        self.calls += 1
        per_token = seconds / max(tokens, 1)
        if self.baseline == 0.0 or per_token < self.baseline:
            self.baseline = per_token
        elif self.calls % 50 == 0:  # a baseline from a lucky call drifts up slowly
            self.baseline *= 1.02
        if per_token > self.slow_ratio * self.baseline:
            self.duty = max(self.min_duty, self.duty / 2)
        else:
            self.duty = min(1.0, self.duty + self.step)
        pause = seconds * (1.0 / self.duty - 1.0)
        if self.max_rows_per_s > 0:
            pause = max(pause, rows / self.max_rows_per_s - seconds)
        return max(0.0, pause)


@dataclass
class Yield:
    """Online traffic first: the job sends a call only when the server is quiet.

    Quiet, by the server's own count (``count``: the requests the model server has answered,
    from TF Serving's ``:tensorflow:serving:request_count``; the default where its monitoring is
    on): the server answered no request but the job's (``own``) for the last ``window_s``. Any
    request of someone else's restarts the window, so the job sends nothing while online traffic
    flows and runs back to back when there is none. On a shared CPU nothing else keeps an online
    call's p99 near quiet: a call of the job's that overlaps it shares its cores (a probe can land
    between two online calls and read quiet; the counter can't miss one).

    Quiet, by probes (``count`` None: a server without monitoring, or shards that would read each
    other's calls as online traffic): before each call the job sends a probe (one short text, the
    smallest call there is) and times it. Its quiet baseline is the median of the first ``first``
    probes, sent before any call of the job's (after two that warm the server up). A probe
    slower than ``ratio`` x the baseline, and than the slowest of those first probes (their
    jitter), means someone else's work shares the server: the job sends nothing, waits, and
    probes again, the waits doubling from ``first_wait_s`` up to ``max_wait_s`` (so that the
    probes themselves touch few online calls); a probe within it lets the call go. And the job's
    calls are short, so that one sent just before online traffic arrives holds it up little:
    each call's rows are sized so that it takes about ``call_ratio`` x the probe's quiet time
    (from the last call's rows per second, at most ``--call-rows``). Nothing here is a latency of
    this machine: each rule is a ratio to what the same probe takes on the same server when quiet.
    The job is never starved: after ``patience_s`` of waiting one call goes anyway (so a server
    that is never quiet, or a host whose other load the probe reads as traffic, still gets one
    short call of the job's per ``patience_s``: counted in ``forced``). Both rules size calls so.
    """

    ratio: float = 1.2
    first: int = 5
    first_wait_s: float = 0.05
    max_wait_s: float = 2.0
    call_ratio: float = 8.0
    patience_s: float = 10.0
    forced: int = 0  # calls sent after ``patience_s`` of waiting, quiet or not
    rows: int = 0  # the next call's rows (0: not sized yet)
    baseline: float = 0.0  # the median of the first probes (seconds); 0 until they are in
    probes: int = 0
    waited_s: float = 0.0
    count: Callable[[], float] | None = None  # the server's answered requests; None: probes
    window_s: float = 1.0  # count: how long the server must have answered only the job
    own: int = 0  # count: the requests the job has sent (its calls and probes)
    _first: list[float] = field(default_factory=list)
    _others: float | None = None  # count: the others' requests at the last change
    _since: float = 0.0  # count: when they last changed

    @property
    def rule(self) -> str:
        """Return the rule's name: "requests" (the server's count) or "probe"."""
        return "probe" if self.count is None else "requests"

    def idle(self, now: float) -> bool:
        """Return whether the server answered only the job's requests over the last
        ``window_s`` (by ``count``; the first reading starts the window)."""
        assert self.count is not None
        others = self.count() - self.own
        if others != self._others:
            self._others, self._since = others, now
        return now - self._since >= self.window_s

    def quiet(self, probe_s: float) -> bool:
        """Return whether a probe that took ``probe_s`` says the server is quiet (the first
        ``first`` probes make the baseline: quiet)."""
        self.probes += 1
        if len(self._first) < self.first:
            self._first.append(probe_s)
            self.baseline = statistics.median(self._first)
            return True
        return probe_s <= max(self.ratio * self.baseline, max(self._first))

    def size(self, took: float, rows: int, most: int) -> None:
        """Size the next call from the last (``rows`` rows in ``took`` seconds): about
        ``call_ratio`` x the quiet probe, 1 to ``most`` rows, at most doubling a call."""
        want = rows * self.call_ratio * self.baseline / max(took, 1e-6)
        self.rows = max(1, min(most, 2 * rows, int(want)))

    def wait(self, probe: Any, sleep: Any, clock: Callable[[], float] | None = None) -> None:
        """Wait until the server is quiet: by ``count`` (read at ``clock()``), else by probes
        (``probe()`` returns its seconds); ``sleep(s)`` between readings, doubling."""
        clock = clock or time.monotonic
        pause, waited = self.first_wait_s, 0.0
        while not (self.quiet(probe()) if self.count is None else self.idle(clock())):
            if waited >= self.patience_s:
                self.forced += 1
                return
            sleep(pause)
            self.waited_s += pause
            waited += pause
            pause = min(self.max_wait_s, pause * 2)
