"""A label moved and its old version unloaded in one config change: the gateway follows the label.

A rollback rewrites models.config once: ``stable`` moves to the other version and the version
policy drops the old one. A worker whose label cache still says the old version gets a 404 from
the model server; it must re-read the labels and retry once instead of passing the 404 on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from backend.app import create_app
from backend.worker import stop_worker
from ops.procs import ServerProcess, free_port, python_cmd

MODEL = "tiny-label"


def _config(base: Path, versions: list[int], stable: int) -> str:
    specific = " ".join(f"versions: {v}" for v in versions)
    return (
        "model_config_list {\n  config {\n"
        f'    name: "{MODEL}"\n    base_path: "{base / MODEL}"\n'
        '    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ specific {{ {specific} }} }}\n"
        f'    version_labels {{ key: "stable" value: {stable} }}\n'
        "  }\n}\n"
    )


def _available(rest_port: int) -> list[int]:
    try:
        reply = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}", timeout=1).json()
    except (requests.RequestException, ValueError):
        return []
    states = reply.get("model_version_status", [])
    return sorted(int(s["version"]) for s in states if s["state"] == "AVAILABLE")


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[Path, Path, int, int, ServerProcess]]:
    from export.tiny import export_tiny_model

    base = tmp_path / "models"
    for version in (1, 2):
        export_tiny_model(base, MODEL, task="classify", version=version, seed=version, warmup=False)
    config = tmp_path / "models.config"
    config.write_text(_config(base, [1, 2], stable=1))
    grpc_port, rest_port = free_port(), free_port()
    server = ServerProcess(
        python_cmd(
            "-m", "modelserver", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
            f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1",
            "--allow_version_labels_for_unavailable_models=true",
        ),
        tmp_path / "modelserver.log",
    )  # fmt: skip
    try:
        server.wait_until(lambda: _available(rest_port) == [1, 2], 120)
        yield base, config, grpc_port, rest_port, server
    finally:
        server.stop()


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_label_whose_version_was_unloaded_is_resolved_again_not_404(
    served: tuple[Path, Path, int, int, ServerProcess], upstream: str
) -> None:
    base, config, grpc_port, rest_port, server = served
    settings = {
        "upstream": upstream,
        "tfs_grpc_target": f"127.0.0.1:{grpc_port}",
        "tfs_rest_url": f"http://127.0.0.1:{rest_port}",
        "model_base_path": str(base),
        "model_config_file": str(config),
        "labels_cache_s": 3600,  # this worker would not look at the file again by itself
    }
    app = create_app(settings)
    # the same worker with room for 3 upstream rows per request: its retry spends the request's
    # budget, not a fresh one (2 rows tried on v1, then 2 more on v2: 4)
    tight = create_app({**settings, "max_request_rows": 3})
    client, tight_client = app.test_client(), tight.test_client()
    body = {"texts": ["hello world"], "label": "stable"}
    try:
        first = client.post(f"/v1/models/{MODEL}:classify", json=body)
        assert first.status_code == 200 and first.get_json()["model"]["version"] == 1
        warm = tight_client.post(f"/v1/models/{MODEL}:classify", json=body)
        assert warm.status_code == 200 and warm.get_json()["model"]["version"] == 1

        config.write_text(_config(base, [2], stable=2))  # rollback: label moves, v1 leaves
        server.wait_until(lambda: _available(rest_port) == [2], 60)

        retried = tight_client.post(
            f"/v1/models/{MODEL}:classify", json={**body, "texts": ["hello", "world"]}
        )
        assert retried.status_code == 413, retried.get_json()
        message = retried.get_json()["error"]["message"]
        assert "4 upstream rows" in message and "GATEWAY_MAX_REQUEST_ROWS" in message, message

        second = client.post(f"/v1/models/{MODEL}:classify", json=body)
        assert second.status_code == 200, second.get_json()
        assert second.get_json()["model"]["version"] == 2
        explicit = client.post(
            f"/v1/models/{MODEL}:classify", json={"texts": ["hello world"], "version": 1}
        )
        assert explicit.status_code == 404  # a version the caller named is still their 404
    finally:
        stop_worker(app)
        stop_worker(tight)
