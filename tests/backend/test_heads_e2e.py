"""Every head through a real gunicorn gateway and model server (issue 22), against transformers.

One module-scoped stack serves several tiny exported heads at once: a sentence-pair classifier
(cross-encoder: irrelevant / relevant), a single-text classifier, and (with export's tag head) a
token classifier. The Hugging Face checkpoints they were exported from are kept, and torch
(test-only) loads them with transformers as the numerical reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config

PAIR, SINGLE = "tiny-pairs", "tiny-single"
MAX_LEN = 32
PAIR_LABELS = ("irrelevant", "relevant")
PAIRS = [
    ["where is my order", "your package ships in two days"],
    ["Thé órder 我的订单还没到", "hello 😀 refund refunding"],  # accents, CJK, emoji
    ["help", " ".join(["refund money"] * 30)],  # the second segment cut
    [" ".join(["card"] * 20), " ".join(["order"] * 20)],  # both cut, the longer first
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return {gateway, checkpoints}: the tiny heads exported, served, behind one gateway."""
    import json

    from export.build import build
    from export.tiny import write_hf_checkpoint

    root = tmp_path_factory.mktemp("heads")
    base, checkpoints = root / "models", {}
    checkpoints[PAIR] = write_hf_checkpoint(root / PAIR, labels=PAIR_LABELS, seed=11)
    checkpoints[SINGLE] = write_hf_checkpoint(root / SINGLE, seed=12)
    for name in (PAIR, SINGLE):
        build(checkpoints[name], name, base, version=1, task="classify", max_seq_len=MAX_LEN,
              warmup=False)  # fmt: skip
    info_path = base / PAIR / "1" / "assets" / "model.json"
    info = json.loads(info_path.read_text(encoding="utf-8"))
    info["text_pair"] = True  # what export writes for a pair head: its inputs don't change
    info_path.write_text(json.dumps(info), encoding="utf-8")
    config = root / "models.config"
    config.write_text(model_config(base, {}, [PAIR, SINGLE]), encoding="utf-8")
    logs = root / "logs"
    logs.mkdir()
    server = ModelServer(config, logs)
    gateway = None
    try:
        for name in (PAIR, SINGLE):
            server.wait_available(name, 1)
        gateway = Gateway(gateway_env(server, "grpc", base, config), logs)
        yield {"gateway": gateway, "checkpoints": checkpoints}
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


def _post(stack: dict[str, Any], path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{stack['gateway'].url}{path}", json=body, timeout=60)


def _reference_logits(checkpoint: Path, pairs: list[list[str]]) -> np.ndarray:
    import torch
    from transformers import BertForSequenceClassification, BertTokenizerFast

    tokenizer = BertTokenizerFast(str(checkpoint / "vocab.txt"), do_lower_case=True)
    ckpt = str(checkpoint)
    model = BertForSequenceClassification.from_pretrained(ckpt, local_files_only=True).eval()
    batch = tokenizer([a for a, _ in pairs], [b for _, b in pairs], truncation=True,
                      max_length=MAX_LEN, padding=True, return_tensors="pt")  # fmt: skip
    with torch.no_grad():
        return model(**batch).logits.numpy()


# -- sentence pairs ---------------------------------------------------------------------------


def test_pair_logits_match_transformers_on_the_same_pairs(stack: dict[str, Any]) -> None:
    response = _post(stack, f"/v1/models/{PAIR}:classify",
                     {"pairs": PAIRS, "return_logits": True, "top_k": 2})  # fmt: skip

    assert response.status_code == 200, response.text
    got = np.asarray([p["logits"] for p in response.json()["predictions"]])
    want = _reference_logits(stack["checkpoints"][PAIR], PAIRS)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert [p["truncated"] for p in response.json()["predictions"]] == [False, False, True, True]


def test_the_segments_order_matters(stack: dict[str, Any]) -> None:
    """token_type_ids reach the model: (a, b) and (b, a) are different inputs."""
    pair = ["where is my order", "your package ships in two days"]
    body = {"pairs": [pair, pair[::-1]], "return_logits": True}

    logits = [p["logits"] for p in _post(stack, f"/v1/models/{PAIR}:classify", body).json()[
        "predictions"]]  # fmt: skip

    assert not np.allclose(logits[0], logits[1], atol=1e-3)


@pytest.mark.parametrize(
    ("model", "body", "status", "code", "says"),
    [
        (PAIR, {"texts": ["hello"]}, 422, "task_mismatch", "sentence-pair classifier"),
        (SINGLE, {"pairs": [["a", "b"]]}, 422, "task_mismatch", "single-text classifier"),
        (PAIR, {"pairs": [["hello", " "]]}, 422, "unprocessable", "pairs[0][1] is empty"),
        (PAIR, {"pairs": [["hello"]]}, 400, "bad_request", "two texts"),
        (PAIR, {"pairs": [["a", "b"]], "texts": ["a"]}, 400, "bad_request", "not both"),
        (PAIR, {"pairs": [[" ".join(["card"] * 40), "b"]]}, 422, "text_too_long",
         "alone needs 42 tokens"),
        (PAIR, {"pairs": [["a", " ".join(["card"] * 40)]], "truncate": False}, 422,
         "text_too_long", "pairs[0] needs"),
        (SINGLE, {"texts": ["hello"], "aggregation": "simple"}, 400, "bad_request", "unknown"),
    ],
)  # fmt: skip
def test_bad_pair_requests_get_a_clear_error(
    stack: dict[str, Any], model: str, body: dict, status: int, code: str, says: str
) -> None:
    response = _post(stack, f"/v1/models/{model}:classify", body)

    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert says in response.json()["error"]["message"]


def test_a_tag_request_to_a_classifier_is_a_422_naming_its_task(stack: dict[str, Any]) -> None:
    response = _post(stack, f"/v1/models/{SINGLE}:tag", {"texts": ["hello"]})

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "task_mismatch"
    assert "single-text classifier" in response.json()["error"]["message"]


# -- cross-encoder rerank ---------------------------------------------------------------------

QUERY = "where is my order"
DOCUMENTS = ["your package ships in two days", "reset the password", "我的订单还没到",
             "refund " * 25, "Thé órder 😀"]  # fmt: skip


def _relevance(stack: dict[str, Any]) -> np.ndarray:
    logits = _reference_logits(stack["checkpoints"][PAIR], [[QUERY, d] for d in DOCUMENTS])
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True))[:, PAIR_LABELS.index("relevant")]


@pytest.mark.parametrize("path", [f"/v1/models/{PAIR}:rerank", "/v1/rerank", "/v2/rerank"])
def test_a_cross_encoder_reranks_by_the_relevant_labels_probability(
    stack: dict[str, Any], path: str
) -> None:
    body: dict[str, Any] = {"query": QUERY, "documents": DOCUMENTS}
    if not path.startswith("/v1/models"):
        body["model"] = PAIR

    response = _post(stack, path, body)

    assert response.status_code == 200, response.text
    results = response.json()["results"]
    want = _relevance(stack)
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

    response = _post(stack, path, body)

    assert response.status_code == 422
    assert error(response.json())["code"] == "task_mismatch"
    assert "cross-encoder" in error(response.json())["message"]


def test_a_query_that_fills_max_seq_len_is_a_clear_422(stack: dict[str, Any]) -> None:
    body = {"query": " ".join(["card"] * 40), "documents": ["a"]}

    response = _post(stack, f"/v1/models/{PAIR}:rerank", body)

    assert response.status_code == 422
    assert "query alone fills max_seq_len" in response.json()["error"]["message"]
