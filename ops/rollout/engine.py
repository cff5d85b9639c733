"""Roll a new model version out on live traffic, step by step, and promote it or roll it back.

``Rollout`` drives one model's rollout: each step's routing entry written (``ops.rollout.state``
keeps the entry and the state beside it consistent, for a resume or ``--revert``), the reader wait,
the step held and decided (``ops.rollout.steps``, ``ops.rollout.decisions``), then the promotion or
the rollback. The command line, and what each step and threshold means, is ``ops.rollout.cli``;
publishing the new version first and moving the label through push_model is ``ops.rollout.push``.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from modelformat import serverconfig
from modelformat.errors import FormatError
from modelformat.routing import ModelRoute
from ops.modelconfig import OpsError, say
from ops.rollout.decisions import (
    DEFAULT_STEPS,
    GO,
    ROLLBACK,
    Decision,
    Reference,
    Step,
    Thresholds,
    format_steps,
    parse_steps,
)
from ops.rollout.metrics import Figures, MetricsSource
from ops.rollout.spaces import SpaceCheck, refusal
from ops.rollout.state import (
    PROMOTING,
    ROLLING_BACK,
    STEPS,
    State,
    driving,
    entry_following,
    load_states,
    read_routing,
    restore_route,
    route_to_json,
    routing_path_for,
    state_path_for,
    write_route,
    write_states,
)
from ops.rollout.steps import Hold, Meter

EXIT_PROMOTED, EXIT_ERROR, EXIT_ROLLED_BACK, EXIT_INTERRUPTED = 0, 1, 3, 130

Promote = Callable[[str, str, int], None]  # (model, label, version): the label names the version
CheckAvailable = Callable[[str, int], None]  # (model, version): raise OpsError unless AVAILABLE
# (model, stable, new): the spaces compared (ops.rollout.spaces), or None for a non-embedder
CheckSpaces = Callable[[str, int, int], "SpaceCheck | None"]


@dataclass
class Settings:
    """What a rollout does, from the command line (the metrics source and hooks aside)."""

    model: str
    version: int
    config_path: Path
    from_label: str = "stable"
    steps: tuple[Step, ...] = field(default_factory=lambda: parse_steps(DEFAULT_STEPS))
    thresholds: Thresholds = field(default_factory=Thresholds)
    hold_s: float = 300.0
    hold_requests: int = 0
    step_timeout_s: float = 1800.0
    poll_s: float = 5.0
    progress_s: float = 30.0
    reader_wait_s: float = 12.0
    drain_timeout_s: float = 300.0  # how long a step waits for the gateways' shadow backlog
    lock_timeout_s: float = 600.0
    routing_path: Path | None = None
    log_path: Path | None = None

    @property
    def routing(self) -> Path:
        return self.routing_path or routing_path_for(self.config_path)


class Rollout:
    """One model's rollout: steps, holds and decisions, then the promotion or the rollback."""

    def __init__(
        self,
        settings: Settings,
        source: MetricsSource,
        promote: Promote,
        check_available: CheckAvailable,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        check_spaces: CheckSpaces | None = None,
    ):
        self.s = settings
        self.check_spaces = check_spaces
        self.source = source
        self.promote = promote
        self.check_available = check_available
        self.clock = clock
        self.sleep = sleep
        self.state_path = state_path_for(settings.routing)

    # -- the whole run

    def run(self) -> str:
        """Carry the rollout out (or on, from its state); return 'promoted' or 'rolled back'."""
        with driving(self.s.routing, self.s.model):
            state = self.begin()
            if state.phase == STEPS:
                self.check_available(state.model, state.version)
                refused = self.spaces_refusal(state)
                if refused:
                    return self.roll_back(state, refused)
                while state.step < len(self.s.steps):
                    decision, figs = self.run_step(state)
                    if decision.verdict != GO:
                        why = "; ".join(decision.reasons[:2])
                        return self.roll_back(state, f"step {self.s.steps[state.step]}: {why}")
                    state = self.advance(state, figs)
            if state.phase == ROLLING_BACK:
                return self.roll_back(state, state.reason)
            return self.promote_new(state)

    @contextmanager
    def locked(self) -> Iterator[dict[str, State]]:
        """Hold the models.config lock; yield the states, written back when the block ends."""
        try:
            with serverconfig.config_lock(self.s.config_path, self.s.lock_timeout_s, say):
                states = load_states(self.state_path)
                before = {m: asdict(s) for m, s in states.items()}
                yield states
                if {m: asdict(s) for m, s in states.items()} != before:
                    write_states(self.state_path, states)
        except FormatError as exc:  # the lock held too long
            raise OpsError(str(exc)) from exc

    def owned(self, states: dict[str, State], state: State) -> State:
        """Return this rollout's state as recorded; OpsError if someone else ended or changed it."""
        recorded = states.get(state.model)
        if recorded is None or recorded.started_at != state.started_at:
            raise OpsError(
                f"the rollout state of {state.model} was cleared or replaced meanwhile "
                f"(--revert?); stopping without touching the routing file"
            )
        return recorded

    def begin(self) -> State:
        """Return the state to go on from: the recorded one (same arguments) or a new one."""
        s = self.s
        with self.locked() as states:
            labels = self.labels()
            existing = states.get(s.model)
            if existing is not None:
                self.check_resumable(existing, labels)
                existing.pid = os.getpid()
                say(
                    f"resuming the rollout of {s.model} v{s.version} at step "
                    f"{existing.step + 1}/{len(s.steps)} "
                    f"({self.step_name(existing)}, phase {existing.phase})"
                )
                self.log("resume", existing)
                return existing
            if s.from_label not in labels:
                raise OpsError(
                    f"{s.model} has no label {s.from_label!r} (labels: {labels or 'none'}); "
                    "the rollout compares the new version with the version it names"
                )
            stable = labels[s.from_label]
            if stable == s.version:
                raise OpsError(f"v{s.version} is already {s.model}'s {s.from_label}")
            previous = read_routing(s.routing).route(s.model)
            state = State(
                s.model, s.version, s.from_label, stable, format_steps(s.steps),
                previous=route_to_json(previous), started_at=time.time(), pid=os.getpid(),
            )  # fmt: skip
            states[s.model] = state
        say(
            f"rollout of {s.model} v{s.version} against {s.from_label}=v{stable}: steps "
            f"{state.steps}; metrics from {self.source.describe()}"
        )
        if previous is not None:
            say(f"the routing entry {s.model} has now comes back on a rollback: {previous}")
        self.log("start", state)
        return state

    def check_resumable(self, state: State, labels: dict[str, int]) -> None:
        """Raise OpsError unless ``state`` is this command's rollout, and its label unmoved."""
        s = self.s
        asked = (s.version, s.from_label, format_steps(s.steps))
        recorded = (state.version, state.from_label, state.steps)
        if asked != recorded:
            raise OpsError(
                f"a rollout of {s.model} is in progress (v{state.version} against "
                f"{state.from_label}=v{state.stable}, steps {state.steps}, at step "
                f"{state.step + 1}, recorded in {self.state_path}): re-run it with --version "
                f"{state.version} --from-label {state.from_label} --steps {state.steps} to "
                f"resume, or with --revert to put its weights back and clear it"
            )
        now = labels.get(state.from_label)
        if now not in (state.stable, state.version):
            raise OpsError(
                f"{state.from_label} of {s.model} moved to v{now} during the rollout (it was "
                f"v{state.stable}); end it with --revert"
            )

    def labels(self) -> dict[str, int]:
        """Return the model's version labels in models.config (read without TensorFlow)."""
        try:
            config = serverconfig.read(self.s.config_path)
        except FormatError as exc:
            raise OpsError(f"{self.s.config_path}: {exc}") from exc
        by_model = serverconfig.version_labels(config)
        if self.s.model not in by_model:
            known = ", ".join(sorted(by_model)) or "none"
            raise OpsError(f"model {self.s.model!r} is not in {self.s.config_path} ({known})")
        return by_model[self.s.model]

    def spaces_refusal(self, state: State) -> str:
        """Return why the weighted steps are refused (two vector spaces), or "" to go on.

        Checked once, before the first step, when a weighted step is still to come and the
        model is an embedder; the check is recorded in the state and the log.
        """
        if self.check_spaces is None or state.spaces is not None:
            return self.refusal_of(state)
        if not any(not step.shadow for step in self.s.steps[state.step :]):
            return ""
        check = self.check_spaces(state.model, state.stable, state.version)
        if check is None:
            return ""
        say(f"vector spaces: {check.describe()}: {'one' if check.same_space else 'two'} space(s)")
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.spaces = state.spaces = check.to_json()
        self.log("spaces", state)
        return self.refusal_of(state)

    def refusal_of(self, state: State) -> str:
        """Return the refusal the recorded space check makes ("" when one space or none)."""
        data = state.spaces
        if not data or data["same_space"]:
            return ""
        return refusal(state.model, SpaceCheck.from_json(data), state.from_label)

    def step_name(self, state: State) -> str:
        if state.step >= len(self.s.steps):
            return "after the last step"
        return str(self.s.steps[state.step])

    # -- one step

    def run_step(self, state: State) -> tuple[Decision, Figures | None]:
        """Make ``state``'s step live, hold it, and return its decision (and last figures)."""
        s = self.s
        step = s.steps[state.step]
        where = f"step {state.step + 1}/{len(s.steps)} ({step})"
        with self.locked() as states:
            self.owned(states, state)
            changed = write_route(s.routing, s.model, step.route(state.stable, state.version))
        say(
            f"{where}: {step.describe(state.stable, state.version)}"
            + (f"; {s.routing} written" if changed else "")
        )
        self.wait_for_readers()
        meter = Meter(self.source, s.model, self.clock, self.sleep)
        meter.wait_for_drain(self.hold_settings())
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.live_at = state.live_at = time.time()
        self.log("live", state)
        reference = Reference.from_json(state.reference)
        decision, figs = meter.hold(
            step, state.stable, state.version, self.hold_settings(), s.thresholds, reference
        )
        verdict = {GO: "go on", ROLLBACK: "ROLL BACK"}.get(decision.verdict, decision.verdict)
        say(f"{where}: {verdict}")
        for reason in decision.reasons:
            say(f"  {reason}")
        self.log("decision", state, decision)
        return decision, figs

    def hold_settings(self) -> Hold:
        s = self.s
        return Hold(s.hold_s, s.hold_requests, s.step_timeout_s, s.poll_s, s.progress_s,
                    s.drain_timeout_s)  # fmt: skip

    def wait_for_readers(self) -> None:
        """Sleep until ``reader_wait_s`` has passed since the routing file last changed."""
        age = time.time() - self.s.routing.stat().st_mtime
        remaining = min(self.s.reader_wait_s, self.s.reader_wait_s - age)
        if remaining > 0:
            say(f"  waiting {remaining:.1f}s for every gateway to read the routing file")
            self.sleep(remaining)

    def advance(self, state: State, figs: Figures | None) -> State:
        """Record that ``state``'s step passed: the next one is current, not live yet."""
        step = self.s.steps[state.step]
        measured = None
        if figs is not None:
            measured = Reference.of(step, figs.stable, self.s.thresholds.min_samples)
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.step += 1
            recorded.live_at = None
            if measured is not None:
                recorded.reference = measured.to_json()
            new = replace(recorded)
        return new

    # -- the end

    def promote_new(self, state: State) -> str:
        """Serve all default traffic with the new version, move the label, remove the entry."""
        s = self.s
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.phase = state.phase = PROMOTING
            only_new = ModelRoute(((state.version, 100.0),))
            changed = write_route(s.routing, s.model, only_new)
        say(f"promoting v{state.version}: {state.from_label} := v{state.version}")
        if changed:
            say(f"  v{state.version} serves all default traffic first ({s.routing} written)")
            self.wait_for_readers()
        self.promote(state.model, state.from_label, state.version)
        with self.locked() as states:
            self.owned(states, state)
            route, note = self.entry_after_promotion(state)
            write_route(s.routing, s.model, route)
            del states[s.model]
        say(f"promoted: {state.from_label}=v{state.version}; {note}")
        self.log("promoted", state)
        return "promoted"

    def entry_after_promotion(self, state: State) -> tuple[ModelRoute | None, str]:
        """Return the model's routing entry once the new version is promoted, and what it means
        (default traffic follows the label: ``ops.rollout.state.entry_following``)."""
        return entry_following(self.s.config_path, state.model, state.version)

    def roll_back(self, state: State, reason: str) -> str:
        """Put the routing entry back (label unmoved, nothing unloaded) and clear the state."""
        s = self.s
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.phase = state.phase = ROLLING_BACK
            recorded.reason = state.reason = reason
        with self.locked() as states:
            self.owned(states, state)
            route, note = restore_route(state)
            write_route(s.routing, s.model, route)
            del states[s.model]
        say(f"rolled back v{state.version} ({reason}): {note}; {state.from_label} unmoved")
        self.log("rolled_back", state)
        return "rolled back"

    def revert(self) -> str:
        """End the recorded rollout of the model: its weights put back, its state cleared."""
        s = self.s
        with driving(s.routing, s.model), self.locked() as states:
            state = states.get(s.model)
            if state is None:
                entry = read_routing(s.routing).route(s.model)
                raise OpsError(
                    f"no rollout of {s.model} to revert ({self.state_path} records none)"
                    + (
                        f"; its routing entry {entry} is not a rollout's: edit it by hand"
                        if entry
                        else ""
                    )
                )
            if state.phase == PROMOTING and self.labels().get(state.from_label) == state.version:
                route, note = self.entry_after_promotion(state)
                note = f"the label had already moved: promotion complete; {note}"
            else:
                route, note = restore_route(state)
            write_route(s.routing, s.model, route)
            del states[s.model]
        say(
            f"reverted the rollout of {s.model} v{state.version} at {self.step_name(state)}: {note}"
        )
        self.log("reverted", state)
        return "reverted"

    def log(self, event: str, state: State, decision: Decision | None = None) -> None:
        """Append one JSON line about ``state`` (and ``decision``) to the rollout log."""
        if self.s.log_path is None:
            return
        record: dict[str, Any] = {
            "time": round(time.time(), 3), "event": event, "model": state.model,
            "version": state.version, "stable": state.stable, "from_label": state.from_label,
            "step_index": state.step, "step": self.step_name(state), "phase": state.phase,
        }  # fmt: skip
        if decision is not None:
            record.update(verdict=decision.verdict, reasons=decision.reasons,
                          figures=decision.figures)  # fmt: skip
        if state.reason:
            record["reason"] = state.reason
        if event == "spaces" and state.spaces:
            record["spaces"] = state.spaces
        self.s.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.s.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")
