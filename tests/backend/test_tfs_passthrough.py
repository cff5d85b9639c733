"""TF Serving's REST API through the gateway (/tfs) for models the project did not export.

The models are exported here as users export them (Keras ``model.export``, ``tf.saved_model.save``)
and served by the project's model server; each request goes to it directly (``/v1/...``) and
through a gateway over gRPC and one over REST (``/tfs/v1/...``): same status, same JSON (over
REST the same bytes). The gateways have API keys on and a routing file that sends half_plus_two's
default traffic to v2 and shadows it on v1 (v2 is also the newest: direct answers are the same).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.backend.stack import Gateway, ModelServer, model_config

HP2, KERAS, DECODE = "half_plus_two", "keras_multi", "str_decode"
MAX_ELEMENTS = 64
MAX_ANSWER_BYTES = 65_536
# API keys: every model and version; half_plus_two's public scope only; one request a second
KEYS = {"ops": {"versions": "all"}, "hp2": {"models": [HP2]}, "slow": {"rate": 0.2, "burst": 1}}
ROUTING = f"{HP2}:\n  weights: {{2: 1}}\n  shadow: {{version: 1, share: 1.0}}\n"


def key_header(name: str = "ops") -> dict[str, str]:
    return {"Authorization": f"Bearer key-{name}"}


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
    """A tf.Module whose string input is parsed in the graph: y = 2 * to_number(s); signature
    ``thirds``: float64 in and out (x / 3, 17 digits to write); ``expand``: n float32 halves
    (an answer far larger than its body)."""
    import tensorflow as tf

    class Decoder(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
        def serve(self, s: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": 2.0 * tf.strings.to_number(s), "echo_bytes": s}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float64, name="x")])
        def thirds(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": x / 3.0}

        @tf.function(input_signature=[tf.TensorSpec([1], tf.int32, name="n")])
        def expand(self, n: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"z": tf.fill(n, 0.5)}

    module = Decoder()
    signatures = {"serving_default": module.serve, "thirds": module.thirds,
                  "expand": module.expand}  # fmt: skip
    tf.saved_model.save(module, str(base / "1"), signatures=signatures)


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
    (root / "routing.yaml").write_text(ROUTING, encoding="utf-8")
    keys = [
        {"name": name, "sha256": hashlib.sha256(f"key-{name}".encode()).hexdigest(), **entry}
        for name, entry in KEYS.items()
    ]
    (root / "keys.json").write_text(json.dumps({"keys": keys}), encoding="utf-8")
    server = ModelServer(config, root)
    gateways: dict[str, Gateway] = {}
    try:
        envs = {
            upstream: {
                "GATEWAY_UPSTREAM": upstream,
                "GATEWAY_TFS_GRPC": server.grpc_target,
                "GATEWAY_TFS_REST": server.rest_url,
                "GATEWAY_MODEL_BASE_PATH": str(root),
                "GATEWAY_MODEL_CONFIG_FILE": str(config),
                "GATEWAY_TFS_MAX_ELEMENTS": str(MAX_ELEMENTS),
                "GATEWAY_MAX_ANSWER_BYTES": str(MAX_ANSWER_BYTES),
                "GATEWAY_MAX_REQUEST_ROWS": "16",
                "GATEWAY_DEBUG_ENDPOINTS": "1",
                "GATEWAY_API_KEYS_FILE": str(root / "keys.json"),
                "GATEWAY_SHADOW_QUEUE": "8",
            }
            for upstream in ("grpc", "rest")
        }
        # the gateways start while the model server loads (they need nothing of it to start)
        with ThreadPoolExecutor(2) as pool:
            started = {u: pool.submit(Gateway, env, root, 1, 4) for u, env in envs.items()}
            for model, version in ((HP2, 1), (HP2, 2), (KERAS, 1), (DECODE, 1)):
                server.wait_available(model, version)
            failed = None
            for upstream, future in started.items():  # each one that started is stopped below
                try:
                    gateways[upstream] = future.result()
                except Exception as exc:  # re-raised once all are collected
                    failed = exc
            if failed is not None:
                raise failed
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
    ("float64-rows", "POST", f"{DECODE}:predict",
     {"signature_name": "thirds", "instances": [1.0, 0.1, 2, 1e300, -7e-320, 123456789.123]}),
    ("float64-columns", "POST", f"{DECODE}:predict",
     {"signature_name": "thirds", "inputs": [0.7, 5e-324, 1.7976931348623157e308]}),
    ("answer-within-budget", "POST", f"{DECODE}:predict",
     {"signature_name": "expand", "inputs": {"n": [1000]}}),
    ("wrong-dtype-large", "POST", f"{HP2}:predict", {"inputs": [[1.0] * 60 + ["x" * 20_000]]}),
    ("wrong-dtype-deep", "POST", f"{HP2}:predict",
     {"instances": [[1.0]] * 8 + [[{"b64": "x" * 20_000}]]}),
    ("unknown-model", "POST", "nope:predict", {"instances": [[1.0]]}),
    ("unknown-model-status", "GET", "nope", None),
    ("unknown-version", "POST", f"{HP2}/versions/9:predict", {"instances": [[1.0]]}),
    ("unknown-signature", "POST", f"{HP2}:predict", {"signature_name": "zz", "instances": [[1]]}),
    ("wrong-dtype", "POST", f"{HP2}:predict", {"instances": [["x"]]}),
    ("keras-missing-input", "POST", f"{KERAS}:predict", {"inputs": {"f": [[1.0, 2.0]]}}),
    ("version-over-int64", "POST", f"{HP2}/versions/99999999999999999999:predict",
     {"instances": [[1.0]]}),
    ("bad-json", "POST", f"{HP2}:predict", "RAW:{\"instances\": [[1.0] [2.0]]}"),
    ("empty-body", "POST", f"{HP2}:predict", "RAW:"),
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


def _send(
    base: str, method: str, path: str, body: Any, key: str | None = "ops"
) -> requests.Response:
    if isinstance(body, str) and body.startswith("RAW:"):
        data: bytes | None = body.removeprefix("RAW:").encode()
    else:
        data = None if body is None else json.dumps(body).encode()
    headers = key_header(key) if key else {}
    return requests.request(method, f"{base}/{path}", data=data, headers=headers, timeout=30)


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
@pytest.mark.parametrize(("name", "method", "path", "body"), CASES, ids=[c[0] for c in CASES])
def test_gateway_answers_as_the_model_server_does(
    tfs_stack: dict[str, Any], upstream: str, name: str, method: str, path: str, body: Any
) -> None:
    """Same status, same JSON with every number as written (float64's 17 digits compared as
    text, not as the floats they parse to), over REST the same bytes."""
    direct = _send(tfs_stack["server"].rest_url + "/v1/models", method, path, body)
    through = _send(tfs_stack[upstream].url + "/tfs/v1/models", method, path, body)
    assert (through.status_code, _as_written(through.content)) == (
        direct.status_code,
        _as_written(direct.content),
    )
    assert through.headers["Content-Type"] == "application/json"
    if upstream == "rest":
        assert through.content == direct.content  # TF Serving's own bytes


def _as_written(content: bytes) -> Any:
    """Return a JSON answer with each number kept as its text."""
    return json.loads(content, parse_float=str, parse_int=str, parse_constant=str)


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_unknown_paths_under_the_prefix_answer_in_tf_servings_shape(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    base = tfs_stack[upstream].url + "/tfs/v1/models"
    reply = _send(base, "POST", f"{HP2}:PREDICT", {"instances": [[1.0]]})

    assert reply.status_code == 404 and set(reply.json()) == {"error"}


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


STEPPING_AROUND = {
    # TF Serving reads Inf (rapidjson's kParseNanAndInfFlag): the body is counted all the same
    "Inf among too many elements": (
        "RAW:{\"inputs\": [[Inf, " + "1.0, " * MAX_ELEMENTS + "-Inf]]}", 413,
        "GATEWAY_TFS_MAX_ELEMENTS"),
    "Inf among too many rows": ("RAW:{\"instances\": [" + "[Inf], " * 16 + "[NaN]]}", 413,
                                "GATEWAY_MAX_REQUEST_ROWS"),
    # TF Serving reads the first copy of a name, a parse here the last: refused
    "a second, small copy of instances": (
        "RAW:{\"instances\": " + json.dumps([[1.0]] * 17) + ", \"instances\": [[1.0]]}", 400,
        "repeats a member name"),
    "a second copy of an input": (
        "RAW:{\"inputs\": {\"x\": " + json.dumps([[1.0]] * MAX_ELEMENTS * 2) + ", \"x\": [[1]]}}",
        400, "repeats a member name"),
}  # fmt: skip


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
@pytest.mark.parametrize("case", list(STEPPING_AROUND))
def test_limits_cant_be_stepped_around_by_what_only_tf_serving_reads(
    tfs_stack: dict[str, Any], upstream: str, case: str
) -> None:
    """A body the gateway's parse could not read went on unchecked over REST; a repeated name
    was counted by its last copy while TF Serving serves its first."""
    body, status, words = STEPPING_AROUND[case]
    reply = _send(tfs_stack[upstream].url + "/tfs/v1/models", "POST", f"{HP2}:predict", body)

    assert reply.status_code == status, reply.text[:300]
    assert words in reply.json()["error"]


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_an_answer_over_the_answer_budget_is_a_413_naming_the_setting(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    """A 4-element body asks for 20,000 float32s: the reply (80 KB over gRPC, ~100 KB of JSON
    over REST) is refused by the client past GATEWAY_MAX_ANSWER_BYTES, before it is read in."""
    body = {"signature_name": "expand", "inputs": {"n": [20_000]}}
    reply = _send(tfs_stack[upstream].url + "/tfs/v1/models", "POST", f"{DECODE}:predict", body)

    assert reply.status_code == 413, reply.text[:300]
    error = reply.json()["error"]
    assert "GATEWAY_MAX_ANSWER_BYTES" in error and str(MAX_ANSWER_BYTES) in error, error


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_metrics_name_configured_models_and_timing_headers_come_back(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    url = tfs_stack[upstream].url
    reply = _send(url + "/tfs/v1/models", "POST", f"{HP2}/versions/2:predict", {"instances": [[1]]})
    _send(url + "/tfs/v1/models", "GET", "some-model-nobody-serves", None)
    text = requests.get(url + "/metrics", timeout=10).text
    modules = requests.get(url + "/debug/modules", headers=key_header(), timeout=10).json()

    assert "Server-Timing" in reply.headers
    assert any(
        line.startswith("gateway_requests_total{")
        and all(part in line for part in ('model="half_plus_two"', 'version="2"', "/tfs/v1/"))
        for line in text.splitlines()
    )
    assert 'model="some-model-nobody-serves"' not in text and 'model="other"' in text
    assert modules["tensorflow"] == []


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_api_keys_scope_the_models_and_versions_in_tf_servings_error_shape(
    tfs_stack: dict[str, Any], upstream: str
) -> None:
    base = tfs_stack[upstream].url + "/tfs/v1/models"
    body = {"instances": [[1.0]]}
    answers = {
        "no key": _send(base, "POST", f"{HP2}:predict", body, key=None),
        "other model": _send(base, "GET", f"{KERAS}/metadata", None, key="hp2"),
        "unvetted version": _send(base, "POST", f"{HP2}/versions/2:predict", body, key="hp2"),
        "unvetted metadata": _send(base, "GET", f"{HP2}/versions/2/metadata", None, key="hp2"),
        "unvetted status": _send(base, "GET", f"{HP2}/versions/2", None, key="hp2"),
        "unvetted label": _send(base, "GET", f"{HP2}/labels/canary/metadata", None, key="hp2"),
        "public metadata": _send(base, "GET", f"{HP2}/labels/stable/metadata", None, key="hp2"),
        "public label": _send(base, "POST", f"{HP2}/labels/stable:predict", body, key="hp2"),
        "default": _send(base, "POST", f"{HP2}:predict", body, key="hp2"),
    }
    slow = [_send(base, "GET", HP2, None, key="slow") for _ in range(2)]

    statuses = {name: reply.status_code for name, reply in answers.items()}
    assert statuses == {
        "no key": 401, "other model": 403, "unvetted version": 403, "unvetted metadata": 403,
        "unvetted status": 403, "unvetted label": 403, "public metadata": 200,
        "public label": 200, "default": 200,
    }  # fmt: skip
    assert set(answers["other model"].json()) == {"error"}  # TF Serving's shape
    assert answers["public label"].json() == {"predictions": [[2.5]]}  # v1: 0.5x + 2
    assert answers["default"].json() == {"predictions": [[3.5]]}  # the routing file's v2
    assert [r.status_code for r in slow] == [200, 429] and "Retry-After" in slow[1].headers


def _allclose_series(url: str) -> tuple[float, float]:
    """Return (count, sum) of half_plus_two's v2-vs-v1 shadow allclose series (0, 0 before any)."""
    wanted = ('measure="allclose"', 'model="half_plus_two"', 'served_version="2"',
              'shadow_version="1"')  # fmt: skip
    values = {"count": 0.0, "sum": 0.0}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        for kind in values:
            if line.startswith(f"gateway_shadow_agreement_{kind}{{") and all(
                part in line for part in wanted
            ):
                values[kind] = float(line.split()[-1])
    return values["count"], values["sum"]


def test_the_shadow_compares_raw_outputs_with_allclose(tfs_stack: dict[str, Any]) -> None:
    url = tfs_stack["grpc"].url
    count, total = _allclose_series(url)
    # default traffic: served by v2 (0.5x + 3), shadowed on v1 (0.5x + 2): they disagree
    _send(url + "/tfs/v1/models", "POST", f"{HP2}:predict", {"instances": [[1.0], [2.0]]})
    deadline = time.monotonic() + 10
    after = _allclose_series(url)
    while after[0] == count and time.monotonic() < deadline:
        time.sleep(0.1)
        after = _allclose_series(url)

    assert after == (count + 1, total)  # one output compared, not allclose


def test_compare_raw_agrees_within_the_stated_tolerances() -> None:
    from backend.shadow import RAW_ATOL, RAW_RTOL, compare_raw

    served = {"y": np.array([[1.0, 100.0]])}
    close = {"y": served["y"] * (1 + RAW_RTOL / 2) + RAW_ATOL / 2}
    far = {"y": served["y"] + 0.5}

    assert compare_raw(served, close) == {"allclose": [1.0]}
    assert compare_raw(served, far) == {"allclose": [0.0]}
    assert compare_raw(served, {"z": served["y"]}) == {"allclose": [0.0]}


@pytest.mark.parametrize(
    ("value", "text"),
    [(9000000, "9e+06"), (999999, "999999.0"), (0.5, "0.5"), (0.00003, "3e-05"),
     (555557.5, "555557.5"), (3, "3.0"), (1 / 3, "0.333333343"), (-0.0, "-0.0"),
     (float("nan"), "NaN"), (float("-inf"), "-Infinity")],
)  # fmt: skip
def test_floats_are_written_as_tf_serving_writes_float32(value: float, text: str) -> None:
    from backend.tfs_json import format_float

    assert format_float(float(np.float32(value))) == text


@pytest.mark.parametrize(
    ("doc", "size"),
    [({"instances": [[1.0, 2.0], [3.0, 4.0]]}, (2, 4)),
     ({"instances": [{"a": [1, 2], "s": b64("x")}]}, (1, 3)),
     ({"inputs": {"a": [[1], [2], [3]], "b": [0.5, 1, 2]}}, (3, 6)),
     ({"inputs": 7}, (1, 1)),
     ({"examples": [{"x": [1.0, 2.0]}, {}], "context": {"c": "z"}}, (2, 3))],
)  # fmt: skip
def test_rows_and_elements_are_counted_before_the_call(doc: Any, size: tuple[int, int]) -> None:
    from backend.tfs_json import request_size

    assert request_size(doc) == size


# -- the body as TF Serving reads it, counted and checked before anything is built --------------

INF = float("inf")


@pytest.mark.parametrize(
    ("body", "value"),
    [(b'{"x": [Inf, -Inf, Infinity, -Infinity]}', [INF, -INF, INF, -INF]),
     (b'{"x": ["Inf", "a -Inf b", 1]} trailing bytes', ["Inf", "a -Inf b", 1]),
     (b'{"x": 123456789012345678901234}', 1.2345678901234568e23),  # rapidjson: a double
     (b'{"x": [NaN, -123456789012345678901234, 1]}', [math.nan, -1.2345678901234568e23, 1]),
     (b'{"x": 18446744073709551615}', 2**64 - 1),
     (b'{"x:": "a:b", "y": {"\\u003a": ":"}}', {"x:": "a:b", "y": {":": ":"}})],
)  # fmt: skip
def test_the_body_is_read_as_tf_servings_parser_reads_it(body: bytes, value: Any) -> None:
    from backend.tfs_json import parse_body

    doc = parse_body(body)
    if isinstance(value, dict):
        assert doc == value
    else:  # the same values (NaN as NaN), of the same types (an int is not a float)
        got = doc["x"] if isinstance(value, list) else [doc["x"]]
        want = value if isinstance(value, list) else [value]
        assert [(type(v), repr(v)) for v in got] == [(type(v), repr(v)) for v in want]


@pytest.mark.parametrize(
    ("body", "words"),
    [(b'{"instances": [[1.0]], "instances": [[1.0], [2.0]]}', "repeats a member name"),
     (b'{"inputs": {"a": [1], "a": [1, 2, 3]}}', "repeats a member name"),
     (b'{"inputs": {"a\\u003a": [1], "a\\u003a": [2]}, "s": ":"}', "repeats a member name"),
     (b'{"x": 1e400}', "Number too big"),
     (b'{"x": [NaN, 1e999]}', "Number too big"),
     (b"[" * 100_000 + b"]" * 100_000, "nested deeper than"),
     (b"[" * 100_000 + b"NaN" + b"]" * 100_000, "nested deeper than"),
     (b'{"instances": [1.0, Inf', "JSON Parse error"),
     (b"true", "JSON Value: true Is not object"),  # a bare value was a 500 (schemathesis)
     (b"-4.767266435005891e-83", "Is not object"),
     (b"null", "Is not object"),
     (b"[[1.0]]", "Is not object")],
)  # fmt: skip
def test_what_the_gateway_would_count_otherwise_than_tf_serving_is_a_400(
    body: bytes, words: str
) -> None:
    """A repeated name is read by its first copy there and by its last here: refused, as are
    numbers past a double and nesting no tensor has (never a RecursionError's 500)."""
    from backend.tfs_json import TfsError, parse_body

    with pytest.raises(TfsError, match=words) as caught:
        parse_body(body)
    assert caught.value.status == 400


def test_elements_are_counted_without_recursion() -> None:
    from backend.tfs_json import MAX_DEPTH, count_elements

    deep: Any = [1.0, 2.0]
    for _ in range(MAX_DEPTH * 4):
        deep = [deep, {"b64": "eA=="}]
    assert count_elements(deep) == 2 + MAX_DEPTH * 4


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [([1.0, True], "DT_FLOAT", "JSON Value: true Type: True is not of expected type: float"),
     ([[1, 2], [3, False]], "DT_INT32",
      "JSON Value: false Type: False is not of expected type: int32"),
     ([200, -300, 2**31 - 1], "DT_INT8", np.array([200, -300, 2**31 - 1]).astype(np.int8)),
     ([2**31], "DT_UINT8", "JSON Value: 2147483648 Type: Number is not of expected type: uint8"),
     ([1.8446744073709552e19], "DT_INT64",
      "JSON Value: 1.8446744073709552e+19 Type: Number is not of expected type: int64"),
     ([2**64 - 1], "DT_UINT64", np.array([2**64 - 1], dtype=np.uint64)),
     ([1, 2], "DT_UINT16", "Conversion of JSON Value: 1 to type: uint16"),
     ([[1.0, 2.0], [3.0]], "DT_DOUBLE", "Encountered list at unexpected size: 1 at level: 1"),
     ([[1.0, [2.0]], [3.0, 4.0]], "DT_DOUBLE", "JSON Value: [2.0] found at incorrect level: 3")],
)  # fmt: skip
def test_leaves_are_taken_as_tf_serving_takes_them(value: Any, dtype: str, expected: Any) -> None:
    """json_tensor.cc AddValueToTensor: bools are not numbers; int8, int16 and uint8 take any
    int32 (cast into the tensor); an integer past 64 bits is the double rapidjson read."""
    from backend.tfs_json import DT, TfsError, to_array

    try:
        got: Any = to_array(value, DT.Value(dtype))
    except TfsError as exc:
        got = exc.message
    if isinstance(expected, str):
        assert isinstance(got, str) and got.startswith(expected), got
    else:
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


@pytest.mark.parametrize("dtype", ["DT_FLOAT", "DT_INT32", "DT_BOOL"])
def test_no_array_is_built_before_its_leaves_are_checked(dtype: str) -> None:
    """Numbers and one long string: numpy once inferred a unicode array of numbers x (4 x the
    string's length) bytes from them (a 60 KB body took a worker to 1.6 GB)."""
    import tracemalloc

    from backend.tfs_json import DT, TfsError, to_array

    leaf: Any = True if dtype == "DT_BOOL" else 1
    value = [leaf] * 1000 + ["x" * 10_000]
    tracemalloc.start()
    try:
        with pytest.raises(TfsError, match="Type: String is not of expected type"):
            to_array(value, DT.Value(dtype))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / (1 << 20):.1f} MiB"  # it was 40 MiB


class _SlowUpstream:
    """A gRPC client that takes ``seconds`` per call and notes each call's timeout (a fault a
    real model server does not make on cue)."""

    transport = "grpc"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.timeouts: list[tuple[str, float]] = []

    def forward(self, method: str, request: Any, *, model: str, version: int | None,
                timeout_s: float) -> Any:  # fmt: skip
        from backend.tensors import fill_tensor_proto
        from modelformat.protos import serving_pb2, tensor_pb2

        self.timeouts.append((method, timeout_s))
        time.sleep(min(self.seconds, timeout_s))
        if method == "metadata":
            sigs = serving_pb2.SignatureDefMap()
            sigs.signature_def["serving_default"].inputs["x"].dtype = tensor_pb2.DT_FLOAT
            reply = serving_pb2.GetModelMetadataResponse()
            reply.metadata["signature_def"].value = sigs.SerializeToString()
            return reply
        reply = serving_pb2.PredictResponse()
        fill_tensor_proto(reply.outputs["y"], np.array([[2.5]], dtype=np.float32))
        return reply


def test_a_grpc_predict_spends_one_deadline_on_its_metadata_and_its_call() -> None:
    """The signatures' lookup and the Predict each took the full GATEWAY_TIMEOUT_S: twice it."""
    from types import SimpleNamespace

    from backend.errors import UpstreamTimeout
    from backend.passthrough import Passthrough, Target
    from backend.settings import Settings

    def run(seconds: float) -> tuple[Any, list[tuple[str, float]]]:
        client = _SlowUpstream(seconds)
        gateway = SimpleNamespace(settings=Settings(request_timeout_s=0.3), client=client)
        try:
            answer: Any = Passthrough(gateway).infer(  # type: ignore[arg-type]
                "predict", Target("m"), b"", {"instances": [[1.0]]}
            )
        except UpstreamTimeout as exc:
            answer = exc
        return answer, client.timeouts

    answer, timeouts = run(0.1)
    assert answer.status == 200 and [m for m, _ in timeouts] == ["metadata", "predict"]
    assert timeouts[1][1] <= 0.3 - 0.1 + 0.02, timeouts  # what the metadata left of it
    late, timeouts = run(0.5)
    assert isinstance(late, UpstreamTimeout) and [m for m, _ in timeouts] == ["metadata"]
