"""Roll a good version out and a bad one back, on live traffic of real tickets (issue 24's drill).

  python scripts/rollout_drill.py --spawn models/ --model minilm-intent --clients 16

The versions come from one fine-tuned checkpoint (``--checkpoint``, by default the one
``make finetune-demo`` keeps in run/finetune-demo/tickets-v1; fine-tuned here with
``python -m finetune.demo`` when it is absent): v1, its export, is ``stable``; the good version is
a copy of that export (the same checkpoint); the bad one is that checkpoint exported with two labels
swapped in its ``labels`` (``export.build(..., labels=[...])``): numerically the same model, so
the export gate passes it, but two intents answer under each other's name. The two swapped are
the ones stable predicts most often on the tickets.

A model server and a gunicorn gateway run on the drill's copy. ``--clients`` closed-loop clients
measure the stack's capacity first (``--capacity-s``); then an open-loop load of
``--load-fraction`` of that capacity (at most ``--clients`` in flight) sends the tickets of
data/tickets/test.tsv (one per request, naming no version: the traffic the routing file splits)
for the whole run. Then, one after another:

1. ``rollout.py --from-dir <good>``: default traffic pinned to stable, the good version pushed
   with no label, and rolled out through ``--steps``; expected: promoted (stable moves to it);
2. ``rollout.py --from-dir <bad>`` the same way; expected: rolled back at the shadow step;
3. ``--windows`` interleaved windows of ``--window-s`` seconds with and without a shadow at
   100 % (the bad version shadows the stable one): each window's client p50 and each model
   server's CPU seconds per second.

The shadow's cost, and the trade-off the drill states: a 100 % shadow sends every default request
to a model server twice. The gateway keeps the shadow out of the client's path (after the
answer, one shadow in flight per worker with ``GATEWAY_SHADOW_QUEUE=0``, the rest dropped and
counted), but CPU is shared: under a closed loop that saturates it (the first real run: 16
clients on 2 cores) the second call can only come out of the clients' share, and p50 rose 16 %.
So the drill loads the stack open-loop at a fraction of its measured capacity, the way a service
is run with headroom. With ``--shadow-server shared`` the shadow calls go to the clients' model
server and queue beside their calls. With ``--shadow-server own`` (the default) they go to a
second model server on the same models (``GATEWAY_SHADOW_TFS_GRPC``; in the k8s deployment the
``shadow-tf-serving`` Deployment, at a low CPU request and priority) started at nice 19, its
session's scheduler group too (``ops.stack.set_group_nice``): it runs on the CPU the clients'
serving leaves idle, so a shadow waits for the clients instead of the other way round, and when
little is idle the rollout gets fewer shadow samples per second (dropped ones are counted and
printed) rather than slower clients. The same headroom keeps a version's load (TensorFlow import
of the SavedModel and its warmup batches) from pushing queued client requests past the gateway's
timeout.

Checks (exit status 1 if one fails): no failed client request; the good version promoted; the
bad one rolled back at its shadow step; no client answer ever came from the bad version; none came
from the good one before its shadow step decided (the pin keeps an unvetted version off default
traffic from the moment it is published). The issue's target for the shadow's cost (client p50
with shadow within 10 % of without) is reported beside them, not as a check: it depends on the
CPU the model server has to spare. The transcript (each decision with its figures) is printed
and appended to ``--report``; ``--plot`` draws agreement and each version's share of the
answers over time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

from modelformat import layout, serverconfig
from modelformat.routing import ModelRoute, Shadow
from ops import modelconfig, stack
from ops.drills import common, rolloutreport
from ops.drills.tickets import Clients, Reply, Sampler, classify, measure_capacity, read_tickets
from ops.modelconfig import OpsError
from ops.procs import REPO, ServerProcess, child_env
from ops.rollout import engine, state

TICKETS = REPO / "data" / "tickets" / "test.tsv"
DEFAULT_CHECKPOINT = REPO / "run" / "finetune-demo" / "tickets-v1"
# the drill's gateway re-reads labels and routing at least this often (--labels-cache-s)
LABELS_CACHE_S = 1.0
# the CPU priority of the shadow's own model server (the lowest: it gets what is left idle)
SHADOW_NICE = 19
# The exporting child: one TensorFlow import; each stdin line (JSON: ckpt, name, max_seq_len,
# exports as (base, version, labels)) exported in turn, then "done" on stdout.
EXPORT_CHILD = """
import json, sys
from export.lean_tf import import_tensorflow
import_tensorflow()
from export.build import build
for line in sys.stdin:
    a = json.loads(line)
    for base, version, labels in a["exports"]:
        build(a["ckpt"], a["name"], base, version=version, task="classify",
              max_seq_len=a["max_seq_len"], labels=labels)
    print("done", flush=True)
"""
# what TensorFlow's import prints on stderr in push_model's child (not the rollout's words)
TF_NOISE = ("WARNING: All log messages before absl", "I0000 00:00:")


class Drill:
    """One run: the versions, the stack, the load, two rollouts and the shadow's cost."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args = args
        self.work = work
        self.base = work / "models"
        self.staging = work / "staging"
        self.config = work / "models.config"
        self.log = work / "rollouts.jsonl"
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        self.lines: list[str] = []  # the transcript
        self.events: list[tuple[float, str]] = []
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.windows: list[dict[str, Any]] = []
        self.exporter: subprocess.Popen[str] | None = None  # start_exporter's child
        self.exporter_log = work / "export.log"

    def say(self, text: str) -> None:
        """Print a line of the transcript, stamped with the drill's clock."""
        line = f"[{time.monotonic() - self.t0:6.1f}s] {text}"
        self.lines.append(line)
        print(line, flush=True)

    def mark(self, text: str) -> None:
        self.events.append((time.monotonic() - self.t0, text))
        self.say(f"== {text}")

    # -- versions -------------------------------------------------------------------------
    def checkpoint(self) -> Path:
        """Return the fine-tuned checkpoint, fine-tuning it first when it is absent."""
        ckpt: Path = self.args.checkpoint
        if (ckpt / "config.json").is_file():
            self.say(f"checkpoint {ckpt} (fine-tuned earlier: reused)")
            return ckpt
        if ckpt != DEFAULT_CHECKPOINT:
            raise OpsError(f"no checkpoint at {ckpt}")
        self.say(f"no fine-tuned checkpoint at {ckpt}: fine-tuning now (python -m finetune.demo)")
        scratch = self.work / "finetune-models"
        scratch.mkdir()
        cmd = [sys.executable, "-m", "finetune.demo", "--base-path", str(scratch), "--keep",
               str(ckpt)]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, env=child_env(), text=True, capture_output=True)
        tail = [line for line in done.stdout.splitlines() if line.startswith(("|", "total"))]
        for line in tail:
            self.say(f"  finetune: {line}")
        if done.returncode != 0 or not (ckpt / "config.json").is_file():
            raise OpsError(f"fine-tuning failed: {done.stderr[-2000:]}")
        return ckpt

    def start_exporter(self) -> None:
        """Start the child that exports: it imports TensorFlow once for every export of the run
        (ops imports none), then exports what each line of its stdin asks for."""
        with self.exporter_log.open("w") as log:
            self.exporter = subprocess.Popen(
                [sys.executable, "-c", EXPORT_CHILD], cwd=REPO, env=child_env(), text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
            )  # fmt: skip

    def stop_exporter(self) -> None:
        """End the exporting child (its stdin closed: it leaves its loop)."""
        exporter = self.exporter
        if exporter is None:
            return
        self.exporter = None
        try:
            if exporter.stdin is not None:
                exporter.stdin.close()
            exporter.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            exporter.kill()
            exporter.wait()

    def export(self, ckpt: Path, exports: list[tuple[Path, int, list[str] | None]]) -> list[Path]:
        """Export ``ckpt`` as each ``(base, version, labels)``; return the version directories.

        In the exporting child (``start_exporter``): one TensorFlow import serves every export.
        """
        spec = {"ckpt": str(ckpt), "name": self.args.model, "max_seq_len": self.args.max_seq_len,
                "exports": [(str(b), v, labels) for b, v, labels in exports]}  # fmt: skip
        started = time.monotonic()
        exporter = self.exporter
        assert exporter is not None and exporter.stdin is not None and exporter.stdout is not None
        try:
            exporter.stdin.write(json.dumps(spec) + "\n")
            exporter.stdin.flush()
            done = any(line.strip() == "done" for line in iter(exporter.stdout.readline, ""))
        except OSError:  # the child is gone: its log says why
            done = False
        if not done:
            self.stop_exporter()
            tail = self.exporter_log.read_text(errors="replace")[-2000:]
            raise OpsError(f"export of {ckpt} failed: {tail}")
        for _, version, labels in exports:
            self.say(f"exported v{version}" + (f" with labels {labels}" if labels else ""))
        self.say(f"  ({time.monotonic() - started:.0f}s)")
        return [base / self.args.model / str(version) for base, version, _ in exports]

    def swapped_labels(self, stable_dir: Path, texts: list[str], url: str) -> list[str]:
        """Return stable's labels with the two it predicts most often on ``texts`` swapped."""
        labels = list((layout.read_model_info(stable_dir) or {}).get("labels", []))
        session = requests.Session()
        endpoint = f"{url}/v1/models/{self.args.model}:classify"
        predicted = Counter(
            classify(session, endpoint, t, 60.0).label for t in texts[: self.args.probe]
        )
        top = [label for label, _ in predicted.most_common() if label in labels][:2]
        if len(top) < 2:
            top = [*top, *[label for label in labels if label not in top]][:2]
        a, b = labels.index(top[0]), labels.index(top[1])
        labels[a], labels[b] = labels[b], labels[a]
        self.say(
            f"stable's top-1 on {self.args.probe} tickets: {dict(predicted.most_common())}; "
            f"the bad version swaps {top[0]!r} and {top[1]!r}"
        )
        return labels

    # -- the run --------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Set up; run both rollouts and the shadow windows under load; return the figures."""
        args = self.args
        texts = read_tickets(args.tickets)
        ckpt = self.checkpoint()
        self.start_exporter()
        try:
            return self.run_exported(texts, ckpt)
        finally:
            self.stop_exporter()

    def run_exported(self, texts: list[str], ckpt: Path) -> dict[str, Any]:
        """Export v1 and v2, start the stack, export v3; run both rollouts and the windows."""
        args = self.args
        (stable_dir,) = self.export(ckpt, [(self.base, 1, None)])
        # the good version: the same checkpoint, so v1's export itself (another export of it
        # would be the same model at the cost of a second export)
        good_dir = self.staging / args.model / "2"
        shutil.copytree(stable_dir, good_dir)
        self.say("v2: a copy of v1's export")
        text = f"""model_config_list {{ config {{
            name: "{args.model}" base_path: "{self.base / args.model}" model_platform: "tensorflow"
            model_version_policy {{ specific {{ versions: 1 }} }}
            version_labels {{ key: "stable" value: 1 }} }} }}"""
        serverconfig.write_atomic(self.config, modelconfig.full_config(text))
        server: ServerProcess | None = None
        shadow_server: ServerProcess | None = None
        gateway: ServerProcess | None = None
        clients: Clients | None = None
        sampler: Sampler | None = None
        try:
            server, grpc_port, rest_port = stack.start_modelserver(
                self.config, self.work, batching=False
            )
            self.targets = [f"127.0.0.1:{grpc_port}"]
            pids = [server.pid]
            if args.shadow_server == "own":
                # Capacity of the shadow's own: a second model server on the same models and
                # config, at the lowest CPU priority, so it runs on what the clients' model
                # server leaves idle (on a cluster: a Deployment of its own, deploy/k8s).
                shadow_server, shadow_port, _ = stack.start_modelserver(
                    self.config, self.work, batching=False, nice=SHADOW_NICE
                )
                self.targets.append(f"127.0.0.1:{shadow_port}")
                pids.append(shadow_server.pid)
                self.say(f"shadow calls go to a model server of their own on :{shadow_port} "
                         f"(nice {SHADOW_NICE}); clients' calls to :{grpc_port}")  # fmt: skip
            settings = {
                "GATEWAY_DEFAULT_MODEL": args.model, "GATEWAY_WORKERS": str(args.workers),
                "GATEWAY_LABELS_CACHE_S": str(args.labels_cache_s),
                "GATEWAY_STATUS_CACHE_S": str(args.labels_cache_s), "GATEWAY_ACCESS_LOG": "",
                # 0: one shadow in flight per worker, none waiting; the rest are dropped and
                # counted, so a shadow only takes the model server's spare capacity and leaves
                # no backlog to drain into the next step (the rollout waits for it anyway).
                "GATEWAY_SHADOW_QUEUE": str(args.shadow_queue),
            }  # fmt: skip
            if shadow_server is not None:
                settings["GATEWAY_SHADOW_TFS_GRPC"] = self.targets[1]
            gateway, url = stack.start_gateway(
                "grpc", grpc_port, rest_port, self.base, self.config, self.work,
                timeout_s=600, settings=settings,
            )  # fmt: skip
            self.url = url
            bad_labels = self.swapped_labels(stable_dir, texts, url)
            (bad_dir,) = self.export(ckpt, [(self.staging, 3, bad_labels)])
            capacity = measure_capacity(url, args.model, texts, args.clients, args.capacity_s)
            self.rate = args.load_fraction * capacity
            self.say(
                f"capacity: {capacity:.1f} answers/s with {args.clients} closed-loop clients "
                f"({args.capacity_s:g}s); the drill's load: {args.load_fraction:g} of it, "
                f"{self.rate:.1f} requests/s open-loop (at most {args.clients} in flight)"
            )
            sampler = Sampler(url, args.model, pids).start()
            clients = Clients(url, args.model, texts, args.clients, rate=self.rate).start()
            self.t0 = time.monotonic()
            self.wall0 = time.time()
            self.mark(f"clients start: {self.rate:.1f} requests/s (tickets of {args.tickets.name})")
            time.sleep(args.gap)
            self.rollouts["good"] = self.roll("good", good_dir)
            time.sleep(args.gap)
            self.rollouts["bad"] = self.roll("bad", bad_dir)
            time.sleep(args.gap)
            self.shadow_windows(clients, sampler)
            replies = clients.stop()
            clients = None
            sampler.stop()
            return self.results(replies, sampler)
        finally:
            if clients is not None:
                clients.stop()
            if sampler is not None:
                sampler.stop()
            if gateway is not None:
                gateway.stop()
            for process in (server, shadow_server):
                if process is not None:
                    process.stop()

    def roll(self, which: str, version_dir: Path) -> dict[str, Any]:
        """Run ``rollout.py --from-dir version_dir``; return its exit status and log events."""
        args = self.args
        cmd = [
            sys.executable, str(REPO / "scripts" / "rollout.py"), "--name", args.model,
            "--from-dir", str(version_dir), "--gateway", self.url,
            *(f for target in self.targets for f in ("--server", target)),
            "--config", str(self.config), "--base-path", str(self.base),
            "--steps", args.steps, "--hold-s", str(args.hold_s),
            "--min-samples", str(args.min_samples), "--min-agreement", str(args.min_agreement),
            "--max-latency-ratio", str(args.max_latency_ratio), "--poll-s", "1",
            "--reader-wait", str(args.reader_wait), "--timeout", "600",
            "--log", str(self.log),
        ]  # fmt: skip
        self.mark(
            f"rollout of the {which} version: rollout.py --from-dir {version_dir.name} --steps "
            f"{args.steps} --hold-s {args.hold_s:g} --min-samples {args.min_samples} "
            f"--min-agreement {args.min_agreement:g}"
        )
        started = time.time()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            if not line.startswith(TF_NOISE):
                self.say(f"  | {line.rstrip()}")
        code = proc.wait()
        events = [e for e in read_log(self.log) if e["time"] >= started]
        self.mark(f"rollout of the {which} version: exit {code}")
        for e in events:
            if e["event"] in ("decision", "promoted", "rolled_back", "live"):
                self.events.append((e["time"] - self.wall0, f"{which}: {e['event']} {e['step']}"))
        return {"exit": code, "events": events}

    def shadow_windows(self, clients: Clients, sampler: Sampler) -> None:
        """Alternate windows without and with a 100 % shadow; record p50 and model-server CPU."""
        args = self.args
        labels = serverconfig.version_labels(serverconfig.read(self.config))[args.model]
        stable = labels["stable"]
        shadow = max((e["version"] for e in self.rollouts["bad"]["events"]), default=stable)
        routing = state.routing_path_for(self.config)
        before = state.read_routing(routing).route(args.model)
        self.mark(f"shadow cost: {args.windows} windows of {args.window_s:g}s each way, "
                  f"stable v{stable}, shadow v{shadow} at 100 %")  # fmt: skip
        pin = ModelRoute(((stable, 100.0),))
        for i in range(2 * args.windows):
            on = i % 2 == 1
            route = ModelRoute(pin.weights, Shadow(shadow, 1.0)) if on else pin
            with serverconfig.config_lock(self.config, 60.0):
                state.write_route(routing, args.model, route)
            time.sleep(args.labels_cache_s + 1.5)  # every worker has re-read it
            start = time.monotonic()
            time.sleep(args.window_s)
            end = time.monotonic()
            window = [r.finished - r.started for r in clients.since(start) if r.finished <= end]
            p50 = statistics.median(window) * 1000 if window else float("nan")
            cpu = sampler.cpu_between(start, end)
            row = {"shadow": on, "p50_ms": round(p50, 1), "requests": len(window),
                   "server_cpu_s_per_s": round(cpu, 2)}  # fmt: skip
            line = (
                f"  window {i + 1}: shadow {'100%' if on else 'off '}  p50 {p50:6.1f} ms  "
                f"{len(window) / args.window_s:5.1f} req/s  model server CPU {cpu:.2f} s/s"
            )
            if len(self.targets) > 1:
                row["shadow_server_cpu_s_per_s"] = round(sampler.cpu_between(start, end, 1), 2)
                line += f", the shadow's own {row['shadow_server_cpu_s_per_s']:.2f} s/s"
            self.windows.append(row)
            self.say(line)
        with serverconfig.config_lock(self.config, 60.0):
            state.write_route(routing, args.model, before)
        self.mark("shadow cost: routing entry back")

    # -- the verdict ----------------------------------------------------------------------
    def results(self, replies: list[Reply], sampler: Sampler) -> dict[str, Any]:
        """Judge the run, print it, append the report, draw the plot; return the figures."""
        good, bad = self.rollouts["good"], self.rollouts["bad"]
        good_v = next((e["version"] for e in good["events"]), None)
        bad_v = next((e["version"] for e in bad["events"]), None)
        shadow_decided = next(
            (e["time"] - self.wall0 + self.t0 for e in good["events"]
             if e["event"] == "decision" and e["step_index"] == 0),
            float("inf"),
        )  # fmt: skip
        bad_end = [e for e in bad["events"] if e["event"] == "rolled_back"]
        failed = [r for r in replies if not r.ok]
        early = [r for r in replies if r.ok and r.version == good_v and r.started < shadow_decided]
        from_bad = [r for r in replies if r.ok and r.version == bad_v]
        off = [w["p50_ms"] for w in self.windows if not w["shadow"]]
        on = [w["p50_ms"] for w in self.windows if w["shadow"]]
        cpu_off = [w["server_cpu_s_per_s"] for w in self.windows if not w["shadow"]]
        cpu_on = [w["server_cpu_s_per_s"] for w in self.windows if w["shadow"]]
        p50_off, p50_on = _median(off), _median(on)
        ratio = p50_on / p50_off if p50_off else float("nan")
        checks = {
            "0 failed client requests": bool(replies) and not failed,
            f"good version v{good_v} promoted": good["exit"] == engine.EXIT_PROMOTED,
            f"bad version v{bad_v} rolled back at the shadow step": bad["exit"]
            == engine.EXIT_ROLLED_BACK
            and bool(bad_end)
            and bad_end[0]["step_index"] == 0,
            f"no client answer from the bad version v{bad_v}": not from_bad,
            f"no client answer from v{good_v} before its shadow step decided": not early,
        }
        decisions = [
            {"rollout": which, "step": e["step"], "verdict": e["verdict"],
             "reasons": e["reasons"], "figures": e["figures"]}
            for which, r in self.rollouts.items() for e in r["events"] if e["event"] == "decision"
        ]  # fmt: skip
        result = {
            "checks": checks,
            "counts": common.counts(_as_answers(replies)),
            "versions": {"stable": 1, "good": good_v, "bad": bad_v},
            "decisions": decisions,
            "windows": self.windows,
            "p50_ms_without_shadow": round(p50_off, 1),
            "p50_ms_with_shadow": round(p50_on, 1),
            "p50_ratio": round(ratio, 3),
            "server_cpu_without_shadow": round(_median(cpu_off), 2),
            "server_cpu_with_shadow": round(_median(cpu_on), 2),
            "failed_examples": [(r.status, r.error) for r in failed[:5]],
        }
        self.say(f"answers: {json.dumps(result['counts'], sort_keys=True)}")
        self.say(f"client p50 without shadow {p50_off:.1f} ms, with shadow 100 % {p50_on:.1f} ms "
                 f"(x{ratio:.2f}; the issue's target: within 10 %: "
                 f"{'met' if ratio <= 1.1 else 'NOT met'}); model server CPU "
                 f"{result['server_cpu_without_shadow']} -> {result['server_cpu_with_shadow']} "
                 "s/s")  # fmt: skip
        for name, passed in checks.items():
            self.say(f"[{'PASS' if passed else 'FAIL'}] {name}")
        if self.args.plot:
            versions = {"good": good_v, "bad": bad_v}
            rolloutreport.plot(self.args, self.t0, self.events, replies, sampler, versions)
            self.say(f"plot: {self.args.plot}")
        if self.args.report:
            rolloutreport.append_report(self.args, self.wall0, self.lines, result)
            self.say(f"report appended to {self.args.report}")
        return result


def read_log(path: Path) -> list[dict[str, Any]]:
    """Return the rollout log's JSON lines (none when it does not exist yet)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _as_answers(replies: list[Reply]) -> list[common.Answer]:
    return [
        common.Answer(0, "", r.started, r.finished, r.status, r.version, r.error) for r in replies
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--spawn", type=Path, default=REPO / "models", help="the demo models (unused "
                   "but for the report: every version comes from --checkpoint)")  # fmt: skip
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT,
                   help="fine-tuned HF checkpoint (default: make finetune-demo's; fine-tuned "
                   "here when absent)")  # fmt: skip
    p.add_argument("--tickets", type=Path, default=TICKETS)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--workers", type=int, default=2, help="gunicorn workers of the gateway")
    p.add_argument("--steps", default="shadow:100,25,50,100")
    p.add_argument("--hold-s", type=float, default=30.0)
    p.add_argument("--min-samples", type=int, default=200)
    p.add_argument("--shadow-queue", type=int, default=0, help="GATEWAY_SHADOW_QUEUE")
    p.add_argument("--shadow-server", choices=("own", "shared"), default="own",
                   help="own: shadow calls go to a second model server at the lowest CPU "
                   "priority (GATEWAY_SHADOW_TFS_GRPC); shared: to the clients' model "
                   "server")  # fmt: skip
    p.add_argument("--load-fraction", type=float, default=0.4,
                   help="the open-loop load, a fraction of the capacity measured first: a "
                   "100 %% shadow doubles the model server's work")  # fmt: skip
    p.add_argument("--capacity-s", type=float, default=10.0,
                   help="seconds of closed-loop load that measure the capacity")  # fmt: skip
    p.add_argument("--min-agreement", type=float, default=0.9)
    # the rollout's default; tests on tiny models (p99 of a few ms, all noise) pass a loose one
    p.add_argument("--max-latency-ratio", type=float, default=1.5)
    p.add_argument("--labels-cache-s", type=float, default=LABELS_CACHE_S,
                   help="the gateway's GATEWAY_LABELS_CACHE_S and GATEWAY_STATUS_CACHE_S: how "
                   "stale its labels and routing may be")  # fmt: skip
    p.add_argument("--reader-wait", type=float,
                   help="the rollout's wait for the gateways after a routing write (default: "
                   "--labels-cache-s + 2 s)")  # fmt: skip
    p.add_argument("--max-seq-len", type=int, default=128,
                   help="the versions' max_seq_len (longer tickets are truncated)")  # fmt: skip
    p.add_argument("--probe", type=int, default=100, help="tickets stable classifies first")
    p.add_argument("--gap", type=float, default=5.0, help="seconds of load between phases")
    p.add_argument("--windows", type=int, default=5, help="shadow windows each way")
    p.add_argument("--window-s", type=float, default=15.0)
    p.add_argument("--report", type=Path, default=REPO / "results" / "loadtest" / "drills.md",
                   help="append the transcript here ('' for nowhere)")  # fmt: skip
    p.add_argument("--plot", type=Path, default=REPO / "results" / "rollout_drill.png",
                   help="draw agreement and traffic share here ('' for nowhere)")  # fmt: skip
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    args = p.parse_args(argv)
    args.report = args.report if str(args.report) not in ("", ".") else None
    args.plot = args.plot if str(args.plot) not in ("", ".") else None
    args.checkpoint = args.checkpoint.resolve()
    if args.reader_wait is None:
        args.reader_wait = args.labels_cache_s + 2.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return common.run_in_tmp("rollout_drill", args.json, lambda work: Drill(args, work).run())
