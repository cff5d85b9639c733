"""Real processes for the gateway's end-to-end tests: a modelserver and gunicorn gateways."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import requests

from ops.procs import REPO, ServerProcess, child_env, free_port, python_cmd
from ops.stack import MONITORING_CONFIG

GUNICORN_CONF = REPO / "docker" / "gunicorn.conf.py"


def model_config(base: Path, labels: dict[str, dict[str, int]], models: list[str]) -> str:
    """Return a text-format ModelServerConfig serving every version of ``models``."""
    entries = []
    for name in models:
        label_lines = "".join(
            f'    version_labels {{ key: "{key}" value: {value} }}\n'
            for key, value in labels.get(name, {}).items()
        )
        entries.append(
            "  config {\n"
            f'    name: "{name}"\n'
            f'    base_path: "{base / name}"\n'
            '    model_platform: "tensorflow"\n'
            "    model_version_policy { all {} }\n"
            f"{label_lines}"
            "  }\n"
        )
    return "model_config_list {\n" + "".join(entries) + "}\n"


class ModelServer:
    """``python -m modelserver`` on free gRPC and REST ports."""

    def __init__(self, config_file: Path, log_dir: Path, extra_flags: Sequence[str] = ()) -> None:
        self.grpc_port = free_port()
        self.rest_port = free_port()
        self.process = ServerProcess(
            python_cmd(
                "-m",
                "modelserver",
                f"--port={self.grpc_port}",
                f"--rest_api_port={self.rest_port}",
                f"--model_config_file={config_file}",
                "--file_system_poll_wait_seconds=1",
                "--allow_version_labels_for_unavailable_models",
                f"--monitoring_config_file={MONITORING_CONFIG}",
                *extra_flags,
            ),
            log_dir / f"modelserver-{self.grpc_port}.log",
        )

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def wait_available(self, model: str, version: int, timeout_s: float = 120.0) -> None:
        """Block until ``model`` ``version`` is AVAILABLE."""

        def ready() -> bool:
            try:
                reply = requests.get(f"{self.rest_url}/v1/models/{model}", timeout=1).json()
            except (requests.RequestException, ValueError):
                return False
            return any(
                int(s["version"]) == version and s["state"] == "AVAILABLE"
                for s in reply.get("model_version_status", [])
            )

        self.process.wait_until(ready, timeout_s)

    def stop(self) -> None:
        self.process.stop()


class Gateway:
    """gunicorn running ``backend.app:create_app()`` with docker/gunicorn.conf.py."""

    def __init__(
        self, env: dict[str, str], log_dir: Path, workers: int = 2, threads: int = 4
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = child_env(
            GATEWAY_BIND=f"127.0.0.1:{self.port}",
            GATEWAY_WORKERS=str(workers),
            GATEWAY_THREADS=str(threads),
            GATEWAY_ACCESS_LOG="-",
            **env,
        )
        full_env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the config makes a fresh one
        self.process = ServerProcess(
            python_cmd("-m", "gunicorn", "-c", str(GUNICORN_CONF), "backend.app:create_app()"),
            log_dir / f"gateway-{self.port}.log",
            env=full_env,
        )
        self.process.wait_until(self._healthy, 60)

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.process.stop()


def gateway_env(
    server: ModelServer | None, upstream: str, base: Path, config: Path
) -> dict[str, str]:
    """Return GATEWAY_* variables for a gateway in front of ``server``."""
    grpc_target = server.grpc_target if server else "127.0.0.1:1"
    rest_url = server.rest_url if server else "http://127.0.0.1:1"
    return {
        "GATEWAY_UPSTREAM": upstream,
        "GATEWAY_TFS_GRPC": grpc_target,
        "GATEWAY_TFS_REST": rest_url,
        "GATEWAY_MODEL_BASE_PATH": str(base),
        "GATEWAY_MODEL_CONFIG_FILE": str(config),
        "GATEWAY_DEFAULT_MODEL": "tiny-intent",
        "GATEWAY_TIMEOUT_S": "10",
        "GATEWAY_STATUS_CACHE_S": "0.5",
        "GATEWAY_MAX_BATCH": "4",
        "GATEWAY_MAX_TEXTS": "64",
        "GATEWAY_MAX_TEXT_CHARS": "2000",
        "GATEWAY_MAX_BODY_BYTES": "65536",
        "GATEWAY_DEBUG_ENDPOINTS": "1",
    }


@contextlib.contextmanager
def hung_port() -> Iterator[int]:
    """Yield a port that accepts TCP connections and never answers (a hung model server)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=2)
        for conn in held:
            conn.close()
        server.close()
