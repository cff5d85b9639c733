"""The model server dies and comes back: the gateway answers 503 meanwhile, then recovers fast."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from backend.app import create_app
from backend.worker import stop_worker
from ops.procs import ServerProcess, free_port, python_cmd

MODEL = "tiny-restart"


def _spawn(base: Path, grpc_port: int, rest_port: int, log: Path) -> ServerProcess:
    return ServerProcess(
        python_cmd(
            "-m",
            "modelserver",
            f"--port={grpc_port}",
            f"--rest_api_port={rest_port}",
            f"--model_name={MODEL}",
            f"--model_base_path={base / MODEL}",
        ),
        log,
    )


def _available(rest_port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}"
        states = requests.get(url, timeout=1).json().get("model_version_status", [])
    except (requests.RequestException, ValueError):
        return False
    return any(s["state"] == "AVAILABLE" for s in states)


def test_gateway_recovers_quickly_after_a_model_server_restart(tmp_path: Path) -> None:
    from export.tiny import export_tiny_model

    export_tiny_model(tmp_path, MODEL, task="embed", version=1, seed=5, warmup=False)
    grpc_port, rest_port = free_port(), free_port()
    server = _spawn(tmp_path, grpc_port, rest_port, tmp_path / "ms1.log")
    server.wait_until(lambda: _available(rest_port), 120)

    def settings(upstream: str) -> dict[str, object]:
        return {
            "upstream": upstream,
            "tfs_grpc_target": f"127.0.0.1:{grpc_port}",
            "tfs_rest_url": f"http://127.0.0.1:{rest_port}",
            "model_base_path": str(tmp_path),
            "status_cache_s": 0.1,
            "grpc_retries": 0,
        }

    apps = {upstream: create_app(settings(upstream)) for upstream in ("grpc", "rest")}
    clients = {upstream: app.test_client() for upstream, app in apps.items()}
    path, body = f"/v1/models/{MODEL}:embed", {"texts": ["hello world"]}
    try:
        assert all(c.post(path, json=body).status_code == 200 for c in clients.values())

        server.stop()
        outage_end = time.monotonic() + 3
        while time.monotonic() < outage_end:  # traffic keeps coming while the server is down
            for client in clients.values():
                down = client.post(path, json=body)
                assert down.status_code == 503 and down.headers["Retry-After"]
            time.sleep(0.1)

        server = _spawn(tmp_path, grpc_port, rest_port, tmp_path / "ms2.log")
        # "Back" is when a gateway with no history of the outage gets an answer: the model
        # server is up *and* has run this signature once, however slow this machine is at
        # either. From then on, only the gateways' own reconnect and caches can delay them.
        apps["probe"] = create_app({**settings("rest"), "status_cache_s": 0})
        probe = apps["probe"].test_client()
        back_at = None
        waiting = dict(clients)
        while waiting:
            if back_at is None and probe.post(path, json=body).status_code == 200:
                back_at = time.monotonic()
            for upstream in [
                u for u, c in waiting.items() if c.post(path, json=body).status_code == 200
            ]:
                del waiting[upstream]
            # gRPC's reconnect backoff is capped at 1 s (grpc_client.CHANNEL_OPTIONS); its
            # default would keep growing through the outage, to several seconds.
            assert back_at is None or time.monotonic() - back_at < 3.0, f"slow: {list(waiting)}"
            assert server.proc.poll() is None, server.tail()
            time.sleep(0.1)
    finally:
        for app in apps.values():
            stop_worker(app)
        server.stop()
