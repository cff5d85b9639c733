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
gateway has re-read it (``--reader-wait``, the bound push_model waits before unloading) and the
gateways' shadow backlog from the step before has drained (``gateway_shadow_queue_depth`` at 0, at
most ``--drain-timeout``: queued shadows of a shadow step would run the new version inside the
next step's window and mix into its latency and agreement). Then the step holds for
``--hold-s`` and until ``--hold-requests`` requests reached the new version (compared shadow
requests in a shadow step), reading the increase of the gateways' counters since it went
live, from their ``/metrics`` pages (``--gateway``, repeated) or from Prometheus's HTTP API
(``--prometheus``). At the end of the hold it decides, and it rolls back earlier when a threshold
is already clearly broken:

  shadow steps    mean agreement with the stable version's answers (top-1 label for classifiers,
                  cosine for embeddings, else MaxSim agreement of multi-vectors, else sparse
                  top-10 overlap) >= --min-agreement; shadow calls that failed <= the
                  stable version's error rate + --max-error-increase
  weighted steps  the new version's 5xx rate <= the stable version's + --max-error-increase; its
                  p99 latency <= the stable version's p99 x --max-latency-ratio

Embedders: before the first step, when a weighted step is to come, the two versions embed a
sample (``--space-sample``) in process, once per output kind both have (dense, sparse,
multi-vector: each kind asked alone): one vector space in every kind (a re-export, a precision
change) rolls out as above; two spaces in any kind, or a kind the new version lacks, refuse the
weighted canary (a rollback naming ``python -m ops.rollout migrate``, the measures and thresholds
in ``ops.rollout.spaces``).

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
import signal
import sys
from pathlib import Path
from typing import Any

from backend.errors import GatewayError
from backend.settings import SettingsError
from ops.lifecycle import push
from ops.modelconfig import OpsError, say
from ops.procs import REPO
from ops.rollout.decisions import DEFAULT_STEPS, Thresholds, parse_steps
from ops.rollout.engine import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_PROMOTED,
    EXIT_ROLLED_BACK,
    CheckSpaces,
    Rollout,
    Settings,
)
from ops.rollout.metrics import GatewayMetrics, MetricsSource, PrometheusMetrics
from ops.rollout.push import available_on_replicas, promote_with_push, push_new_version
from ops.rollout.spaces import (
    SpaceCheck,
    compare,
    compared_kinds,
    gateway_embed,
    is_embedder,
    read_sample,
    sample_texts,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed arguments (errors exit with the usage, as argparse does).

    Arguments after ``--`` go to ``python -m export build`` with ``--checkpoint`` (``args.extra``).
    """
    argv, extra = push.split_exporter_args(argv)
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
    parser.add_argument(
        "--drain-timeout", type=float, default=300.0,
        help="seconds a step waits, after the reader wait, for the gateways' queued shadow "
        "requests (gateway_shadow_queue_depth) to drain before it measures (300)",
    )  # fmt: skip
    parser.add_argument("--poll-s", type=float, default=5.0, help="seconds between metric reads")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per replica")
    parser.add_argument("--keep", type=int, default=2, help="as push_model: newest versions kept")
    parser.add_argument("--lock-timeout", type=float, default=600.0, help="as push_model")
    parser.add_argument(
        "--space-sample", type=Path, default=None,
        help="embedders: texts (one a line, or JSONL with a text field) the two versions' "
        "spaces are compared on before a weighted step (default: a built-in sample)",
    )  # fmt: skip
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
        drain_timeout_s=args.drain_timeout,
        lock_timeout_s=args.lock_timeout, routing_path=args.routing, log_path=args.log,
    )  # fmt: skip


def spaces_checker(args: argparse.Namespace) -> CheckSpaces:
    """Return the space check of an embedder's versions, in process on the first --server."""

    def check(model: str, stable: int, new: int) -> SpaceCheck | None:
        texts = read_sample(args.space_sample) if args.space_sample else sample_texts()
        gateway, embed_for = gateway_embed(args.server[0], args.base_path, args.config)
        try:
            if not is_embedder(gateway, model, new):
                return None
            kinds, missing = compared_kinds(gateway, model, stable, new)
            return compare(embed_for(model), stable, new, texts, kinds=kinds, missing=missing)
        except GatewayError as exc:
            raise OpsError(f"the space check of {model} failed: {exc.message}") from exc
        finally:
            gateway.close()

    return check


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (a k8s Job deleted) stops like Ctrl-C


def main(argv: list[str] | None = None) -> int:
    """Run the rollout (``migrate ...``: an embedder's migration, ``ops.rollout.migrate``)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["migrate"]:
        from ops.rollout import migrate

        sys.argv[0] = "python -m ops.rollout migrate"
        return migrate.main(argv[1:])
    args = parse_args(argv)
    settings = settings_from(args)
    source: MetricsSource = (
        PrometheusMetrics(args.prometheus)
        if args.prometheus
        else GatewayMetrics(args.gateway or [])
    )
    rollout = Rollout(
        settings,
        source,
        promote_with_push(args),
        available_on_replicas(args.server, args.timeout),
        check_spaces=spaces_checker(args),
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
