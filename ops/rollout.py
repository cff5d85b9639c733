"""Roll a new model version out on live traffic, step by step, and promote it or roll it back.

  rollout.py --name minilm-intent --version 3 --gateway http://gw-1:8000 --gateway http://gw-2:8000
  rollout.py --name minilm-intent --version 3 --prometheus http://prometheus:9090 \\
      --steps shadow:100,5,25,50,100 --hold-s 600 --hold-requests 2000 --min-agreement 0.95
  rollout.py --name minilm-intent --revert          # undo an interrupted rollout's weights
  rollout.py --name minilm-intent --from-dir exported/7 --gateway http://gw-1:8000  # push + roll
  rollout.py --name minilm-intent --checkpoint ckpt/ --gateway ... -- --precision bf16

``--from-dir`` / ``--checkpoint`` (instead of ``--version``) publish the new version first, the
way push_model does it but with no label, and then roll it out. Without a routing entry the
gateways send requests naming no version to the newest AVAILABLE version, so a version pushed
before its rollout would serve default traffic unvetted from the moment it loads until the first
step is written. So before publishing, the model's default traffic is pinned to the stable
version (``weights: {stable: 100}``, written under the config lock) and the push waits
``--reader-wait`` for every gateway to read the pin; a model that already has a routing entry
keeps it (its weights name versions, so a new one gets no default traffic either). The rollout
records the pin as the entry before it: a rollback puts the pin back, a promotion removes it. If
the push fails the pin written for it is removed again; a crash between the pin and the push
leaves the pin (default traffic stays on stable): run the same command again.

Each step rewrites the model's entry in the routing file beside models.config (``routing.yaml``,
``modelformat.routing``): ``shadow:P`` keeps the stable version (the one ``--from-label`` names)
serving all default traffic and sends P % of it to the new version as a shadow whose answers the
gateways compare; a bare ``P`` serves P % with the new version and the rest with the stable one.
The file is written atomically under the models.config lock; the step counts as live once every
gateway has re-read it (``--reader-wait``, the bound push_model waits before unloading). Then the
step holds for ``--hold-s`` and until ``--hold-requests`` requests reached the new version (compared
shadow requests in a shadow step), reading the increase of the gateways' counters since it went
live, from their ``/metrics`` pages (``--gateway``, repeated) or from Prometheus's HTTP API
(``--prometheus``). At the end of the hold it decides, and it rolls back earlier when a threshold
is already clearly broken:

  shadow steps    mean agreement with the stable version's answers (top-1 label for classifiers,
                  cosine for embeddings) >= --min-agreement; shadow calls that failed <= the
                  stable version's error rate + --max-error-increase
  weighted steps  the new version's 5xx rate <= the stable version's + --max-error-increase; its
                  p99 latency <= the stable version's p99 x --max-latency-ratio

With fewer than ``--min-samples`` samples it says so and holds on, up to ``--step-timeout``; a step
that times out without the evidence rolls back. Every decision is printed with its figures and
appended as a JSON line to ``--log``. After the last step the version is promoted: ``--from-label``
moves to it through push_model's machinery (config lock, label history, every replica AVAILABLE,
reader wait before anything is unloaded) and the model's routing entry is removed. A rollback puts
back the entry the model had before the rollout (none: weights pinned to the stable version, since
without an entry the gateways serve the newest AVAILABLE version, the one rolled back); its label
is not moved and nothing is unloaded.

Crash safety: the rollout's state (model, version, steps, the current step and when it went live)
is kept beside the routing file in ``.routing.yaml.rollout.json`` and written before the routing
entry it owns, both atomically under the config lock. A rollout killed or interrupted (Ctrl-C,
SIGTERM) at any point leaves the two consistent: the same command again resumes at the recorded
step (its hold starts over), ``--revert`` puts the weights back and clears the state, and a rollout
of the same model with other arguments is refused while a state exists. One process at a time
drives a model's rollout (an flock beside the routing file). Exit status: 0 promoted, 3 rolled back
or reverted, 1 error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from backend.settings import SettingsError
from modelformat import routing as routing_format
from modelformat import serverconfig
from modelformat.errors import FormatError
from modelformat.routing import ModelRoute, Routing, Shadow
from ops import push
from ops.modelconfig import OpsError, say
from ops.procs import REPO
from ops.rolloutdecisions import (
    DEFAULT_STEPS,
    GO,
    ROLLBACK,
    Decision,
    Reference,
    Step,
    Thresholds,
    decide,
    format_steps,
    parse_steps,
)
from ops.rolloutmetrics import (
    Figures,
    GatewayMetrics,
    MetricsSource,
    PrometheusMetrics,
    figures,
    increase,
)

STATE_FORMAT = 1
STEPS, PROMOTING, ROLLING_BACK = "steps", "promoting", "rolling_back"
EXIT_PROMOTED, EXIT_ERROR, EXIT_ROLLED_BACK, EXIT_INTERRUPTED = 0, 1, 3, 130

Promote = Callable[[str, str, int], None]  # (model, label, version): the label names the version
CheckAvailable = Callable[[str, int], None]  # (model, version): raise OpsError unless AVAILABLE


# ---------------------------------------------------------------------------------------------
# the routing file and the state beside it


def routing_path_for(config_path: Path) -> Path:
    """Return the routing file the gateways read beside ``config_path``."""
    return config_path.with_name("routing.yaml")


def state_path_for(routing_path: Path) -> Path:
    """Return the rollout state file of ``routing_path`` (a hidden sibling, git-ignored)."""
    return routing_path.with_name(f".{routing_path.name}.rollout.json")


def read_routing(path: Path) -> Routing:
    """Return the routing in ``path`` (none when the file is missing); OpsError if it is bad."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return routing_format.EMPTY
    except (OSError, UnicodeDecodeError) as exc:
        raise OpsError(f"cannot read {path}: {exc}") from exc
    try:
        return routing_format.parse(text, str(path))
    except FormatError as exc:
        raise OpsError(f"{exc}; fix the routing file before a rollout") from exc


def write_route(path: Path, model: str, route: ModelRoute | None) -> bool:
    """Set ``model``'s entry of the routing file (None: remove it); return whether it changed."""
    current = read_routing(path)
    if current.route(model) == route:  # removing from a missing file changes nothing either
        return False
    models = {name: r for name, r in current.models.items() if name != model}
    if route is not None:
        models[model] = route
    serverconfig.write_text_atomic(path, routing_format.dump(Routing(models)))
    return True


def route_to_json(route: ModelRoute | None) -> dict[str, Any] | None:
    """Return ``route`` as JSON data (for the state file)."""
    if route is None:
        return None
    shadow = asdict(route.shadow) if route.shadow else None
    return {"weights": [list(w) for w in route.weights], "shadow": shadow}


def route_from_json(data: dict[str, Any] | None) -> ModelRoute | None:
    """Return the route ``route_to_json`` wrote."""
    if data is None:
        return None
    shadow = Shadow(**data["shadow"]) if data.get("shadow") else None
    return ModelRoute(tuple((int(v), float(w)) for v, w in data["weights"]), shadow)


@dataclass
class State:
    """One model's rollout in progress, as the state file records it."""

    model: str
    version: int
    from_label: str
    stable: int
    steps: str
    step: int = 0  # index of the current step
    live_at: float | None = None  # time.time() when the current step counted as live
    phase: str = STEPS
    previous: dict[str, Any] | None = None  # the model's routing entry before the rollout
    reference: dict[str, Any] | None = None  # the stable version's last measured figures
    started_at: float = 0.0
    reason: str = ""  # why it is rolling back
    pid: int = 0


def load_states(path: Path) -> dict[str, State]:
    """Return the rollouts in progress by model (none without a file); OpsError if unreadable."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise OpsError(
            f"rollout state {path} is unreadable ({exc}); move it away and check the routing "
            "file by hand"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise OpsError(f"rollout state {path}: expected format {STATE_FORMAT}")
    try:
        return {name: State(**entry) for name, entry in data.get("rollouts", {}).items()}
    except TypeError as exc:
        raise OpsError(f"rollout state {path}: {exc}") from exc


def write_states(path: Path, states: dict[str, State]) -> None:
    """Replace the state file with ``states`` (removed when none is left)."""
    if not states:
        path.unlink(missing_ok=True)
        return
    data = {"format": STATE_FORMAT, "rollouts": {m: asdict(s) for m, s in sorted(states.items())}}
    serverconfig.write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


@contextmanager
def driving(routing_path: Path, model: str) -> Iterator[None]:
    """Hold the flock that makes one process at a time drive ``model``'s rollout.

    The kernel drops it when the holder dies, so a killed rollout never blocks its resume.
    """
    path = routing_path.with_name(f".{routing_path.name}.{model}.rollout.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise OpsError(
                f"a rollout of {model} is running (pid {holder}, lock {path}); stop it "
                "(Ctrl-C) before resuming or reverting"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# the rollout


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
    ):
        self.s = settings
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
        with self.locked() as states:
            recorded = self.owned(states, state)
            recorded.live_at = state.live_at = time.time()
        self.log("live", state)
        decision, figs = self.hold(step, state)
        verdict = {GO: "go on", ROLLBACK: "ROLL BACK"}.get(decision.verdict, decision.verdict)
        say(f"{where}: {verdict}")
        for reason in decision.reasons:
            say(f"  {reason}")
        self.log("decision", state, decision)
        return decision, figs

    def wait_for_readers(self) -> None:
        """Sleep until ``reader_wait_s`` has passed since the routing file last changed."""
        age = time.time() - self.s.routing.stat().st_mtime
        remaining = min(self.s.reader_wait_s, self.s.reader_wait_s - age)
        if remaining > 0:
            say(f"  waiting {remaining:.1f}s for every gateway to read the routing file")
            self.sleep(remaining)

    def hold(self, step: Step, state: State) -> tuple[Decision, Figures | None]:
        """Read the metrics until the step decides or times out; return the decision."""
        s = self.s
        started = self.clock()
        deadline = started + s.step_timeout_s
        reference = Reference.from_json(state.reference)
        baseline = None
        while baseline is None:
            try:
                baseline = self.source.snapshot(s.model)
            except OpsError as exc:
                if self.clock() >= deadline:
                    return Decision(
                        ROLLBACK, [f"metrics unreadable for the whole step: {exc}"]
                    ), None
                say(f"  metrics: {exc}; trying again")
                self.sleep(s.poll_s)
        next_progress = started + s.progress_s
        figs: Figures | None = None
        while True:
            self.sleep(s.poll_s)
            now = self.clock()
            try:
                snapshot = self.source.snapshot(s.model)
            except OpsError as exc:
                if now >= deadline:
                    why = f"step timeout ({s.step_timeout_s:g}s) with the metrics unreadable: {exc}"
                    return Decision(ROLLBACK, [why]), figs
                say(f"  metrics: {exc}; trying again")
                continue
            figs = figures(increase(baseline, snapshot), s.model, state.stable, state.version)
            held = now - started
            counted = figs.shadow.compared if step.shadow else figs.new.requests
            over = held >= s.hold_s and counted >= s.hold_requests
            decision = decide(step, figs, s.thresholds, reference, final=over)
            decision.figures.update(held_s=round(held, 1), counted=counted)
            if decision.verdict == ROLLBACK and not over:
                decision.reasons.insert(
                    0, f"clearly broken after {held:.0f}s, before the hold ended"
                )
            if decision.verdict in (GO, ROLLBACK):
                return decision, figs
            if now >= deadline:
                decision.verdict = ROLLBACK
                decision.reasons.append(
                    f"step timeout ({s.step_timeout_s:g}s) without the evidence to go on"
                )
                return decision, figs
            if now >= next_progress:
                next_progress = now + s.progress_s
                say(
                    f"  {held:.0f}s held, {counted:g} requests to v{state.version} "
                    f"(hold: {s.hold_s:g}s, {s.hold_requests} requests); "
                    + "; ".join(decision.reasons)
                )

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
            write_route(s.routing, s.model, None)
            del states[s.model]
        say(
            f"promoted: {state.from_label}=v{state.version}; {s.model}'s routing entry removed "
            "(default traffic: the newest AVAILABLE version)"
        )
        self.log("promoted", state)
        return "promoted"

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
                route, note = None, "the label had already moved: entry removed, promotion complete"
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
        self.s.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.s.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, sort_keys=True) + "\n")


def restore_route(state: State) -> tuple[ModelRoute | None, str]:
    """Return the entry a rolled-back model gets, and what it means.

    The entry it had before the rollout; without one, the gateways would serve the newest
    AVAILABLE version, which is usually the one rolled back: then the stable version keeps all
    default traffic until the new one is unloaded (push_model) and the entry removed by hand.
    """
    previous = route_from_json(state.previous)
    if previous is not None:
        return previous, f"routing entry back to what it was ({previous})"
    if state.version > state.stable:
        return (
            ModelRoute(((state.stable, 100.0),)),
            f"weights pinned to v{state.stable} (without an entry the newest AVAILABLE version, "
            f"v{state.version}, would serve); remove the entry once v{state.version} is unloaded",
        )
    return None, "routing entry removed"


# ---------------------------------------------------------------------------------------------
# the label move and the availability check, against the model servers


def push_args(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """Return push_model's arguments for this rollout's servers and config, with ``changes``."""
    base = dict(
        name=args.name, config=args.config, base_path=args.base_path, server=args.server,
        timeout=args.timeout, keep=args.keep, reader_wait=args.reader_wait,
        lock_timeout=args.lock_timeout, dry_run=False, promote=None, rollback=None, to=None,
        checkpoint=None, from_dir=None, label=None, version=None, set_label=None,
    )  # fmt: skip
    return argparse.Namespace(**{**base, **changes})


def promote_with_push(args: argparse.Namespace) -> Promote:
    """Return the label move push_model --promote makes (lock, history, replicas, reader wait)."""

    def promote(model: str, label: str, version: int) -> None:
        push.run(push_args(args, name=model, set_label=(label, version)), [])

    return promote


def available_on_replicas(
    specs: list[str], timeout_s: float, poll_s: float = 0.5
) -> CheckAvailable:
    """Return a check that every replica ``specs`` name reports a version AVAILABLE.

    Over the gateway's TF-free messages: the rollout runs without TensorFlow until it promotes.
    """

    def check(model: str, version: int) -> None:
        import grpc

        from backend.clients.grpc_client import GET_MODEL_STATUS
        from modelformat.protos import serving_pb2
        from modelformat.status import from_grpc
        from ops.server import CHANNEL_OPTIONS, replica_targets

        request = serving_pb2.GetModelStatusRequest()
        request.model_spec.name = model
        targets = replica_targets(specs)
        channels = {t: grpc.insecure_channel(t, options=CHANNEL_OPTIONS) for t in targets}
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        try:
            while True:
                for target, channel in channels.items():
                    call = channel.unary_unary(
                        GET_MODEL_STATUS,
                        request_serializer=serving_pb2.GetModelStatusRequest.SerializeToString,
                        response_deserializer=serving_pb2.GetModelStatusResponse.FromString,
                    )
                    try:
                        found = {v.version: v.state for v in from_grpc(call(request, timeout=5))}
                        states[target] = found.get(version, "not loaded")
                    except grpc.RpcError as exc:
                        states[target] = f"not answering ({exc.code().name})"
                if all(state == "AVAILABLE" for state in states.values()):
                    say(f"{model} v{version} AVAILABLE on {', '.join(targets)}")
                    return
                if time.monotonic() > deadline:
                    where = "; ".join(f"{t}: {st}" for t, st in states.items())
                    raise OpsError(
                        f"{model} v{version} is not AVAILABLE on every replica after "
                        f"{timeout_s:g}s ({where}); push it first (push_model --from-dir ...)"
                    )
                time.sleep(poll_s)
        finally:
            for channel in channels.values():
                channel.close()

    return check


def pin_to_stable(settings: Settings) -> bool:
    """Pin the model's default traffic to its stable version unless it has a routing entry.

    Returns whether a pin was written. OpsError if the model has no such label or a rollout of
    it is in progress (resume that one with --version).
    """
    s = settings
    try:
        with serverconfig.config_lock(s.config_path, s.lock_timeout_s, say):
            state = load_states(state_path_for(s.routing)).get(s.model)
            if state is not None:
                raise OpsError(
                    f"a rollout of {s.model} v{state.version} is in progress: resume it with "
                    f"--version {state.version} (no --from-dir/--checkpoint), or --revert it"
                )
            rollout = Rollout(s, GatewayMetrics([]), _never, _never)
            labels = rollout.labels()
            if s.from_label not in labels:
                raise OpsError(
                    f"{s.model} has no label {s.from_label!r} (labels: {labels or 'none'}): "
                    "a rollout needs the version to compare with"
                )
            stable = labels[s.from_label]
            entry = read_routing(s.routing).route(s.model)
            if entry is not None:
                say(f"{s.model} keeps its routing entry ({entry}): no new version gets default "
                    "traffic from it")  # fmt: skip
                return False
            write_route(s.routing, s.model, ModelRoute(((stable, 100.0),)))
    except FormatError as exc:  # the lock held too long
        raise OpsError(str(exc)) from exc
    say(
        f"pinned {s.model}'s default traffic to {s.from_label}=v{stable} in {s.routing} before "
        "publishing (without it the newest AVAILABLE version, the new one, would serve it)"
    )
    return True


def push_new_version(args: argparse.Namespace, settings: Settings, extra: list[str]) -> int:
    """Pin default traffic to stable, wait for the gateways, publish the new version (no label).

    Returns the published version. A failed push removes the pin it wrote and raises OpsError.
    """
    pinned = pin_to_stable(settings)
    if pinned:
        Rollout(settings, GatewayMetrics([]), _never, _never).wait_for_readers()
    pushed = push_args(args, checkpoint=args.checkpoint, from_dir=args.from_dir)
    try:
        outcome = push.run(pushed, extra)
    except (OpsError, KeyboardInterrupt):
        if pinned:
            try:
                with serverconfig.config_lock(settings.config_path, settings.lock_timeout_s, say):
                    write_route(settings.routing, settings.model, None)
            except FormatError as exc:
                raise OpsError(f"the push failed and the pin could not be removed: {exc}") from exc
            say(f"the push failed: {settings.model}'s pin removed")
        raise
    if outcome.new_version is None:
        raise OpsError("push_model published no version")
    return outcome.new_version


def _never(*_args: Any) -> None:
    raise AssertionError("not used before the rollout starts")


# ---------------------------------------------------------------------------------------------
# the command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed arguments (errors exit with the usage, as argparse does).

    Arguments after ``--`` go to ``python -m export build`` with ``--checkpoint`` (``args.extra``).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="rollout.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True, help="model name in models.config")
    new = parser.add_mutually_exclusive_group()
    new.add_argument("--version", type=int, help="the new version (pushed and AVAILABLE)")
    new.add_argument(
        "--from-dir", type=Path,
        help="publish this exported version directory first (default traffic pinned to the "
        "stable version before it is published), then roll it out",
    )  # fmt: skip
    new.add_argument(
        "--checkpoint", type=Path,
        help="export this checkpoint as the next version first (pinned as with --from-dir)",
    )  # fmt: skip
    parser.add_argument(
        "--from-label", default="stable",
        help="the label naming the version to compare with and to move when promoting (stable)",
    )  # fmt: skip
    parser.add_argument(
        "--steps", default=DEFAULT_STEPS,
        help=f"comma-separated: shadow:P (shadow P %% of the default traffic) or P (serve P %%) "
        f"(default {DEFAULT_STEPS})",
    )  # fmt: skip
    parser.add_argument("--hold-s", type=float, default=300.0, help="seconds each step holds")
    parser.add_argument(
        "--hold-requests", type=int, default=0,
        help="and until this many requests reached the new version (shadow steps: compared)",
    )  # fmt: skip
    parser.add_argument(
        "--step-timeout", type=float, default=None,
        help="seconds a step may hold waiting for enough samples before it rolls back "
        "(default: 3 x --hold-s + 600)",
    )  # fmt: skip
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--gateway", action="append", metavar="URL",
        help="a gateway whose /metrics to read (repeat for each one; counters summed)",
    )  # fmt: skip
    source.add_argument(
        "--prometheus", metavar="URL", help="read the metrics from Prometheus's API"
    )
    parser.add_argument("--min-agreement", type=float, default=0.9, help="shadow steps (0.9)")
    parser.add_argument(
        "--max-error-increase", type=float, default=0.01,
        help="error rate allowed above the stable version's, a fraction (0.01 = 1 point)",
    )  # fmt: skip
    parser.add_argument(
        "--max-latency-ratio", type=float, default=1.5, help="p99 allowed / stable's p99 (1.5)"
    )
    parser.add_argument(
        "--min-samples", type=int, default=100,
        help="samples a figure needs before it decides anything (100; a p99 needs ~100)",
    )  # fmt: skip
    parser.add_argument(
        "--server", action="append",
        help="model server gRPC host:port, as for push_model (default 127.0.0.1:8500); the new "
        "version must be AVAILABLE on every replica, and the promotion waits for them",
    )  # fmt: skip
    parser.add_argument(
        "--config", type=Path, default=push.default_config_path(),
        help="models.config (its lock, labels and label history); default as push_model",
    )  # fmt: skip
    parser.add_argument(
        "--routing", type=Path, default=None,
        help="the gateways' routing file (default: routing.yaml beside --config)",
    )  # fmt: skip
    parser.add_argument(
        "--base-path", type=Path, default=REPO / "models",
        help="host directory holding <name>/<version>/ (for the promotion, as push_model)",
    )  # fmt: skip
    parser.add_argument(
        "--log", type=Path, default=REPO / "results" / "rollouts.jsonl",
        help="append each decision here as a JSON line (default results/rollouts.jsonl)",
    )  # fmt: skip
    parser.add_argument(
        "--revert", action="store_true",
        help="end the model's recorded rollout: weights back, state cleared, label unmoved",
    )  # fmt: skip
    parser.add_argument(
        "--reader-wait", type=float, default=None,
        help="seconds after a routing change before a step counts as live (default: push_model's "
        "bound from the GATEWAY_* settings)",
    )  # fmt: skip
    parser.add_argument("--poll-s", type=float, default=5.0, help="seconds between metric reads")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per replica")
    parser.add_argument("--keep", type=int, default=2, help="as push_model: newest versions kept")
    parser.add_argument("--lock-timeout", type=float, default=600.0, help="as push_model")
    args = parser.parse_args(argv)
    args.extra = extra
    if extra and not args.checkpoint:
        parser.error("arguments after -- go to the exporter: they need --checkpoint")
    pushing = args.from_dir is not None or args.checkpoint is not None
    # The interrupted command plus --revert must work, --version and all; a push must not.
    if args.revert and pushing:
        parser.error("--revert takes no --from-dir or --checkpoint (nothing to publish)")
    if not args.revert:
        if args.version is None and not pushing:
            parser.error("--version is required (or --from-dir / --checkpoint, or --revert)")
        if not args.gateway and not args.prometheus:
            parser.error("name the metrics: --gateway URL (each one) or --prometheus URL")
        try:
            args.steps = parse_steps(args.steps)
        except OpsError as exc:
            parser.error(str(exc))
    if args.step_timeout is None:
        args.step_timeout = 3 * args.hold_s + 600
    args.server = args.server or ["127.0.0.1:8500"]
    if args.reader_wait is None:
        try:
            args.reader_wait = push.default_reader_wait_s()
        except SettingsError as exc:
            parser.error(f"--reader-wait: cannot derive it from the gateway settings: {exc}")
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    """Return the rollout settings the parsed arguments describe."""
    thresholds = Thresholds(
        args.min_agreement, args.max_error_increase, args.max_latency_ratio, args.min_samples
    )
    return Settings(
        model=args.name, version=args.version or 0, config_path=args.config,
        from_label=args.from_label, steps=args.steps if not args.revert else (),
        thresholds=thresholds, hold_s=args.hold_s, hold_requests=args.hold_requests,
        step_timeout_s=args.step_timeout, poll_s=args.poll_s,
        progress_s=max(args.poll_s, 30.0), reader_wait_s=args.reader_wait,
        lock_timeout_s=args.lock_timeout, routing_path=args.routing, log_path=args.log,
    )  # fmt: skip


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (a k8s Job deleted) stops like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = settings_from(args)
    source: MetricsSource = (
        PrometheusMetrics(args.prometheus)
        if args.prometheus
        else GatewayMetrics(args.gateway or [])
    )
    rollout = Rollout(
        settings, source, promote_with_push(args), available_on_replicas(args.server, args.timeout)
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.from_dir is not None or args.checkpoint is not None:
            settings.version = push_new_version(args, settings, args.extra)
            say(f"v{settings.version} published; the rollout starts")
        outcome = rollout.revert() if args.revert else rollout.run()
    except OpsError as exc:
        print(f"rollout: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(
            f"rollout: interrupted; {settings.routing} and {rollout.state_path} are consistent: "
            "run the same command again to resume, or add --revert to put the weights back",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return EXIT_PROMOTED if outcome == "promoted" else EXIT_ROLLED_BACK
