"""Startup contract: flags and config errors stop the server; ports open only after loading."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
import requests
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

from ops.procs import ServerProcess, child_env, free_port, port_open
from tests.contract.conftest import (
    Server,
    copy_version,
    server_cmd,
    start_server,
    write_config,
)


def run_to_exit(flags: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the server with flags expected to make it exit; return the finished process."""
    cmd = server_cmd([f"--port={free_port()}", f"--rest_api_port={free_port()}", *flags])
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=timeout_s)


def test_unparsable_config_file_stops_startup(tmp_path: Path) -> None:
    config = tmp_path / "bad.config"
    config.write_text("model_config_list { config { name: 'x' base_pat: '/m' } }")

    result = run_to_exit([f"--model_config_file={config}"])

    assert result.returncode != 0
    assert "Error parsing text-format tensorflow.serving.ModelServerConfig" in result.stderr


def test_relative_base_path_stops_startup(tmp_path: Path) -> None:
    result = run_to_exit(["--model_name=m", "--model_base_path=models/m"])

    assert result.returncode != 0
    assert "Expected model m to have an absolute path or URI; got base_path()=models/m" in (
        result.stderr
    )


def test_batching_parameters_without_enable_batching_stops_startup(
    tmp_path: Path, hp2_base: Path
) -> None:
    params = tmp_path / "batching.txt"
    params.write_text("max_batch_size { value: 4 }\n")

    result = run_to_exit([f"--model_base_path={hp2_base}", f"--batching_parameters_file={params}"])

    assert result.returncode != 0
    assert (
        "batching_parameters_file is set without setting server_options.enable_batching to true"
    ) in result.stderr


def write_slow_warmup(version_dir: Path, seconds: float) -> None:
    """Add a warmup record calling the ``slow`` signature for ``seconds``."""
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "half_plus_two"
    request.model_spec.signature_name = "slow"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    request.inputs["seconds"].CopyFrom(tf.make_tensor_proto(np.array([seconds], np.float32)))
    record = prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)
    )
    path = version_dir / "assets.extra" / "tf_serving_warmup_requests"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(record.SerializeToString())


def test_ports_open_only_after_the_initial_load_and_warmup(tmp_path: Path, hp2_base: Path) -> None:
    base = tmp_path / "warm"
    version = copy_version(hp2_base, 1, base, 1)
    write_slow_warmup(version, 2.0)
    rest_port = free_port()
    proc = ServerProcess(
        server_cmd(
            [
                f"--port={free_port()}",
                f"--rest_api_port={rest_port}",
                "--model_name=warm",
                f"--model_base_path={base}",
            ]
        ),
        tmp_path / "server.log",
    )
    try:
        started = time.monotonic()
        proc.wait_until(lambda: port_open(rest_port), timeout_s=120)
        first = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/warm", timeout=10)

        assert first.status_code == 200
        assert first.json()["model_version_status"][0]["state"] == "AVAILABLE"
        assert time.monotonic() - started >= 2.0  # the warmup ran before the port opened
    finally:
        proc.stop()


CONFIG_READ_FAILED = "Failed to read ModelServerConfig file"


def version_available(server: Server, model: str, version: int) -> bool:
    """Return whether the server reports ``model`` ``version`` AVAILABLE."""
    reply = requests.get(f"{server.url}/v1/models/{model}/versions/{version}", timeout=10)
    # The status endpoint answers 200 in every state: readiness is the state field.
    return reply.status_code == 200 and (
        reply.json()["model_version_status"][0]["state"] == "AVAILABLE"
    )


def test_config_file_polling_applies_changes_and_keeps_the_old_config_on_errors(
    tmp_path: Path, hp2_base: Path
) -> None:
    config = tmp_path / "models.config"
    one = [{"name": "a", "base_path": str(hp2_base)}]
    two = [
        *one,
        {
            "name": "b",
            "base_path": str(hp2_base),
            "policy": "model_version_policy { specific { versions: 1 } }",
        },
    ]
    write_config(config, one)
    server = start_server(
        tmp_path, [f"--model_config_file={config}", "--model_config_file_poll_wait_seconds=1"]
    )

    def b_available() -> bool:
        return version_available(server, "b", 1)

    try:
        write_config(config, two)
        deadline = time.monotonic() + 30
        while not b_available() and time.monotonic() < deadline:
            time.sleep(0.3)
        reply = requests.post(
            server.url + "/v1/models/b:predict", json={"instances": [1.0]}, timeout=10
        )
        assert reply.json() == {"predictions": [2.5]}  # specific{1}: y = 0.5x + 2

        failures = server.proc.log_path.read_text(errors="replace").count(CONFIG_READ_FAILED)
        config.write_text("model_config_list { this is not a config")
        # Wait until a poll has read the broken file (both binaries log it), then check that the
        # old config still serves: a sleep alone would pass even if no poll had run.
        server.proc.wait_until(
            lambda: (
                server.proc.log_path.read_text(errors="replace").count(CONFIG_READ_FAILED)
                > failures
            ),
            30,
        )
        assert (
            requests.post(
                server.url + "/v1/models/b:predict", json={"instances": [1.0]}, timeout=10
            ).status_code
            == 200
        )

        write_config(config, one)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            gone = requests.post(
                server.url + "/v1/models/b:predict", json={"instances": [1.0]}, timeout=10
            )
            if gone.status_code == 404:
                break
            time.sleep(0.3)
        assert gone.json() == {"error": "Servable not found for request: Latest(b)"}
    finally:
        server.stop()


def test_flags_take_both_forms(tmp_path: Path, hp2_base: Path) -> None:
    rest_port = free_port()
    flags = [
        "--port",
        str(free_port()),
        f"--rest_api_port={rest_port}",
        "--model_name",
        "m",
        f"--model_base_path={hp2_base}",
        "--enable_model_warmup=true",
        "--max_num_load_retries=2",
        "--rest_api_enable_cors_support=true",
    ]
    proc = ServerProcess(server_cmd(flags), tmp_path / "server.log")
    try:
        proc.wait_until(lambda: port_open(rest_port), timeout_s=120)
        reply = requests.post(
            f"http://127.0.0.1:{rest_port}/v1/models/m:predict",
            json={"instances": [2.0]},
            timeout=10,
        )
        assert reply.json() == {"predictions": [4.0]}
        assert reply.headers["Access-Control-Allow-Origin"] == "*"
    finally:
        proc.stop()
