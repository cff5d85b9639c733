"""The TF Serving readiness check: ready only when every version models.config names is
AVAILABLE on the replica, against a real model server (issue 20 item 3)."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from ops import tfs_ready
from ops.procs import REPO, ServerProcess, child_env, free_port, port_open, python_cmd
from tests.ops.conftest import MODEL, OpsServer


def config_naming(server: OpsServer, tmp_path: Path, policy: str, labels: dict[str, int]) -> Path:
    """Write a models.config for the server's base path with ``policy`` and ``labels``."""
    label_text = " ".join(f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items())
    path = tmp_path / "models.config"
    path.write_text(
        f'model_config_list {{ config {{ name: "{MODEL}" base_path: "{server.base_path / MODEL}" '
        f'model_platform: "tensorflow" model_version_policy {{ {policy} }} {label_text} }} }}\n'
    )
    return path


def rest(server: OpsServer) -> str:
    return f"http://127.0.0.1:{server.rest_port}"


def test_a_replica_serving_every_named_version_is_ready(ops_server: OpsServer) -> None:
    assert tfs_ready.missing_versions(ops_server.config, rest(ops_server), 2.0) == []


@pytest.mark.parametrize(
    ("policy", "labels"),
    [
        ("specific { versions: 1 versions: 2 }", {"stable": 1}),  # the policy names v2
        ("specific { versions: 1 }", {"stable": 1, "canary": 2}),  # a label names v2
        ("latest { num_versions: 1 }", {}),  # the newest on disk is v2
    ],
    ids=["specific", "label", "latest"],
)
def test_a_version_the_config_names_but_the_replica_has_not_loaded_keeps_it_unready(
    ops_server: OpsServer, tiny_exports: Path, tmp_path: Path, policy: str, labels: dict[str, int]
) -> None:
    """The replica listens and serves v1 (TF Serving's own "ready"), but the config names v2."""
    v2 = ops_server.base_path / MODEL / "2"
    shutil.copytree(tiny_exports / MODEL / "2", v2)
    try:
        config = config_naming(ops_server, tmp_path, policy, labels)
        assert tfs_ready.missing_versions(config, rest(ops_server), 2.0) == [
            f"{MODEL} v2 not AVAILABLE"
        ]
    finally:
        shutil.rmtree(v2)


def test_no_answer_or_a_broken_config_is_not_ready(ops_server: OpsServer, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    assert "no status from" in tfs_ready.missing_versions(ops_server.config, dead, 1.0)[0]
    broken = tmp_path / "models.config"
    broken.write_text("model_config_list { config { name: ")
    assert tfs_ready.missing_versions(broken, rest(ops_server), 1.0)[0].startswith("models.config")


def test_the_probe_endpoint_answers_200_or_503_and_never_imports_tensorflow(
    ops_server: OpsServer, tiny_exports: Path, tmp_path: Path
) -> None:
    port = free_port()
    probe = ServerProcess(
        python_cmd("-m", "ops.tfs_ready", "--config", str(ops_server.config),
                   "--rest", rest(ops_server), "--serve", str(port)),
        tmp_path / "probe.log",
    )  # fmt: skip
    try:
        probe.wait_until(lambda: port_open(port), 60)
        reply = requests.get(f"http://127.0.0.1:{port}/ready", timeout=10)
        assert (reply.status_code, reply.json()) == (200, {"ready": True, "missing": []})
        other = config_naming(ops_server, tmp_path, "specific { versions: 1 }", {"canary": 3})
        once = subprocess.run(
            [sys.executable, "-m", "ops.tfs_ready", "--config", str(other), "--rest",
             rest(ops_server)], cwd=REPO, env=child_env(), capture_output=True, text=True,
        )  # fmt: skip
        assert once.returncode == 1 and f"{MODEL} v3 not AVAILABLE" in once.stdout
    finally:
        probe.stop()
    imports = subprocess.run(
        [sys.executable, "-c", "import sys, ops.tfs_ready; print('tensorflow' in sys.modules)"],
        cwd=REPO, env=child_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert imports.stdout.strip() == "False"


def test_the_probe_endpoint_exits_on_sigterm(tmp_path: Path) -> None:
    """As a container's PID 1 the kernel ignores a signal without a handler: a process ended
    by SIGTERM's default action (returncode -15) would not stop there until the SIGKILL."""
    port = free_port()
    probe = subprocess.Popen(
        [sys.executable, "-m", "ops.tfs_ready", "--config", str(tmp_path / "models.config"),
         "--serve", str(port)], cwd=REPO, env=child_env(),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_open(port):
            assert probe.poll() is None and time.monotonic() < deadline, "the probe never listened"
            time.sleep(0.1)
        probe.send_signal(signal.SIGTERM)
        assert probe.wait(timeout=10) == 0
    finally:
        probe.kill()
        probe.wait()
