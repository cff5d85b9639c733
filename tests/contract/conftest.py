"""Contract-suite fixtures: the server under test on free ports, with models the tests build.

The server is ``python -m modelserver`` unless ``TFS_BIN`` names a ``tensorflow_model_server``
binary; both get exactly the same flags.
"""

from __future__ import annotations

import os
import shutil
import textwrap
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import requests

from ops.procs import ServerProcess, child_env, free_port, port_open, python_cmd

TFS_BIN = os.environ.get("TFS_BIN", "")
# batches the server ran (its processed_batch_size histogram counts one per batch)
BATCHES = ":tensorflow:serving:batching_session:processed_batch_size_count"
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def server_cmd(flags: list[str]) -> list[str]:
    """Return the command line of the server under test."""
    return [TFS_BIN, *flags] if TFS_BIN else python_cmd("-m", "modelserver", *flags)


@dataclass
class Server:
    """A running server under test with a gRPC channel and an HTTP session."""

    proc: ServerProcess
    grpc_port: int
    rest_port: int
    workdir: Path
    channel: grpc.Channel = field(init=False)
    http: requests.Session = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}", options=UNLIMITED)
        self.http = requests.Session()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def prediction_stub(self) -> Any:
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        return prediction_service_pb2_grpc.PredictionServiceStub(self.channel)

    def model_stub(self) -> Any:
        from tensorflow_serving.apis import model_service_pb2_grpc

        return model_service_pb2_grpc.ModelServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.http.close()
        self.proc.stop()


def start_server(workdir: Path, flags: list[str], timeout_s: float = 120.0) -> Server:
    """Start the server under test on free ports and wait until both ports accept."""
    grpc_port, rest_port = free_port(), free_port()
    cmd = server_cmd([f"--port={grpc_port}", f"--rest_api_port={rest_port}", *flags])
    proc = ServerProcess(cmd, workdir / f"server-{grpc_port}.log", env=child_env())
    try:
        proc.wait_until(lambda: port_open(rest_port) and port_open(grpc_port), timeout_s)
    except Exception:
        proc.stop()
        raise
    return Server(proc, grpc_port, rest_port, workdir)


def start_batching_server(
    root: Path, name: str, models: list[dict[str, Any]], params: str, extra: Sequence[str] = ()
) -> Server:
    """Start a server with --enable_batching, ``params`` as its batching parameters file, the
    Prometheus endpoint at /metrics and 64 gRPC threads (so concurrent callers all reach the
    batch queue: the default is 4 x cores, 8 on a 2-core machine, in the binary as here)."""
    params_file = root / f"{name}-batching.txt"
    params_file.write_text(params)
    monitoring = root / f"{name}-monitoring.config"
    monitoring.write_text('prometheus_config { enable: true path: "/metrics" }\n')
    config = write_config(root / f"{name}.config", models)
    return start_server(
        root,
        [
            f"--model_config_file={config}",
            "--enable_batching",
            f"--batching_parameters_file={params_file}",
            f"--monitoring_config_file={monitoring}",
            "--grpc_max_threads=64",
            *extra,
        ],
    )


def metric(server: Server, prefix: str) -> float:
    """Return the value of the first /metrics line starting with ``prefix`` (0 before any).

    An unlabelled series is ``name_count 3`` here and ``name_count{} 3`` in the binary: a
    prefix matches both.
    """
    text = requests.get(server.url + "/metrics", timeout=10).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)]
    return values[0] if values else 0.0


def cpu_seconds(server: Server) -> float:
    """Return the CPU time the server process has used so far (user + system, Linux /proc)."""
    stat = Path(f"/proc/{server.proc.proc.pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": field 3 (state) is index 0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_spinning(server: Server, since_cpu_s: float, timeout_s: float = 20) -> None:
    """Wait until a call to the ``slow`` signature is running in the server.

    That signature spins on the clock, so the server's CPU time grows by a spin's worth; neither
    binary shows a running call any other way. ``since_cpu_s`` is cpu_seconds() taken before the
    call was sent. An idle server (a directory listing a second) uses a small fraction of this.
    """
    deadline = time.monotonic() + timeout_s
    while cpu_seconds(server) - since_cpu_s < SPIN_CPU_S:
        assert time.monotonic() < deadline, "no call to the slow signature started running"
        time.sleep(0.02)


SPIN_CPU_S = 0.15


def write_config(path: Path, models: list[dict[str, Any]]) -> Path:
    """Write a ModelServerConfig text file for ``models`` (name, base_path, policy, labels)."""
    blocks = []
    for model in models:
        extra = model.get("policy", "")
        labels = "".join(
            f' version_labels {{ key: "{k}" value: {v} }}'
            for k, v in model.get("labels", {}).items()
        )
        blocks.append(
            f'  config {{ name: "{model["name"]}" base_path: "{model["base_path"]}" '
            f'model_platform: "tensorflow" {extra}{labels} }}'
        )
    path.write_text("model_config_list {\n" + "\n".join(blocks) + "\n}\n")
    return path


def base_models(root: Path) -> list[dict[str, Any]]:
    """Return life_server's models: ``hot`` (latest version) and ``steady`` (all versions)."""
    return [
        {"name": "hot", "base_path": str(root / "hot")},
        {
            "name": "steady",
            "base_path": str(root / "steady"),
            "policy": "model_version_policy { all {} }",
        },
    ]


@pytest.fixture(scope="session")
def main_server(contract_root: Path, hp2_base: Path, tiny_base: Path) -> Iterator[Server]:
    """The shared server: half_plus_two (all versions, labels), tiny BERT, Prometheus metrics."""
    config = write_config(
        contract_root / "main.config",
        [
            {
                "name": "half_plus_two",
                "base_path": str(hp2_base),
                "policy": "model_version_policy { all {} }",
                "labels": {"stable": 1, "canary": 2},
            },
            {"name": "tiny", "base_path": str(tiny_base)},
        ],
    )
    monitoring = contract_root / "monitoring.config"
    monitoring.write_text(
        textwrap.dedent("""\
        prometheus_config { enable: true path: "/monitoring/prometheus/metrics" }
    """)
    )
    server = start_server(
        contract_root,
        [
            f"--model_config_file={config}",
            "--file_system_poll_wait_seconds=1",
            "--allow_version_labels_for_unavailable_models",
            f"--monitoring_config_file={monitoring}",
            "--rest_api_timeout_in_ms=1500",
        ],
    )
    yield server
    server.stop()


def copy_version(src_base: Path, version: int, dest_base: Path, as_version: int) -> Path:
    """Publish a copy of ``src_base/version`` as ``dest_base/as_version`` (temp dir + rename)."""
    dest_base.mkdir(parents=True, exist_ok=True)
    tmp = dest_base / f".tmp-{as_version}"
    shutil.copytree(src_base / str(version), tmp)
    final = dest_base / str(as_version)
    os.replace(tmp, final)
    return final
