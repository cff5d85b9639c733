"""Hot reload under load, measured: clients through the gateway while versions are pushed,
`canary` moves, is promoted to `stable`, and `stable` is rolled back.

  python scripts/reload_drill.py --spawn models/ --model minilm-intent       # throw-away stack
  python scripts/reload_drill.py --config .stack/models.config --gateway http://127.0.0.1:8000

With ``--spawn`` the newest version of the model is copied into a temporary base path with its
own model server and gateway, so the drill never touches your models. Otherwise it drives a
running stack through push_model.py (it pushes copies of the newest version, or ``--source``).
Checks: zero failed requests; every answer names a version the model server reported AVAILABLE
while the request was in flight; no version is unloaded sooner than GATEWAY_LABELS_CACHE_S after
the last label naming it moved (the gateway's label cache); each label move is visible
within ``--switch-bound`` seconds of its label write; at the end the AVAILABLE versions are what
the version policy asks for.
A step that unloads a version (the promote) goes on for push_model's ``--reader-wait`` after
moving the label: from GATEWAY_LABELS_CACHE_S/STATUS_CACHE_S/TIMEOUT_S, 11 s by default.
Prints a per-second timeline (which version answered) and the counts; exits 1 if a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.settings import load_settings
from modelformat import layout, serverconfig
from ops import modelconfig, stack
from ops.drills import common
from ops.drills.common import Answer, copy_newest, pinned_config
from ops.lifecycle import push
from ops.modelconfig import OpsError
from ops.procs import REPO
from ops.server import ModelServer

# When each step starts, as a fraction of --duration.
SCHEDULE = (0.15, 0.35, 0.55, 0.75)


@dataclass
class Step:
    """One ops action of the drill and when it ran."""

    name: str
    argv: list[str]
    label: str = ""
    started: float = 0.0
    finished: float = 0.0
    labelled: float | None = None  # when the label write was applied (None: labels unchanged)
    version: int | None = None  # what ``label`` points at afterwards
    ok: bool = False


def labels_now(config_path: Path, model: str) -> dict[str, int]:
    """Return the model's labels as models.config has them now."""
    return dict(modelconfig.find_model(modelconfig.load_config(config_path), model).version_labels)


def plan_steps(source: Path) -> list[Step]:
    """Return the drill's steps: two pushes to canary, promote, rollback."""
    return [
        Step("push #1 -> canary", ["--from-dir", str(source), "--label", "canary"], "canary"),
        Step("push #2 -> canary", ["--from-dir", str(source), "--label", "canary"], "canary"),
        Step("promote canary -> stable", ["--promote", "canary", "stable"], "stable"),
        Step("rollback stable", ["--rollback", "stable"], "stable"),
    ]


def run_step(step: Step, push_args: list[str], config_path: Path, model: str) -> None:
    """Run one push_model invocation, timing it and its label write."""
    args, extra = push.parse_args([*step.argv, *push_args])
    step.started = time.monotonic()
    try:
        step.labelled = push.run(args, extra).labels_moved_at
        step.ok = True
    except OpsError as exc:
        print(f"push_model: error: {exc}", file=sys.stderr)
    step.finished = time.monotonic()
    step.version = labels_now(config_path, model).get(step.label)


def switch_delay(step: Step, answers: list[Answer]) -> float | None:
    """Return seconds from the label write until the label first answered with its new version.

    A step that unloads a version goes on for ``--reader-wait`` after its label write, so the
    switch is timed from the write (the step's end when it wrote no label).
    """
    moved = step.labelled if step.labelled is not None else step.finished
    hits = [
        a.finished
        for a in answers
        if a.ok
        and a.label == step.label
        and a.version == step.version
        and a.started >= step.started
    ]
    return max(0.0, min(hits) - moved) if hits else None


def check(
    answers: list[Answer],
    steps: list[Step],
    monitor: common.StatusMonitor,
    settled: tuple[set[int], set[int]],
    switch_bound_s: float,
) -> dict[str, Any]:
    """Return the drill's checks and figures (pure, over what was recorded)."""
    failed = [a for a in answers if not a.ok]
    unavailable = [
        a
        for a in answers
        if a.ok and not monitor.available_during(a.version or -1, a.started, a.finished, 0.3)
    ]
    delays = {s.name: switch_delay(s, answers) for s in steps}
    available, wanted = settled
    # The gateway may resolve a label from its cache for GATEWAY_LABELS_CACHE_S after the
    # config changes: a version unloaded sooner than that after its last label moved away can
    # fail requests, whatever the gateway then does about it.
    labels_ttl_s = load_settings().labels_cache_s
    gaps = monitor.unload_gaps()
    checks = {
        "all steps succeeded": all(s.ok for s in steps),
        "zero failed requests": not failed,
        "every answer from an AVAILABLE version": not unavailable,
        f"no version unloaded within {labels_ttl_s:g}s (GATEWAY_LABELS_CACHE_S) of a label "
        "naming it": all(gap >= labels_ttl_s for gap in gaps.values()),
        f"each switch visible within {switch_bound_s:g}s": all(
            d is not None and d <= switch_bound_s for d in delays.values()
        ),
        "AVAILABLE versions match the policy at the end": available == wanted,
    }
    return {
        "checks": checks,
        "switch_delay_s": delays,
        "unloaded_after_label_moved_s": gaps,
        "counts": common.counts(answers),
        "failed_examples": [a.error or a.status for a in failed[:5]],
        "unavailable_examples": [(a.version, a.started, a.finished) for a in unavailable[:5]],
        "available_at_end": sorted(available),
        "policy_at_end": sorted(wanted),
        "latency_p99_ms": _p99([a.finished - a.started for a in answers if a.ok]) * 1000,
    }


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else float("nan")


def settle(
    server: ModelServer, config_path: Path, model_dir: Path, model: str
) -> tuple[set[int], set[int]]:
    """Wait (up to 15 s) for the AVAILABLE set to match the policy; return (available, wanted)."""
    wanted = modelconfig.policy_versions(
        modelconfig.find_model(modelconfig.load_config(config_path), model),
        layout.list_versions(model_dir),
    )
    deadline = time.monotonic() + 15
    while True:
        available = {s.version for s in server.status(model) if s.state == "AVAILABLE"}
        if available == wanted or time.monotonic() > deadline:
            return available, wanted
        time.sleep(0.2)


@contextlib.contextmanager
def spawned(args: argparse.Namespace) -> Iterator[None]:
    """Copy the newest version into a temp base path, start a model server + gateway on it."""
    with tempfile.TemporaryDirectory(prefix="reload-drill-") as tmp:
        work = Path(tmp)
        base = work / "models"
        _, newest = copy_newest(args.spawn, args.model, base)
        args.config = work / "models.config"
        serverconfig.write_atomic(args.config, pinned_config(args.model, base, newest))
        args.base_path = base
        server, grpc_port, rest_port = stack.start_modelserver(args.config, work, batching=False)
        gateway = None
        try:
            args.server = f"127.0.0.1:{grpc_port}"
            gateway, args.gateway = stack.start_gateway(
                "grpc", grpc_port, rest_port, base, args.config, work
            )
            yield
        finally:
            if gateway is not None:
                gateway.stop()
            server.stop()


def drill(args: argparse.Namespace) -> dict[str, Any]:
    """Run the load and the steps; print the timeline; return the checks and figures."""
    model_dir = modelconfig.model_dir_on_host(
        modelconfig.find_model(modelconfig.load_config(args.config), args.model), args.base_path
    )
    source = args.source or model_dir / str(layout.list_versions(model_dir)[-1])
    push_args = [
        "--name", args.model, "--config", str(args.config), "--base-path", str(args.base_path),
        "--server", args.server, "--timeout", "60",
    ]  # fmt: skip
    if "canary" not in labels_now(args.config, args.model):
        push.main(["--promote", "stable", "canary", *push_args])
    server = ModelServer(args.server)
    monitor = common.StatusMonitor(server, args.model, config_path=args.config).start()
    load = common.Load(
        args.gateway, args.model, args.verb, ["stable", "canary", ""], args.clients,
        interval_s=args.pace,
    )  # fmt: skip
    t0 = time.monotonic()
    load.start()
    steps = plan_steps(source)
    events: dict[int, list[str]] = {}
    for step, at in zip(steps, SCHEDULE, strict=True):
        time.sleep(max(0.0, t0 + at * args.duration - time.monotonic()))
        print(f"\n== t={time.monotonic() - t0:.1f}s {step.name}", flush=True)
        run_step(step, push_args, args.config, args.model)
        # Marked when the label moved: a step that unloads a version ends --reader-wait later.
        moved = step.labelled if step.labelled is not None else step.finished
        events.setdefault(int(moved - t0), []).append(
            f"{step.name}: {step.label}=v{step.version} ({step.finished - step.started:.1f}s)"
        )
    # A step that waited for readers may end past --duration: the load goes on long enough
    # after the last step for its switch to show.
    end = max(t0 + args.duration, steps[-1].finished + 2 * args.switch_bound)
    time.sleep(max(0.0, end - time.monotonic()))
    answers = load.stop()
    settled = settle(server, args.config, model_dir, args.model)
    monitor.stop()
    server.close()
    for t, change in monitor.transitions():
        events.setdefault(int(t - t0), []).append(change)
    print("\nTimeline (answers finished per second, by version):")
    print(common.timeline(answers, t0, events))
    result = check(answers, steps, monitor, settled, args.switch_bound)
    print("\nCounts:", json.dumps(result["counts"], sort_keys=True))
    delays = {k: (None if v is None else round(v, 2)) for k, v in result["switch_delay_s"].items()}
    print("Switch visible after (s):", json.dumps(delays))
    gaps = {f"v{k}": round(v, 2) for k, v in result["unloaded_after_label_moved_s"].items()}
    print("Unloaded after its label moved (s, at least):", json.dumps(gaps))
    print(f"AVAILABLE at end: {result['available_at_end']}, policy: {result['policy_at_end']}")
    common.print_checks(result["checks"])
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the command-line arguments."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="minilm-intent")
    p.add_argument("--verb", default="classify", choices=["classify", "embed"])
    p.add_argument("--clients", type=int, default=16)
    common.add_pace(p)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--spawn", type=Path, help="run on a copy of this base path's newest version")
    p.add_argument("--config", type=Path, default=push.default_config_path())
    p.add_argument("--base-path", type=Path, default=REPO / "models")
    p.add_argument("--server", default="127.0.0.1:8500", help="model server gRPC host:port")
    p.add_argument("--gateway", default="http://127.0.0.1:8000")
    p.add_argument("--source", type=Path, help="exported version dir to push (default: newest)")
    p.add_argument("--switch-bound", type=float, default=3.0, help="seconds a label move may take")
    p.add_argument("--json", type=Path, help="also write the checks and figures here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with spawned(args) if args.spawn else contextlib.nullcontext():
            result = drill(args)
    except OpsError as exc:
        print(f"reload_drill: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return 0 if all(result["checks"].values()) else 1
