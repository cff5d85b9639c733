"""Faults under load, measured: the model server SIGKILLed and restarted, then made slow.

  python scripts/fault_drill.py --spawn models/ --model minilm-intent --timeout 2

Starts a throw-away model server on a copy of the model's newest version, a delay proxy in
front of its gRPC port (real sockets) and a gateway (gunicorn, gRPC upstream) behind the proxy
with GATEWAY_TIMEOUT_S=--timeout, then runs clients through the gateway while:

1. **kill**: the model server gets SIGKILL, stays down ``--down`` seconds, and is started again.
   Required: the gateway answers 503 JSON errors within the timeout, never hangs, no gunicorn
   worker dies, and it serves again soon after the model server's ports open: within gRPC's
   capped reconnect backoff (+20 % jitter) plus one request's timeout (``recovery_bounds``).
2. **slow**: the proxy holds back every reply by ``--slow-delay``, more than the timeout and
   its margin (refused otherwise: a 504 at the timeout and one when the held reply comes would
   both fall within the check's bound). Required: 504 JSON errors at the timeout (not later),
   no pile-up (the last slow answers take no longer than the first), and normal answers within
   one timeout once the delay is removed.
Every bound carries MARGIN_S for the drill's own clients being scheduled late on a busy machine;
none is a figure measured on one machine.

Prints the figures and PASS/FAIL per check; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from modelformat import serverconfig
from ops import modelconfig, stack
from ops.delayproxy import DelayProxy
from ops.drills import common
from ops.drills.common import Answer, copy_newest
from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess, port_open

MARGIN_S = 1.0  # the drill's clients and the gateway share a busy (2-core) machine
RECONNECT_JITTER = 0.2  # gRPC's reconnect backoff is spread by +-20 %
WORKERS = 2  # gunicorn workers per gateway: a dead one shows up as a changed pid set


def workers(gateway: ServerProcess) -> set[int]:
    """Return the pids of the gunicorn master's worker processes."""
    try:
        return {p.pid for p in psutil.Process(gateway.proc.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def wait_workers(gateway: ServerProcess, count: int, timeout_s: float = 60.0) -> set[int]:
    """Return the worker pids once all ``count`` workers have booted (readiness needs only one)."""
    deadline = time.monotonic() + timeout_s
    while len(found := workers(gateway)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def first_ok_after(answers: list[Answer], t: float) -> float | None:
    """Return when the first successful answer to a request started after ``t`` finished."""
    times = [a.finished for a in answers if a.ok and a.started >= t]
    return min(times) if times else None


def kill_phase(
    load: common.Load, server: ServerProcess, grpc_port: int, args: argparse.Namespace
) -> dict[str, float]:
    del load  # running: the phase only needs it to be under way
    """SIGKILL the model server, keep it down, restart it; return the phase's timestamps."""
    time.sleep(args.steady)
    killed = time.monotonic()
    server.kill(signal.SIGKILL)
    print(f"model server killed; down for {args.down:.0f}s", flush=True)
    time.sleep(args.down)
    restarted = time.monotonic()
    server.restart()
    server.wait_until(lambda: port_open(grpc_port), 300)
    returned = time.monotonic()
    print(f"model server back after {returned - restarted:.1f}s of start-up", flush=True)
    time.sleep(args.steady)
    return {"killed": killed, "restarted": restarted, "returned": returned, "end": time.monotonic()}


def slow_phase(proxy: DelayProxy, args: argparse.Namespace) -> dict[str, float]:
    """Make the model server slow for ``--slow-for`` seconds; return the phase's timestamps."""
    slow_from = time.monotonic()
    proxy.delay_s = args.slow_delay
    print(f"model server slowed by {args.slow_delay:.1f}s per reply", flush=True)
    time.sleep(args.slow_for)
    proxy.delay_s = 0.0
    fast_from = time.monotonic()
    print("model server fast again", flush=True)
    time.sleep(args.steady)
    return {"slow_from": slow_from, "fast_from": fast_from, "end": time.monotonic()}


def recovery_bounds(timeout_s: float) -> tuple[float, float]:
    """Return the seconds within which the gateway must serve again (after a restart, a slowdown).

    After a restart each gateway worker's channel tries to connect again within the gateway's
    ``grpc.max_reconnect_backoff_ms`` (plus gRPC's jitter); the first request on the new
    connection is answered within GATEWAY_TIMEOUT_S (or it is a 504). Once the delay is removed,
    a new request is answered within the timeout.
    """
    from backend.clients.grpc_client import CHANNEL_OPTIONS

    backoff_s = dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] / 1000
    after_restart = backoff_s * (1 + RECONNECT_JITTER) + timeout_s + MARGIN_S
    return after_restart, timeout_s + MARGIN_S


def evaluate(
    kill_answers: list[Answer],
    slow_answers: list[Answer],
    kill: dict[str, float],
    slow: dict[str, float],
    workers_before: set[int],
    workers_after: set[int],
    timeout_s: float,
) -> dict[str, Any]:
    """Return the checks and figures of both phases (pure, over what was recorded)."""
    margin = MARGIN_S
    restart_bound, fast_bound = recovery_bounds(timeout_s)
    answers = kill_answers + slow_answers
    down = [a for a in kill_answers if kill["killed"] <= a.started < kill["returned"]]
    down_failed = [a for a in down if not a.ok]
    recovered_at = first_ok_after(kill_answers, kill["returned"])
    slowed = [
        a for a in slow_answers if slow["slow_from"] + 0.2 <= a.started < slow["fast_from"] - 0.2
    ]
    slow_failed = [a for a in slowed if not a.ok]
    slow_lat = [a.finished - a.started for a in slow_failed]
    half = len(slow_lat) // 2
    fast_again = first_ok_after(slow_answers, slow["fast_from"])
    worst = max((a.finished - a.started for a in answers), default=0.0)
    figures = {
        "requests": len(answers),
        "kill: answers while down": len(down),
        "kill: statuses while down": sorted({a.status for a in down_failed}),
        "kill: slowest answer while down (s)": max(
            (a.finished - a.started for a in down), default=0.0
        ),
        "kill: serving again after return (s)": None
        if recovered_at is None
        else max(0.0, recovered_at - kill["returned"]),
        "slow: answers while slow": len(slowed),
        "slow: statuses while slow": sorted({a.status for a in slow_failed}),
        "slow: 504 latency min/max (s)": [min(slow_lat, default=0.0), max(slow_lat, default=0.0)],
        "slow: serving again after delay removed (s)": None
        if fast_again is None
        else max(0.0, fast_again - slow["fast_from"]),
        "slowest answer overall (s)": worst,
        "recovery bounds: after return / after delay removed (s)": [restart_bound, fast_bound],
        "workers before/after": [sorted(workers_before), sorted(workers_after)],
    }
    early, late = slow_lat[:half] or [0.0], slow_lat[half:] or [0.0]
    checks = {
        "kill: every failure is a 503 JSON error": bool(down_failed)
        and all(a.status == 503 and a.json_error for a in down_failed),
        "kill: no answer slower than the timeout": all(
            a.finished - a.started <= timeout_s + margin for a in down
        ),
        f"kill: serving again within {restart_bound:.1f}s of return (reconnect backoff + "
        "timeout)": recovered_at is not None and recovered_at - kill["returned"] <= restart_bound,
        "slow: every failure is a 504 JSON error": bool(slow_failed)
        and all(a.status == 504 and a.json_error for a in slow_failed),
        "slow: 504s come at the timeout": bool(slow_lat)
        and all(timeout_s - 0.2 <= t <= timeout_s + margin for t in slow_lat),
        "slow: no pile-up (late 504s no slower than early ones)": max(late) <= max(early) + margin,
        f"slow: serving again within {fast_bound:.1f}s (timeout)": fast_again is not None
        and fast_again - slow["fast_from"] <= fast_bound,
        "no request hung": worst <= timeout_s + margin + 1.0,
        "no gunicorn worker died": bool(workers_before) and workers_before == workers_after,
    }
    return {"checks": checks, "figures": figures, "counts": common.counts(answers)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the stack, run both phases under load, print the timelines, and report.

    The kill phase uses a gateway connected straight to the model server (refused connections,
    gRPC reconnect backoff: what production sees); the slow phase a second gateway behind the
    delay proxy.
    """
    with tempfile.TemporaryDirectory(prefix="fault-drill-") as tmp:
        work = Path(tmp)
        base = work / "models"
        copy_newest(args.spawn, args.model, base)
        config = modelconfig.full_config(
            f'model_config_list {{ config {{ name: "{args.model}" '
            f'base_path: "{base / args.model}" model_platform: "tensorflow" }} }}'
        )
        config_path = work / "models.config"
        serverconfig.write_atomic(config_path, config)
        server, grpc_port, rest_port = stack.start_modelserver(config_path, work, batching=False)
        proxy = DelayProxy(grpc_port).start()
        gateways: list[ServerProcess] = []
        urls: list[str] = []
        settings = {
            "GATEWAY_TIMEOUT_S": str(args.timeout),
            "GATEWAY_STATUS_CACHE_S": "0.5",
            "GATEWAY_WORKERS": str(WORKERS),
        }
        try:
            for port in (grpc_port, proxy.port):
                gateway, url = stack.start_gateway(
                    "grpc", port, rest_port, base, config_path, work, settings=settings
                )
                gateways.append(gateway)
                urls.append(url)
            direct_url, proxied_url = urls
            before = set().union(*(wait_workers(g, WORKERS) for g in gateways))
            client_timeout = args.timeout + 10  # a hang shows up as an answer slower than this
            load = common.Load(
                direct_url, args.model, args.verb, [""], args.clients, client_timeout
            )
            kill = kill_phase(load.start(), server, grpc_port, args)
            kill_answers = load.stop()
            load = common.Load(
                proxied_url, args.model, args.verb, [""], args.clients, client_timeout
            )
            load.start()
            time.sleep(args.steady)
            slow = slow_phase(proxy, args)
            slow_answers = load.stop()
            after = set().union(*(workers(g) for g in gateways))
        finally:
            for gateway in gateways:
                gateway.stop()
            proxy.stop()
            server.stop()
    result = evaluate(kill_answers, slow_answers, kill, slow, before, after, args.timeout)
    for title, answers, events in (
        ("kill", kill_answers, {kill["killed"]: "SIGKILL", kill["returned"]: "model server back"}),
        ("slow", slow_answers, {slow["slow_from"]: f"slow +{args.slow_delay:g}s",
                                slow["fast_from"]: "fast again"}),
    ):  # fmt: skip
        t0 = answers[0].started if answers else 0.0
        marks = {int(t - t0): [text] for t, text in events.items()}
        print(f"\nTimeline, {title} phase (answers finished per second):")
        print(common.timeline(answers, t0, marks))
    print("\n" + json.dumps(result["figures"], indent=1, default=str))
    common.print_checks(result["checks"])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path to copy from")
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--timeout", type=float, default=2.0, help="GATEWAY_TIMEOUT_S for the drill")
    p.add_argument("--down", type=float, default=3.0, help="seconds the model server stays dead")
    p.add_argument("--slow-delay", type=float, default=4.0, help="extra seconds per reply")
    p.add_argument("--slow-for", type=float, default=6.0, help="seconds of slowness")
    p.add_argument("--steady", type=float, default=3.0, help="seconds of normal load around faults")
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    if args.slow_delay <= args.timeout + MARGIN_S:
        p.error(
            f"--slow-delay {args.slow_delay:g} must exceed --timeout {args.timeout:g} + "
            f"{MARGIN_S:g} s of margin: a 504 at the delay would pass for one at the timeout"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except OpsError as exc:
        print(f"fault_drill: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(result["checks"].values()) else 1
