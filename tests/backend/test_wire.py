"""Our compiled messages serialize byte-for-byte like tensorflow-serving-api's (imports TF)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tensorflow.core.framework import tensor_pb2 as tf_tensor_pb2
from tensorflow_serving.apis import get_model_status_pb2 as tf_status_pb2
from tensorflow_serving.apis import predict_pb2 as tf_predict_pb2

from backend.clients.grpc_client import build_predict_request
from backend.tensors import from_tensor_proto, to_tensor_proto
from modelformat.protos import serving_pb2
from modelformat.status import from_grpc as parse_status_response

INPUTS = {
    "input_ids": np.array([[2, 57, 90, 3], [2, 41, 3, 0]], dtype=np.int32),
    "attention_mask": np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=np.int32),
    "token_type_ids": np.zeros((2, 4), dtype=np.int32),
}


def _tf_tensor(array: np.ndarray, dtype: int) -> Any:
    proto = tf_tensor_pb2.TensorProto(dtype=dtype)
    for size in array.shape:
        proto.tensor_shape.dim.add().size = size
    proto.tensor_content = array.tobytes()
    return proto


@pytest.mark.parametrize(
    ("version", "label"), [(None, None), (7, None), (None, "canary")], ids=["latest", "v", "label"]
)
def test_predict_request_bytes_match_tensorflow_serving(
    version: int | None, label: str | None
) -> None:
    theirs = tf_predict_pb2.PredictRequest()
    theirs.model_spec.name = "tiny-intent"
    theirs.model_spec.signature_name = "serving_default"
    if version is not None:
        theirs.model_spec.version.value = version
    if label is not None:
        theirs.model_spec.version_label = label
    for name, array in INPUTS.items():
        theirs.inputs[name].CopyFrom(_tf_tensor(array, 3))

    ours = build_predict_request("tiny-intent", INPUTS, version=version, label=label)

    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )
    assert ours.SerializeToString() == theirs.SerializeToString()


def _tf_predict_response(typed: bool) -> Any:
    reply = tf_predict_pb2.PredictResponse()
    reply.model_spec.name = "tiny-intent"
    reply.model_spec.signature_name = "serving_default"
    reply.model_spec.version.value = 3
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], dtype=np.float32)
    logits = np.log(probs)
    for name, array in (("probabilities", probs), ("logits", logits)):
        if typed:  # what TF Serving sends by default (AsProtoField)
            tensor = reply.outputs[name]
            tensor.dtype = 1
            for size in array.shape:
                tensor.tensor_shape.dim.add().size = size
            tensor.float_val.extend(array.ravel().tolist())
        else:
            reply.outputs[name].CopyFrom(_tf_tensor(array, 1))
    return reply


@pytest.mark.parametrize("typed", [True, False], ids=["float_val", "tensor_content"])
def test_predict_response_round_trips_with_identical_bytes(typed: bool) -> None:
    theirs = _tf_predict_response(typed)
    wire = theirs.SerializeToString(deterministic=True)

    ours = serving_pb2.PredictResponse.FromString(wire)

    assert ours.SerializeToString(deterministic=True) == wire
    assert ours.model_spec.version.value == 3
    np.testing.assert_allclose(
        from_tensor_proto(ours.outputs["probabilities"]), [[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]
    )


def test_predict_response_built_by_us_equals_theirs() -> None:
    theirs = _tf_predict_response(typed=False)
    ours = serving_pb2.PredictResponse()
    ours.model_spec.name = "tiny-intent"
    ours.model_spec.signature_name = "serving_default"
    ours.model_spec.version.value = 3
    probs = np.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]], dtype=np.float32)
    ours.outputs["probabilities"].CopyFrom(to_tensor_proto(probs))
    ours.outputs["logits"].CopyFrom(to_tensor_proto(np.log(probs)))

    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(
        deterministic=True
    )


def test_model_status_response_bytes_match_tensorflow_serving() -> None:
    theirs = tf_status_pb2.GetModelStatusResponse()
    for version, state, code, message in [(2, 30, 0, ""), (1, 50, 5, "Could not find SavedModel")]:
        entry = theirs.model_version_status.add()
        entry.version = version
        entry.state = state
        entry.status.error_code = code
        entry.status.error_message = message
    ours = serving_pb2.GetModelStatusResponse()
    for version, state, code, message in [(2, 30, 0, ""), (1, 50, 5, "Could not find SavedModel")]:
        entry = ours.model_version_status.add()
        entry.version = version
        entry.state = state  # type: ignore[assignment]
        entry.status.error_code = code  # type: ignore[assignment]
        entry.status.error_message = message

    wire = theirs.SerializeToString()

    assert ours.SerializeToString() == wire
    parsed = parse_status_response(serving_pb2.GetModelStatusResponse.FromString(wire))
    assert [(s.version, s.state, s.error_code) for s in parsed] == [
        (2, "AVAILABLE", "OK"),
        (1, "END", "NOT_FOUND"),
    ]


def test_status_request_bytes_match_tensorflow_serving() -> None:
    theirs = tf_status_pb2.GetModelStatusRequest()
    theirs.model_spec.name = "m"
    theirs.model_spec.version.value = 4
    ours = serving_pb2.GetModelStatusRequest()
    ours.model_spec.name = "m"
    ours.model_spec.version.value = 4

    assert ours.SerializeToString() == theirs.SerializeToString()


def test_predict_request_names_a_bucket_signature_when_asked() -> None:
    request = build_predict_request("tiny-intent", INPUTS, version=3, signature_name="seq_16")
    theirs = tf_predict_pb2.PredictRequest.FromString(request.SerializeToString())

    assert theirs.model_spec.signature_name == "seq_16"
    assert build_predict_request("m", INPUTS).model_spec.signature_name == "serving_default"


@pytest.mark.parametrize("models", [1, 40], ids=["short", "length-over-127"])
def test_ops_reload_request_bytes_match_tensorflow_serving(models: int) -> None:
    """ops.server frames HandleReloadConfigRequest by hand (no tensorflow_serving.apis import)."""
    from google.protobuf import text_format
    from tensorflow_serving.apis import model_management_pb2
    from tensorflow_serving.config import model_server_config_pb2

    from ops.server import reload_config_request

    entries = " ".join(
        f'config {{ name: "m{i}" base_path: "/models/m{i}" model_platform: "tensorflow" '
        f'version_labels {{ key: "stable" value: {i + 1} }} }}'
        for i in range(models)
    )
    config = text_format.Parse(
        f"model_config_list {{ {entries} }}", model_server_config_pb2.ModelServerConfig()
    )
    theirs = model_management_pb2.ReloadConfigRequest()
    theirs.config.CopyFrom(config)
    assert reload_config_request(config) == theirs.SerializeToString()
