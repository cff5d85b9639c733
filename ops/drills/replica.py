"""Several model-server replicas behind one gateway, under load: one is SIGKILLed and restarted,
then a new version is pushed to all and promoted.

  python scripts/replica_drill.py --spawn models/ --model minilm-intent --duration 60

Starts ``--replicas`` model servers on 127.0.0.1 (one models.config, one copy of the model's
newest version) and a gateway with ``--workers`` gunicorn workers whose upstream names them all
(gRPC ``ipv4:a:p,b:p,…`` balanced by gRPC's round_robin, or ``--upstream rest`` with the list of
base URLs), and runs ``--clients`` closed-loop clients (labels stable, canary and none) while:

1. at 15 % of ``--duration`` one replica gets SIGKILL, stays down ``--down`` seconds and is
   started again on the same ports;
2. once it listens again (and not before 45 % of the duration), push_model publishes a copy of
   the newest version to every replica with ``--label canary``;
3. then (not before 70 %) ``--promote canary stable``; the load goes on to the end of the duration
   (and at least ``--tail`` seconds after the promote).

Checks: zero failed requests; within each window in which the set of live replicas stays the
same, each live replica's own Predict count (its Prometheus ``request_count``) is within
``--spread`` of the window's mean; every answer names a version that each replica the status
monitor saw up at that moment reported AVAILABLE, and no replica counted a failed request (a
replica asked for a version it had not loaded answers NOT_FOUND); the restarted replica serves
again; both push steps succeed. Prints a per-second timeline, a per-replica table and the checks;
``--json`` writes them too. Exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from modelformat import serverconfig
from ops import stack, tfs_metrics
from ops.drills import common
from ops.drills.common import Answer, copy_newest, pinned_config
from ops.lifecycle import push
from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess, child_env, free_port, port_open
from ops.server import ModelServer
from ops.tfs_metrics import METRICS_PATH

# When each step may start, as a fraction of --duration.
KILL_AT, PUSH_AT, PROMOTE_AT = 0.15, 0.45, 0.70
SETTLE_S = 2.0  # a window starts this long after a replica left or came back (reconnects)
# and the first lasts at least as long
MIN_PER_REPLICA = 20  # a window with fewer requests per live replica is too short to judge


def scrape(rest_port: int, model: str, timeout_s: float = 2.0) -> dict[str, int] | None:
    """Return one replica's request counts by status, or None when it does not answer."""
    return tfs_metrics.scrape(f"http://127.0.0.1:{rest_port}{METRICS_PATH}", model, timeout_s)


@dataclass
class Replica:
    """One model server of the drill, on fixed ports so a restart comes back at the same address."""

    name: str
    proc: ServerProcess
    grpc_port: int
    rest_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass
class ReplicaMonitor:
    """Polls each replica's version states and request counts; remembers what it saw when."""

    replicas: list[Replica]
    model: str
    every_s: float = 0.2
    # (time, replica name, AVAILABLE versions; None = no answer)
    seen: list[tuple[float, str, frozenset[int] | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._servers = {r.name: ModelServer(r.target, timeout_s=1.0) for r in self.replicas}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ReplicaMonitor:
        """Start polling; return self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling and close the channels."""
        self._stop.set()
        self._thread.join(timeout=5)
        for server in self._servers.values():
            server.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, server in self._servers.items():
                try:
                    states = server.status(self.model)
                    available = frozenset(s.version for s in states if s.state == "AVAILABLE")
                except OpsError:
                    available = None
                self.seen.append((time.monotonic(), name, available))
            self._stop.wait(self.every_s)

    def unavailable_on_live_replica(self, answer: Answer, slack_s: float = 0.3) -> list[str]:
        """Return the replicas seen up around ``answer`` that never reported its version
        AVAILABLE then (empty: every live replica could serve it)."""
        window: dict[str, list[frozenset[int]]] = defaultdict(list)
        for t, name, available in self.seen:
            if answer.started - slack_s <= t <= answer.finished + slack_s and available is not None:
                window[name].append(available)
        return sorted(
            name
            for name, sightings in window.items()
            if not any(answer.version in versions for versions in sightings)
        )


@dataclass
class Window:
    """A stretch of the drill with one set of live replicas and their counts at both ends."""

    name: str
    start: float
    end: float
    live: list[str]
    before: dict[str, dict[str, int]] = field(default_factory=dict)
    after: dict[str, dict[str, int]] = field(default_factory=dict)

    def served(self) -> dict[str, int]:
        """Return the OK Predict calls each live replica answered within the window."""
        return {
            name: self.after.get(name, {}).get("OK", 0) - self.before.get(name, {}).get("OK", 0)
            for name in self.live
        }


def spread(counts: dict[str, int]) -> float:
    """Return the largest relative distance of a count from the counts' mean (0 = even)."""
    if not counts:
        return 0.0
    mean = sum(counts.values()) / len(counts)
    return max(abs(c - mean) / mean for c in counts.values()) if mean else float("inf")


def judge_windows(windows: list[Window], bound: float) -> dict[str, Any]:
    """Return each window's counts and spread, and whether every judged window is within bound."""
    rows = []
    for w in windows:
        served = w.served()
        judged = bool(served) and min(served.values()) >= MIN_PER_REPLICA
        rows.append(
            {
                "window": w.name,
                "seconds": round(w.end - w.start, 1),
                "live": w.live,
                "served": served,
                "spread": round(spread(served), 3),
                "judged": judged,
                "within_bound": (spread(served) <= bound) if judged else None,
            }
        )
    judged_rows = [r for r in rows if r["judged"]]
    return {
        "rows": rows,
        "ok": bool(judged_rows) and all(r["within_bound"] for r in judged_rows),
    }


def start_replicas(config: Path, work: Path, count: int, timeout_s: float = 300) -> list[Replica]:
    """Start ``count`` model servers on free ports (all at once); return them once they listen."""
    replicas = []
    for index in range(count):
        grpc_port, rest_port = free_port(), free_port()
        cmd = stack.modelserver_cmd(grpc_port, rest_port, config, batching=False)
        name = f"r{index}"
        proc = ServerProcess(cmd, work / f"modelserver-{name}.log", child_env(), name=name)
        replicas.append(Replica(name, proc, grpc_port, rest_port))
    try:
        for r in replicas:
            wait_listening(r, timeout_s)
    except BaseException:
        for r in replicas:
            r.proc.stop()
        raise
    return replicas


def wait_listening(replica: Replica, timeout_s: float) -> None:
    """Return once ``replica`` accepts connections on both ports (its models are loaded)."""
    replica.proc.wait_until(
        lambda: port_open(replica.grpc_port) and port_open(replica.rest_port), timeout_s
    )


def snapshot(replicas: list[Replica], model: str) -> dict[str, dict[str, int]]:
    """Return every answering replica's request counts by status."""
    out = {}
    for r in replicas:
        counts = scrape(r.rest_port, model)
        if counts is not None:
            out[r.name] = counts
    return out


class Address(Protocol):
    """Where the gateway reaches one replica: its gRPC target and REST port."""

    @property
    def target(self) -> str: ...

    rest_port: int


def upstream_settings(replicas: Sequence[Address], upstream: str, workers: int) -> dict[str, str]:
    """Return the gateway's GATEWAY_* settings naming every replica."""
    return {
        "GATEWAY_TFS_GRPC": "ipv4:" + ",".join(r.target for r in replicas),
        "GATEWAY_TFS_REST": ",".join(f"http://127.0.0.1:{r.rest_port}" for r in replicas),
        "GATEWAY_WORKERS": str(workers),
        "GATEWAY_ACCESS_LOG": "",
    }


def run_push(argv: list[str]) -> tuple[bool, float, str]:
    """Run one push_model invocation; return (succeeded, seconds, error)."""
    started = time.monotonic()
    args, extra = push.parse_args(argv)
    try:
        push.run(args, extra)
    except OpsError as exc:
        print(f"push_model: error: {exc}", file=sys.stderr, flush=True)
        return False, time.monotonic() - started, str(exc)
    return True, time.monotonic() - started, ""


def drill(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Run the stack, the load and the steps; print the tables; return checks and figures."""
    base = work / "models"
    source, newest = copy_newest(args.spawn, args.model, base)
    config = work / "models.config"
    serverconfig.write_atomic(config, pinned_config(args.model, base, newest))
    replicas = start_replicas(config, work, args.replicas)
    gateway = None
    monitor = None
    try:
        gateway, url = stack.start_gateway(
            args.upstream, replicas[0].grpc_port, replicas[0].rest_port, base, config, work,
            settings=upstream_settings(replicas, args.upstream, args.workers),
        )  # fmt: skip
        push_args = [
            "--name", args.model, "--config", str(config), "--base-path", str(base),
            "--timeout", str(args.step_timeout), *[f"--server={r.target}" for r in replicas],
        ]  # fmt: skip
        monitor = ReplicaMonitor(replicas, args.model).start()
        return run_phases(args, replicas, url, push_args, monitor, source)
    finally:
        if monitor is not None:
            monitor.stop()
        if gateway is not None:
            gateway.stop()
        for r in replicas:
            r.proc.stop()


def run_phases(
    args: argparse.Namespace,
    replicas: list[Replica],
    url: str,
    push_args: list[str],
    monitor: ReplicaMonitor,
    source: Path,
) -> dict[str, Any]:
    """Load the gateway through the kill, restart, push and promote; return the results."""
    names = [r.name for r in replicas]
    victim = replicas[1 % len(replicas)]
    load = common.Load(
        url, args.model, args.verb, ["stable", "canary", ""], args.clients, interval_s=args.pace
    )
    events: dict[int, list[str]] = defaultdict(list)
    steps: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()

    def mark(text: str) -> float:
        now = time.monotonic()
        events[int(now - t0)].append(text)
        print(f"== t={now - t0:.1f}s {text}", flush=True)
        return now

    load.start()
    time.sleep(SETTLE_S)
    w_all = Window("all up", time.monotonic(), 0.0, names, before=snapshot(replicas, args.model))
    time.sleep(max(0.0, t0 + max(KILL_AT * args.duration, 2 * SETTLE_S) - time.monotonic()))
    w_all.after = snapshot(replicas, args.model)
    w_all.end = time.monotonic()
    victim.proc.kill(signal.SIGKILL)
    killed = mark(f"SIGKILL {victim.name} ({victim.target})")
    live = [n for n in names if n != victim.name]
    time.sleep(min(SETTLE_S, args.down))
    w_down = Window(f"{victim.name} down", time.monotonic(), 0.0, live)
    w_down.before = snapshot(replicas, args.model)
    time.sleep(max(0.0, killed + args.down - time.monotonic()))
    victim.proc.restart()
    mark(f"restart {victim.name}")
    try:
        wait_listening(victim, args.step_timeout)
    except (TimeoutError, RuntimeError) as exc:
        load.stop()
        raise OpsError(f"{victim.name} did not come back after its restart: {exc}") from exc
    # The outage window runs until the victim listens again (its model loads meanwhile): the
    # live replicas carry the whole load for all of it.
    w_down.after = snapshot(replicas, args.model)
    w_down.end = time.monotonic()
    back = mark(f"{victim.name} listening again")
    steps["restart"] = {"ok": True, "seconds": round(back - killed, 1)}
    time.sleep(SETTLE_S)
    w_back = Window("all up again", time.monotonic(), 0.0, names)
    w_back.before = snapshot(replicas, args.model)

    time.sleep(max(0.0, t0 + PUSH_AT * args.duration - time.monotonic()))
    mark("push copy -> canary (every replica)")
    ok, took, error = run_push(["--from-dir", str(source), "--label", "canary", *push_args])
    steps["push -> canary"] = {"ok": ok, "seconds": round(took, 1), "error": error}
    mark(f"canary moved ({took:.1f}s)" if ok else "push failed")
    time.sleep(max(0.0, t0 + PROMOTE_AT * args.duration - time.monotonic()))
    mark("promote canary -> stable")
    ok, took, error = run_push(["--promote", "canary", "stable", *push_args])
    steps["promote canary -> stable"] = {"ok": ok, "seconds": round(took, 1), "error": error}
    promoted = mark(f"stable moved ({took:.1f}s)" if ok else "promote failed")
    time.sleep(max(0.0, max(t0 + args.duration, promoted + args.tail) - time.monotonic()))
    w_back.after = snapshot(replicas, args.model)
    w_back.end = time.monotonic()
    answers = load.stop()
    final = snapshot(replicas, args.model)

    windows = judge_windows([w_all, w_down, w_back], args.spread)
    not_available = [
        (a.version, round(a.finished - t0, 2), where)
        for a in answers
        if a.ok and (where := monitor.unavailable_on_live_replica(a))
    ]
    # Counts since each replica's (re)start; the victim's first life ended at the kill.
    replica_failures = {
        name: sum(v for status, v in counts.items() if status != "OK")
        for name, counts in final.items()
    }
    victim_first = w_down.before.get(victim.name) or w_all.after.get(victim.name, {})
    replica_failures[f"{victim.name} before the kill"] = sum(
        v for status, v in victim_first.items() if status != "OK"
    )
    failed = [a for a in answers if not a.ok]
    checks = {
        "zero failed requests": not failed and bool(answers),
        f"load within ±{args.spread:.0%} across live replicas (each window)": windows["ok"],
        "every answer from a version AVAILABLE on its replica": not not_available
        and not any(replica_failures.values()),
        f"{victim.name} serves again after its restart": w_back.served().get(victim.name, 0) > 0,
        "push and promote reached every replica": all(s["ok"] for s in steps.values()),
    }
    result = {
        "checks": checks,
        "upstream": args.upstream,
        "replicas": {r.name: r.target for r in replicas},
        "steps": steps,
        "windows": windows["rows"],
        "counts": common.counts(answers),
        "replica_counts_at_end": final,
        "replica_failed_requests": replica_failures,
        "not_available_examples": not_available[:5],
        "failed_examples": [a.error or a.status for a in failed[:5]],
        "latency_p99_ms": _p99([a.finished - a.started for a in answers if a.ok]) * 1000,
    }
    report(result, answers, t0, events)
    return result


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def report(result: dict[str, Any], answers: list[Answer], t0: float, events: Any) -> None:
    """Print the timeline, the per-replica table and the checks."""
    print("\nTimeline (answers finished per second, by version):")
    print(common.timeline(answers, t0, dict(events)))
    print("\nCounts:", json.dumps(result["counts"], sort_keys=True))
    names = list(result["replicas"])
    print("\nPredict calls each replica answered (its own request_count), per window:")
    print(f"{'window':<16} {'s':>5}  " + "  ".join(f"{n:>7}" for n in names) + "   spread")
    for row in result["windows"]:
        cells = "  ".join(f"{row['served'].get(n, '-'):>7}" for n in names)
        verdict = (
            "too few to judge"
            if not row["judged"]
            else f"{row['spread']:.1%} {'ok' if row['within_bound'] else 'OVER'}"
        )
        print(f"{row['window']:<16} {row['seconds']:>5}  {cells}   {verdict}")
    print("Failed requests counted by the replicas:", json.dumps(result["replica_failed_requests"]))
    for name, step in result["steps"].items():
        print(f"step {name}: {'ok' if step['ok'] else 'FAILED'} in {step['seconds']}s")
    print(f"p99 latency: {result['latency_p99_ms']:.1f} ms")
    common.print_checks(result["checks"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path to copy from")
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--upstream", default="grpc", choices=["grpc", "rest"])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers of the gateway")
    p.add_argument("--clients", type=int, default=16)
    common.add_pace(p)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (at least)")
    p.add_argument("--down", type=float, default=5.0, help="seconds the killed replica stays down")
    p.add_argument("--tail", type=float, default=3.0, help="seconds of load after the promote")
    p.add_argument(
        "--step-timeout", type=float, default=600.0,
        help="seconds the restarted replica may take to listen again, and push_model's "
        "--timeout for each replica to load the pushed version (a busy 2-core machine "
        "loading a BERT version under load needs minutes)",
    )  # fmt: skip
    p.add_argument("--spread", type=float, default=0.2, help="allowed distance from the mean")
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    if args.replicas < 2:
        p.error("--replicas must be at least 2 (one is killed)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="replica-drill-") as tmp:
            result = drill(args, Path(tmp))
    except OpsError as exc:
        print(f"replica_drill: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(result["checks"].values()) else 1
