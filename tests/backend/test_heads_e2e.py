"""Every head through a real model server and gunicorn gateways (issue 22), against transformers.

One module-scoped stack exports (export.build.build, as `python -m export` does) and serves five
tiny heads, each described by its own checkpoint's config.json as finetune writes it: a
sentence-pair classifier (irrelevant / relevant), a one-logit cross-encoder (sigmoid score), a
multi-label classifier (per-label thresholds), a BIO token classifier and a single-text
classifier. Two gateways, one over gRPC and one over REST, sit in front of the one model server;
the parity tests run through both. The Hugging Face checkpoints are kept, and transformers (torch,
test-only, local files only) loads them as the numerical reference: logits within 1e-4, and for
the tagger the entities of pipeline("token-classification") under every aggregation strategy.
"""

from __future__ import annotations

import functools
import multiprocessing
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from backend.tagging import STRATEGIES
from tests.backend.golden import Case, check, recording
from tests.backend.heads_reference import (
    LONG,
    TAG_TEXTS,
    assert_same_entities,
    hf_tokenizer,
    reference_entities,
    token_pipeline,
)
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config

PAIR, CROSS, MULTI, TAGGER, SINGLE = (
    "tiny-pairs", "tiny-cross", "tiny-multi", "tiny-tagger", "tiny-single",
)  # fmt: skip
MAX_LEN = 32
# The gateway's :tag windows overlap by a quarter of a window (backend/service.py Gateway.tag):
# the pipeline's ``stride`` that makes the same chunks.
STRIDE = (MAX_LEN - 2) // 4
TRANSPORTS = ("grpc", "rest")
PAIR_LABELS = ("irrelevant", "relevant")
MULTI_LABELS = ("billing", "shipping", "account", "urgent")
THRESHOLDS = {"billing": 0.3, "shipping": 0.7, "account": 0.5, "urgent": 0.45}
# write_hf_checkpoint's arguments per head: what its config.json says (no model.json edits).
HEADS: dict[str, dict[str, Any]] = {
    PAIR: {"labels": PAIR_LABELS, "text_pair": True, "seed": 11},
    # as cross-encoder checkpoints have it: one logit, no problem_type, a placeholder label
    CROSS: {"labels": ("LABEL_0",), "text_pair": True, "seed": 13},
    MULTI: {"labels": MULTI_LABELS, "problem_type": "multi_label_classification",
            "thresholds": THRESHOLDS, "seed": 14},
    TAGGER: {"task": "tag", "seed": 15},
    SINGLE: {"seed": 12},
}  # fmt: skip
PAIRS = [
    ["where is my order", "your package ships in two days"],
    ["Thé órder 我的订单还没到", "hello 😀 refund refunding"],  # accents, CJK, emoji
    ["help", " ".join(["refund money"] * 30)],  # the second segment cut
    [" ".join(["card"] * 20), " ".join(["order"] * 20)],  # both cut, the longer first
]
TEXTS = [
    "my card was charged twice",
    "Thé pâckage never arrived 😀",
    "我的订单还没到 please help",
    " ".join(["refund the money for my cancelled subscription"] * 8),  # cut at max_seq_len
]


def _export(checkpoints: dict[str, Path], base: Path) -> None:
    """Export every head to ``base`` as version 1 (run in a child process, see ``stack``)."""
    from export.build import build

    for name, checkpoint in checkpoints.items():
        build(checkpoint, name, base, version=1, task=HEADS[name].get("task", "classify"),
              max_seq_len=MAX_LEN, warmup=False)  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return {gateways: {transport: Gateway}, checkpoints}: the tiny heads exported, served by
    one model server, behind a gRPC and a REST gateway."""
    from export.tiny import write_hf_checkpoint

    root = tmp_path_factory.mktemp("heads")
    base = root / "models"
    checkpoints = {name: write_hf_checkpoint(root / name, **head) for name, head in HEADS.items()}
    # TensorFlow exports in a child while torch loads the references here: on two cores the
    # two take about as long as the exports alone (and torch and TF never share a process).
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        exported = pool.submit(_export, checkpoints, base)
        _load_references(checkpoints)
        exported.result()
    config = root / "models.config"
    config.write_text(model_config(base, {}, list(HEADS)), encoding="utf-8")
    logs = root / "logs"
    logs.mkdir()
    server = ModelServer(config, logs)
    gateways: dict[str, Gateway] = {}
    try:
        for name in HEADS:
            server.wait_available(name, 1)
        with ThreadPoolExecutor(len(TRANSPORTS)) as starting:  # both gateways start at once
            started = {
                transport: starting.submit(
                    Gateway, gateway_env(server, transport, base, config), logs, workers=1
                )
                for transport in TRANSPORTS
            }
        gateways = {t: f.result() for t, f in started.items() if f.exception() is None}
        for future in started.values():
            future.result()  # raises a gateway's failure to start (the others are stopped below)
        yield {"gateways": gateways, "checkpoints": checkpoints}
    finally:
        for gateway in gateways.values():
            gateway.stop()
        server.stop()


@pytest.fixture(params=TRANSPORTS)
def url(request: pytest.FixtureRequest, stack: dict[str, Any]) -> str:
    """Return the base URL of the gRPC gateway, then of the REST one."""
    return str(stack["gateways"][request.param].url)


def _post(url: str, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{url}{path}", json=body, timeout=60)


def _grpc(stack: dict[str, Any]) -> str:
    return str(stack["gateways"]["grpc"].url)


# -- the reference: transformers on the same checkpoints --------------------------------------


@functools.cache
def _sequence_classifier(checkpoint: Path) -> Any:
    from transformers import BertForSequenceClassification

    model = BertForSequenceClassification.from_pretrained(str(checkpoint), local_files_only=True)
    return model.eval()


@functools.cache
def _token_classifier(checkpoint: Path) -> Any:
    from transformers import BertForTokenClassification

    return BertForTokenClassification.from_pretrained(str(checkpoint), local_files_only=True).eval()


def _load_references(checkpoints: dict[str, Path]) -> None:
    """Load transformers' model of every checkpoint (and the tagger's pipelines) into the caches."""
    for name, checkpoint in checkpoints.items():
        if HEADS[name].get("task") == "tag":
            for strategy in STRATEGIES:
                _pipeline(checkpoint, strategy)
        else:
            _sequence_classifier(checkpoint)


def _reference_logits(checkpoint: Path, inputs: list[str] | list[list[str]]) -> np.ndarray:
    """Return transformers' logits of ``inputs`` (texts, or [a, b] pairs cut longest-first)."""
    import torch

    tokenizer = hf_tokenizer(checkpoint / "vocab.txt", MAX_LEN)
    if isinstance(inputs[0], list):
        batch = tokenizer([a for a, _ in inputs], [b for _, b in inputs], truncation=True,
                          padding=True, return_tensors="pt")  # fmt: skip
    else:
        batch = tokenizer(inputs, truncation=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        return _sequence_classifier(checkpoint)(**batch).logits.numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


@functools.cache
def _pipeline(checkpoint: Path, strategy: str) -> Any:
    return token_pipeline(_token_classifier(checkpoint),
                          hf_tokenizer(checkpoint / "vocab.txt", MAX_LEN), strategy)  # fmt: skip


def _pipeline_entities(
    stack: dict[str, Any], text: str, strategy: str, stride: int | None = None
) -> list[dict]:
    """Return transformers' pipeline entities of ``text`` in the gateway's shape."""
    return _entities(stack["checkpoints"][TAGGER], text, strategy, stride)


@functools.cache  # each transport's test asks for the same answer
def _entities(checkpoint: Path, text: str, strategy: str, stride: int | None) -> list[dict]:
    pipe = _pipeline(checkpoint, strategy)
    found = pipe(text) if stride is None else pipe(text, stride=stride)
    return reference_entities(found, text, strategy)


# -- sentence pairs ---------------------------------------------------------------------------


def test_pair_logits_match_transformers_on_the_same_pairs(url: str, stack: dict[str, Any]) -> None:
    response = _post(url, f"/v1/models/{PAIR}:classify",
                     {"pairs": PAIRS, "return_logits": True, "top_k": 2})  # fmt: skip

    assert response.status_code == 200, response.text
    got = np.asarray([p["logits"] for p in response.json()["predictions"]])
    want = _reference_logits(stack["checkpoints"][PAIR], PAIRS)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert [p["truncated"] for p in response.json()["predictions"]] == [False, False, True, True]
    # both texts of each pair were tokenized
    characters = sum(len(a) + len(b) for a, b in PAIRS)
    assert int(response.headers["x-compute-characters"]) == characters


def test_a_one_logit_cross_encoder_scores_the_sigmoid_of_transformers_logit(
    url: str, stack: dict[str, Any]
) -> None:
    response = _post(url, f"/v1/models/{CROSS}:classify", {"pairs": PAIRS, "return_logits": True})

    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    want = _reference_logits(stack["checkpoints"][CROSS], PAIRS)
    assert want.shape == (len(PAIRS), 1)
    np.testing.assert_allclose([p["logits"] for p in predictions], want, atol=1e-4, rtol=0)
    np.testing.assert_allclose([p["score"] for p in predictions], _sigmoid(want[:, 0]), atol=1e-5)


def test_the_segments_order_matters(stack: dict[str, Any]) -> None:
    """token_type_ids reach the model: (a, b) and (b, a) are different inputs."""
    pair = ["where is my order", "your package ships in two days"]
    body = {"pairs": [pair, pair[::-1]], "return_logits": True}

    logits = [p["logits"] for p in _post(_grpc(stack), f"/v1/models/{PAIR}:classify", body).json()[
        "predictions"]]  # fmt: skip

    assert not np.allclose(logits[0], logits[1], atol=1e-3)


# -- multi-label ------------------------------------------------------------------------------


def test_multi_label_logits_match_and_every_label_over_its_threshold_is_answered(
    url: str, stack: dict[str, Any]
) -> None:
    response = _post(url, f"/v1/models/{MULTI}:classify", {"texts": TEXTS, "return_logits": True})

    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    want = _reference_logits(stack["checkpoints"][MULTI], TEXTS)
    np.testing.assert_allclose([p["logits"] for p in predictions], want, atol=1e-4, rtol=0)
    probabilities = _sigmoid(want)
    for prediction, row in zip(predictions, probabilities, strict=True):
        over = [i for i, label in enumerate(MULTI_LABELS) if row[i] >= THRESHOLDS[label]]
        over.sort(key=lambda i: -row[i])
        assert [x["label"] for x in prediction["labels"]] == [MULTI_LABELS[i] for i in over]
        assert [x["score"] for x in prediction["labels"]] == pytest.approx(row[over], abs=1e-5)
    assert max(len(p["labels"]) for p in predictions) >= 2  # several labels for one text
    # the model's own thresholds decided: a plain 0.5 cut would answer otherwise
    assert [{x["label"] for x in p["labels"]} for p in predictions] != [
        {label for label, q in zip(MULTI_LABELS, row, strict=True) if q >= 0.5}
        for row in probabilities
    ]
    assert [p["truncated"] for p in predictions] == [False, False, False, True]


# -- token classification ---------------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_tag_entities_match_the_transformers_pipeline(
    url: str, stack: dict[str, Any], strategy: str
) -> None:
    response = _post(url, f"/v1/models/{TAGGER}:tag",
                     {"texts": TAG_TEXTS, "aggregation": strategy})  # fmt: skip

    assert response.status_code == 200, response.text
    assert response.json()["aggregation"] == strategy
    predictions = response.json()["predictions"]
    for text, prediction in zip(TAG_TEXTS, predictions, strict=True):
        assert (prediction["truncated"], prediction["windows"]) == (False, 1)
        assert_same_entities(prediction["entities"], _pipeline_entities(stack, text, strategy),
                             atol=1e-4)  # fmt: skip
    assert any(p["entities"] for p in predictions)  # the tagger does find entities


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "none"])
def test_a_long_text_is_tagged_in_windows_as_the_pipeline_does_with_stride(
    url: str, stack: dict[str, Any], strategy: str
) -> None:
    """The pipeline refuses stride with aggregation 'none': there is no reference for it."""
    response = _post(url, f"/v1/models/{TAGGER}:tag", {"texts": [LONG], "aggregation": strategy})

    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    assert prediction["windows"] > 3 and not prediction["truncated"]
    want = _pipeline_entities(stack, LONG, strategy, stride=STRIDE)
    assert_same_entities(prediction["entities"], want, atol=1e-4)
    assert want and want[-1]["end"] > len(LONG) // 2  # entities past the first window


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_truncated_tagging_matches_the_pipeline_without_stride(
    url: str, stack: dict[str, Any], strategy: str
) -> None:
    body = {"texts": [LONG], "aggregation": strategy, "long_text": "truncate"}

    response = _post(url, f"/v1/models/{TAGGER}:tag", body)

    assert response.status_code == 200, response.text
    (prediction,) = response.json()["predictions"]
    assert (prediction["truncated"], prediction["windows"]) == (True, 1)
    want = _pipeline_entities(stack, LONG, strategy)
    assert_same_entities(prediction["entities"], want, atol=1e-4)


# -- bad input --------------------------------------------------------------------------------

FILLS = " ".join(["card"] * 40)  # 40 tokens: more than max_seq_len alone


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "says"),
    [
        # pairs to a single-text model, texts to a pair model
        (f"{SINGLE}:classify", {"pairs": [["a", "b"]]}, 422, "task_mismatch",
         "single-text classifier"),
        (f"{MULTI}:classify", {"pairs": [["a", "b"]]}, 422, "task_mismatch",
         "single-text multi-label classifier"),
        (f"{PAIR}:classify", {"texts": ["hello"]}, 422, "task_mismatch",
         "sentence-pair classifier"),
        (f"{CROSS}:classify", {"texts": ["hello"]}, 422, "task_mismatch",
         "sentence-pair classifier"),
        # a tag request to a classifier, a classify request to a tagger
        (f"{SINGLE}:tag", {"texts": ["hello"]}, 422, "task_mismatch", "single-text classifier"),
        (f"{PAIR}:tag", {"texts": ["hello"]}, 422, "task_mismatch", "sentence-pair classifier"),
        (f"{TAGGER}:classify", {"texts": ["hello"]}, 422, "task_mismatch",
         "token-classification (tag) model"),
        # empty segments and texts
        (f"{PAIR}:classify", {"pairs": [["hello", " "]]}, 422, "unprocessable",
         "pairs[0][1] is empty"),
        (f"{PAIR}:classify", {"pairs": [["ok", "b"], ["", "b"]]}, 422, "unprocessable",
         "pairs[1][0] is empty"),
        (f"{TAGGER}:tag", {"texts": ["hello", "\t"]}, 422, "unprocessable", "texts[1] is empty"),
        # malformed pairs
        (f"{PAIR}:classify", {"pairs": [["hello"]]}, 400, "bad_request", "two texts"),
        (f"{PAIR}:classify", {"pairs": [["a", "b"]], "texts": ["a"]}, 400, "bad_request",
         "not both"),
        # a first segment that alone fills max_seq_len; a pair over it with truncate off
        (f"{PAIR}:classify", {"pairs": [[FILLS, "b"]]}, 422, "text_too_long",
         "pairs[0][0] alone needs 42 tokens"),
        (f"{CROSS}:classify", {"pairs": [["a", "b"], [FILLS, "b"]]}, 422, "text_too_long",
         "pairs[1][0] alone needs 42 tokens"),
        (f"{PAIR}:classify", {"pairs": [["a", FILLS]], "truncate": False}, 422,
         "text_too_long", "pairs[0] needs"),
        # options of the wrong route or value
        (f"{SINGLE}:classify", {"texts": ["hello"], "aggregation": "simple"}, 400,
         "bad_request", "unknown"),
        (f"{TAGGER}:tag", {"texts": ["hello"], "aggregation": "longest"}, 400, "bad_request",
         "aggregation"),
        (f"{TAGGER}:tag", {"texts": ["hello"], "long_text": "chunk"}, 400, "bad_request",
         "long_text"),
        (f"{TAGGER}:tag", {"texts": ["hello"], "truncate": False}, 400, "bad_request",
         "truncate"),
    ],
)  # fmt: skip
def test_bad_head_requests_get_a_clear_json_error(
    stack: dict[str, Any], path: str, body: dict, status: int, code: str, says: str
) -> None:
    response = _post(_grpc(stack), f"/v1/models/{path}", body)

    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert says in response.json()["error"]["message"]


# -- cross-encoder rerank ---------------------------------------------------------------------

QUERY = "where is my order"
DOCUMENTS = ["your package ships in two days", "reset the password", "我的订单还没到",
             "refund " * 25, "Thé órder 😀"]  # fmt: skip


def _relevance(stack: dict[str, Any], model: str) -> np.ndarray:
    logits = _reference_logits(stack["checkpoints"][model], [[QUERY, d] for d in DOCUMENTS])
    if logits.shape[1] == 1:  # one logit: its sigmoid
        return _sigmoid(logits[:, 0])
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True))[:, PAIR_LABELS.index("relevant")]


@pytest.mark.parametrize("model", [PAIR, CROSS])
@pytest.mark.parametrize("route", ["model", "/v1/rerank", "/v2/rerank"])
def test_a_cross_encoder_reranks_by_its_relevance_score(
    url: str, stack: dict[str, Any], model: str, route: str
) -> None:
    body: dict[str, Any] = {"query": QUERY, "documents": DOCUMENTS}
    path = f"/v1/models/{model}:rerank" if route == "model" else route
    if route != "model":
        body["model"] = model

    response = _post(url, path, body)

    assert response.status_code == 200, response.text
    # what was tokenized: the query again beside each document
    characters = len(QUERY) * len(DOCUMENTS) + sum(map(len, DOCUMENTS))
    assert int(response.headers["x-compute-characters"]) == characters
    results = response.json()["results"]
    want = _relevance(stack, model)
    assert [r["index"] for r in results] == np.argsort(-want, kind="stable").tolist()
    got = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
    np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    ("path", "error"),
    [(f"/v1/models/{SINGLE}:rerank", lambda j: j["error"]), ("/v1/rerank", lambda j: j)],
)
def test_a_single_text_classifier_cannot_rerank(
    stack: dict[str, Any], path: str, error: Any
) -> None:
    body = {"query": QUERY, "documents": DOCUMENTS, "model": SINGLE}
    if path.startswith("/v1/models"):
        del body["model"]

    response = _post(_grpc(stack), path, body)

    assert response.status_code == 422
    assert error(response.json())["code"] == "task_mismatch"
    assert "cross-encoder" in error(response.json())["message"]


def test_a_query_that_fills_max_seq_len_is_a_clear_422(stack: dict[str, Any]) -> None:
    body = {"query": FILLS, "documents": ["a"]}

    response = _post(_grpc(stack), f"/v1/models/{PAIR}:rerank", body)

    assert response.status_code == 422
    assert "query alone fills max_seq_len" in response.json()["error"]["message"]


# -- golden answers (tests/backend/golden.py; the other routes: test_golden.py) ----------------

GOLDEN = [
    Case("heads-pairs", f"/v1/models/{PAIR}:classify",
         {"pairs": PAIRS, "top_k": 2, "return_scores": True, "return_logits": True}),
    Case("heads-cross", f"/v1/models/{CROSS}:classify", {"pairs": PAIRS, "return_logits": True}),
    Case("heads-multi-label", f"/v1/models/{MULTI}:classify",
         {"texts": TEXTS, "return_scores": True, "return_logits": True}),
    Case("heads-single", f"/v1/models/{SINGLE}:classify", {"texts": TEXTS, "top_k": 3}),
    Case("heads-rerank-cross", f"/v1/models/{CROSS}:rerank",
         {"query": "where is my order", "documents": [b for _, b in PAIRS],
          "return_documents": True}),
    Case("heads-rerank-pairs", "/v2/rerank",
         {"model": PAIR, "query": "refund", "documents": TEXTS, "top_n": 3}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "transport"),
    [(case, transport) for case in GOLDEN for transport in TRANSPORTS],
    ids=[f"{case.name}-{transport}" for case in GOLDEN for transport in TRANSPORTS],
)
def test_answers_match_the_golden_files(stack: dict[str, Any], case: Case, transport: str) -> None:
    check(stack["gateways"][transport].url, case, record=recording() and transport == "grpc")
