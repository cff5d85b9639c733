"""podman for the deploy tests: containers and pods on the host's network, always removed.

Every name is unique (a prefix and random hex), every port a free one, and each context manager
removes what it started whatever the test did, printing the logs first (pytest shows them for a
failed test).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import requests

from backend.clients.grpc_client import CHANNEL_OPTIONS
from ops.images import podman, podman_env
from tests.debian import needs

# Root installs podman with `make sysdeps`; only a user who is not root may lack it.
needs_podman = needs("podman", "podman")

GATEWAY_UID = 10001  # docker/backend.Dockerfile's and docker/ops.Dockerfile's user
# the gateway's gRPC channels retry a refused connection at most this far apart
RECONNECT_BACKOFF_S = dict(CHANNEL_OPTIONS)["grpc.max_reconnect_backoff_ms"] / 1000


def unique(prefix: str) -> str:
    """Return a container or pod name no other test run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def share_with_containers(path: Path) -> Path:
    """Give the images' user (uid 10001) ``path``'s tree, as a volume it writes must be."""
    subprocess.run(["chown", "-R", f"{GATEWAY_UID}:{GATEWAY_UID}", str(path)], check=True)
    path.chmod(0o755)
    return path


def quiet(*args: str) -> str:
    """Run podman for cleanup or logs: never raises, returns what it printed."""
    try:
        result = subprocess.run(
            ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as exc:
        return f"podman {' '.join(args)}: no answer in {exc.timeout} s"
    return result.stdout + result.stderr


def run_options(env: dict[str, str], volumes: dict[Path, str]) -> list[str]:
    """Return ``-e`` and ``-v`` options for ``podman run``."""
    out = [f"--env={key}={value}" for key, value in env.items()]
    return out + [f"--volume={host}:{target}" for host, target in volumes.items()]


@contextmanager
def started(name: str, image: str, options: Sequence[str], args: Sequence[str]) -> Iterator[str]:
    """Like ``container`` with prepared options (``run_options``): remove it on the way out."""
    podman("run", "-d", "--name", name, "--network=host", *options, image, *args)
    try:
        yield name
    finally:
        print(f"--- podman logs {name}\n{quiet('logs', '--tail', '60', name)}")
        quiet("rm", "-f", "-t", "5", name)


def wait_ready(url: str, timeout_s: float, alive: str | None = None) -> float:
    """Poll ``url`` until it answers 200; return the seconds it took.

    ``alive`` names a container that must keep running meanwhile (a crash fails at once).
    """
    started_at = time.monotonic()
    while time.monotonic() - started_at < timeout_s:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                # /readyz reached one gateway worker; another worker's channel that tried before
                # the model server listened reconnects within the channels' reconnect backoff and
                # answers 503 until then (the gateway's own retries wait 0.15 s)
                time.sleep(RECONNECT_BACKOFF_S + 0.5)
                return time.monotonic() - started_at
        except requests.RequestException:
            pass
        if alive and not running(alive):
            raise AssertionError(f"{alive} stopped: {quiet('logs', '--tail', '40', alive)}")
        time.sleep(0.5)
    raise AssertionError(f"{url} not ready in {timeout_s:.0f} s")


def running(name: str) -> bool:
    """Whether container ``name`` is running."""
    state = quiet("inspect", "--format", "{{.State.Running}}", name).strip()
    return state == "true"


def exec_in(name: str, *cmd: str) -> str:
    """Run ``cmd`` in container ``name``; return its output (raise when it fails)."""
    return podman("exec", name, *cmd).stdout.strip()


def image_config(ref: str) -> dict[str, object]:
    """Return an image's config (User, Env, Entrypoint ...) as podman inspects it."""
    config: dict[str, object] = json.loads(podman("image", "inspect", ref).stdout)[0]["Config"]
    return config
