"""The HTTP API end to end: gunicorn gateway (grpc and rest) → real modelserver → tiny models."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from backend import timing
from backend.schemas import ClassifyResponse, EmbedResponse, ModelStatusResponse
from backend.tokenization import BertTokenizer
from tests.backend.conftest import EMBED, EXITS, INTENT
from tests.backend.stack import Gateway, ModelServer

LONG = " ".join(["my card was charged twice"] * 20)  # ~100 tokens > max_seq_len 64
TEXTS = ["my card was charged twice", "我的订单还没到", "hello world", "where is my package?"]


def _post(gateway: Gateway, path: str, body: object) -> requests.Response:
    return requests.post(f"{gateway.url}{path}", json=body, timeout=30)


def test_classify_returns_label_score_top_k_and_the_serving_version(gateway: Gateway) -> None:
    response = _post(gateway, f"/v1/models/{INTENT}:classify", {"texts": TEXTS, "top_k": 2})

    assert response.status_code == 200, response.text
    body = ClassifyResponse.model_validate(response.json())
    assert body.model.name == INTENT and body.model.version == 2  # newest AVAILABLE
    assert len(body.predictions) == len(TEXTS)
    for item in body.predictions:
        assert item.label in {"negative", "neutral", "positive"}
        assert item.top_k[0].label == item.label and len(item.top_k) == 2
        assert item.top_k[0].score >= item.top_k[1].score and not item.truncated


def test_classify_can_return_logits(gateway: Gateway) -> None:
    body = _post(
        gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hello"], "return_logits": True}
    ).json()

    assert len(body["predictions"][0]["logits"]) == 3


def test_embed_returns_unit_vectors_unless_told_not_to(gateway: Gateway) -> None:
    normalized = _post(gateway, f"/v1/models/{EMBED}:embed", {"texts": TEXTS}).json()
    raw = _post(gateway, f"/v1/models/{EMBED}:embed", {"texts": TEXTS, "normalize": False}).json()

    body = EmbedResponse.model_validate(normalized)
    vectors = np.asarray(body.embeddings)
    assert body.model.version == 1 and body.dim == 32 and vectors.shape == (4, 32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    raw_vectors = np.asarray(raw["embeddings"])
    np.testing.assert_allclose(
        raw_vectors / np.linalg.norm(raw_vectors, axis=1, keepdims=True), vectors, atol=1e-6
    )


@pytest.mark.parametrize(
    ("selector", "version"),
    [({"version": 1}, 1), ({"version": 2}, 2), ({"label": "stable"}, 1), ({"label": "canary"}, 2)],
)
def test_version_and_label_pick_the_serving_version(
    gateway: Gateway, selector: dict[str, object], version: int
) -> None:
    body = _post(gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hi"], **selector}).json()

    assert body["model"] == {"name": INTENT, "version": version}


def test_each_version_is_tokenized_with_its_own_vocabulary(
    gateway: Gateway, modelserver: ModelServer, model_base: Path
) -> None:
    text = "my card was charged twice"
    vocabs = {v: model_base / INTENT / str(v) / "assets" / "vocab.txt" for v in (1, 2)}
    for version, other in ((1, 2), (2, 1)):
        body = _post(
            gateway,
            f"/v1/models/{INTENT}:classify",
            {"texts": [text], "version": version, "top_k": 3},
        ).json()
        got = {t["label"]: t["score"] for t in body["predictions"][0]["top_k"]}
        scores = np.array([got["negative"], got["neutral"], got["positive"]])

        own_ids = _direct_probabilities(modelserver, version, vocabs[version], text)
        other_ids = _direct_probabilities(modelserver, version, vocabs[other], text)
        # The gateway matches the model run on this version's own ids, not the other vocabulary's.
        np.testing.assert_allclose(scores, own_ids, rtol=1e-5)
        assert not np.allclose(scores, other_ids, rtol=1e-3)


def _direct_probabilities(server: ModelServer, version: int, vocab: Path, text: str) -> np.ndarray:
    """Return the modelserver's probabilities for ``text`` tokenized with ``vocab`` (no gateway)."""
    [encoded] = BertTokenizer.from_files(vocab, max_seq_len=64).encode([text])
    ids = encoded.ids.tolist()
    body = {
        "inputs": {
            "input_ids": [ids],
            "attention_mask": [[1] * len(ids)],
            "token_type_ids": [[0] * len(ids)],
        }
    }
    reply = requests.post(
        f"{server.rest_url}/v1/models/{INTENT}/versions/{version}:predict", json=body, timeout=30
    ).json()
    return np.asarray(reply["outputs"]["probabilities"][0])


def test_texts_come_back_in_caller_order_across_chunks(gateway: Gateway) -> None:
    # 11 texts of mixed length, GATEWAY_MAX_BATCH=4: several chunks, sorted and reassembled.
    texts = [("hello " * n).strip() for n in (9, 1, 30, 2, 5, 1, 14, 3, 22, 7, 1)]

    batch = _post(gateway, f"/v1/models/{EMBED}:embed", {"texts": texts}).json()["embeddings"]
    single = [
        _post(gateway, f"/v1/models/{EMBED}:embed", {"texts": [t]}).json()["embeddings"][0]
        for t in texts
    ]

    np.testing.assert_allclose(np.asarray(batch), np.asarray(single), atol=2e-5)


def test_long_texts_are_truncated_and_reported(gateway: Gateway) -> None:
    body = _post(gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hi", LONG]}).json()

    assert [p["truncated"] for p in body["predictions"]] == [False, True]


def test_truncate_false_turns_a_long_text_into_422(gateway: Gateway) -> None:
    response = _post(
        gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hi", LONG], "truncate": False}
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "text_too_long"
    assert "texts[1]" in response.json()["error"]["message"]


def test_model_status_lists_versions_states_and_labels(gateway: Gateway) -> None:
    response = requests.get(f"{gateway.url}/v1/models/{INTENT}", timeout=10)

    body = ModelStatusResponse.model_validate(response.json())
    assert {(v.version, v.state) for v in body.versions} == {(1, "AVAILABLE"), (2, "AVAILABLE")}
    assert body.labels == {"stable": 1, "canary": 2} and body.default_version == 2


def test_readyz_is_200_when_the_default_model_is_available(gateway: Gateway) -> None:
    response = requests.get(f"{gateway.url}/readyz", timeout=10)

    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["model"], body["version"]) == ("ready", INTENT, 2)
    assert body["models"][INTENT] == 2  # with every model of the config, on the first answer


def test_metrics_count_requests_by_route_model_version_and_status(gateway: Gateway) -> None:
    for _ in range(4):  # gunicorn spreads these over both workers
        _post(gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hi"], "version": 1})

    text = requests.get(f"{gateway.url}/metrics", timeout=10).text

    line = next(
        line
        for line in text.splitlines()
        if line.startswith("gateway_requests_total{")
        and f'model="{INTENT}"' in line
        and 'version="1"' in line
        and 'status="200"' in line
    )
    assert float(line.rsplit(" ", 1)[1]) >= 4
    for stage in timing.STAGES:
        assert f'gateway_stage_duration_seconds_count{{stage="{stage}"}}' in text
    assert "gateway_texts_per_request_bucket" in text
    assert "gateway_tokens_per_request_bucket" in text
    assert "gateway_request_duration_seconds_bucket" in text


def test_workers_never_import_tensorflow(gateway: Gateway) -> None:
    for _ in range(6):
        _post(gateway, f"/v1/models/{INTENT}:classify", {"texts": ["hi"]})
        _post(gateway, f"/v1/models/{EMBED}:embed", {"texts": ["hi"]})
    seen = {}
    for _ in range(20):  # keep-alive off: new connections reach both workers
        reply = requests.get(
            f"{gateway.url}/debug/modules", timeout=10, headers={"Connection": "close"}
        ).json()
        seen[reply["pid"]] = reply["tensorflow"]

    assert seen and all(modules == [] for modules in seen.values()), seen


def _check(schema: dict[str, Any], value: object, doc: dict[str, Any], where: str = "$") -> None:
    """Assert ``value`` fits ``schema`` (the JSON Schema subset pydantic emits)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return _check(doc["components"]["schemas"][name], value, doc, where)
    if "anyOf" in schema:
        failures = []
        for option in schema["anyOf"]:
            try:
                return _check(option, value, doc, where)
            except AssertionError as exc:
                failures.append(str(exc))
        raise AssertionError(f"{where}: no anyOf option fits: {failures}")
    kinds = {
        "object": dict, "array": list, "string": str, "boolean": bool,
        "integer": int, "number": (int, float), "null": type(None),
    }  # fmt: skip
    kind = schema.get("type")
    if kind is not None:
        assert isinstance(value, kinds[kind]), f"{where}: {value!r} is not {kind}"
        assert not (kind in ("integer", "number") and isinstance(value, bool)), where
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{where}: missing {key}"
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                _check(properties[key], item, doc, f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                _check(schema["additionalProperties"], item, doc, f"{where}.{key}")
            else:
                assert schema.get("additionalProperties", True) is not False, f"{where}.{key}"
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            _check(schema["items"], item, doc, f"{where}[{index}]")
    return None


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("post", f"/v1/models/{INTENT}:classify", {"texts": TEXTS, "top_k": 2}, "200"),
        ("post", f"/v1/models/{INTENT}:classify", {"texts": ["a"], "return_logits": True}, "200"),
        ("post", f"/v1/models/{EMBED}:embed", {"texts": TEXTS}, "200"),
        ("post", f"/v1/models/{EXITS}:classify", {"texts": TEXTS, "speed": 0.5}, "200"),
        ("post", f"/v1/models/{EXITS}:classify", {"texts": TEXTS, "speed": [0, 1, 1, 0.5]}, "200"),
        ("post", f"/v1/models/{INTENT}:classify", {"texts": ["a"], "speed": 1}, "200"),
        ("post", f"/v1/models/{EXITS}:classify", {"texts": ["a"], "speed": "1"}, "422"),
        ("get", f"/v1/models/{INTENT}", None, "200"),
        ("get", "/healthz", None, "200"),
        ("get", "/readyz", None, "200"),
        ("post", f"/v1/models/{INTENT}:classify", {"texts": []}, "422"),
        ("post", f"/v1/models/{INTENT}:classify", {"texts": ["a"], "label": "zz"}, "404"),
        ("post", f"/v1/models/{INTENT}:classify", {"texts": ["a"], "top_k": "x"}, "400"),
        ("post", f"/v1/models/{EMBED}:embed", {"texts": ["a"] * 65}, "413"),
    ],
)
def test_responses_match_the_openapi_document(
    gateway: Gateway, method: str, path: str, body: object, status: str
) -> None:
    doc = requests.get(f"{gateway.url}/openapi.json", timeout=10).json()
    template = path if path.startswith("/healthz") or path.startswith("/readyz") else None
    if template is None:
        template = path.replace(INTENT, "{model}").replace(EMBED, "{model}")
        template = template.replace(EXITS, "{model}")

    response = requests.request(method, f"{gateway.url}{path}", json=body, timeout=30)

    assert str(response.status_code) == status, response.text
    operation = doc["paths"][template][method]
    schema = operation["responses"][status]["content"]["application/json"]["schema"]
    _check(schema, response.json(), doc)
    if body is not None:
        request_schema = operation["requestBody"]["content"]["application/json"]["schema"]
        if status == "200":
            _check(request_schema, body, doc)


def test_the_schema_check_rejects_wrong_shapes(gateway: Gateway) -> None:
    doc = requests.get(f"{gateway.url}/openapi.json", timeout=10).json()
    ref = {"$ref": "#/components/schemas/ClassifyResponse"}
    good = {"model": {"name": "m", "version": 1}, "predictions": []}

    _check(ref, good, doc)
    for bad in (
        {"model": {"name": "m"}, "predictions": []},
        {"model": {"name": "m", "version": "1"}, "predictions": []},
        {"model": {"name": "m", "version": 1}, "predictions": [{"label": "x"}]},
    ):
        with pytest.raises(AssertionError):
            _check(ref, bad, doc)


def test_access_log_lines_are_json(gateway: Gateway) -> None:
    requests.get(f"{gateway.url}/healthz", headers={"X-Request-Id": "abc-123"}, timeout=10)

    mine: list[dict[str, Any]] = []
    deadline = time.monotonic() + 10
    while not mine and time.monotonic() < deadline:  # gunicorn logs after sending the response
        time.sleep(0.1)
        lines = gateway.process.tail(400).split("\n")
        records = [json.loads(line) for line in lines if line.startswith("{")]
        mine = [r for r in records if r.get("request_id") == "abc-123"]

    assert mine and mine[-1]["path"] == "/healthz" and mine[-1]["status"] == 200
    assert {"ts", "method", "duration_ms", "bytes", "pid"} <= set(mine[-1])


def test_concurrent_requests_get_the_same_answers_as_sequential_ones(gateway: Gateway) -> None:
    from concurrent.futures import ThreadPoolExecutor

    calls = [
        (f"/v1/models/{INTENT}:classify", {"texts": TEXTS[i % 4 :], "version": 1 + i % 2})
        for i in range(12)
    ] + [(f"/v1/models/{EMBED}:embed", {"texts": TEXTS[: 1 + i % 4]}) for i in range(12)]
    sequential = [_post(gateway, path, body).json() for path, body in calls]

    with ThreadPoolExecutor(max_workers=12) as pool:
        concurrent = list(pool.map(lambda call: _post(gateway, *call).json(), calls * 2))

    for got, want in zip(concurrent, sequential * 2, strict=True):
        assert got["model"] == want["model"]
        if "embeddings" in want:
            np.testing.assert_allclose(got["embeddings"], want["embeddings"], atol=1e-6)
        else:
            assert [p["label"] for p in got["predictions"]] == [
                p["label"] for p in want["predictions"]
            ]
