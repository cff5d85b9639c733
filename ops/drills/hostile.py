"""A hostile client cannot hurt the clients that behave; restarts under keep-alive load lose
nothing.

  python scripts/hostile_drill.py --spawn models/ --model minilm-intent --clients 16

Starts a throw-away model server on a copy of the model's newest version and a gateway
(gunicorn with docker/gunicorn.conf.py, gRPC upstream), measures its capacity (``--clients``
closed-loop clients, ``--probe`` s), then runs the same clients paced at ``--load`` of that
capacity (pooled keep-alive sessions, as SDKs hold them) for ``--duration`` s each:

1. quiet phases (nothing else: the baselines; ``--quiet`` s each, by default ``--duration``)
   with one attack between each two, the attacker a process of its own:
   - ``stalled``: ``--connections`` connections each sending half a request (half a request
     line, half the headers, half a body, half a chunked body) and no more; each one reopened
     as soon as the gateway answers or closes it;
   - ``idle``: ``--connections`` pooled connections that make one request each and then stay
     open without a FIN (what requests and httpx do), reopened when the gateway closes them;
   - ``names``: requests naming a new model, a new version of the model and ``GET
     /v1/models/<new name>`` in turn, each with a fresh name or number and a large body,
     ``--attack-rate`` per second;
   - ``ids``: ``:detokenize`` and ``/v1/embeddings`` with ``--ids`` token ids in one list,
     ``--attack-rate`` per second;
   - ``costly``: the bodies of ``ops.drills.costly`` in turn (a megabyte of wrong-typed items,
     integral float ids past the limit, 52 texts of 20,000 characters in chunk mode),
     ``--attack-rate`` per second (with ``--verb embed`` and an embedding model, chunk mode is
     served by the model; on a classifier it is a 422 before tokenization);
2. rolling restarts under the same paced keep-alive load: the gateway gets SIGHUP twice (new
   workers, the old ones stopped gracefully); then a second gateway with
   ``GATEWAY_MAX_REQUESTS=--max-requests`` restarts its workers as they reach it.

Checks: no well-behaved request fails in any phase; during each attack their p99 stays within
``P99_FACTOR`` of the quiet phases' on either side (the higher); the workers' RSS after the
attacks is within ``RSS_BOUND`` of theirs after the first quiet phase; the restarts happened.
The attackers' own answers are counted and shown (408 for stalled requests, JSON errors for the
rest). ``--json`` writes the figures; exits 1 if a check fails. ``--attacks`` runs some of the
attacks only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import psutil
import requests

from ops import stack
from ops.drills import common, costly
from ops.drills.common import Answer
from ops.procs import REPO, ServerProcess, child_env

ATTACKS = ("stalled", "idle", "names", "ids", "costly")
P99_FACTOR = 1.5  # a well-behaved client's p99 under attack, at most this times the quiet one
# the workers' RSS after every attack, at most this much above theirs after the quiet phase:
# a tenth, or 16 MiB per worker where that is more (allocator noise on a small worker)
RSS_BOUND = (0.10, 16 * 2**20)
HEADER_TIMEOUT_S = 2.0  # the drill's GATEWAY_HEADER_TIMEOUT_S / GATEWAY_BODY_TIMEOUT_S
HALVES = (
    b"POST /v1/models/x:classify HT",
    b"POST /v1/models/x:classify HTTP/1.1\r\nHost: drill\r\nContent-Type: appl",
    b"POST /v1/models/x:classify HTTP/1.1\r\nHost: drill\r\nContent-Type: application/json\r\n"
    b'Content-Length: 4000\r\n\r\n{"texts": ["',
    b"POST /v1/models/x:classify HTTP/1.1\r\nHost: drill\r\nTransfer-Encoding: chunked\r\n\r\n"
    b'fa0\r\n{"texts": ["',
)
HEALTH = b"GET /healthz HTTP/1.1\r\nHost: drill\r\n\r\n"


# -- the attacker (a process of its own: its CPU is not the clients') -------------------------


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    return sock


def attack_connections(kind: str, port: int, seconds: float, count: int) -> Counter[str]:
    """Hold ``count`` stalled or idle connections open for ``seconds``, reopening each as the
    gateway closes it; return what the gateway did to them."""
    seen: Counter[str] = Counter()
    selector = selectors.DefaultSelector()

    def open_one(n: int) -> None:
        try:
            sock = _connect(port)
            sock.sendall(HALVES[n % len(HALVES)] if kind == "stalled" else HEALTH)
        except OSError as exc:
            seen[f"connect failed: {type(exc).__name__}"] += 1
            return
        selector.register(sock, selectors.EVENT_READ, [n, b""])
        seen["opened"] += 1

    for n in range(count):
        open_one(n)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, _ in selector.select(timeout=0.2):
            sock, state = key.fileobj, key.data
            assert isinstance(sock, socket.socket)
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                if not state[1]:
                    seen[data.split(b"\r\n", 1)[0].decode(errors="replace")[9:12]] += 1
                state[1] += data  # answered; idle ones then wait for the gateway to close
                continue
            selector.unregister(sock)
            sock.close()
            seen["closed by the gateway"] += 1
            open_one(state[0])
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]
    return seen


def attack_requests(kind: str, url: str, model: str, seconds: float, rate: float,
                    ids: int) -> Counter[str]:  # fmt: skip
    """Send ``rate`` hostile requests per second for ``seconds``; return their statuses."""
    seen: Counter[str] = Counter()
    session = requests.Session()
    filler = ["a hostile client pads its body"] * 200  # ~6 KB of texts per request
    id_list = [1] * ids
    costly_bodies = [costly.encoded(probe, model) for probe in costly.probes()]
    end, n = time.monotonic() + seconds, 0
    due = time.monotonic()
    while time.monotonic() < end:
        time.sleep(max(0.0, due - time.monotonic()))
        due += 1 / rate
        fresh = f"drill-{os.getpid()}-{n}-{random.getrandbits(40):x}"
        call: tuple[str, str, Any]
        if kind == "costly":
            path, raw = costly_bodies[n % len(costly_bodies)]
            call = ("POST", path, raw)
        elif kind == "names":
            step = n % 3
            if step == 0:
                call = ("POST", f"/v1/models/{fresh}:classify", {"texts": filler})
            elif step == 1:
                version = random.randrange(10**6, 10**9)
                call = (
                    "POST",
                    f"/v1/models/{model}:classify",
                    {"texts": filler, "version": version},
                )
            else:
                call = ("GET", f"/v1/models/{fresh}", None)
        elif n % 2 == 0:
            call = ("POST", f"/v1/models/{model}:detokenize", {"ids": [id_list]})
        else:
            call = ("POST", "/v1/embeddings", {"model": model, "input": id_list})
        n += 1
        method, path, body = call
        try:
            data = (
                body
                if isinstance(body, bytes)
                else (orjson.dumps(body) if body is not None else None)
            )
            resp = session.request(method, url + path, data=data, timeout=30,
                                   headers={"Content-Type": "application/json"})  # fmt: skip
            seen[f"{method} {path.split(':')[-1] if ':' in path else path.split('/')[2]} "
                 f"{resp.status_code}"] += 1  # fmt: skip
        except requests.RequestException as exc:
            seen[f"failed: {type(exc).__name__}"] += 1
    return seen


def attacker_main(argv: list[str]) -> int:
    """``python -m ops.drills hostile attack KIND URL MODEL SECONDS ...``: one attack, its
    counts as JSON on stdout."""
    kind, url, model, seconds, count, rate, ids = argv
    port = int(url.rsplit(":", 1)[1])
    if kind in ("stalled", "idle"):
        seen = attack_connections(kind, port, float(seconds), int(count))
    else:
        seen = attack_requests(kind, url, model, float(seconds), float(rate), int(ids))
    print(json.dumps(dict(seen)))
    return 0


# -- the drill ---------------------------------------------------------------------------------


def worker_pids(gateway: ServerProcess) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(gateway.proc.pid).children()}
    except psutil.NoSuchProcess:
        return set()


def worker_rss(gateway: ServerProcess) -> int:
    """Return the gateway's workers' resident memory, bytes, summed."""
    total = 0
    for pid in worker_pids(gateway):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += psutil.Process(pid).memory_info().rss
    return total


def p99_ms(answers: list[Answer]) -> float:
    times = sorted(a.finished - a.started for a in answers)
    return times[min(len(times) - 1, int(0.99 * len(times)))] * 1000 if times else float("nan")


def failed(answers: list[Answer]) -> int:
    return sum(1 for a in answers if not a.ok)


def paced(url: str, args: argparse.Namespace, interval: float, seconds: float) -> list[Answer]:
    load = common.Load(url, args.model, args.verb, [""], args.clients, 30.0, interval_s=interval)
    load.start()
    time.sleep(seconds)
    return load.stop()


def run_attack(url: str, args: argparse.Namespace, attack: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, "-m", "ops.drills", "hostile", "attack", attack, url, args.model,
        str(args.duration), str(args.connections), str(args.attack_rate), str(args.ids),
    ]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, text=True)


def restart_phase(
    gateway: ServerProcess, url: str, args: argparse.Namespace, interval: float, hup: bool
) -> dict[str, Any]:
    """Paced keep-alive load for ``--duration`` s; SIGHUP at a third and two thirds when
    ``hup``; return the answers and every worker pid seen."""
    load = common.Load(url, args.model, args.verb, [""], args.clients, 30.0, interval_s=interval)
    load.start()
    seen = set(worker_pids(gateway))
    start, hups = time.monotonic(), 0
    while time.monotonic() - start < args.duration:
        time.sleep(0.1)
        seen |= worker_pids(gateway)
        if hup and hups < 2 and time.monotonic() - start >= args.duration * (hups + 1) / 3:
            os.kill(gateway.proc.pid, signal.SIGHUP)
            hups += 1
    answers = load.stop()
    return {"answers": answers, "workers_seen": len(seen)}


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    config_path = common.newest_config(args.spawn, args.model, work)
    base = work / "models"
    server, grpc_port, rest_port = stack.start_modelserver(config_path, work, batching=False)
    settings = {
        "GATEWAY_WORKERS": str(args.workers),
        "GATEWAY_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "GATEWAY_BODY_TIMEOUT_S": str(HEADER_TIMEOUT_S),
        "GATEWAY_ACCESS_LOG": "",
    }
    gateways: list[ServerProcess] = []
    result: dict[str, Any] = {"figures": {}, "attackers": {}}
    figures = result["figures"]
    try:
        gateway, url = stack.start_gateway("grpc", grpc_port, rest_port, base, config_path, work,
                                           settings=settings)  # fmt: skip
        gateways.append(gateway)
        probe = common.Load(url, args.model, args.verb, [""], args.clients, 30.0).start()
        time.sleep(args.probe)
        probed = [a for a in probe.stop() if a.ok]
        span = max(a.finished for a in probed) - min(a.started for a in probed)
        capacity = len(probed) / span
        interval = args.clients / (args.load * capacity)
        figures["capacity (req/s)"] = round(capacity, 1)
        figures["offered (req/s)"] = round(args.clients / interval, 1)
        print(f"capacity {capacity:.0f} req/s; {args.clients} clients paced at "
              f"{args.load:g} of it", flush=True)  # fmt: skip
        phases: dict[str, list[Answer]] = {}
        rss: dict[str, int] = {}
        for n, attack in enumerate(args.attacks):
            # quiet runs on both sides of each attack are its baseline (a shared machine's
            # load drifts over minutes); the one after an attack is the next one's before
            print(f"quiet, then attack: {attack}", flush=True)
            phases[f"quiet {n}"] = paced(url, args, interval, args.quiet)
            rss.setdefault("quiet", worker_rss(gateway))
            attacker = run_attack(url, args, attack)
            phases[attack] = paced(url, args, interval, args.duration)
            out, _ = attacker.communicate(timeout=args.duration + 60)
            result["attackers"][attack] = json.loads(out or "{}")
            rss[attack] = worker_rss(gateway)
        phases[f"quiet {len(args.attacks)}"] = paced(url, args, interval, args.quiet)
        for name, answers in phases.items():
            figures[f"{name}: requests / failed / p99 ms"] = (
                len(answers),
                failed(answers),
                round(p99_ms(answers), 1),
            )
        figures["worker RSS MiB after " + ", ".join(rss)] = [
            round(v / 2**20, 1) for v in rss.values()]  # fmt: skip
        print("rolling restart: SIGHUP x2", flush=True)
        hup = restart_phase(gateway, url, args, interval, hup=True)
        restarting, url2 = stack.start_gateway(
            "grpc", grpc_port, rest_port, base, config_path, work,
            settings={**settings, "GATEWAY_MAX_REQUESTS": str(args.max_requests)},
        )  # fmt: skip
        gateways.append(restarting)
        print(f"rolling restart: max_requests {args.max_requests}", flush=True)
        maxreq = restart_phase(restarting, url2, args, interval, hup=False)
    finally:
        for proc in gateways:
            proc.stop()
        server.stop()
    for name, phase in (("SIGHUP", hup), ("max_requests", maxreq)):
        answers = phase["answers"]
        figures[f"{name}: requests / failed / workers seen"] = (
            len(answers),
            failed(answers),
            phase["workers_seen"],
        )
    grown = max(rss[a] for a in args.attacks) - rss["quiet"]
    bound = max(RSS_BOUND[0] * rss["quiet"], RSS_BOUND[1] * args.workers)
    checks = {f"{name}: 0 failed well-behaved requests": failed(answers) == 0
              for name, answers in phases.items()}  # fmt: skip
    for n, attack in enumerate(args.attacks):
        hit = p99_ms(phases[attack])
        quiet = max(p99_ms(phases[f"quiet {n}"]), p99_ms(phases[f"quiet {n + 1}"]))
        checks[f"{attack}: p99 {hit:.1f} ms within {P99_FACTOR}x quiet {quiet:.1f} ms"] = (
            hit <= P99_FACTOR * quiet
        )
    checks[f"worker RSS flat: grew {grown / 2**20:.1f} MiB, bound {bound / 2**20:.1f}"] = (
        grown <= bound
    )
    if "stalled" in args.attacks:
        checks["stalled: the gateway answered 408 to half requests"] = (
            result["attackers"]["stalled"].get("408", 0) > 0
        )
    checks["SIGHUP: 0 failed, workers replaced"] = (
        failed(hup["answers"]) == 0 and hup["workers_seen"] > args.workers
    )
    checks["max_requests: 0 failed, workers replaced"] = (
        failed(maxreq["answers"]) == 0 and maxreq["workers_seen"] > args.workers
    )
    result["checks"] = checks
    print("\n" + json.dumps(figures, indent=1))
    print("attackers saw: " + json.dumps(result["attackers"], indent=1))
    common.print_checks(checks)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="base path to copy from")
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--clients", type=int, default=16, help="well-behaved clients")
    p.add_argument("--load", type=float, default=0.5, help="their load, a fraction of capacity")
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    p.add_argument("--probe", type=float, default=5.0, help="seconds measuring capacity")
    p.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    p.add_argument("--quiet", type=float, help="seconds per quiet phase (default: --duration)")
    p.add_argument("--connections", type=int, default=64, help="stalled / idle connections")
    p.add_argument("--attack-rate", type=float, default=5.0, help="hostile requests per second")
    p.add_argument("--ids", type=int, default=400_000, help="token ids per hostile list")
    p.add_argument("--max-requests", type=int, default=100, help="GATEWAY_MAX_REQUESTS")
    p.add_argument(
        "--attacks",
        type=lambda v: v.split(","),
        default=list(ATTACKS),
        help=f"comma-separated, of {','.join(ATTACKS)} (default: all, in that order)",
    )
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    if not args.attacks or set(args.attacks) - set(ATTACKS):
        p.error(f"--attacks: some of {','.join(ATTACKS)}")
    if args.quiet is None:
        args.quiet = args.duration
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["attack"]:
        return attacker_main(argv[1:])
    args = parse_args(argv)
    return common.run_in_tmp("hostile_drill", args.json, lambda work: run(args, work))
