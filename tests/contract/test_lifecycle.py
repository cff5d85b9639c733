"""Lifecycle contract: file-system polling, availability-preserving swaps, failed loads, labels,
HandleReloadConfigRequest adding and removing models, in-flight requests during changes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import text_format
from tensorflow_serving.apis import get_model_status_pb2, model_management_pb2, predict_pb2
from tensorflow_serving.config import model_server_config_pb2

from tests.contract.conftest import (
    Server,
    base_models,
    copy_version,
    cpu_seconds,
    wait_until_spinning,
    write_config,
)

AVAILABLE, END = 30, 50


def predict(server: Server, name: str, x: float = 1.0, timeout: float = 10, **spec: Any) -> Any:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    for key, value in spec.items():
        if key == "version":
            request.model_spec.version.value = value
        else:
            setattr(request.model_spec, key, value)
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[x]], np.float32)))
    if spec.get("signature_name") == "slow":
        request.inputs["seconds"].CopyFrom(tf.make_tensor_proto(np.array([1.0], np.float32)))
    return server.prediction_stub().Predict(request, timeout=timeout)


def y_of(response: Any) -> float:
    return float(tf.make_ndarray(response.outputs["y"]).ravel()[0])


def statuses(server: Server, name: str) -> list[tuple[int, int, int, str]]:
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = name
    response = server.model_stub().GetModelStatus(request, timeout=10)
    return [
        (s.version, s.state, s.status.error_code, s.status.error_message)
        for s in response.model_version_status
    ]


def wait_for(check: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


def reload(server: Server, models: list[dict[str, Any]], timeout: float = 60) -> Any:
    text = write_config(server.workdir / "reload.config", models).read_text()
    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    request = model_management_pb2.ReloadConfigRequest(config=config)
    return server.model_stub().HandleReloadConfigRequest(request, timeout=timeout)


def test_new_version_is_loaded_before_the_old_one_unloads_without_dropping_requests(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    errors: list[Exception] = []
    served: set[float] = set()
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            try:
                served.add(y_of(predict(life_server, "hot", 1.0)))
            except grpc.RpcError as exc:
                errors.append(exc)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        copy_version(hp2_base, 2, life_root / "hot", 2)
        wait_for(
            lambda: [s[:2] for s in statuses(life_server, "hot")] == [(2, AVAILABLE), (1, END)]
        )
        wait_for(lambda: 3.5 in served)  # the caller has been answered by v2 too
    finally:
        stop.set()
        thread.join()

    assert errors == []
    assert served == {2.5, 3.5}  # v1 served until v2 took over
    assert y_of(predict(life_server, "hot", 1.0)) == 3.5


def test_non_numeric_directories_are_ignored(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    hot = life_root / "hot"
    for name in ("tmp-9", ".tmp-8", "v7"):
        (hot / name).mkdir()
    numeric = {int(p.name) for p in hot.iterdir() if p.name.isdigit()}
    # Publish a numeric version after them: once the server serves it, a listing that already
    # held the non-numeric names has run (a sleep could not tell whether any poll happened).
    newest = max(numeric) + 1
    copy_version(hp2_base, 2, hot, newest)
    wait_for(lambda: statuses(life_server, "hot")[0][:2] == (newest, AVAILABLE))

    assert {s[0] for s in statuses(life_server, "hot")} <= {*numeric, newest}
    assert y_of(predict(life_server, "hot", 1.0)) == 3.5  # the copy of y = 0.5x + 3


def test_corrupt_version_ends_with_error_while_previous_keeps_serving(
    life_server: Server, life_root: Path
) -> None:
    broken = life_root / "steady" / ".tmp-5"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a saved model")
    broken.rename(life_root / "steady" / "5")

    wait_for(lambda: statuses(life_server, "steady")[0][:2] == (5, END))

    _, _, code, message = statuses(life_server, "steady")[0]
    assert code != 0 and message
    assert statuses(life_server, "steady")[1][:2] == (1, AVAILABLE)
    assert y_of(predict(life_server, "steady", 1.0)) == 2.5


@pytest.mark.parametrize(
    ("damage", "version"),
    [
        pytest.param(lambda data: data[:20] + bytes([data[20] ^ 1]) + data[21:], 6, id="bit-flip"),
        pytest.param(lambda data: data[:-3], 7, id="truncated"),
    ],
)
def test_corrupt_warmup_file_fails_the_load_with_data_loss(
    life_server: Server, life_root: Path, hp2_base: Path, damage: Any, version: int
) -> None:
    from tests.contract.test_startup import write_slow_warmup

    staging = copy_version(hp2_base, 1, life_root / f"staging-{version}", 1)
    write_slow_warmup(staging, 0.0)
    # TFRecord framing: 8-byte length, 4-byte CRC of it, the data (byte 20 is in it), its CRC.
    path = staging / "assets.extra" / "tf_serving_warmup_requests"
    path.write_bytes(damage(path.read_bytes()))
    copy_version(life_root / f"staging-{version}", 1, life_root / "steady", version)

    def state_of(v: int) -> tuple[int, int, str]:
        found = {s[0]: s[1:] for s in statuses(life_server, "steady")}
        return found.get(v, (0, 0, ""))

    wait_for(lambda: state_of(version)[0] == END)

    _, code, message = state_of(version)
    assert code == grpc.StatusCode.DATA_LOSS.value[0] and message
    assert state_of(1)[0] == AVAILABLE
    assert y_of(predict(life_server, "steady", 1.0, version=1)) == 2.5


def test_labels_move_between_available_versions_and_refuse_unavailable_ones(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    copy_version(hp2_base, 2, life_root / "steady", 2)
    wait_for(lambda: (2, AVAILABLE) in [s[:2] for s in statuses(life_server, "steady")])
    models = base_models(life_root)

    models[1]["labels"] = {"stable": 1, "canary": 2}
    reload(life_server, models)
    assert y_of(predict(life_server, "steady", version_label="stable")) == 2.5
    assert y_of(predict(life_server, "steady", version_label="canary")) == 3.5

    models[1]["labels"] = {"stable": 2}
    reload(life_server, models)
    assert y_of(predict(life_server, "steady", version_label="stable")) == 3.5

    models[1]["labels"] = {"stable": 7}
    with pytest.raises(grpc.RpcError) as info:
        reload(life_server, models)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info.value.details() == (
        "Request to assign label to version 7 of model steady, "
        "which is not currently available for inference"
    )
    assert y_of(predict(life_server, "steady", version_label="stable")) == 3.5


def test_reload_blocks_until_an_added_model_serves_then_removal_unloads_it(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    copy_version(hp2_base, 1, life_root / "added", 1)
    models = base_models(life_root)

    reload(life_server, [*models, {"name": "added", "base_path": str(life_root / "added")}])
    assert y_of(predict(life_server, "added", 2.0)) == 3.0  # no wait: reload returned when ready

    with ThreadPoolExecutor(1) as pool:
        before = cpu_seconds(life_server)
        in_flight = pool.submit(predict, life_server, "added", 2.0, 10, signature_name="slow")
        wait_until_spinning(life_server, before)  # the call is running in the server
        reload(life_server, models)
        assert y_of(in_flight.result()) == 3.0  # the request that was running completes

    with pytest.raises(grpc.RpcError) as info:
        predict(life_server, "added")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert info.value.details() == "Servable not found for request: Latest(added)"
    wait_for(lambda: statuses(life_server, "added")[0][:2] == (1, END))


def test_reload_rejects_relative_base_paths_and_keeps_serving(
    life_server: Server, life_root: Path
) -> None:
    models = [*base_models(life_root), {"name": "rel", "base_path": "models/rel"}]

    with pytest.raises(grpc.RpcError) as info:
        reload(life_server, models)

    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "Expected model rel to have an absolute path or URI; got base_path()=models/rel"
    )
    assert y_of(predict(life_server, "steady")) > 0


def test_model_with_missing_base_path_has_no_versions_while_others_serve(
    life_server: Server, life_root: Path
) -> None:
    models = [*base_models(life_root), {"name": "ghost", "base_path": str(life_root / "nowhere")}]

    with pytest.raises(grpc.RpcError) as info:
        reload(life_server, models, timeout=2)  # TF Serving waits for the model to appear

    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(grpc.RpcError) as status_info:
        statuses(life_server, "ghost")
    assert status_info.value.details() == "Could not find any versions of model ghost"
    assert y_of(predict(life_server, "steady")) > 0
    reload(life_server, base_models(life_root))


def test_failing_warmup_fails_the_load_and_the_previous_version_keeps_serving(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    from tests.contract.test_startup import write_slow_warmup

    staging = copy_version(hp2_base, 1, life_root / "staging", 1)
    write_slow_warmup(staging, 0.0)
    # Point the warmup record at a signature the model doesn't have.
    path = staging / "assets.extra" / "tf_serving_warmup_requests"
    path.write_bytes(path.read_bytes().replace(b"slow", b"nope"))
    copy_version(life_root / "staging", 1, life_root / "hot", 9)

    wait_for(lambda: statuses(life_server, "hot")[0][:2] == (9, END))

    assert statuses(life_server, "hot")[0][2] != 0
    assert AVAILABLE in [s[1] for s in statuses(life_server, "hot")[1:]]
    assert y_of(predict(life_server, "hot", 1.0)) in (2.5, 3.5)


def test_cancelled_call_leaves_the_server_serving(life_server: Server) -> None:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "steady"
    request.model_spec.signature_name = "slow"
    request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.array([[1.0]], np.float32)))
    request.inputs["seconds"].CopyFrom(tf.make_tensor_proto(np.array([1.0], np.float32)))

    before = cpu_seconds(life_server)
    future = life_server.prediction_stub().Predict.future(request, timeout=10)
    wait_until_spinning(life_server, before)  # cancelled while it runs, not before it is sent
    future.cancel()

    assert future.cancelled()
    assert y_of(predict(life_server, "steady", 1.0)) > 0


def test_status_shows_loading_during_warmup_while_the_old_version_serves(
    life_server: Server, life_root: Path, hp2_base: Path
) -> None:
    from tests.contract.test_startup import write_slow_warmup

    staging = copy_version(hp2_base, 1, life_root / "staging-slow", 1)
    write_slow_warmup(staging, 2.0)
    copy_version(life_root / "staging-slow", 1, life_root / "hot", 10)
    seen: list[list[tuple[int, int]]] = []

    def loading_seen() -> bool:
        seen.append([s[:2] for s in statuses(life_server, "hot")])
        return (10, 20) in seen[-1]

    wait_for(loading_seen, timeout_s=15)
    assert any(state == AVAILABLE for _, state in seen[-1])  # the old version still serves
    assert y_of(predict(life_server, "hot", 1.0)) == 3.5
    wait_for(lambda: statuses(life_server, "hot")[0][:2] == (10, AVAILABLE))
    assert y_of(predict(life_server, "hot", 1.0)) == 2.5
