"""A rollout's files: the routing file's entry it owns, and its state beside it (for resume).

The state (model, version, steps, the current step and when it went live, the entry the model had
before) is kept in ``.routing.yaml.rollout.json`` beside the routing file and written before the
routing entry it owns, both atomically under the models.config lock, so a rollout killed at any
point leaves the two consistent (``engine`` resumes or reverts from them). One process at a
time drives a model's rollout: ``driving`` holds an flock the kernel drops when its holder dies.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from modelformat import routing as routing_format
from modelformat import serverconfig
from modelformat.errors import FormatError
from modelformat.routing import ModelRoute, Routing, Shadow
from ops.modelconfig import OpsError

STATE_FORMAT = 1
STEPS, PROMOTING, ROLLING_BACK = "steps", "promoting", "rolling_back"

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
    spaces: dict[str, Any] | None = None  # an embedder's space check (ops.rollout.spaces)


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


def entry_following(config_path: Path, model: str, version: int) -> tuple[ModelRoute | None, str]:
    """Return the routing entry that sends ``model``'s default traffic to ``version`` (the one
    its label now names), and what it means.

    None (no entry) when ``version`` is the newest the config serves: without an entry the
    gateways send default traffic to the newest AVAILABLE version, and the gateways' version
    states are at most 2 x GATEWAY_STATUS_CACHE_S (+ one fetch) old, while ``version`` has been
    AVAILABLE since before the label moved. A newer version in the policy would take the default
    traffic then: the entry pins ``version`` at 100 %.
    """
    try:
        config = serverconfig.read(config_path)
    except FormatError as exc:
        raise OpsError(f"{config_path}: {exc}") from exc
    newer = [
        v
        for m in config.model_config_list.config
        if m.name == model
        for v in m.model_version_policy.specific.versions
        if v > version
    ]
    if newer:
        return ModelRoute(((version, 100.0),)), (
            f"{model}'s routing entry keeps v{version} at 100 % (v{max(newer)}, newer, is in "
            "the policy: without the entry it would serve)"
        )
    return None, (
        f"{model}'s routing entry removed (default traffic: the newest AVAILABLE version, "
        f"v{version})"
    )
