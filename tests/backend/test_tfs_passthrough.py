"""TF Serving's REST API through the gateway (/tfs) for models the project did not export.

The models are exported here as users export them (Keras ``model.export``, ``tf.saved_model.save``)
and served by the project's model server; each request goes to it directly (``/v1/...``) and
through a gateway over gRPC and one over REST (``/tfs/v1/...``): same status, same JSON (over
REST the same bytes).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.backend.stack import Gateway, ModelServer, model_config

HP2, KERAS, DECODE = "half_plus_two", "keras_multi", "str_decode"
MAX_ELEMENTS = 64


def _export_keras(base: Path) -> None:
    """A Keras model with three named inputs: float [2], int64 [1] and string [1] (a lookup)."""
    import keras

    f = keras.Input(shape=(2,), dtype="float32", name="f")
    i = keras.Input(shape=(1,), dtype="int64", name="i")
    s = keras.Input(shape=(1,), dtype="string", name="s")
    looked_up = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(s)
    joined = keras.layers.Concatenate()(
        [f, keras.ops.cast(i, "float32"), keras.ops.cast(looked_up, "float32")]
    )
    out = keras.layers.Dense(2, kernel_initializer="ones", name="score")(joined)
    keras.Model({"f": f, "i": i, "s": s}, out).export(str(base / "1"), verbose=False)


def _export_decoder(base: Path) -> None:
    """A tf.Module whose string input is parsed in the graph: y = 2 * to_number(s)."""
    import tensorflow as tf

    class Decoder(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
        def serve(self, s: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 2.0 * tf.strings.to_number(s), "echo_bytes": s}

    module = Decoder()
    tf.saved_model.save(module, str(base / "1"), signatures={"serving_default": module.serve})


@pytest.fixture(scope="session")
def tfs_stack(tmp_path_factory: pytest.TempPathFactory, hp2_base: Path) -> Iterator[dict[str, Any]]:
    """A model server with half_plus_two (v1, v2; labels), the Keras model and the decoder, and a
    gateway over each upstream in front of it."""
    import shutil

    root = tmp_path_factory.mktemp("tfs")
    shutil.copytree(hp2_base, root / HP2)
    _export_keras(root / KERAS)
    _export_decoder(root / DECODE)
    config = root / "models.config"
    labels = {HP2: {"stable": 1, "canary": 2}}
    config.write_text(model_config(root, labels, [HP2, KERAS, DECODE]), encoding="utf-8")
    server = ModelServer(config, root)
    gateways: dict[str, Gateway] = {}
    try:
        for model, version in ((HP2, 1), (HP2, 2), (KERAS, 1), (DECODE, 1)):
            server.wait_available(model, version)
        for upstream in ("grpc", "rest"):
            env = {
                "GATEWAY_UPSTREAM": upstream,
                "GATEWAY_TFS_GRPC": server.grpc_target,
                "GATEWAY_TFS_REST": server.rest_url,
                "GATEWAY_MODEL_BASE_PATH": str(root),
                "GATEWAY_MODEL_CONFIG_FILE": str(config),
                "GATEWAY_TFS_MAX_ELEMENTS": str(MAX_ELEMENTS),
                "GATEWAY_MAX_REQUEST_ROWS": "16",
                "GATEWAY_DEBUG_ENDPOINTS": "1",
            }
            gateways[upstream] = Gateway(env, root, workers=1, threads=4)
        yield {"server": server, **gateways}
    finally:
        for gateway in gateways.values():
            gateway.stop()
        server.stop()


def b64(text: str) -> dict[str, str]:
    return {"b64": base64.b64encode(text.encode()).decode()}


# (name, method, path under /v1/models, body): each is sent directly and through both gateways.
CASES: list[tuple[str, str, str, Any]] = [
    ("status", "GET", HP2, None),
    ("status-version", "GET", f"{HP2}/versions/1", None),
    ("metadata", "GET", f"{HP2}/metadata", None),
    ("metadata-keras", "GET", f"{KERAS}/versions/1/metadata", None),
    ("rows", "POST", f"{HP2}:predict", {"instances": [[1.0], [2.5], [-3]]}),
    ("columns", "POST", f"{HP2}:predict", {"inputs": [[1.0], [0.1]]}),
    ("version", "POST", f"{HP2}/versions/2:predict", {"instances": [[1.0]]}),
    ("label", "POST", f"{HP2}/labels/canary:predict", {"instances": [[4.0]]}),
    ("signature-multi-rows", "POST", f"{HP2}:predict",
     {"signature_name": "multi", "instances": [{"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 0.5}]}),
    ("signature-multi-columns", "POST", f"{HP2}:predict",
     {"signature_name": "multi", "inputs": {"a": [1.0, 1e-7], "b": [2.0, 9000000]}}),
    ("b64-strings", "POST", f"{HP2}:predict",
     {"signature_name": "strings", "instances": [b64("héllo"), "ab"]}),
    ("keras-rows", "POST", f"{KERAS}:predict",
     {"instances": [{"f": [1.0, 2.0], "i": [3], "s": ["b"]},
                    {"f": [0.5, 0], "i": [-1], "s": ["z"]}]}),
    ("keras-columns", "POST", f"{KERAS}:predict",
     {"inputs": {"f": [[1.0, 2.0]], "i": [[3]], "s": [["c"]]}}),
    ("decode-rows", "POST", f"{DECODE}:predict", {"instances": ["1.5", b64("2")]}),
    ("decode-columns", "POST", f"{DECODE}:predict", {"inputs": ["0.25"]}),
    ("unknown-model", "POST", "nope:predict", {"instances": [[1.0]]}),
    ("unknown-model-status", "GET", "nope", None),
    ("unknown-version", "POST", f"{HP2}/versions/9:predict", {"instances": [[1.0]]}),
    ("unknown-signature", "POST", f"{HP2}:predict", {"signature_name": "zz", "instances": [[1]]}),
    ("wrong-dtype", "POST", f"{HP2}:predict", {"instances": [["x"]]}),
    ("keras-missing-input", "POST", f"{KERAS}:predict", {"inputs": {"f": [[1.0, 2.0]]}}),
    ("both-keys", "POST", f"{HP2}:predict", {"instances": [[1.0]], "inputs": [[1.0]]}),
    ("regress", "POST", f"{HP2}:regress",
     {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}, {"x": 3.0}]}),
    ("classify", "POST", f"{HP2}/labels/stable:classify",
     {"signature_name": "classify_x_to_y", "examples": [{"x": 2.0}]}),
    ("regress-context", "POST", f"{HP2}/versions/2:regress",
     {"signature_name": "regress_x_to_y", "context": {"x": 5.0}, "examples": [{}, {"x": 1.0}]}),
    ("regress-int-feature", "POST", f"{HP2}:regress",
     {"signature_name": "regress_x_to_y", "examples": [{"x": 2}]}),
    ("regress-no-examples", "POST", f"{HP2}:regress", {"signature_name": "regress_x_to_y"}),
]  # fmt: skip


def _send(base: str, method: str, path: str, body: Any) -> requests.Response:
    data = None if body is None else json.dumps(body).encode()
    return requests.request(method, f"{base}/{path}", data=data, timeout=30)


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
@pytest.mark.parametrize(("name", "method", "path", "body"), CASES, ids=[c[0] for c in CASES])
def test_gateway_answers_as_the_model_server_does(
    tfs_stack: dict[str, Any], upstream: str, name: str, method: str, path: str, body: Any
) -> None:
    direct = _send(tfs_stack["server"].rest_url + "/v1/models", method, path, body)
    through = _send(tfs_stack[upstream].url + "/tfs/v1/models", method, path, body)
    assert (through.status_code, json.loads(through.content)) == (
        direct.status_code,
        json.loads(direct.content),
    )
    assert through.headers["Content-Type"] == "application/json"
    if upstream == "rest":
        assert through.content == direct.content  # TF Serving's own bytes


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_limits_answer_413_naming_the_setting_in_tf_servings_shape(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    base = tfs_stack[upstream].url + "/tfs/v1/models"
    elements = _send(base, "POST", f"{HP2}:predict", {"inputs": [[1.0] * (MAX_ELEMENTS + 1)]})
    rows = _send(base, "POST", f"{HP2}:predict", {"instances": [[1.0]] * 17})

    assert elements.status_code == 413
    assert "GATEWAY_TFS_MAX_ELEMENTS" in elements.json()["error"]
    assert rows.status_code == 413 and "GATEWAY_MAX_REQUEST_ROWS" in rows.json()["error"]


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_metrics_name_configured_models_and_timing_headers_come_back(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    url = tfs_stack[upstream].url
    reply = _send(url + "/tfs/v1/models", "POST", f"{HP2}/versions/2:predict", {"instances": [[1]]})
    _send(url + "/tfs/v1/models", "GET", "some-model-nobody-serves", None)
    text = requests.get(url + "/metrics", timeout=10).text
    modules = requests.get(url + "/debug/modules", timeout=10).json()

    assert "Server-Timing" in reply.headers
    assert any(
        line.startswith("gateway_requests_total{")
        and all(part in line for part in ('model="half_plus_two"', 'version="2"', "/tfs/v1/"))
        for line in text.splitlines()
    )
    assert 'model="some-model-nobody-serves"' not in text and 'model="other"' in text
    assert modules["tensorflow"] == []
