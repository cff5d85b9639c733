"""Start a throw-away local stack (model server + gunicorn gateways) for the load and drill scripts.

The model server is the real ``tensorflow_model_server`` when ``TFS_BIN`` names one, otherwise
``python -m modelserver``: both take the same flags (docs/architecture.md, contract 4). Every
process runs in its own session and is stopped as a group.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ops.procs import REPO, ServerProcess, child_env, free_port, http_ok, port_open

SERVING_CONFIG = REPO / "serving_config"
MONITORING_CONFIG = SERVING_CONFIG / "monitoring.config"  # the Prometheus page, request counts
# OPS_GATEWAY_APP overrides it, e.g. to drill a gateway variant without editing backend/.
GATEWAY_APP = "backend.app:create_app()"


def modelserver_cmd(
    grpc_port: int, rest_port: int, config: Path, batching: bool = True, extra: Sequence[str] = ()
) -> list[str]:
    """Return the model-server command line (``TFS_BIN`` or ``python -m modelserver``).

    ``extra``: more TF Serving flags, after the project's (a later flag wins).
    """
    binary = os.environ.get("TFS_BIN")
    head = [binary] if binary else [sys.executable, "-m", "modelserver"]
    flags = [
        f"--port={grpc_port}", f"--rest_api_port={rest_port}", f"--model_config_file={config}",
        "--file_system_poll_wait_seconds=1", "--model_config_file_poll_wait_seconds=2",
        "--allow_version_labels_for_unavailable_models=true",
    ]  # fmt: skip
    if MONITORING_CONFIG.is_file():
        flags.append(f"--monitoring_config_file={MONITORING_CONFIG}")
    if batching:
        flags.append("--enable_batching=true")
        parameters = SERVING_CONFIG / "batching_parameters.txt"
        if parameters.is_file():
            flags.append(f"--batching_parameters_file={parameters}")
    return [*head, *flags, *extra]


def start_modelserver(
    config: Path,
    log_dir: Path,
    batching: bool = True,
    timeout_s: float = 300,
    nice: int = 0,
    extra: Sequence[str] = (),
) -> tuple[ServerProcess, int, int]:
    """Start a model server on free ports; return it with its gRPC and REST ports once open.

    ``nice`` > 0 runs it at that lower CPU priority: it gets little more than the CPU that the
    processes at the normal priority leave idle. Where the kernel groups processes by session
    (``sched_autogroup_enabled``), a process's nice value counts only against its own session,
    and each server has a session of its own: so the session's group gets the nice value too.
    ``extra``: more flags (``modelserver_cmd``).
    """
    grpc_port, rest_port = free_port(), free_port()
    cmd = modelserver_cmd(grpc_port, rest_port, config, batching, extra)
    if nice:
        cmd = ["nice", "-n", str(nice), *cmd]
    name = f"modelserver-{grpc_port}"
    proc = ServerProcess(cmd, log_dir / f"{name}.log", child_env(), name=name)
    if nice:
        set_group_nice(proc.pid, nice)
    proc.wait_until(lambda: port_open(grpc_port) and port_open(rest_port), timeout_s)
    return proc, grpc_port, rest_port


def set_group_nice(pid: int, nice: int) -> None:
    """Give the scheduler's session group of ``pid`` the nice value ``nice`` (if it has one)."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    if autogroup.exists():  # absent on kernels built without autogroup
        autogroup.write_text(f"{nice}\n")


def start_gateway(
    upstream: str,
    grpc_port: int,
    rest_port: int,
    base_path: Path,
    config: Path,
    log_dir: Path,
    timeout_s: float = 120,
    settings: dict[str, str] | None = None,
) -> tuple[ServerProcess, str]:
    """Start gunicorn with the gateway on a free port; return it and its URL once ready."""
    port = free_port()
    env = child_env(
        **{
            "GATEWAY_UPSTREAM": upstream,
            "GATEWAY_TFS_GRPC": f"127.0.0.1:{grpc_port}",
            "GATEWAY_TFS_REST": f"http://127.0.0.1:{rest_port}",
            "GATEWAY_MODEL_BASE_PATH": str(base_path),
            "GATEWAY_MODEL_CONFIG_FILE": str(config),
            "GATEWAY_BIND": f"127.0.0.1:{port}",
            **(settings or {}),  # may name several replicas instead of the one above
        }
    )
    cmd = [
        sys.executable, "-m", "gunicorn", "-c", str(REPO / "docker" / "gunicorn.conf.py"),
        "--bind", f"127.0.0.1:{port}", os.environ.get("OPS_GATEWAY_APP", GATEWAY_APP),
    ]  # fmt: skip
    name = f"gateway-{upstream}-{port}"
    proc = ServerProcess(cmd, log_dir / f"{name}.log", env, name=name)
    url = f"http://127.0.0.1:{port}"
    proc.wait_until(lambda: http_ok(f"{url}/readyz"), timeout_s)
    return proc, url
