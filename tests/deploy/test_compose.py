"""docker/docker-compose.yml under podman, docker/docker-compose.podman.yml the only change.

The two files are copied beside a models tree and a serving_config/ of tiny models (compose's
``../models`` and ``../serving_config``), brought up with podman-compose on free host ports, sent
a push of a new version by the ops container (as docs/guides/model-lifecycle.md runs
push_model), asked for it through the gateway, and brought down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from ops.images import podman_env
from ops.procs import free_port
from tests.deploy.conftest import CLASSIFY, EMBED, BuiltImages, models_config, record
from tests.deploy.containers import needs_podman, quiet, share_with_containers, unique, wait_ready

pytestmark = [needs_podman, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
FILES = ("docker-compose.yml", "docker-compose.podman.yml")
# requirements-dev.txt pins podman-compose, whose script sits beside this interpreter.
PODMAN_COMPOSE = str(Path(sys.executable).parent / "podman-compose")


@dataclass(frozen=True)
class ComposeStack:
    """A compose project brought up from a copy of docker/, and where it listens."""

    root: Path
    project: str
    url: str
    grpc_port: int


def compose(stack_root: Path, project: str, *args: str, env: dict[str, str]) -> str:
    """Run podman-compose with both files on the copy; raise with its output when it fails."""
    files = [arg for name in FILES for arg in ("-f", str(stack_root / "docker" / name))]
    result = subprocess.run(
        [PODMAN_COMPOSE, "-p", project, *files, *args], capture_output=True, text=True,
        env={**podman_env(), **env}, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, f"podman-compose {args}: {result.stdout}\n{result.stderr}"
    return result.stdout


def lay_out(root: Path, tiny_models: Path) -> Path:
    """Copy docker/'s two files, a models tree and serving_config/ as compose's paths want them."""
    (root / "docker").mkdir()
    for name in FILES:
        shutil.copy(REPO / "docker" / name, root / "docker" / name)
    shutil.copytree(tiny_models, root / "models")
    config = root / "serving_config"
    config.mkdir()
    for name in ("batching_parameters.txt", "monitoring.config"):
        shutil.copy(REPO / "serving_config" / name, config / name)
    labels = {CLASSIFY: {"stable": 1}}
    (config / "models.config").write_text(models_config([CLASSIFY, EMBED], labels))
    share_with_containers(root / "models")
    share_with_containers(config)
    return root


@pytest.fixture(scope="module")
def compose_stack(
    built_images: BuiltImages, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComposeStack]:
    """`up -d` the copy on free ports (no build: the images are built_images'); `down` after."""
    import time

    root = lay_out(tmp_path_factory.mktemp("compose"), tiny_models)
    project = unique("bgcompose")
    ports = {
        "TFS_GRPC_PORT": free_port(),
        "TFS_REST_PORT": free_port(),
        "GATEWAY_PORT": free_port(),
    }
    env = {key: str(port) for key, port in ports.items()}
    t0 = time.monotonic()
    try:
        compose(root, project, "up", "-d", "--no-build", env=env)
        url = f"http://127.0.0.1:{ports['GATEWAY_PORT']}"
        wait_ready(f"{url}/readyz", timeout_s=300)
        record(
            "compose up (podman-compose) to the gateway's /readyz", f"{time.monotonic() - t0:.0f} s"
        )
        yield ComposeStack(root, project, url, ports["TFS_GRPC_PORT"])
    finally:
        print(quiet("ps", "-a", "--filter", f"label=io.podman.compose.project={project}"))
        for service in ("tfserving", "gateway"):
            print(f"--- {service}\n{quiet('logs', '--tail', '40', f'{project}_{service}_1')}")
        compose(root, project, "down", "-t", "5", env=env)


def classify(stack: ComposeStack, **selector: object) -> dict[str, object]:
    """Return the gateway's classify answer for one text (``label=...`` or ``version=...``)."""
    reply = requests.post(
        f"{stack.url}/v1/models/{CLASSIFY}:classify",
        json={"texts": ["where is my parcel?"], **selector}, timeout=30,
    )  # fmt: skip
    assert reply.status_code == 200, reply.text
    body: dict[str, object] = reply.json()
    return body


def test_compose_serves_through_the_gateway(compose_stack: ComposeStack) -> None:
    assert classify(compose_stack, label="stable")["model"] == {"name": CLASSIFY, "version": 1}
    reply = requests.post(
        f"{compose_stack.url}/v1/models/{EMBED}:embed", json={"texts": ["hello"]}, timeout=30
    )
    assert reply.status_code == 200 and len(reply.json()["embeddings"]) == 1, reply.text


def test_a_version_pushed_by_the_ops_container_is_served(
    compose_stack: ComposeStack, built_images: BuiltImages, tmp_path: Path
) -> None:
    """push_model in the ops image, on the compose volume, against compose's published port."""
    from export.tiny import export_tiny_model

    incoming = compose_stack.root / "models" / ".incoming"
    export_tiny_model(incoming, CLASSIFY, task="classify", version=2, seed=7, max_seq_len=32)
    share_with_containers(incoming)
    push = [
        "podman", "run", "--rm", "--network=host", "--name", unique("bg-push"),
        f"--volume={compose_stack.root / 'models'}:/models",
        f"--volume={compose_stack.root / 'serving_config'}:/config",
        built_images.ops,
        "--config", "/config/models.config", "--base-path", "/models",
        "--server", f"127.0.0.1:{compose_stack.grpc_port}", "--timeout", "120",
        "--name", CLASSIFY, "--from-dir", f"/models/.incoming/{CLASSIFY}/2", "--label", "canary",
    ]  # fmt: skip
    result = subprocess.run(push, env=podman_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert classify(compose_stack, label="canary")["model"] == {"name": CLASSIFY, "version": 2}
    assert classify(compose_stack, label="stable")["model"] == {"name": CLASSIFY, "version": 1}
    assert os.path.isdir(compose_stack.root / "models" / CLASSIFY / "2")
