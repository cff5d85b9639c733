"""One rollout step's measurement: wait for the shadow backlog to drain, then hold and decide.

A step's figures are the increase of the gateways' counters over its window, so the window must
hold only this step's traffic. Two things from the step before can leak into it: gateways that
have not re-read the routing file yet (the reader wait, ``engine``) and shadow requests still
queued in the gateways when the routing file changed. The second is what ``wait_for_drain``
waits out, reading ``gateway_shadow_queue_depth`` (queued + running shadows, summed over every
worker of every gateway): a backlog from a shadow step runs the new version while the next step
measures its latency, and mixes its load into the stable version's figures too. Gateways that
do not expose the gauge (older ones) read as drained. With Prometheus as the source the gauge is
as old as the last scrape, so the wait can end up to one scrape interval early.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ops.modelconfig import OpsError, say
from ops.rollout.decisions import GO, ROLLBACK, Decision, Reference, Step, Thresholds, decide
from ops.rollout.metrics import Figures, MetricsSource, figures, increase, shadow_backlog


@dataclass(frozen=True)
class Hold:
    """How a step holds: its time, its requests, its timeout, how often it reads the metrics."""

    hold_s: float
    hold_requests: int
    step_timeout_s: float
    poll_s: float
    progress_s: float
    drain_timeout_s: float


@dataclass
class Meter:
    """Reads one model's figures from ``source`` on the rollout's clock."""

    source: MetricsSource
    model: str
    clock: Callable[[], float]
    sleep: Callable[[float], None]

    def wait_for_drain(self, hold: Hold) -> float:
        """Wait until no gateway has a shadow queued or running; return the seconds waited.

        Gives up after ``hold.drain_timeout_s`` (saying so: the step then measures with the
        backlog in it, and its figures are the worse for it, never the better). Unreadable
        metrics are the hold's business: this returns at once on them.
        """
        started = self.clock()
        said = False
        while True:
            try:
                backlog = shadow_backlog(self.source.snapshot(self.model), self.model)
            except OpsError:
                return self.clock() - started
            waited = self.clock() - started
            if backlog <= 0:
                if said:
                    say(f"  shadow backlog drained after {waited:.1f}s")
                return waited
            if waited >= hold.drain_timeout_s:
                say(
                    f"  {backlog:g} shadow requests still queued after {waited:.0f}s "
                    "(--drain-timeout): measuring with them"
                )
                return waited
            if not said:
                say(f"  waiting for {backlog:g} queued shadow requests to drain before measuring")
                said = True
            self.sleep(hold.poll_s)

    def hold(
        self,
        step: Step,
        stable: int,
        new: int,
        hold: Hold,
        thresholds: Thresholds,
        reference: Reference | None,
    ) -> tuple[Decision, Figures | None]:
        """Read the metrics until the step decides or times out; return the decision."""
        started = self.clock()
        deadline = started + hold.step_timeout_s
        baseline = None
        while baseline is None:
            try:
                baseline = self.source.snapshot(self.model)
            except OpsError as exc:
                if self.clock() >= deadline:
                    why = f"metrics unreadable for the whole step: {exc}"
                    return Decision(ROLLBACK, [why]), None
                say(f"  metrics: {exc}; trying again")
                self.sleep(hold.poll_s)
        next_progress = started + hold.progress_s
        figs: Figures | None = None
        while True:
            self.sleep(hold.poll_s)
            now = self.clock()
            try:
                snapshot = self.source.snapshot(self.model)
            except OpsError as exc:
                if now >= deadline:
                    why = f"step timeout ({hold.step_timeout_s:g}s), metrics unreadable: {exc}"
                    return Decision(ROLLBACK, [why]), figs
                say(f"  metrics: {exc}; trying again")
                continue
            figs = figures(increase(baseline, snapshot), self.model, stable, new)
            held = now - started
            counted = figs.shadow.compared if step.shadow else figs.new.requests
            over = held >= hold.hold_s and counted >= hold.hold_requests
            decision = decide(step, figs, thresholds, reference, final=over)
            decision.figures.update(held_s=round(held, 1), counted=counted)
            if decision.verdict == ROLLBACK and not over:
                why = f"clearly broken after {held:.0f}s, before the hold ended"
                decision.reasons.insert(0, why)
            if decision.verdict in (GO, ROLLBACK):
                return decision, figs
            if now >= deadline:
                decision.verdict = ROLLBACK
                decision.reasons.append(
                    f"step timeout ({hold.step_timeout_s:g}s) without the evidence to go on"
                )
                return decision, figs
            if now >= next_progress:
                next_progress = now + hold.progress_s
                say(
                    f"  {held:.0f}s held, {counted:g} requests to v{new} "
                    f"(hold: {hold.hold_s:g}s, {hold.hold_requests} requests); "
                    + "; ".join(decision.reasons)
                )
