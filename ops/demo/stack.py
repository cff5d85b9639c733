"""Start the whole stack locally — model server + gateway — and show a request and its answer.

``make run`` calls this after building the demo models. The model server is
``scripts/serve_model.sh`` (the real ``tensorflow_model_server`` when ``TFS_BIN`` points at one,
else ``python -m modelserver``), driven by ``serving_config/`` with base paths rewritten to
this checkout's absolute model directory.
The stack keeps running in the background; ``make stop`` (``--stop``) ends it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from ops.procs import REPO, ServerProcess, child_env, http_ok, port_open, stop_group

STATE_DIR = REPO / ".stack"
PORTS_FILE = "ports.json"  # the running stack's ports, beside its models.config
SERVING_CONFIG = REPO / "serving_config"
DEMO_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "POST",
        "/v1/models/minilm-intent:classify",
        {"texts": ["my card was charged twice", "where is my parcel?"], "top_k": 2},
    ),
    ("POST", "/v1/models/minilm:embed", {"texts": ["hello world", "你好，世界"]}),
]
# `make finetune-heads` (finetune/heads_demo.py) exports these; `make run` serves those that exist
HEAD_REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "minilm-pairs": (
        "/v1/models/minilm-pairs:rerank",
        {
            "query": "I was charged twice for my order",
            "documents": [
                "Tracking not updating: a parcel's status can pause for a day between scans.",
                "If you see two charges for one order, one of them is usually a pending "
                "authorisation that disappears within a few days.",
                "Reset or change your password from the sign-in page.",
            ],
        },
    ),
    "minilm-ner": (
        "/v1/models/minilm-ner:tag",
        {
            "texts": [
                "Order #57120 arrived broken on 14 March: refund €49.99 to anna@example.test"
            ],
            "aggregation": "first",  # the demo's tagger learnt on each word's first piece
        },
    ),
    "minilm-topics": (
        "/v1/models/minilm-topics:classify",
        {"texts": ["The app crashes whenever I open the tracking page, so where is my parcel?"]},
    ),
}


def served_heads(base_path: Path) -> list[str]:
    """Return the head models of HEAD_REQUESTS that have a version under ``base_path``."""
    from modelformat.layout import list_versions

    return [name for name in HEAD_REQUESTS if list_versions(base_path / name)]


def demo_requests(base_path: Path) -> list[tuple[str, str, dict[str, Any]]]:
    """Return the requests `make run` shows: the demo models', then each served head's."""
    heads = [("POST", *HEAD_REQUESTS[name]) for name in served_heads(base_path)]
    return [*DEMO_REQUESTS, *heads]


@dataclass(frozen=True)
class Ports:
    """The three ports of the stack."""

    grpc: int = 8500
    rest: int = 8501
    gateway: int = 8000


def local_model_config(base_path: Path, state_dir: Path) -> Path:
    """Write serving_config/models.config with base paths at ``base_path``; return its path.

    The committed file uses the docker layout (``/models/<name>``); TF Serving requires absolute
    paths, so a local run rewrites them to this checkout's model directory.
    """
    text = (SERVING_CONFIG / "models.config").read_text()
    models_dir = base_path.resolve()
    text = re.sub(
        r'base_path:\s*"/models/([^"]+)"', lambda m: f'base_path: "{models_dir / m.group(1)}"', text
    )
    heads = [name for name in served_heads(base_path) if f'name: "{name}"' not in text]
    if heads:  # not in the committed config: a model with no version would never be ready
        text = text.rstrip()
        assert text.endswith("}"), "models.config ends with model_config_list's brace"
        entries = "".join(
            f'  config {{\n    name: "{name}"\n    base_path: "{models_dir / name}"\n'
            f'    model_platform: "tensorflow"\n  }}\n'
            for name in heads
        )
        text = f"{text[:-1]}{entries}}}\n"
    out = state_dir / "models.config"
    out.write_text(text)
    return out


def stack_grpc_target(config: Path) -> str | None:
    """Return the gRPC target of the stack running on ``config`` (None: not a running stack's)."""
    try:
        ports = json.loads((config.parent / PORTS_FILE).read_text())
        return f"127.0.0.1:{int(ports['grpc'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _spawn(name: str, cmd: list[str], env: dict[str, str], state_dir: Path) -> ServerProcess:
    proc = ServerProcess(cmd, state_dir / f"{name}.log", env, name=name)
    (state_dir / f"{name}.pid").write_text(str(proc.pid))  # for `make stop` from another shell
    return proc


def gateway_env(
    base_path: Path, config: Path, ports: Ports, upstream: str = "grpc"
) -> dict[str, str]:
    """Return the environment the gateway runs with in the local stack."""
    return child_env(
        **{
            "GATEWAY_UPSTREAM": upstream,
            "GATEWAY_TFS_GRPC": f"127.0.0.1:{ports.grpc}",
            "GATEWAY_TFS_REST": f"http://127.0.0.1:{ports.rest}",
            "GATEWAY_MODEL_BASE_PATH": str(base_path.resolve()),
            "GATEWAY_MODEL_CONFIG_FILE": str(config),
            "GATEWAY_BIND": f"127.0.0.1:{ports.gateway}",
        }
    )


def start_stack(
    base_path: Path, ports: Ports = Ports(), state_dir: Path = STATE_DIR, upstream: str = "grpc"
) -> None:
    """Start the model server and the gateway; return once the gateway is ready."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for port in (ports.grpc, ports.rest, ports.gateway):
        if port_open(port):
            raise RuntimeError(f"port {port} is in use (a stack already running? `make stop`)")
    config = local_model_config(base_path, state_dir)
    # beside the config: push_model.py, given this config, tells this stack's model server
    (state_dir / PORTS_FILE).write_text(json.dumps(dataclasses.asdict(ports)) + "\n")
    env = child_env(TF_CPP_MIN_LOG_LEVEL="2")
    print(f"starting model server on :{ports.grpc} (gRPC) and :{ports.rest} (REST) ...", flush=True)
    server_cmd = [
        "bash", str(REPO / "scripts" / "serve_model.sh"),
        f"--port={ports.grpc}", f"--rest_api_port={ports.rest}",
        f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=5",
        "--file_system_poll_wait_seconds=1", "--allow_version_labels_for_unavailable_models=true",
        "--enable_batching=true",
        f"--batching_parameters_file={SERVING_CONFIG / 'batching_parameters.txt'}",
        f"--monitoring_config_file={SERVING_CONFIG / 'monitoring.config'}",
    ]  # fmt: skip
    server = _spawn("modelserver", server_cmd, env, state_dir)
    server.wait_until(lambda: port_open(ports.rest), 300)
    print(f"starting gateway (gunicorn) on :{ports.gateway} ...", flush=True)
    gateway_cmd = [
        sys.executable, "-m", "gunicorn", "-c", str(REPO / "docker" / "gunicorn.conf.py"),
        "--bind", f"127.0.0.1:{ports.gateway}", "backend.app:create_app()",
    ]  # fmt: skip
    gateway = _spawn(
        "gateway", gateway_cmd, gateway_env(base_path, config, ports, upstream), state_dir
    )
    gateway.wait_until(lambda: http_ok(f"http://127.0.0.1:{ports.gateway}/readyz"), 120)


def stop_stack(state_dir: Path = STATE_DIR) -> None:
    """Stop the processes recorded in ``state_dir`` (SIGTERM, then SIGKILL)."""
    for name in ("gateway", "modelserver"):
        pid_file = state_dir / f"{name}.pid"
        if not pid_file.exists():
            continue
        stop_group(int(pid_file.read_text()))
        pid_file.unlink()
        print(f"stopped {name}")
    (state_dir / PORTS_FILE).unlink(missing_ok=True)


def show_requests(port: int, base_path: Path) -> None:
    """Send the demo requests to the gateway and print each with its answer."""
    for method, path, body in demo_requests(base_path):
        print(f"\n$ curl -s localhost:{port}{path} -d '{json.dumps(body, ensure_ascii=False)}'")
        resp = requests.request(method, f"http://127.0.0.1:{port}{path}", json=body, timeout=30)
        answer = resp.json()
        if "embeddings" in answer:  # 384 numbers are not worth printing
            answer["embeddings"] = [[*row[:4], "..."] for row in answer["embeddings"]]
        print(json.dumps(answer, ensure_ascii=False, indent=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-path", type=Path, default=REPO / "models")
    parser.add_argument("--upstream", choices=["grpc", "rest", "local"], default="grpc")
    parser.add_argument("--stop", action="store_true", help="stop a running stack and exit")
    args = parser.parse_args(argv)
    if args.stop:
        stop_stack()
        return 0
    stop_stack()  # a previous `make run` may still be up: restart it with the current code
    ports = Ports()
    try:
        start_stack(args.base_path, ports, upstream=args.upstream)
    except (RuntimeError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        stop_stack()
        return 1
    show_requests(ports.gateway, args.base_path)
    print(
        f"\nThe stack is running: gateway http://localhost:{ports.gateway}, model server "
        f"gRPC :{ports.grpc} / REST :{ports.rest}. Logs in {STATE_DIR}. Stop it with `make stop`."
    )
    return 0
