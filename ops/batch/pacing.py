"""The batch job's yield to online traffic: AIMD on its own call latency against its quiet one.

The rule: each call's latency per row-token (seconds per padded token it sent) is compared with
the job's quiet baseline (the lowest it has seen in its first calls, then the lowest of a slow
moving window). Above ``slow_ratio`` x the baseline, the model server is busy with someone else:
the job's duty cycle halves (it sleeps after each call so that calls fill ``duty`` of its time).
At or below it, the duty grows by ``step`` back to 1. A ``max_rows_per_s`` cap holds whatever
the latency says. Pure arithmetic on the clock the caller passes: unit-tested without servers.
"""

from __future__ import annotations

from dataclasses import dataclass


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
