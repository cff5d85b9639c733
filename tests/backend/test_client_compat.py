"""The clients people already have, unchanged, against a real gunicorn gateway and model server:
the openai SDK and LangChain's OpenAIEmbeddings (/v1/embeddings, /v1/models), the cohere SDK
(/v1/rerank, /v2/rerank), plus our :rerank, :tokenize and :detokenize (issue 21 items 1-3, 6)."""

from __future__ import annotations

import base64
from pathlib import Path

import cohere
import cohere.errors
import numpy as np
import openai
import pytest
import requests
from langchain_openai import OpenAIEmbeddings

from tests.backend.conftest import EMBED, INTENT
from tests.backend.stack import Gateway

TEXTS = ["where is my parcel", "refund my order please", "the app crashes"]


def ours(gateway: Gateway, texts: list[str]) -> np.ndarray:
    reply = requests.post(
        f"{gateway.url}/v1/models/{EMBED}:embed", json={"texts": texts}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    return np.asarray(reply.json()["embeddings"], dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=-1, keepdims=True)
    b = b / np.linalg.norm(b, axis=-1, keepdims=True)
    return np.sum(a * b, axis=-1)


@pytest.fixture(scope="module")
def client(grpc_gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{grpc_gateway.url}/v1", api_key="unused", max_retries=0)


# -- OpenAI ----------------------------------------------------------------------------------


def test_openai_sdk_embeds_a_string_and_a_list_as_embed_does(
    client: openai.OpenAI, grpc_gateway: Gateway
) -> None:
    want = ours(grpc_gateway, TEXTS)
    one = client.embeddings.create(input=TEXTS[0], model=EMBED)
    many = client.embeddings.create(input=TEXTS, model=EMBED, encoding_format="float")
    assert one.object == "list" and one.data[0].object == "embedding"
    assert cosine(np.asarray(one.data[0].embedding), want[0]) >= 0.99999
    got = np.asarray([d.embedding for d in sorted(many.data, key=lambda d: d.index)])
    assert np.all(cosine(got, want) >= 0.99999)
    assert many.model == f"{EMBED}@1"
    assert many.usage.prompt_tokens == many.usage.total_tokens > 3 * 2  # [CLS], [SEP] each


def test_base64_and_float_answers_are_the_same_numbers(grpc_gateway: Gateway) -> None:
    url = f"{grpc_gateway.url}/v1/embeddings"
    floats = requests.post(url, json={"input": TEXTS, "model": EMBED}, timeout=30).json()
    packed = requests.post(
        url, json={"input": TEXTS, "model": EMBED, "encoding_format": "base64"}, timeout=30
    ).json()
    for f, p in zip(floats["data"], packed["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(p["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.asarray(f["embedding"], dtype=np.float32))


def test_dimensions_keep_the_first_n_renormalised(
    client: openai.OpenAI, grpc_gateway: Gateway
) -> None:
    full = ours(grpc_gateway, TEXTS[:1])[0]
    cut = client.embeddings.create(input=TEXTS[0], model=EMBED, dimensions=4).data[0].embedding
    assert len(cut) == 4
    np.testing.assert_allclose(cut, full[:4] / np.linalg.norm(full[:4]), atol=1e-6)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.embeddings.create(input="x", model=EMBED, dimensions=100_000)
    assert "dimensions" in info.value.message


def test_token_ids_and_model_versions_and_labels(
    client: openai.OpenAI, grpc_gateway: Gateway
) -> None:
    tokens = requests.post(
        f"{grpc_gateway.url}/v1/models/{EMBED}:tokenize", json={"texts": [TEXTS[0]]}, timeout=30
    ).json()["tokens"][0]
    ids = [i for i, special in zip(tokens["ids"], tokens["special"], strict=True) if not special]
    by_ids = client.embeddings.create(input=[ids], model=f"{EMBED}@1", encoding_format="float")
    by_text = client.embeddings.create(input=TEXTS[0], model=EMBED, encoding_format="float")
    assert (
        cosine(np.asarray(by_ids.data[0].embedding), np.asarray(by_text.data[0].embedding))
        >= 0.99999
    )
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(input=[[10**9]], model=EMBED)


def test_errors_are_the_sdks_own_exceptions_in_openais_shape(
    client: openai.OpenAI, grpc_gateway: Gateway
) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.embeddings.create(input="x", model="no-such-model")
    body = info.value.body
    assert isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body)
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(input=[""], model=EMBED)
    with pytest.raises(openai.UnprocessableEntityError):  # a classifier can't embed
        client.embeddings.create(input="x", model=INTENT)
    # Our routes keep our shape.
    reply = requests.post(f"{grpc_gateway.url}/v1/models/nope:embed", json={"texts": ["x"]})
    assert set(reply.json()["error"]) == {"code", "message"}


def test_models_list_names_the_served_models(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {EMBED, INTENT} <= ids


def test_langchain_openai_embeddings_with_the_documented_setting(grpc_gateway: Gateway) -> None:
    embedder = OpenAIEmbeddings(
        model=EMBED, base_url=f"{grpc_gateway.url}/v1", api_key="unused",  # type: ignore[arg-type]
        check_embedding_ctx_length=False, max_retries=0,
    )  # fmt: skip
    want = ours(grpc_gateway, TEXTS)
    docs = np.asarray(embedder.embed_documents(TEXTS))
    query = np.asarray(embedder.embed_query(TEXTS[1]))
    assert np.all(cosine(docs, want) >= 0.99999)
    assert cosine(query, want[1]) >= 0.99999


# -- rerank ----------------------------------------------------------------------------------

DOCS = ["my parcel never arrived", "how do I reset my password", "where is my package"]


def test_cohere_v2_and_v1_clients_rerank_by_cosine(grpc_gateway: Gateway) -> None:
    vectors = ours(grpc_gateway, [TEXTS[0], *DOCS])
    expected = np.argsort(-(vectors[1:] @ vectors[0]), kind="stable").tolist()
    v2 = cohere.ClientV2(api_key="unused", base_url=grpc_gateway.url)
    answer = v2.rerank(model=EMBED, query=TEXTS[0], documents=DOCS, top_n=2)
    assert [r.index for r in answer.results] == expected[:2]
    scores = [r.relevance_score for r in answer.results]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    v1 = cohere.Client(api_key="unused", base_url=grpc_gateway.url)
    old = v1.rerank(model=EMBED, query=TEXTS[0], documents=DOCS, return_documents=True)
    assert [r.index for r in old.results] == expected
    assert old.results[0].document is not None
    assert old.results[0].document.text == DOCS[expected[0]]
    with pytest.raises(cohere.errors.UnprocessableEntityError):  # a classifier can't rerank
        v2.rerank(model=INTENT, query="x", documents=["y"])


def test_our_rerank_route_and_jina_style_documents(grpc_gateway: Gateway) -> None:
    url = grpc_gateway.url
    mine = requests.post(
        f"{url}/v1/models/{EMBED}:rerank", json={"query": TEXTS[0], "documents": DOCS}, timeout=30
    ).json()
    jina = requests.post(
        f"{url}/v1/rerank",
        json={"model": EMBED, "query": TEXTS[0], "documents": [{"text": d} for d in DOCS],
              "return_documents": True},
        timeout=30,
    ).json()  # fmt: skip
    assert [r["index"] for r in mine["results"]] == [r["index"] for r in jina["results"]]
    assert mine["model"] == {"name": EMBED, "version": 1}
    assert jina["usage"]["total_tokens"] == mine["tokens"] > 0
    error = requests.post(f"{url}/v2/rerank", json={"model": EMBED, "query": "q"}, timeout=30)
    assert error.status_code == 400 and "documents" in error.json()["message"]


# -- tokenize ----------------------------------------------------------------------------------


def test_tokenize_gives_offsets_into_the_original_text_and_detokenize_inverts_it(
    grpc_gateway: Gateway,
) -> None:
    text = "Café  東京 parcel"
    url = f"{grpc_gateway.url}/v1/models/{INTENT}"
    reply = requests.post(
        f"{url}:tokenize", json={"texts": [text], "label": "stable"}, timeout=30
    ).json()
    assert reply["model"] == {"name": INTENT, "version": 1}
    tokens = reply["tokens"][0]
    assert tokens["special"][0] and tokens["special"][-1] and not tokens["truncated"]
    for (start, end), special in zip(tokens["offsets"], tokens["special"], strict=True):
        if not special:
            assert 0 <= start < end <= len(text) and text[start:end].strip() == text[start:end]
    spans = [
        text[s:e] for (s, e), sp in zip(tokens["offsets"], tokens["special"], strict=True) if not sp
    ]
    assert "東" in spans and "京" in spans  # CJK characters are single tokens at their places
    back = requests.post(
        f"{grpc_gateway.url}/v1/models/{INTENT}:detokenize", json={"ids": [tokens["ids"]]},
        timeout=30,
    ).json()  # fmt: skip
    assert back["texts"][0]["tokens"] == tokens["tokens"]
    long = requests.post(
        f"{grpc_gateway.url}/v1/models/{INTENT}:tokenize", json={"texts": ["word " * 300]},
        timeout=30,
    ).json()["tokens"][0]  # fmt: skip
    assert long["truncated"] and long["length"] == len(long["ids"]) == reply["max_seq_len"]


# -- long texts --------------------------------------------------------------------------------


def test_truncation_direction_keeps_the_end_when_left(grpc_gateway: Gateway) -> None:
    tail = "where is my parcel " * 40  # alone over max_seq_len (64)
    texts = ["billing invoice " * 40 + tail, "password login " * 40 + tail]
    url = f"{grpc_gateway.url}/v1/models/{EMBED}:embed"

    def embed(direction: str) -> np.ndarray:
        body = {"texts": texts, "truncation_direction": direction}
        reply = requests.post(url, json=body, timeout=30).json()
        assert reply["truncated"] == [True, True]
        return np.asarray(reply["embeddings"])

    left, right = embed("left"), embed("right")
    assert cosine(left[0], left[1]) >= 0.99999  # the same tail kept
    assert cosine(right[0], right[1]) < 0.999  # different heads kept


def test_a_long_text_chunked_is_the_token_weighted_mean_of_its_windows(
    grpc_gateway: Gateway, client: openai.OpenAI, model_base: Path
) -> None:
    from backend.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_files(model_base / EMBED / "1" / "assets" / "vocab.txt",
                                         max_seq_len=64)  # fmt: skip
    text = " ".join(f"ticket {i} parcel refund" for i in range(60))
    assert len(tokenizer.encode([text])[0].ids) == 64 and tokenizer.encode([text])[0].truncated
    windows = tokenizer.windows([text])[0]
    chunked = requests.post(
        f"{grpc_gateway.url}/v1/models/{EMBED}:embed",
        json={"texts": [text], "long_text": "chunk"}, timeout=30,
    ).json()  # fmt: skip
    assert chunked["windows"] == [len(windows)] and len(windows) >= 3
    assert chunked["truncated"] == [False]
    bodies = [w.ids[1:-1].tolist() for w in windows]
    alone = client.embeddings.create(input=bodies, model=EMBED, encoding_format="float")
    vectors = np.asarray([d.embedding for d in sorted(alone.data, key=lambda d: d.index)])
    mean = (vectors * np.asarray([len(b) for b in bodies])[:, None]).sum(axis=0)
    assert cosine(np.asarray(chunked["embeddings"][0]), mean) >= 0.9999
    # Without long_text, today's rule: cut to max_seq_len.
    plain = requests.post(f"{grpc_gateway.url}/v1/models/{EMBED}:embed",
                          json={"texts": [text]}, timeout=30).json()  # fmt: skip
    assert (plain["truncated"] == [True] and "windows" not in plain) or plain["windows"] is None
