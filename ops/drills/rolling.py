"""Replicas come and go under load as they do in a cluster: a push, a rolling update, a replica
that loads slowly, one that hangs, and a rollback; no client request may fail.

  python scripts/rolling_drill.py --spawn models/ --model minilm-intent --clients 16

The gateway's upstream names a fixed set of *slots*, ``--replicas`` + 2 addresses on 127.0.0.1:
one machine cannot give each replica its own IP on the ports a model server binds, so a slot
stands for one address a headless Service's DNS would list, and an empty slot refuses
connections. Under ``--clients`` closed-loop clients (label stable, label canary, no label, and
version 1 named explicitly), one step after another, each followed by ``--gap`` s of load:

1. push: a copy of the newest exported version is published as v2 with ``--label canary``;
2. rolling update: each original replica is replaced: a new one starts in a free slot and loads
   while the others serve; once it reports every version the labels name AVAILABLE (what the
   TF Serving readiness check in deploy/k8s requires) the old one gets SIGTERM;
3. slow replica: one more replica joins behind a delay proxy that holds every answer
   ``--slow-delay`` s for its first ``--slow-for`` s (slow status and slow predicts);
4. hang: one replica is SIGSTOPped for ``--hang`` s (its sockets stay open, nothing answers);
5. rollback: ``push_model --rollback canary`` (canary back to v1, v2 unloaded after the
   readers' wait).

Checks: zero failed requests of any kind; every answer names a version that a replica up at
that moment reported AVAILABLE; ``/readyz`` (polled every 0.5 s) always answers 200 within the
gateway's readiness-probe timeout; every replacement served requests; push and rollback
succeed. Predict attempts a replica refused (a version it had not loaded) are counted and
shown: the gateway retries those on another replica. ``--json`` writes the figures; exits 1 if
a check fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from modelformat import serverconfig
from ops import modelconfig, stack
from ops.delayproxy import DelayProxy
from ops.drills import common
from ops.drills.common import Answer, copy_newest, pinned_config
from ops.drills.replica import run_push, scrape, upstream_settings
from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess, child_env, free_port, port_open
from ops.server import ModelServer

# deploy/k8s/base/gateway.yaml: the gateway's readinessProbe timeoutSeconds.
PROBE_TIMEOUT_S = 3.0
LABELS = ["stable", "canary", "", "@1"]


@dataclass
class Slot:
    """One address the gateway names; a replica (maybe behind a delay proxy) or nothing."""

    grpc_port: int
    rest_port: int
    replica: ReplicaProc | None = None
    proxies: list[DelayProxy] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass
class ReplicaProc:
    """A model server of the drill: its own ports, the slot it stands in, its life span."""

    name: str
    proc: ServerProcess
    grpc_port: int
    rest_port: int
    started: float
    stopped: float | None = None
    counts: dict[str, int] = field(default_factory=dict)  # its request counts when last seen

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class Monitor:
    """Polls every live replica's version states (one thread each) and /readyz of the gateway."""

    def __init__(self, model: str, ready_url: str, probe_timeout_s: float):
        self.model = model
        self.ready_url = ready_url
        self.probe_timeout_s = probe_timeout_s
        # (time, replica, AVAILABLE versions): answers only (a silent replica serves nothing)
        self.seen: list[tuple[float, str, frozenset[int]]] = []
        self.ready: list[tuple[float, int, float]] = []  # (time, status (0: none), seconds)
        self._stops: dict[str, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()

    def start(self) -> Monitor:
        """Start polling /readyz; return self."""
        self._spawn(self._poll_ready)
        return self

    def watch(self, replica: ReplicaProc) -> None:
        """Start polling ``replica``'s version states until ``forget``."""
        self._stops[replica.name] = stop = threading.Event()
        self._spawn(self._poll_replica, replica, stop)

    def forget(self, replica: ReplicaProc) -> None:
        """Stop polling ``replica``."""
        self._stops.pop(replica.name).set()

    def stop(self) -> None:
        """Stop every poll."""
        self._done.set()
        for stop in self._stops.values():
            stop.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _poll_replica(self, replica: ReplicaProc, stop: threading.Event) -> None:
        server = ModelServer(replica.target, timeout_s=1.0)
        try:
            while not (stop.is_set() or self._done.is_set()):
                try:
                    states = server.status(self.model)
                except OpsError:
                    pass
                else:
                    available = frozenset(s.version for s in states if s.state == "AVAILABLE")
                    self.seen.append((time.monotonic(), replica.name, available))
                stop.wait(0.2)
        finally:
            server.close()

    def _poll_ready(self) -> None:
        session = requests.Session()
        while not self._done.is_set():
            started = time.monotonic()
            try:
                status = session.get(self.ready_url, timeout=self.probe_timeout_s).status_code
            except requests.RequestException:
                status = 0
            self.ready.append((started, status, time.monotonic() - started))
            self._done.wait(0.5)

    def available_somewhere(self, answer: Answer, slack_s: float = 0.5) -> bool:
        """Return True if a replica reported ``answer``'s version AVAILABLE around it."""
        return any(
            answer.version in versions
            for t, _, versions in self.seen
            if answer.started - slack_s <= t <= answer.finished + slack_s
        )

    def available_on(self, name: str) -> frozenset[int]:
        """Return the versions ``name`` last reported AVAILABLE (empty before its first answer)."""
        for _, who, versions in reversed(self.seen):
            if who == name:
                return versions
        return frozenset()


class Drill:
    """The stack of one run: slots, replicas, the gateway, the load and the monitor."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.base = work / "models"
        self.config = work / "models.config"
        self.slots = [Slot(free_port(), free_port()) for _ in range(args.replicas + 2)]
        self.replicas: list[ReplicaProc] = []
        self.events: dict[int, list[str]] = defaultdict(list)
        self.steps: dict[str, dict[str, Any]] = {}
        self.t0 = time.monotonic()
        self.monitor: Monitor | None = None

    # -- replicas -------------------------------------------------------------------------
    def start_replica(self, slot: Slot, *, behind_proxy: bool = False) -> ReplicaProc:
        """Start a model server standing in ``slot`` (directly, or behind delay proxies)."""
        if behind_proxy:
            grpc_port, rest_port = free_port(), free_port()
            slot.proxies = [
                DelayProxy(grpc_port, port=slot.grpc_port).start(),
                DelayProxy(rest_port, port=slot.rest_port).start(),
            ]
        else:
            grpc_port, rest_port = slot.grpc_port, slot.rest_port
        name = f"r{len(self.replicas)}"
        cmd = stack.modelserver_cmd(grpc_port, rest_port, self.config, batching=False)
        proc = ServerProcess(cmd, self.work / f"modelserver-{name}.log", child_env(), name=name)
        replica = ReplicaProc(name, proc, grpc_port, rest_port, time.monotonic())
        slot.replica = replica
        self.replicas.append(replica)
        return replica

    def wait_listening(self, replica: ReplicaProc) -> None:
        """Wait until ``replica`` accepts connections on both of its ports."""
        replica.proc.wait_until(
            lambda: port_open(replica.grpc_port) and port_open(replica.rest_port),
            self.args.step_timeout,
        )

    def wait_ready(self, replica: ReplicaProc) -> float:
        """Wait until ``replica`` listens and reports every labelled version AVAILABLE."""
        started = time.monotonic()
        self.wait_listening(replica)
        assert self.monitor is not None
        self.monitor.watch(replica)

        def labelled_available() -> bool:
            model = modelconfig.find_model(modelconfig.load_config(self.config), self.args.model)
            wanted = set(model.version_labels.values())
            return wanted <= self.monitor.available_on(replica.name)  # type: ignore[union-attr]

        replica.proc.wait_until(labelled_available, self.args.step_timeout)
        return time.monotonic() - started

    def stop_replica(self, slot: Slot) -> None:
        """SIGTERM the replica in ``slot`` (its last counts kept) and empty the slot."""
        replica = slot.replica
        assert replica is not None and self.monitor is not None
        replica.counts = scrape(replica.rest_port, self.args.model) or replica.counts
        self.monitor.forget(replica)
        replica.proc.stop()
        replica.stopped = time.monotonic()
        slot.replica = None
        for proxy in slot.proxies:
            proxy.stop()
        slot.proxies = []

    def live(self) -> list[ReplicaProc]:
        """Return the replicas now standing in a slot."""
        return [s.replica for s in self.slots if s.replica is not None]

    def free_slot(self) -> Slot:
        """Return an empty slot."""
        return next(s for s in self.slots if s.replica is None)

    def mark(self, text: str) -> float:
        """Print and remember a step on the timeline; return the time."""
        now = time.monotonic()
        self.events[int(now - self.t0)].append(text)
        print(f"== t={now - self.t0:.1f}s {text}", flush=True)
        return now

    def push(self, step: str, argv: list[str]) -> None:
        """Run push_model against every live replica; record the step."""
        self.mark(step)
        servers = [f"--server={r.target}" for r in self.live()]
        common = [
            "--name", self.args.model, "--config", str(self.config),
            "--base-path", str(self.base), "--timeout", str(self.args.step_timeout),
        ]  # fmt: skip
        ok, took, error = run_push([*argv, *common, *servers])
        self.steps[step] = {"ok": ok, "seconds": round(took, 1), "error": error}
        self.mark(f"{step}: {'done' if ok else 'FAILED'} ({took:.1f}s)")

    def pause(self) -> None:
        """Let the load run ``--gap`` seconds between steps."""
        time.sleep(self.args.gap)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Set up, run every step under load, tear down; return the results."""
        args = self.args
        source, _ = copy_newest(args.spawn, args.model, self.base, as_version=1)
        serverconfig.write_atomic(self.config, pinned_config(args.model, self.base, 1))
        gateway = None
        load = None
        try:
            first = [self.start_replica(slot) for slot in self.slots[: args.replicas]]
            # As deployed (deploy/k8s): /readyz checks the default model.
            settings = {
                **upstream_settings(self.slots, args.upstream, args.workers),
                "GATEWAY_DEFAULT_MODEL": args.model,
            }
            for replica in first:
                self.wait_listening(replica)
            gateway, url = stack.start_gateway(
                args.upstream, self.slots[0].grpc_port, self.slots[0].rest_port, self.base,
                self.config, self.work, settings=settings,
            )  # fmt: skip
            self.monitor = Monitor(args.model, f"{url}/readyz", args.probe_timeout).start()
            for replica in first:
                self.wait_ready(replica)
            load = common.Load(
                url, args.model, args.verb, LABELS, args.clients, interval_s=args.pace
            ).start()
            self.t0 = time.monotonic()
            self.steps_under_load(source, first)
            answers = load.stop()
            load = None
            for slot in self.slots:
                if slot.replica is not None:
                    slot.replica.counts = scrape(slot.replica.rest_port, args.model) or {}
            return self.results(answers)
        finally:
            if load is not None:
                load.stop()
            if self.monitor is not None:
                self.monitor.stop()
            if gateway is not None:
                gateway.stop()
            for slot in self.slots:
                if slot.replica is not None:
                    slot.replica.proc.kill(signal.SIGCONT)
                    slot.replica.proc.stop()
                for proxy in slot.proxies:
                    proxy.stop()

    def steps_under_load(self, source: Path, first: list[ReplicaProc]) -> None:
        """Push, roll every replica, add a slow one, hang one, roll back."""
        args = self.args
        self.pause()
        self.push("push v2 -> canary", ["--from-dir", str(source), "--label", "canary"])
        self.pause()
        for old in first:
            slot = self.free_slot()
            new = self.start_replica(slot)
            self.mark(f"rolling: {new.name} starts in slot :{slot.grpc_port} (replaces {old.name})")
            took = self.wait_ready(new)
            self.mark(f"rolling: {new.name} ready ({took:.1f}s); SIGTERM {old.name}")
            self.stop_replica(next(s for s in self.slots if s.replica is old))
            self.steps[f"replace {old.name} by {new.name}"] = {
                "ok": True,
                "seconds": round(took, 1),
            }
            self.pause()
        slot = self.free_slot()
        slow = self.start_replica(slot, behind_proxy=True)
        for proxy in slot.proxies:
            proxy.delay_s = args.slow_delay
        self.mark(f"slow replica {slow.name} joins (answers held {args.slow_delay}s)")
        took = self.wait_ready(slow)
        self.mark(f"{slow.name} loaded ({took:.1f}s)")
        time.sleep(max(0.0, slow.started + args.slow_for - time.monotonic()))
        for proxy in slot.proxies:
            proxy.delay_s = 0.0
        self.mark(f"{slow.name} answers at full speed")
        self.steps[f"slow replica {slow.name}"] = {"ok": True, "seconds": round(took, 1)}
        self.pause()
        victim = next(r for r in self.live() if r is not slow)
        victim.proc.kill(signal.SIGSTOP)
        self.mark(f"hang {victim.name} (SIGSTOP) for {args.hang:.0f}s")
        time.sleep(args.hang)
        victim.proc.kill(signal.SIGCONT)
        self.mark(f"{victim.name} answers again (SIGCONT)")
        self.pause()
        self.push("rollback canary", ["--rollback", "canary"])
        self.pause()

    def results(self, answers: list[Answer]) -> dict[str, Any]:
        """Judge the run; print the timeline, the replicas and the checks."""
        assert self.monitor is not None
        t0 = self.t0
        failed = [a for a in answers if not a.ok]
        unavailable = [
            (a.version, round(a.finished - t0, 2))
            for a in answers
            if a.ok and not self.monitor.available_somewhere(a)
        ]
        ready = self.monitor.ready
        ready_max = max((s for _, _, s in ready), default=float("nan"))
        not_ready = [(round(t - t0, 1), status) for t, status, _ in ready if status != 200]
        replicas: dict[str, dict[str, Any]] = {
            r.name: {
                "served": r.counts.get("OK", 0),
                "refused": sum(v for k, v in r.counts.items() if k != "OK"),
                "started_s": round(r.started - t0, 1),
                "stopped_s": None if r.stopped is None else round(r.stopped - t0, 1),
            }
            for r in self.replicas
        }
        replacements = self.replicas[self.args.replicas :]
        latencies = sorted(a.finished - a.started for a in answers if a.ok)
        checks = {
            "zero failed requests (default, label, explicit version)": bool(answers) and not failed,
            "every answer from a version a live replica had AVAILABLE": not unavailable,
            f"/readyz always 200 within {self.args.probe_timeout:g}s": not not_ready
            and ready_max < self.args.probe_timeout,
            "every new replica served": all(r.counts.get("OK", 0) > 0 for r in replacements),
            "push and rollback reached every replica": all(s["ok"] for s in self.steps.values()),
        }
        result = {
            "checks": checks,
            "upstream": self.args.upstream,
            "steps": self.steps,
            "counts": common.counts(answers),
            "by_kind": {
                label or "default": sum(1 for a in answers if a.label == label and a.ok)
                for label in LABELS
            },
            "replicas": replicas,
            "refused_attempts": sum(r["refused"] for r in replicas.values()),
            "readyz_max_s": round(ready_max, 3),
            "readyz_not_ready": not_ready[:10],
            "unavailable_examples": unavailable[:5],
            "failed_examples": [(a.label, a.status, a.error) for a in failed[:5]],
            "latency_p50_ms": round(_quantile(latencies, 0.5) * 1000, 1),
            "latency_p99_ms": round(_quantile(latencies, 0.99) * 1000, 1),
        }
        self.report(result, answers)
        return result

    def report(self, result: dict[str, Any], answers: list[Answer]) -> None:
        """Print the timeline, the per-replica table and the checks."""
        print("\nTimeline (answers finished per second, by version):")
        print(common.timeline(answers, self.t0, dict(self.events)))
        print("\nCounts:", json.dumps(result["counts"], sort_keys=True))
        print("Answers by kind:", json.dumps(result["by_kind"]))
        print("\nreplica  up at   down at  served  refused (retried elsewhere)")
        for name, r in result["replicas"].items():
            down = "-" if r["stopped_s"] is None else f"{r['stopped_s']:.1f}s"
            print(f"{name:<8} {r['started_s']:>6.1f}s {down:>8} {r['served']:>7} {r['refused']:>8}")
        for name, step in result["steps"].items():
            print(f"step {name}: {'ok' if step['ok'] else 'FAILED ' + step.get('error', '')}"
                  f" in {step['seconds']}s")  # fmt: skip
        print(
            f"/readyz: slowest {result['readyz_max_s'] * 1000:.0f} ms "
            f"(probe timeout {self.args.probe_timeout:g} s), "
            f"not ready {len(result['readyz_not_ready'])}x"
        )
        print(f"latency p50 {result['latency_p50_ms']} ms, p99 {result['latency_p99_ms']} ms")
        common.print_checks(result["checks"])


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path to copy from")
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--upstream", default="grpc", choices=["grpc", "rest"])
    p.add_argument("--replicas", type=int, default=3, help="replicas before and after the roll")
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers of the gateway")
    p.add_argument("--clients", type=int, default=16)
    common.add_pace(p)
    p.add_argument("--gap", type=float, default=5.0, help="seconds of load between steps")
    p.add_argument("--slow-delay", type=float, default=2.0, help="seconds the slow one holds")
    p.add_argument("--slow-for", type=float, default=15.0, help="seconds it is slow")
    p.add_argument("--hang", type=float, default=20.0, help="seconds one replica hangs")
    p.add_argument("--probe-timeout", type=float, default=PROBE_TIMEOUT_S)
    p.add_argument(
        "--step-timeout", type=float, default=600.0,
        help="seconds a replica may take to load, and push_model's --timeout",
    )  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    if args.replicas < 2:
        p.error("--replicas must be at least 2 (one hangs while the others serve)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return common.run_in_tmp("rolling_drill", args.json, lambda work: Drill(args, work).run())
