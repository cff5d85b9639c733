"""push_model.py against a real model server process: publish, wait, move labels, fail clearly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from backend.versions import LabelTable
from modelformat.layout import read_model_info
from ops import modelconfig
from ops.lifecycle import push
from ops.procs import REPO, ServerProcess, child_env, python_cmd
from ops.server import ModelServer
from tests.ops.conftest import MODEL, OpsServer


def predict_request(label: str = "", version: int = 0) -> Any:
    """Return a tiny-model PredictRequest naming ``label`` or ``version``."""
    from tensorflow_serving.apis import predict_pb2

    ids = np.array([[2, 10, 11, 3]], dtype=np.int32)
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    if label:
        request.model_spec.version_label = label
    else:
        request.model_spec.version.value = version
    for name, array in {
        "input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)
    }.items():  # fmt: skip
        request.inputs[name].dtype = 3  # DT_INT32
        request.inputs[name].tensor_shape.dim.add(size=1)
        request.inputs[name].tensor_shape.dim.add(size=ids.shape[1])
        request.inputs[name].tensor_content = array.tobytes()
    return request


def served_version(server: OpsServer, label: str) -> int:
    """Return the version that answers a gRPC Predict for ``label``."""
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(server.grpc_target) as channel:
        reply = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(
            predict_request(label=label), timeout=30
        )
    return int(reply.model_spec.version.value)


def labels(server: OpsServer) -> dict[str, int]:
    return dict(
        modelconfig.find_model(modelconfig.load_config(server.config), MODEL).version_labels
    )


def available(server: OpsServer) -> set[int]:
    client = ModelServer(server.grpc_target)
    try:
        return {s.version for s in client.status(MODEL) if s.state == "AVAILABLE"}
    finally:
        client.close()


def test_dry_run_shows_the_plan_and_changes_nothing(
    ops_server: OpsServer, tiny_exports: Path
) -> None:
    before = ops_server.config.read_text()
    source = str(tiny_exports / MODEL / "2")
    args = ops_server.push_args("--from-dir", source, "--label", "canary", "--dry-run")
    cmd = [sys.executable, "scripts/push_model.py", *args]
    result = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "as version 2" in result.stdout and '+      key: "canary"' in result.stdout
    assert ops_server.config.read_text() == before
    assert sorted(p.name for p in (ops_server.base_path / MODEL).iterdir()) == ["1"]


def test_push_publishes_the_next_version_and_labels_it_once_available(
    ops_server: OpsServer, tiny_exports: Path
) -> None:
    args = ops_server.push_args("--from-dir", str(tiny_exports / MODEL / "2"), "--label", "canary")
    assert push.main(args) == 0
    assert (ops_server.base_path / MODEL / "2" / "saved_model.pb").is_file()
    assert labels(ops_server) == {"stable": 1, "canary": 2}
    assert available(ops_server) == {1, 2}
    assert served_version(ops_server, "canary") == 2
    assert served_version(ops_server, "stable") == 1


def test_promote_points_stable_at_canarys_version(ops_server: OpsServer) -> None:
    assert push.main(ops_server.push_args("--promote", "canary", "stable")) == 0
    assert labels(ops_server) == {"stable": 2, "canary": 2}
    assert served_version(ops_server, "stable") == 2


def test_rollback_points_stable_at_the_previous_version(ops_server: OpsServer) -> None:
    assert push.main(ops_server.push_args("--rollback", "stable")) == 0
    assert labels(ops_server)["stable"] == 1
    assert served_version(ops_server, "stable") == 1


def test_unknown_model_is_a_clear_error(
    ops_server: OpsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ops_server.push_args("--promote", "canary", "stable")
    args[args.index("--name") + 1] = "nope"
    assert push.main(args) == 1
    assert "'nope' is not in the model config (known: tiny)" in capsys.readouterr().err


def test_version_that_never_loads_times_out_clearly_and_restores_the_config(
    ops_server: OpsServer, tiny_exports: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = labels(ops_server)
    args = ops_server.push_args("--from-dir", str(tiny_exports / MODEL / "2"), "--label", "canary")
    # Published into a copy the server does not poll: version 9 can never become AVAILABLE.
    shutil.copytree(ops_server.base_path, tmp_path / "elsewhere")
    args[args.index("--base-path") + 1] = str(tmp_path / "elsewhere")
    args[args.index("--timeout") + 1] = "2"
    assert push.main([*args, "--version", "9"]) == 1
    assert "tiny version 9 not AVAILABLE after 2s" in capsys.readouterr().err
    assert labels(ops_server) == before
    config = modelconfig.find_model(modelconfig.load_config(ops_server.config), MODEL)
    assert 9 not in config.model_version_policy.specific.versions


def test_push_from_a_checkpoint_exports_the_next_version_with_exporter_options(
    ops_server: OpsServer, tmp_path: Path
) -> None:
    from export.tiny import write_hf_checkpoint

    checkpoint = write_hf_checkpoint(tmp_path / "ckpt", task="classify", seed=7)
    args = ops_server.push_args("--checkpoint", str(checkpoint), "--label", "canary")
    assert push.main([*args, "--", "--task", "classify", "--max-seq-len", "32"]) == 0
    assert labels(ops_server)["canary"] == 3
    info = read_model_info(ops_server.base_path / MODEL / "3")
    assert info is not None and info["max_seq_len"] == 32
    assert served_version(ops_server, "canary") == 3


class LabelReader:
    """What the gateway does, in a loop: resolve ``label`` from the config file with the gateway's
    own LabelTable (cached ``recheck_s``), then Predict on exactly that version."""

    def __init__(self, server: OpsServer, label: str, recheck_s: float) -> None:
        self.table = LabelTable(str(server.config), recheck_s=recheck_s)
        self.target = server.grpc_target
        self.label = label
        self.versions: list[int] = []  # the version of each answer, in order
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tensorflow_serving.apis import prediction_service_pb2_grpc

        with grpc.insecure_channel(self.target) as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not self._stop.is_set():
                version = self.table.version_for(MODEL, self.label)
                try:
                    reply = stub.Predict(predict_request(version=version), timeout=30)
                    self.versions.append(int(reply.model_spec.version.value))
                except grpc.RpcError as exc:
                    self.failures.append(f"v{version}: {exc.code().name} {exc.details()}")

    def start(self) -> LabelReader:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f}s: {what}"
        time.sleep(0.05)


def test_a_version_leaves_the_policy_only_after_every_reader_saw_its_label_move(
    two_versions_server: OpsServer,
) -> None:
    server = two_versions_server
    assert labels(server) == {"stable": 1, "canary": 2} and available(server) == {1, 2}
    ttl_s = 3.0  # the reader's label cache; --reader-wait covers it plus a request's time
    reader = LabelReader(server, "stable", recheck_s=ttl_s).start()
    try:
        # Have the reader re-read the labels now, so it holds stable=1 for ttl_s from here on.
        reader.table.refresh()
        seen = len(reader.versions)
        wait_for(lambda: len(reader.versions) > seen, "the reader answered from stable=1")
        common = ("--keep", "1", "--reader-wait", str(ttl_s + 2))
        # Back to back: the second push must not drop v1 while the reader still resolves to it.
        first = push.run(
            *push.parse_args(server.push_args("--promote", "canary", "stable", *common))
        )
        push.run(*push.parse_args(server.push_args("--promote", "canary", "blue", *common)))
        wait_for(lambda: 2 in reader.versions, "the reader followed stable to v2")
        wait_for(lambda: 1 not in available(server), "v1 unloaded")
    finally:
        reader.stop()
    assert reader.failures == []
    assert first.unloaded == [1] and first.reader_wait_s > 0
    assert reader.versions[0] == 1 and reader.versions[-1] == 2
    assert labels(server) == {"stable": 2, "canary": 2, "blue": 2}
    config = modelconfig.find_model(modelconfig.load_config(server.config), MODEL)
    assert list(config.model_version_policy.specific.versions) == [2]


def test_concurrent_label_moves_both_land(two_versions_server: OpsServer, tmp_path: Path) -> None:
    server = two_versions_server
    before = labels(server)
    go = tmp_path / "go"  # each push pauses between reading the config and writing it until go
    env = child_env(BERTGW_PUSH_PAUSE_FILE=str(go))

    def push(name: str, *args: str) -> ServerProcess:
        cmd = python_cmd("scripts/push_model.py", *server.push_args(*args))
        return ServerProcess(cmd, tmp_path / f"{name}.log", env)

    def said(proc: ServerProcess, *texts: str) -> bool:
        return any(text in proc.tail() for text in texts)

    first = push("first", "--promote", "canary", "green")
    second = None
    try:
        first.wait_until(lambda: said(first, "paused after reading"), timeout_s=120)
        second = push("second", "--promote", "stable", "violet")
        # Either it waits for the lock, or (without one) it read the same config as the first.
        waiting = second
        waiting.wait_until(lambda: said(waiting, "waiting for", "paused after"), timeout_s=120)
        go.touch()
        assert first.proc.wait(timeout=120) == 0, first.tail()
        assert second.proc.wait(timeout=120) == 0, second.tail()
        took_turns = said(second, "waiting for") and "another push" in second.tail()
    finally:
        for proc in (first, second):
            if proc is not None:
                proc.stop()
    expected = {**before, "green": before["canary"], "violet": before["stable"]}
    assert labels(server) == expected
    assert took_turns  # the second push read the config only after the first had written it
    assert served_version(server, "green") == before["canary"]
    assert served_version(server, "violet") == before["stable"]
