"""The images as built and run: the model server from the ops image, the gateway from its own.

Both containers run on the host's network on free ports, the models on a mounted volume; the
gateway answers a classify and an embed, has no TensorFlow and runs as a user who is not root.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from ops.procs import free_port
from tests.deploy.conftest import CLASSIFY, EMBED, BuiltImages, models_config, record
from tests.deploy.containers import (
    exec_in,
    image_config,
    needs_podman,
    run_options,
    started,
    unique,
    wait_ready,
)

pytestmark = [needs_podman, pytest.mark.timeout(1800)]


@dataclass(frozen=True)
class Stack:
    """A model server and a gateway container, and the gateway's URL."""

    modelserver: str
    gateway: str
    url: str


def modelserver_args(grpc_port: int, rest_port: int) -> list[str]:
    """Return the model server's flags (TF Serving's) for the config at /config/models.config."""
    return [
        "-m", "modelserver", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
        "--model_config_file=/config/models.config", "--file_system_poll_wait_seconds=1",
    ]  # fmt: skip


def gateway_env(grpc_port: int, rest_port: int, port: int) -> dict[str, str]:
    """Return the gateway's settings: the model server on this host, the models at /models."""
    return {
        "GATEWAY_UPSTREAM": "grpc",
        "GATEWAY_TFS_GRPC": f"127.0.0.1:{grpc_port}",
        "GATEWAY_TFS_REST": f"http://127.0.0.1:{rest_port}",
        "GATEWAY_MODEL_BASE_PATH": "/models",
        "GATEWAY_MODEL_CONFIG_FILE": "/config/models.config",
        "GATEWAY_BIND": f"127.0.0.1:{port}",
        "GATEWAY_WORKERS": "1",
    }


@pytest.fixture(scope="module")
def stack(
    built_images: BuiltImages, tiny_models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Start the model server (ops image) and the gateway (its image); remove both after."""
    config = tmp_path_factory.mktemp("image-config")
    (config / "models.config").write_text(models_config([CLASSIFY, EMBED]))
    config.chmod(0o755)
    volumes = {tiny_models: "/models:ro", config: "/config:ro"}
    grpc_port, rest_port, port = free_port(), free_port(), free_port()
    with ExitStack() as stack:
        t0 = time.monotonic()
        modelserver = stack.enter_context(started(
            unique("bg-modelserver"), built_images.ops,
            ["--entrypoint=python", *run_options({}, volumes)],
            modelserver_args(grpc_port, rest_port),
        ))  # fmt: skip
        gateway = stack.enter_context(started(
            unique("bg-gateway"), built_images.gateway,
            run_options(gateway_env(grpc_port, rest_port, port), volumes), [],
        ))  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_ready(f"{url}/readyz", timeout_s=300, alive=gateway)
        record(
            "model server + gateway containers: start to /readyz", f"{time.monotonic() - t0:.0f} s"
        )
        yield Stack(modelserver, gateway, url)


@pytest.mark.parametrize(
    ("model", "verb", "key"),
    [(CLASSIFY, "classify", "predictions"), (EMBED, "embed", "embeddings")],
)
def test_the_gateway_container_answers_through_the_model_server_container(
    stack: Stack, model: str, verb: str, key: str
) -> None:
    texts = ["my card was charged twice", "where is my parcel?"]
    reply = requests.post(
        f"{stack.url}/v1/models/{model}:{verb}", json={"texts": texts}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == {"name": model, "version": 1}
    assert len(body[key]) == len(texts)


def test_the_gateway_container_has_no_tensorflow(stack: Stack) -> None:
    """The image installs exactly requirements-gateway.txt: TensorFlow is not importable."""
    found = exec_in(
        stack.gateway, "python", "-c",
        "import importlib.util as u; print([m for m in ('tensorflow', 'keras') if u.find_spec(m)])",
    )  # fmt: skip
    assert found == "[]"


@pytest.mark.parametrize("which", ["gateway", "modelserver"])
def test_the_containers_run_as_a_user_who_is_not_root(stack: Stack, which: str) -> None:
    name = getattr(stack, which)
    assert exec_in(name, "id", "-u") == "10001"
    assert exec_in(name, "id", "-g") == "10001"


@pytest.mark.parametrize("image", ["gateway", "ops"])
def test_the_images_are_tagged_with_the_projects_version(
    built_images: BuiltImages, image: str
) -> None:
    from ops.images import project_version

    ref = getattr(built_images, image)
    assert ref.endswith(f":{project_version()}")
    assert image_config(ref)["User"] in {"gateway", "ops"}
