"""A sentence-transformers checkpoint through the real modelserver and gunicorn gateways.

tiny-sentence (tests/backend/conftest.py): mean pooling, a tanh Dense, Normalize, prompts
'query' / 'passage', and an XLM-R-style SentencePiece Unigram tokenizer.json (no vocab.txt).
The reference is its modules in torch over transformers' BertModel and AutoTokenizer
(tests/export/test_export_sentence_modules.py), as SentenceTransformer.encode computes them.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from backend.embeddings import quantize
from tests.backend.conftest import SENTENCE, SENTENCE_PROMPTS
from tests.backend.stack import Gateway
from tests.export.test_export_sentence_modules import _reference

TEXTS = ["my card was charged twice", "hello world", "Café naïve 我的订单还没到"]


def _encode(checkpoint: Path, texts: list[str]) -> np.ndarray:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    feeds = tokenizer(texts, padding=True, truncation=True, max_length=32, return_tensors="np")
    return _reference(checkpoint, {k: np.asarray(v) for k, v in feeds.items()})


def _post(gateway: Gateway, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{gateway.url}{path}", json=body, timeout=30)


def test_embed_answers_like_sentence_transformers_encode(
    gateway: Gateway, sentence_checkpoint: Path
) -> None:
    response = _post(gateway, f"/v1/models/{SENTENCE}:embed", {"texts": TEXTS})

    assert response.status_code == 200, response.text
    got = np.asarray(response.json()["embeddings"], dtype=np.float32)
    want = _encode(sentence_checkpoint, TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert float(((got * want).sum(1)).min()) >= 0.99999  # unit vectors: cosine
    assert response.json()["dim"] == 24  # the Dense module's width


@pytest.mark.parametrize(
    ("field", "value", "prompt"),
    [
        ("prompt_name", "query", "query: "),
        ("prompt_name", "passage", "passage: "),
        ("input_type", "search_query", "query: "),
        ("input_type", "search_document", "passage: "),  # no 'document' prompt: 'passage'
    ],
)
def test_prompts_are_put_before_each_text(
    grpc_gateway: Gateway, sentence_checkpoint: Path, field: str, value: str, prompt: str
) -> None:
    assert prompt in SENTENCE_PROMPTS.values()

    embed = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed", {"texts": TEXTS, field: value})
    openai = _post(
        grpc_gateway, "/v1/embeddings", {"model": SENTENCE, "input": TEXTS, field: value}
    )

    want = _encode(sentence_checkpoint, [prompt + text for text in TEXTS])
    assert embed.status_code == 200 and openai.status_code == 200, (embed.text, openai.text)
    np.testing.assert_allclose(embed.json()["embeddings"], want, atol=1e-5)
    vectors = [item["embedding"] for item in openai.json()["data"]]
    np.testing.assert_allclose(vectors, want, atol=1e-5)


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt_name": "doc"}, 422, "no prompt 'doc' (its prompts: ['passage', 'query'])"),
        ({"prompt_name": "query", "input_type": "search_query"}, 400,
         "give 'prompt_name' or 'input_type', not both"),
        ({"input_type": "search"}, 400, "input_type"),
        ({"embedding_types": ["int4"]}, 400, "embedding_types"),
        ({"embedding_types": []}, 400, "embedding_types"),
        ({"prompt_name": "x" * 257}, 400, "prompt_name"),
    ],
)  # fmt: skip
def test_bad_prompts_and_types_get_clear_errors(
    grpc_gateway: Gateway, body: dict[str, Any], status: int, message: str
) -> None:
    response = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed", {"texts": TEXTS, **body})

    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_embedding_types_answer_each_type_of_the_float_vectors(grpc_gateway: Gateway) -> None:
    types = ["float", "int8", "uint8", "binary", "ubinary"]

    response = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed",
                     {"texts": TEXTS, "embedding_types": types})  # fmt: skip

    assert response.status_code == 200, response.text
    answer = response.json()
    floats = np.asarray(answer["embeddings"], dtype=np.float32)
    by_type = answer["embeddings_by_type"]
    assert sorted(by_type) == sorted(types)
    for kind in types[1:]:
        assert by_type[kind] == quantize(floats, kind).tolist(), kind
    assert len(by_type["binary"][0]) == 3  # 24 dims, 8 to a value


def test_without_float_the_float_embeddings_are_left_out(grpc_gateway: Gateway) -> None:
    response = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed",
                     {"texts": TEXTS, "embedding_types": ["ubinary"]})  # fmt: skip

    assert response.status_code == 200, response.text
    assert "embeddings" not in response.json()
    assert all(0 <= v <= 255 for row in response.json()["embeddings_by_type"]["ubinary"]
               for v in row)  # fmt: skip


def test_int8_of_vectors_that_are_not_unit_vectors_is_refused(grpc_gateway: Gateway) -> None:
    body = {"texts": TEXTS, "normalize": False, "embedding_types": ["int8"]}

    response = _post(grpc_gateway, "/v1/models/tiny-embed:embed", body)

    assert response.status_code == 422, response.text
    assert "normalize=true" in response.json()["error"]["message"]


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_openai_embedding_type_binary(grpc_gateway: Gateway, encoding: str) -> None:
    body = {"model": SENTENCE, "input": TEXTS, "embedding_type": "binary",
            "encoding_format": encoding}  # fmt: skip

    response = _post(grpc_gateway, "/v1/embeddings", body)
    floats = _post(grpc_gateway, "/v1/embeddings", {"model": SENTENCE, "input": TEXTS})

    assert response.status_code == 200, response.text
    want = quantize(np.asarray([d["embedding"] for d in floats.json()["data"]], np.float32),
                    "binary")  # fmt: skip
    got = [d["embedding"] for d in response.json()["data"]]
    if encoding == "base64":
        got = [np.frombuffer(base64.b64decode(g), dtype=np.int8).tolist() for g in got]
    assert got == want.tolist()


def test_tokenize_offsets_are_the_checkpoints_tokenizers(
    grpc_gateway: Gateway, sentence_checkpoint: Path
) -> None:
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(str(sentence_checkpoint), local_files_only=True)

    response = _post(grpc_gateway, f"/v1/models/{SENTENCE}:tokenize", {"texts": TEXTS})

    assert response.status_code == 200, response.text
    for text, tokens in zip(TEXTS, response.json()["tokens"], strict=True):
        want = reference(text, return_offsets_mapping=True)
        assert tokens["ids"] == want["input_ids"]
        assert tokens["offsets"] == [list(o) for o in want["offset_mapping"]]
        assert tokens["tokens"][0] == "<s>" and tokens["tokens"][-1] == "</s>"


def test_cohere_v2_client_embeds_by_type_with_the_models_prompts(
    grpc_gateway: Gateway, sentence_checkpoint: Path
) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=grpc_gateway.url)

    answer = client.embed(texts=TEXTS, model=SENTENCE, input_type="search_query",
                          embedding_types=["float", "int8", "ubinary"])  # fmt: skip

    want = _encode(sentence_checkpoint, ["query: " + text for text in TEXTS])
    floats = np.asarray(answer.embeddings.float_, dtype=np.float32)
    np.testing.assert_allclose(floats, want, atol=1e-5)
    assert answer.embeddings.int8 == quantize(floats, "int8").tolist()
    assert answer.embeddings.ubinary == quantize(floats, "ubinary").tolist()


def test_cohere_v2_truncate_none_refuses_a_text_over_max_seq_len(grpc_gateway: Gateway) -> None:
    import cohere
    import cohere.errors

    client = cohere.ClientV2(api_key="unused", base_url=grpc_gateway.url)

    with pytest.raises(cohere.errors.UnprocessableEntityError):
        client.embed(texts=["hello " * 200], model=SENTENCE, input_type="search_document",
                     embedding_types=["float"], truncate="NONE")  # fmt: skip


def test_rerank_embeds_the_query_and_documents_with_their_prompts(grpc_gateway: Gateway) -> None:
    query, documents = TEXTS[0], TEXTS[1:]

    ranked = _post(grpc_gateway, f"/v1/models/{SENTENCE}:rerank",
                   {"query": query, "documents": documents})  # fmt: skip
    asked = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed",
                  {"texts": [query], "prompt_name": "query"})  # fmt: skip
    given = _post(grpc_gateway, f"/v1/models/{SENTENCE}:embed",
                  {"texts": documents, "prompt_name": "passage"})  # fmt: skip

    assert ranked.status_code == 200, ranked.text
    cosine = np.asarray(given.json()["embeddings"]) @ np.asarray(asked.json()["embeddings"][0])
    scores = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
    np.testing.assert_allclose([scores[i] for i in range(len(documents))], (1 + cosine) / 2,
                               atol=1e-5)  # fmt: skip
