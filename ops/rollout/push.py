"""A rollout's dealings with push_model and the model servers: publish, pin, check, promote.

``--from-dir`` / ``--checkpoint`` publish the new version before its rollout, the way push_model
does it but with no label. Without a routing entry the gateways send requests naming no version
to the newest AVAILABLE version, so a version pushed before its rollout would serve default
traffic unvetted from the moment it loads until the first step is written: ``pin_to_stable``
pins the model's default traffic to the stable version first (a model with an entry keeps it).
The promotion moves the label through push_model's machinery (config lock, label history, every
replica AVAILABLE); the availability check speaks gRPC with the gateway's TF-free messages.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from modelformat import serverconfig
from modelformat.errors import FormatError
from modelformat.routing import ModelRoute
from ops.lifecycle import push
from ops.modelconfig import OpsError, say
from ops.rollout.engine import CheckAvailable, Promote, Rollout, Settings
from ops.rollout.metrics import GatewayMetrics
from ops.rollout.state import load_states, read_routing, state_path_for, write_route


def push_args(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """Return push_model's arguments for this rollout's servers and config, with ``changes``."""
    base = dict(
        name=args.name, config=args.config, base_path=args.base_path, server=args.server,
        timeout=args.timeout, keep=args.keep, reader_wait=args.reader_wait,
        lock_timeout=args.lock_timeout, dry_run=False, promote=None, rollback=None, to=None,
        checkpoint=None, from_dir=None, label=None, version=None, set_label=None,
        add=False, task=None, also_config=[], offline=False,
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
