"""Early-exit models without servers: speed validation and precedence, per-chunk speeds,
exit_layer on each prediction, the note for models without exits, OpenAPI, the histogram."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask.testing import FlaskClient

from backend import metrics
from backend.app import create_app
from backend.early_exit import EarlyExit, chunk_speeds, parse_early_exit, text_speeds
from backend.errors import BadRequest, ModelAssetsError, UnprocessableInput
from backend.schemas import ClassifyRequest, EmbedRequest, parse_request
from backend.service import Gateway
from backend.settings import Settings, SettingsError, load_settings
from backend.tensors import from_tensor_proto, to_tensor_proto
from backend.versions import AssetCache
from modelformat.protos import serving_pb2
from tests.backend.fake_grpc import predict_server

LAYERS = 6
EXITS = {"default_speed": 0.0, "num_layers": LAYERS, "layers": [1, 2, 3, 4, 5]}

# -- the request's speed -----------------------------------------------------------------------


def _parse(body: dict[str, Any], kind: type = ClassifyRequest) -> Any:
    return parse_request(kind, json.dumps(body).encode(), Settings())


@pytest.mark.parametrize(
    ("speed", "parsed"),
    [(0, 0.0), (1, 1.0), (0.25, 0.25), ([0, 0.5, 1], [0.0, 0.5, 1.0]), (None, None)],
)
def test_speed_is_a_number_or_one_per_text_in_0_to_1(speed: Any, parsed: Any) -> None:
    texts = ["a", "b", "c"]

    request = _parse({"texts": texts, "speed": speed})

    assert request.speed == parsed


def test_no_speed_means_none() -> None:
    assert _parse({"texts": ["a"]}).speed is None


@pytest.mark.parametrize(
    ("speed", "says"),
    [
        (-0.1, "field 'speed'"),
        (1.01, "field 'speed'"),
        (2, "field 'speed'"),
        ("NaN", "field 'speed'"),
        ("Infinity", "field 'speed'"),
        ("-Infinity", "field 'speed'"),
        ("0.5", "field 'speed'"),
        (True, "field 'speed'"),
        (False, "field 'speed'"),
        ({"a": 1}, "field 'speed'"),
        ([0.5], "1 values for 3 texts"),
        ([0.5] * 4, "4 values for 3 texts"),
        ([], "0 values for 3 texts"),
        ([0.5, "0.5", 0.5], "speed[1]"),
        ([0.5, 0.5, None], "speed[2]"),
        ([0.5, True, 0.5], "speed[1]"),
        ([0.5, 1.5, 0.5], "speed[1]"),
        ([0.5, [0.5], 0.5], "speed[1]"),
    ],
)
def test_every_bad_speed_is_a_422_naming_the_field(speed: Any, says: str) -> None:
    with pytest.raises(UnprocessableInput) as caught:
        _parse({"texts": ["a", "b", "c"], "speed": speed})

    assert says in caught.value.message


def test_a_bare_nan_is_not_json_so_400() -> None:
    with pytest.raises(BadRequest):
        parse_request(ClassifyRequest, b'{"texts": ["a"], "speed": NaN}', Settings())


def test_embed_takes_no_speed() -> None:
    with pytest.raises(BadRequest, match="unknown field 'speed'"):
        _parse({"texts": ["a"], "speed": 0.5}, EmbedRequest)


def test_a_long_bad_speed_is_cut_short_in_the_message() -> None:
    with pytest.raises(UnprocessableInput) as caught:
        _parse({"texts": ["a"], "speed": "x" * 5000})

    assert len(caught.value.message) < 200


# -- which speed applies ------------------------------------------------------------------------

MODEL_DEFAULT = EarlyExit(default_speed=0.3, num_layers=LAYERS, layers=(1, 2, 3, 4, 5))


@pytest.mark.parametrize(
    ("requested", "setting", "model", "expected"),
    [
        (0.9, 0.5, MODEL_DEFAULT, [0.9, 0.9, 0.9]),  # the request's wins
        ([0.1, 0.0, 1.0], 0.5, MODEL_DEFAULT, [0.1, 0.0, 1.0]),
        (0.0, 0.5, MODEL_DEFAULT, [0.0, 0.0, 0.0]),  # 0 is a speed, not "unset"
        (None, 0.5, MODEL_DEFAULT, [0.5, 0.5, 0.5]),  # then GATEWAY_DEFAULT_SPEED
        (None, 0.0, MODEL_DEFAULT, [0.0, 0.0, 0.0]),
        (None, None, MODEL_DEFAULT, [0.3, 0.3, 0.3]),  # then model.json's default_speed
        (None, None, parse_early_exit({"early_exit": {}}), [0.0, 0.0, 0.0]),  # then 0
    ],
)
def test_speed_precedence_request_then_setting_then_model_then_zero(
    requested: Any, setting: float | None, model: EarlyExit | None, expected: list[float]
) -> None:
    assert model is not None
    speeds = text_speeds(requested, setting, model, 3)

    assert speeds.dtype == np.float32
    np.testing.assert_array_equal(speeds, np.asarray(expected, dtype=np.float32))


def test_a_speed_list_of_the_wrong_length_is_refused_by_text_speeds() -> None:
    with pytest.raises(ValueError, match="2 speeds for 3 texts"):
        text_speeds([0.1, 0.2], None, MODEL_DEFAULT, 3)


def test_chunk_speeds_follow_the_chunks_row_order() -> None:
    speeds = np.asarray([0.0, 0.1, 0.2, 0.3, 0.4], dtype=np.float32)

    sliced = chunk_speeds(speeds, (3, 0, 4))

    assert sliced.dtype == np.float32
    np.testing.assert_array_equal(sliced, np.asarray([0.3, 0.0, 0.4], dtype=np.float32))


@pytest.mark.parametrize("value", ["0", "0.25", "1", ""])
def test_gateway_default_speed_is_read_from_the_environment(value: str) -> None:
    settings = load_settings(environ={"GATEWAY_DEFAULT_SPEED": value})

    assert settings.default_speed == (float(value) if value else None)


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "inf", "fast"])
def test_gateway_default_speed_outside_0_to_1_fails_at_start(value: str) -> None:
    with pytest.raises(SettingsError, match="GATEWAY_DEFAULT_SPEED"):
        load_settings(environ={"GATEWAY_DEFAULT_SPEED": value})


# -- model.json ---------------------------------------------------------------------------------


def _version(base: Path, vocab: Path, model: str, version: int, info: dict[str, Any]) -> None:
    assets = base / model / str(version) / "assets"
    assets.mkdir(parents=True)
    (assets / "vocab.txt").write_bytes(vocab.read_bytes())
    (assets / "model.json").write_text(json.dumps(info))


def _classifier(**extra: Any) -> dict[str, Any]:
    return {"task": "classify", "max_seq_len": 64, "labels": ["neg", "pos"], **extra}


def test_early_exit_is_parsed_from_model_json_once(tmp_path: Path, tiny_vocab_file: Path) -> None:
    _version(tmp_path, tiny_vocab_file, "ee", 1, _classifier(early_exit=EXITS))
    _version(tmp_path, tiny_vocab_file, "plain", 1, _classifier())
    cache = AssetCache(tmp_path)

    assert cache.get("ee", 1).early_exit == EarlyExit(0.0, LAYERS, (1, 2, 3, 4, 5))
    assert cache.get("plain", 1).early_exit is None


@pytest.mark.parametrize("entry", [{"default_speed": 2}, {"default_speed": "x"}, [1, 2]])
def test_an_unusable_early_exit_entry_is_a_model_assets_error(
    tmp_path: Path, tiny_vocab_file: Path, entry: Any
) -> None:
    _version(tmp_path, tiny_vocab_file, "ee", 1, _classifier(early_exit=entry))

    with pytest.raises(ModelAssetsError):
        AssetCache(tmp_path).get("ee", 1)


# -- the pipeline with a scripted upstream --------------------------------------------------------


class ScriptedClient:
    """A PredictClient recording every call; an early-exit model when ``exits`` is set.

    Each row's probabilities encode its real length (its texts' order can be checked) and its
    exit layer is 1 + round((1 - speed) * (LAYERS - 1)): speed 0 → LAYERS, speed 1 → 1.
    """

    transport = "scripted"
    enforces_deadline = True

    def __init__(self, exits: bool) -> None:
        self.exits = exits
        self.calls: list[dict[str, np.ndarray]] = []

    def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        timeout_s: float,
        signature_name: str | None = None,
    ) -> tuple[dict[str, np.ndarray], int]:
        self.calls.append(dict(inputs))
        return _answer(dict(inputs), self.exits), int(version or 1)

    def model_status(self, model: str, *, timeout_s: float) -> list[Any]:
        raise AssertionError("tests name the version")

    def close(self) -> None:
        pass


def _answer(inputs: dict[str, np.ndarray], exits: bool) -> dict[str, np.ndarray]:
    """Return the scripted model's outputs for one chunk (the contract's names and dtypes)."""
    if exits != ("speed" in inputs):
        raise AssertionError(f"inputs {sorted(inputs)} for a model with exits={exits}")
    length = inputs["attention_mask"].sum(axis=1).astype(np.float32)
    probabilities = np.stack([1 / length, 1 - 1 / length], axis=1).astype(np.float32)
    outputs = {"logits": np.log(probabilities), "probabilities": probabilities}
    if exits:
        speed = inputs["speed"]
        if speed.dtype != np.float32 or speed.shape != (length.shape[0],):
            raise AssertionError(f"speed {speed.dtype} {speed.shape}")
        outputs["exit_layer"] = (1 + np.rint((1 - speed) * (LAYERS - 1))).astype(np.int32)
    return outputs


# Real lengths 2 + words: 9, 3, 5, 4, 7 tokens; max_batch 2 → chunks of the sorted order.
TEXTS = ["hello " * 7, "hello", "hello " * 3, "hello " * 2, "hello " * 5]


@pytest.fixture()
def base(tmp_path: Path, tiny_vocab_file: Path) -> Path:
    _version(tmp_path, tiny_vocab_file, "ee", 1, _classifier(early_exit=EXITS))
    _version(tmp_path, tiny_vocab_file, "plain", 1, _classifier())
    return tmp_path


def _gateway(base: Path, exits: bool, **settings: Any) -> tuple[Gateway, ScriptedClient]:
    client = ScriptedClient(exits)
    values = {"model_base_path": str(base), "max_batch_size": 2, **settings}
    return Gateway(load_settings(values, environ={}), client=client), client  # type: ignore[arg-type]


def _exit_layers(speeds: list[float]) -> list[int]:
    return [1 + round((1 - s) * (LAYERS - 1)) for s in speeds]


def test_each_chunk_sends_its_rows_speeds_and_exit_layers_come_back_in_caller_order(
    base: Path,
) -> None:
    gateway, client = _gateway(base, exits=True)
    speeds = [0.0, 1.0, 0.2, 0.4, 0.8]

    answer = gateway.classify("ee", ClassifyRequest(texts=TEXTS, version=1, speed=speeds))

    assert len(client.calls) == 3  # 5 texts, 2 per chunk
    for call in client.calls:
        lengths = call["attention_mask"].sum(axis=1).tolist()
        expected = [speeds[[2 + len(t.split()) for t in TEXTS].index(n)] for n in lengths]
        np.testing.assert_array_equal(call["speed"], np.asarray(expected, dtype=np.float32))
    predictions = answer["predictions"]
    assert [p["exit_layer"] for p in predictions] == _exit_layers(speeds)
    # each row is its own text's: the scripted "pos" probability is 1 - 1 / real length
    assert [round(1 / (1 - p["score"])) for p in predictions] == [2 + len(t.split()) for t in TEXTS]
    assert "notes" not in answer


@pytest.mark.parametrize(
    ("request_speed", "setting", "expected"),
    [(None, None, 0.0), (None, 0.8, 0.8), (0.6, 0.8, 0.6), (1, None, 1.0)],
)
def test_the_speed_that_applies_goes_upstream_for_every_text(
    base: Path, request_speed: float | None, setting: float | None, expected: float
) -> None:
    gateway, client = _gateway(base, exits=True, default_speed=setting)

    answer = gateway.classify("ee", ClassifyRequest(texts=TEXTS, version=1, speed=request_speed))

    sent = np.concatenate([call["speed"] for call in client.calls])
    np.testing.assert_array_equal(sent, np.full(len(TEXTS), expected, dtype=np.float32))
    assert {p["exit_layer"] for p in answer["predictions"]} == set(_exit_layers([expected]))


def test_a_model_without_exits_gets_no_speed_and_the_answer_says_it_was_ignored(
    base: Path,
) -> None:
    gateway, client = _gateway(base, exits=False, default_speed=0.5)
    plain, _ = _gateway(base, exits=False)

    answer = gateway.classify("plain", ClassifyRequest(texts=TEXTS, version=1, speed=0.7))
    unasked = plain.classify("plain", ClassifyRequest(texts=TEXTS, version=1))

    assert all("speed" not in call for call in client.calls)
    assert answer["notes"] == ["speed ignored: model 'plain' version 1 has no early exits"]
    assert all("exit_layer" not in p for p in answer["predictions"])
    assert answer["predictions"] == unasked["predictions"]
    assert "notes" not in unasked  # GATEWAY_DEFAULT_SPEED alone is no reason for a note


def test_an_early_exit_model_that_returns_no_exit_layer_is_a_502(base: Path) -> None:
    gateway, client = _gateway(base, exits=True)
    client.predict = lambda model, inputs, **kw: (  # type: ignore[method-assign]
        {k: v for k, v in _answer(dict(inputs), True).items() if k != "exit_layer"},
        1,
    )

    with pytest.raises(Exception) as caught:
        gateway.classify("ee", ClassifyRequest(texts=["hi"], version=1))

    assert getattr(caught.value, "status_code", None) == 502
    assert "exit_layer" in str(caught.value)


def test_exit_layers_are_counted_in_the_histogram_per_model_and_version(base: Path) -> None:
    gateway, _ = _gateway(base, exits=True)
    histogram = metrics.child(metrics.EXIT_LAYER, "ee", "1")
    before = _bucket_counts(histogram)

    gateway.classify("ee", ClassifyRequest(texts=TEXTS, version=1, speed=[1, 1, 0, 1, 0]))

    after = _bucket_counts(histogram)
    assert after[1.0] - before[1.0] == 3  # three texts left at layer 1
    assert after[float(LAYERS)] - before[float(LAYERS)] == 5  # cumulative: all five by layer 6
    assert after[float(LAYERS - 1)] - before[float(LAYERS - 1)] == 3


def _bucket_counts(histogram: Any) -> dict[float, float]:
    """Return upper bound → cumulative count of one labelled histogram."""
    counts = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                counts[float(sample.labels["le"])] = sample.value
    return counts


# -- the speed over a real gRPC channel (float32 tensor_content both ways) ------------------------


@pytest.fixture()
def grpc_exit_model() -> Iterator[tuple[list[dict[str, np.ndarray]], str]]:
    seen: list[dict[str, np.ndarray]] = []

    def handler(request: serving_pb2.PredictRequest, context: object) -> object:
        inputs = {name: from_tensor_proto(proto) for name, proto in request.inputs.items()}
        seen.append(inputs)
        reply = serving_pb2.PredictResponse()
        reply.model_spec.name = request.model_spec.name
        reply.model_spec.version.value = request.model_spec.version.value
        for name, value in _answer(inputs, exits=True).items():
            reply.outputs[name].CopyFrom(to_tensor_proto(value))
        return reply

    with predict_server(handler) as target:
        yield seen, target


def test_speeds_travel_as_float32_over_grpc_and_exit_layers_as_int32(
    grpc_exit_model: tuple[list[dict[str, np.ndarray]], str], base: Path
) -> None:
    seen, target = grpc_exit_model
    settings = load_settings(
        {"tfs_grpc_target": target, "model_base_path": str(base), "max_batch_size": 8},
        environ={},
    )
    gateway = Gateway(settings)
    speeds = [0.0, 1.0, 0.2, 0.4, 0.8]

    answer = gateway.classify("ee", ClassifyRequest(texts=TEXTS, version=1, speed=speeds))
    gateway.close()

    assert seen and all(call["speed"].dtype == np.float32 for call in seen)
    assert sorted(np.concatenate([c["speed"] for c in seen]).tolist()) == sorted(
        np.asarray(speeds, dtype=np.float32).tolist()
    )
    assert [p["exit_layer"] for p in answer["predictions"]] == _exit_layers(speeds)
    assert all(type(p["exit_layer"]) is int for p in answer["predictions"])


def test_rest_sends_speeds_as_json_numbers() -> None:
    from backend.clients.rest_client import RestClient

    sent: list[bytes] = []
    client = RestClient("http://127.0.0.1:1")

    def fake_request(
        url: str, method: str, path: str, model: str, timeout_s: float, body: Any = None
    ) -> Any:
        if body is not None:
            sent.append(body)
            return {"outputs": {"exit_layer": [1, 2]}}
        sig = {"outputs": {"exit_layer": {"dtype": "DT_INT32"}}}
        return {"metadata": {"signature_def": {"signature_def": {"serving_default": sig}}}}

    client._request_at = fake_request  # type: ignore[method-assign]
    speed = np.asarray([0.25, 1.0], dtype=np.float32)

    outputs, _ = client.predict("ee", {"speed": speed}, version=1, timeout_s=1)

    assert json.loads(sent[0])["inputs"]["speed"] == [0.25, 1.0]
    assert outputs["exit_layer"].dtype == np.int32


# -- the OpenAPI document -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client() -> FlaskClient:
    return create_app({"upstream": "rest", "tfs_rest_url": "http://127.0.0.1:1"}).test_client()


def test_openapi_documents_speed_exit_layer_and_notes(client: FlaskClient) -> None:
    schemas = client.get("/openapi.json").get_json()["components"]["schemas"]

    speed = schemas["ClassifyRequest"]["properties"]["speed"]
    number = {"type": "number", "minimum": 0.0, "maximum": 1.0}
    options = speed["anyOf"]
    assert any(all(o.get(k) == v for k, v in number.items()) for o in options)
    arrays = [o for o in options if o.get("type") == "array"]
    assert arrays and all(arrays[0]["items"].get(k) == v for k, v in number.items())
    assert "speed" not in schemas["EmbedRequest"]["properties"]
    exit_layer = schemas["Prediction"]["properties"]["exit_layer"]
    assert {"type": "integer", "minimum": 1} in exit_layer["anyOf"]
    assert "exit_layer" not in schemas["Prediction"]["required"]
    notes = schemas["ClassifyResponse"]["properties"]["notes"]
    assert {"type": "array", "items": {"type": "string"}} in notes["anyOf"]
    assert "notes" not in schemas["ClassifyResponse"]["required"]


def test_a_bad_speed_is_a_json_422_through_flask(client: FlaskClient) -> None:
    response = client.post("/v1/models/m:classify", json={"texts": ["a", "b"], "speed": [0.1]})

    assert response.status_code == 422
    assert response.get_json()["error"]["code"] == "unprocessable"
    assert "speed" in response.get_json()["error"]["message"]
