"""Hybrid retrieval end to end: :embed's sparse and multi-vector outputs, ColBERT's query and
document sides, inference-free SPLADE queries, TEI's /embed_sparse, MaxSim rerank and the answer
budget, through a real model server and gunicorn gateways (grpc and rest).

Two kinds of models: tables without context (tests/backend/retrieval_models.py), whose expected
answers are recomputed here from the table and the ids the gateway's own :tokenize reports; and
real exports of tiny random checkpoints (export/tiny_retrieval.py, built by export.build): a
BGE-M3 layout checked against FlagEmbedding's ``BGEM3FlagModel`` and a PyLate ColBERT checked
against PyLate's ``ColBERT.encode``. The BGE-M3 export's answers also feed Qdrant's local mode
(``test_qdrant_hybrid_search_...``): sparse and dense prefetches fused by RRF, rescored by MaxSim,
checked against the same search in numpy on FlagEmbedding's vectors. A BGE-M3-like table model
with three versions (v2 a re-export of v1, v3 another seed) is shadowed in turn: the sparse
overlap and MaxSim agreement, and the rollout's shadow verdict on them, tell the two apart.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from tests.backend.alike import assert_alike
from tests.backend.corpus import CORPUS
from tests.backend.retrieval_models import (
    COLBERT,
    HYBRID,
    M3,
    SPECIAL_IDS,
    SPLADE,
    TOP_K,
    write_hybrid_version,
    write_m3_versions,
    write_versions,
)
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config

TEXTS = ["hello world", "my card was charged twice, and the refund is late!"]
QUERIES = ["my order is late", "refund my card", "reset my password", "hello"]
REAL_TEXTS = [t for t in CORPUS if len(t) < 80] + [
    "where is my order? it is three days late.", "refund, please!", "the parcel never arrived",
    "how do I reset my password", "the quick brown fox jumps over the lazy dog",
    "cancel my subscription today", "the app crashes when I open it", "track a package",
    "my invoice shows the wrong amount", "change the delivery address",
]  # fmt: skip
MODELS = (M3, COLBERT, SPLADE)
EXPORTED = "st-splade"  # an inference-free SPLADE exported by export/ (sentence-transformers')
REAL_M3 = "bge-m3"  # FlagEmbedding's layout, exported by export/
REAL_COLBERT = "pylate"  # a PyLate ColBERT, exported by export/
REAL_SEQ = 64
# BGE-M3-like tables: v2 re-exports v1 (the same seed), v3 is another seed; shadowed in turn
SHADOWED, SHADOW_SEEDS = "tiny-m3-shadowed", {1: 40, 2: 40, 3: 77}


@pytest.fixture(scope="module")
def retrieval(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return the three versions' tables and a model server serving them."""
    from export.build import build
    from export.tiny_retrieval import save_m3_checkpoint, save_pylate_checkpoint
    from export.tiny_splade import save_tiny_inference_free

    base = tmp_path_factory.mktemp("retrieval")
    made = write_versions(base)
    write_m3_versions(base, SHADOWED, SHADOW_SEEDS)
    write_hybrid_version(base)
    checkpoints = tmp_path_factory.mktemp("retrieval-ckpt")
    checkpoint = save_tiny_inference_free(checkpoints / EXPORTED, seed=3)
    build(checkpoint, EXPORTED, base, version=1, task="embed", top_k=TOP_K, warmup=False)
    made[EXPORTED] = {"checkpoint": checkpoint}
    for name, save in ((REAL_M3, save_m3_checkpoint), (REAL_COLBERT, save_pylate_checkpoint)):
        checkpoint = save(checkpoints / name)
        build(checkpoint, name, base, version=1, task="embed", max_seq_len=REAL_SEQ,
              warmup=False)  # fmt: skip
        made[name] = {"checkpoint": checkpoint}
    served = [*MODELS, EXPORTED, REAL_M3, REAL_COLBERT, SHADOWED, HYBRID]
    config = base / "models.config"
    config.write_text(model_config(base, {}, served), encoding="utf-8")
    server = ModelServer(config, tmp_path_factory.mktemp("retrieval-logs"))
    try:
        for name in served:
            for version in SHADOW_SEEDS if name == SHADOWED else (1,):
                server.wait_available(name, version)
        yield {"made": made, "server": server, "base": base, "config": config}
    finally:
        server.stop()


@pytest.fixture(scope="module", params=["grpc", "rest"])
def gateway(request: pytest.FixtureRequest, retrieval: dict[str, Any],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:  # fmt: skip
    env = gateway_env(retrieval["server"], request.param, retrieval["base"], retrieval["config"])
    env["GATEWAY_DEFAULT_MODEL"] = SPLADE  # TEI's /embed_sparse serves the default model
    # the result cache on (one worker: a repeat hits): every test here crosses the cache, and a
    # text another test sent with other kinds or another side is a hit only if its key says so
    env["GATEWAY_CACHE_BYTES"] = "4000000"
    running = Gateway(env, tmp_path_factory.mktemp("retrieval-gw"), workers=1, threads=4)
    try:
        yield running
    finally:
        running.stop()


def _post(gateway: Gateway, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{gateway.url}{path}", json=body, timeout=30)


def _ids(gateway: Gateway, model: str, texts: list[str]) -> list[np.ndarray]:
    reply = _post(gateway, f"/v1/models/{model}:tokenize", {"texts": texts})
    assert reply.status_code == 200, reply.text
    return [np.asarray(t["ids"]) for t in reply.json()["tokens"]]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_bge_m3_answers_dense_sparse_and_multivectors_as_flagembedding_would(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    made = retrieval["made"][M3]
    table, weight = made["table"], made["sparse"]
    body = {"texts": TEXTS, "outputs": ["dense", "sparse", "multivector"], "return_tokens": True}

    reply = _post(gateway, f"/v1/models/{M3}:embed", body)

    assert reply.status_code == 200, reply.text
    answer = reply.json()
    for index, ids in enumerate(_ids(gateway, M3, TEXTS)):
        np.testing.assert_allclose(answer["embeddings"][index], _unit(table[ids[0]]), atol=1e-5)
        expected: dict[int, float] = {}  # FlagEmbedding's _process_token_weights
        for token, w in zip(ids.tolist(), np.maximum(table[ids] @ weight, 0).tolist(), strict=True):
            if token not in SPECIAL_IDS and w > 0:
                expected[token] = max(expected.get(token, 0.0), w)
        item = answer["sparse"][index]
        assert dict(zip(item["indices"], item["values"], strict=True)) == pytest.approx(expected)
        assert item["values"] == sorted(item["values"], reverse=True)
        assert len(item["tokens"]) == len(item["indices"])
        vectors = answer["multivectors"][index]
        assert vectors["rows"] == len(ids) - 1  # CLS out, the final SEP in
        np.testing.assert_allclose(vectors["vectors"], _unit(table[ids[1:]]), atol=1e-5)
    assert answer["dim"] == answer["multivector_dim"] == 8


# Issue 60 item 3: the output kinds (each narrows the model-server call), the side, the truncation
# side and post-processing options, crossed on BGE-M3-like (no sides) and a hybrid with ColBERT
# markers (a query's tokens differ for every kind); the multi-vector request is not cached.
KINDS = [{"outputs": ["dense"]}, {"outputs": ["sparse"]}, {"outputs": ["dense", "sparse"]},
         {"outputs": ["sparse", "dense"], "truncation_direction": "left"},
         {"outputs": ["sparse"], "return_tokens": True, "top_k": 3},
         {"outputs": ["dense", "sparse", "multivector"]}]  # fmt: skip
SIDES = [{"outputs": ["sparse"], "is_query": True},
         {"outputs": ["dense", "sparse"], "input_type": "search_query",
          "truncation_direction": "left"}]  # fmt: skip


@pytest.mark.parametrize(("model", "variants"), [(M3, KINDS), (HYBRID, [*KINDS, *SIDES])],
                         ids=[M3, HYBRID])  # fmt: skip
def test_every_output_kind_and_side_answers_as_uncached_in_any_order(
    gateway: Gateway, model: str, variants: list[dict[str, Any]]
) -> None:
    """The same texts with each option in turn, then in the other order, partly cached every
    third time: each answer is what the same request gets uncached (``no-store``: the stages
    the cache off crosses), byte for byte when its texts were computed together (a miss), else
    up to its floats' last bits (another batch). Before issue 60 a sparse request after a dense
    one was a 502, a partly cached dense+sparse one a 500."""
    path = f"/v1/models/{model}:embed"
    tag = f"{model}-{gateway.port}"
    long = " ".join(REAL_TEXTS[:12])  # over max_seq_len 32, its two ends of other tokens
    texts = [f"crossed {tag}", f"{long} {tag}", f"{tag} {long}"]

    def post(body: dict[str, Any], **headers: str) -> requests.Response:
        reply = requests.post(f"{gateway.url}{path}", json=body, headers=headers, timeout=30)
        assert reply.status_code == 200, (body, reply.text)
        return reply

    no_store = {"Cache-Control": "no-store"}
    uncached = [post({"texts": texts, **v}, **no_store).content for v in variants]
    assert len(set(uncached)) == len(variants), "two options answer alike: nothing to tell apart"
    order = [*range(len(variants)), *reversed(range(len(variants)))]
    seen = []
    for step, index in enumerate(order):
        some = texts if step % 3 else [f"new {step} {tag}", *texts[1:]]
        body = {"texts": some, **variants[index]}
        answer = post(body)
        seen.append(answer.headers.get("x-cache"))
        want = uncached[index] if some is texts else post(body, **no_store).content
        assert_alike(answer.content, want, (variants[index], answer.headers.get("x-cache")))
        if answer.headers.get("x-cache") == "miss":
            assert answer.content == want, variants[index]
    assert "hit" in seen and "partial" in seen  # the kinds cached were served from the cache


def test_a_batch_job_writes_each_output_kind_as_parquet_columns_and_embed_lines_as_embed_answers(
    retrieval: dict[str, Any], tmp_path: Any
) -> None:
    """ops.batch on BGE-M3-like rows with --outputs dense,sparse,multivector: each kind's
    columns hold what :embed answers for the same texts; an OpenAI Batch :embed line asking for
    sparse output is answered as :embed answers it."""
    import io

    import orjson
    import pyarrow.parquet as pq

    from backend.schemas import EmbedRequest
    from backend.service import Gateway as InProcess
    from backend.settings import load_settings
    from ops.batch.job import JobSpec, run_job

    env = gateway_env(retrieval["server"], "grpc", retrieval["base"], retrieval["config"])
    settings = load_settings({"group_in_flight": 0}, environ=env)
    texts = [*TEXTS, *QUERIES]
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b"".join(orjson.dumps({"id": str(i), "text": t}) + b"\n"
                              for i, t in enumerate(texts)))  # fmt: skip
    kinds = ("dense", "sparse", "multivector")
    run_job(JobSpec(rows, tmp_path / "pq", model=M3, kinds=kinds), settings, io.StringIO())
    lines = tmp_path / "batch.jsonl"
    lines.write_bytes(
        orjson.dumps(
            {
                "custom_id": "s",
                "method": "POST",
                "url": f"/v1/models/{M3}:embed",
                "body": {"texts": texts, "outputs": ["sparse"]},
            }
        )
        + b"\n"
    )
    run_job(JobSpec(lines, tmp_path / "openai"), settings, io.StringIO())

    online = InProcess(settings)
    try:
        want = online.embed(M3, EmbedRequest(texts=texts, outputs=list(kinds)))
    finally:
        online.close()
    table = pq.read_table(next((tmp_path / "pq").glob("part-*.parquet")))
    assert table.column_names == ["id", "embedding", "sparse_indices", "sparse_values",
                                  "token_vectors", "model", "version"]  # fmt: skip
    got = {row["id"]: row for row in table.to_pylist()}
    assert len(got) == len(texts)
    for i in range(len(texts)):
        row = got[str(i)]
        np.testing.assert_allclose(row["embedding"], want["embeddings"][i], atol=1e-6)
        assert row["sparse_indices"] == want["sparse"][i]["indices"].tolist()
        np.testing.assert_allclose(row["sparse_values"], want["sparse"][i]["values"], atol=1e-6)
        np.testing.assert_allclose(row["token_vectors"], want["multivectors"][i]["vectors"],
                                   atol=1e-6)  # fmt: skip
        assert (row["model"], row["version"]) == (M3, 1)
    line = orjson.loads((tmp_path / "openai" / "output.jsonl").read_bytes())
    body = line["response"]["body"]
    assert body["model"] == {"name": M3, "version": 1} and "embeddings" not in body
    assert [s["indices"] for s in body["sparse"]] == [s["indices"].tolist() for s in want["sparse"]]


def test_a_dense_batch_job_on_a_multi_output_model_asks_the_model_server_for_dense_only(
    retrieval: dict[str, Any], tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ops.batch with its default --outputs dense on BGE-M3-like rows (Parquet and OpenAI Batch
    /v1/embeddings lines): every Predict names only ``embedding`` in its output filter (the token
    vectors and weights stay on the model server), and the vectors are :embed's dense ones."""
    import io

    import orjson
    import pyarrow.parquet as pq

    from backend.clients.grpc_client import GrpcClient
    from backend.schemas import EmbedRequest
    from backend.service import Gateway as InProcess
    from backend.settings import load_settings
    from ops.batch.job import JobSpec, run_job

    env = gateway_env(retrieval["server"], "grpc", retrieval["base"], retrieval["config"])
    settings = load_settings({"group_in_flight": 0}, environ=env)
    texts = [*TEXTS, *QUERIES]
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(b"".join(orjson.dumps({"id": str(i), "text": t}) + b"\n"
                              for i, t in enumerate(texts)))  # fmt: skip
    lines = tmp_path / "batch.jsonl"
    lines.write_bytes(orjson.dumps({"custom_id": "o", "method": "POST", "url": "/v1/embeddings",
                                    "body": {"model": M3, "input": texts}}) + b"\n")  # fmt: skip
    asked: list[tuple[str, ...]] = []
    predict = GrpcClient.predict

    def spy(self: Any, model: str, inputs: Any, **kwargs: Any) -> Any:
        asked.append(tuple(kwargs.get("output_filter", ())))
        return predict(self, model, inputs, **kwargs)

    monkeypatch.setattr(GrpcClient, "predict", spy)
    run_job(JobSpec(rows, tmp_path / "pq", model=M3), settings, io.StringIO())
    run_job(JobSpec(lines, tmp_path / "openai"), settings, io.StringIO())
    monkeypatch.undo()

    online = InProcess(settings)
    try:
        want = online.embed(M3, EmbedRequest(texts=texts, outputs=["dense"]))["embeddings"]
    finally:
        online.close()
    assert asked and set(asked) == {("embedding",)}, set(asked)
    got = {row["id"]: row["embedding"] for row in
           pq.read_table(next((tmp_path / "pq").glob("part-*.parquet"))).to_pylist()}  # fmt: skip
    np.testing.assert_allclose([got[str(i)] for i in range(len(texts))], want, atol=1e-6)
    line = orjson.loads((tmp_path / "openai" / "output.jsonl").read_bytes())
    assert len(line["response"]["body"]["data"]) == len(texts)


def test_colbert_queries_and_documents_each_get_their_side(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    made = retrieval["made"][COLBERT]
    table, spec = made["table"], made["outputs"].multivector
    ids = _ids(gateway, COLBERT, TEXTS)

    query = _post(gateway, f"/v1/models/{COLBERT}:embed",
                  {"texts": TEXTS[:1], "input_type": "search_query"}).json()  # fmt: skip
    document = _post(gateway, f"/v1/models/{COLBERT}:embed", {"texts": TEXTS[1:]}).json()

    q = ids[0]
    sent = [q[0], spec.query.prefix_id, *q[1:]]
    sent += [spec.query.expansion_id] * (spec.query.length - len(sent))
    assert query["multivectors"][0]["rows"] == spec.query.length
    np.testing.assert_allclose(query["multivectors"][0]["vectors"], _unit(table[sent]), atol=1e-5)
    d = ids[1]
    kept = [t for t in [d[0], spec.document.prefix_id, *d[1:]] if t not in spec.skiplist_ids]
    np.testing.assert_allclose(document["multivectors"][0]["vectors"], _unit(table[kept]),
                               atol=1e-5)  # fmt: skip
    assert "embeddings" not in document  # a ColBERT model's default: its multi-vectors


def test_splade_documents_come_from_the_graph_and_queries_from_the_idf_table(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    made = retrieval["made"][SPLADE]
    table = made["table"]
    asset = retrieval["base"] / SPLADE / "1" / "assets" / "sparse_idf.json"
    idf = {int(k): v for k, v in json.loads(asset.read_text(encoding="utf-8")).items()}
    ids = _ids(gateway, SPLADE, TEXTS[:1])[0]

    doc = _post(gateway, f"/v1/models/{SPLADE}:embed", {"texts": TEXTS[:1], "top_k": 4}).json()
    query = _post(gateway, f"/v1/models/{SPLADE}:embed",
                  {"texts": TEXTS[:1], "is_query": True}).json()  # fmt: skip
    tei = _post(gateway, "/embed_sparse", {"inputs": TEXTS[0]})

    pooled = np.log1p(np.log1p(np.maximum(table[ids] @ table.T, 0))).max(axis=0)
    best = np.argsort(-pooled)[:TOP_K]
    best = best[pooled[best] > 0]
    assert doc["sparse"][0]["indices"] == best[:4].tolist()
    np.testing.assert_allclose(doc["sparse"][0]["values"], pooled[best[:4]], rtol=1e-5)
    expected = {t: idf[t] for t in set(ids.tolist()) if idf.get(t, 0) > 0}
    item = query["sparse"][0]
    assert dict(zip(item["indices"], item["values"], strict=True)) == pytest.approx(expected)
    assert tei.status_code == 200, tei.text
    assert [e["index"] for e in tei.json()[0]] == sorted(best.tolist())


def _rows(answer: dict[str, Any]) -> list[dict[int, float]]:
    return [dict(zip(item["indices"], item["values"], strict=True)) for item in answer["sparse"]]


def test_an_exported_splade_answers_as_sparse_encoder_encodes(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(retrieval["made"][EXPORTED]["checkpoint"]), device="cpu",
                          local_files_only=True)  # fmt: skip
    documents = model.encode_document(TEXTS, max_active_dims=TOP_K, convert_to_tensor=True,
                                      convert_to_sparse_tensor=False).numpy()  # fmt: skip
    queries = model.encode_query(TEXTS, convert_to_tensor=True,
                                 convert_to_sparse_tensor=False).numpy()  # fmt: skip

    ours_d = _post(gateway, f"/v1/models/{EXPORTED}:embed", {"texts": TEXTS})
    ours_q = _post(gateway, f"/v1/models/{EXPORTED}:embed", {"texts": TEXTS, "is_query": True})

    assert ours_d.status_code == 200 and ours_q.status_code == 200, ours_d.text + ours_q.text
    for ours, theirs in ((_rows(ours_d.json()), documents), (_rows(ours_q.json()), queries)):
        for row, want in zip(ours, theirs, strict=True):
            expected = {int(i): float(want[i]) for i in np.flatnonzero(want)}
            assert row == pytest.approx(expected, rel=1e-4, abs=1e-5)


@pytest.fixture(scope="module")
def flagembedding(retrieval: dict[str, Any]) -> dict[str, Any]:
    """Return FlagEmbedding's ``BGEM3FlagModel.encode`` of REAL_TEXTS (all three outputs) on the
    BGE-M3 checkpoint the gateway serves exported."""
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(retrieval["made"][REAL_M3]["checkpoint"]), use_fp16=False,
                           colbert_dim=16, devices="cpu", normalize_embeddings=True)  # fmt: skip
    return dict(model.encode(REAL_TEXTS + QUERIES, batch_size=64, max_length=REAL_SEQ,
                             return_dense=True, return_sparse=True,
                             return_colbert_vecs=True))  # fmt: skip


def m3_answer(gateway: Gateway, texts: list[str]) -> dict[str, Any]:
    """Return the gateway's :embed answer of the BGE-M3 export to ``texts``, all three outputs."""
    reply = _post(gateway, f"/v1/models/{REAL_M3}:embed",
                  {"texts": texts, "outputs": ["dense", "sparse", "multivector"]})  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_real_bge_m3_export_answers_as_flagembedding_encodes(
    gateway: Gateway, flagembedding: dict[str, Any]
) -> None:
    answer = m3_answer(gateway, REAL_TEXTS + QUERIES)

    np.testing.assert_allclose(answer["embeddings"], flagembedding["dense_vecs"], atol=1e-5)
    keys = 0
    for item, want, vectors, rows in zip(answer["sparse"], flagembedding["lexical_weights"],
                                         answer["multivectors"], flagembedding["colbert_vecs"],
                                         strict=True):  # fmt: skip
        ours = {str(i): v for i, v in zip(item["indices"], item["values"], strict=True)}
        assert ours == pytest.approx({k: float(v) for k, v in want.items()}, abs=1e-4)
        keys += len(want)
        assert vectors["rows"] == len(rows)
        np.testing.assert_allclose(vectors["vectors"], rows, atol=1e-4)
    assert keys >= len(REAL_TEXTS)  # the tiny sparse head weighs some tokens > 0


def test_base64_vectors_are_the_float_answers_bytes(gateway: Gateway) -> None:
    """encoding_format base64: each dense vector and each text's multi-vector matrix is one
    string of the same numbers' little-endian bytes (float32, int8 one byte each)."""
    import base64

    body = {"texts": TEXTS, "outputs": ["dense", "multivector"],
            "embedding_types": ["float", "int8"]}  # fmt: skip
    plain = _post(gateway, f"/v1/models/{REAL_M3}:embed", body)
    packed = _post(gateway, f"/v1/models/{REAL_M3}:embed", {**body, "encoding_format": "base64"})
    assert plain.status_code == packed.status_code == 200, packed.text
    want, got = plain.json(), packed.json()
    assert len(packed.content) < len(plain.content) / 2

    def decode(text: str, dtype: str) -> np.ndarray:
        return np.frombuffer(base64.b64decode(text), dtype)

    def f32(values: Any) -> np.ndarray:  # a JSON float32 read back as float32: the same bits
        return np.asarray(values, np.float32)

    np.testing.assert_array_equal([decode(v, "<f4") for v in got["embeddings"]],
                                  f32(want["embeddings"]))  # fmt: skip
    np.testing.assert_array_equal([decode(v, "i1") for v in got["embeddings_by_type"]["int8"]],
                                  want["embeddings_by_type"]["int8"])  # fmt: skip
    dim = got["multivector_dim"]
    for ours, theirs in zip(got["multivectors"], want["multivectors"], strict=True):
        assert ours["rows"] == theirs["rows"]
        rows = decode(ours["vectors"], "<f4").reshape(-1, dim)
        np.testing.assert_array_equal(rows, f32(theirs["vectors"]))
        int8 = decode(ours["vectors_by_type"]["int8"], "i1").reshape(-1, dim)
        np.testing.assert_array_equal(int8, theirs["vectors_by_type"]["int8"])


PREFETCH = 10  # each prefetch's limit; the fusion keeps their union (no RRF tie at a cut)
RRF_K = 2  # qdrant_client's local RRF constant (hybrid/fusion.py DEFAULT_RANKING_CONSTANT_K)


def qdrant_collection(answer: dict[str, Any]) -> Any:
    """Return a Qdrant local-mode client holding one point per REAL_TEXTS with the gateway's
    dense, sparse and multi-vector answers as named vectors."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(":memory:")
    client.create_collection(
        "docs",
        vectors_config={
            "dense": models.VectorParams(size=answer["dim"], distance=models.Distance.COSINE),
            "colbert": models.VectorParams(
                size=answer["multivector_dim"], distance=models.Distance.COSINE,
                multivector_config=models.MultiVectorConfig(
                    comparator=models.MultiVectorComparator.MAX_SIM),
                hnsw_config=models.HnswConfigDiff(m=0),  # used only to rescore
            ),
        },
        sparse_vectors_config={"sparse": models.SparseVectorParams()},
    )  # fmt: skip
    client.upsert("docs", [
        models.PointStruct(id=i, payload={"text": REAL_TEXTS[i]}, vector={
            "dense": answer["embeddings"][i],
            "sparse": models.SparseVector(indices=s["indices"], values=s["values"]),
            "colbert": answer["multivectors"][i]["vectors"],
        })
        for i, s in enumerate(answer["sparse"][: len(REAL_TEXTS)])
    ])  # fmt: skip
    return client


def hybrid_query(client: Any, answer: dict[str, Any], q: int, rescore: bool) -> list[Any]:
    """Return Qdrant's points for the ``q``-th answer as a query: sparse and dense prefetches
    fused by RRF, then (``rescore``) rescored by MaxSim on the multi-vectors."""
    from qdrant_client import models

    sparse = answer["sparse"][q]
    prefetch = [
        models.Prefetch(query=models.SparseVector(indices=sparse["indices"],
                                                  values=sparse["values"]),
                        using="sparse", limit=PREFETCH),
        models.Prefetch(query=answer["embeddings"][q], using="dense", limit=PREFETCH),
    ]  # fmt: skip
    fusion = models.FusionQuery(fusion=models.Fusion.RRF)
    if not rescore:
        return client.query_points("docs", prefetch=prefetch, query=fusion,
                                   limit=2 * PREFETCH).points  # fmt: skip
    return client.query_points(
        "docs", prefetch=models.Prefetch(prefetch=prefetch, query=fusion, limit=2 * PREFETCH),
        query=answer["multivectors"][q]["vectors"], using="colbert", limit=5,
    ).points  # fmt: skip


def numpy_hybrid(flag: dict[str, Any], q: int) -> tuple[dict[int, float], list[int]]:
    """Return (RRF score per fused id, the ids ranked by MaxSim) of the same search as
    ``hybrid_query`` done in numpy on FlagEmbedding's vectors of REAL_TEXTS + QUERIES."""
    n = len(REAL_TEXTS)
    dense = np.asarray(flag["dense_vecs"][:n]) @ np.asarray(flag["dense_vecs"][q])
    query = flag["lexical_weights"][q]
    lexical = {i: sum(float(w) * float(query[t]) for t, w in flag["lexical_weights"][i].items()
                      if t in query) for i in range(n)}  # fmt: skip
    touching = [i for i in range(n) if query.keys() & flag["lexical_weights"][i].keys()]
    rankings = [sorted(touching, key=lambda i: -lexical[i])[:PREFETCH],
                np.argsort(-dense)[:PREFETCH].tolist()]  # fmt: skip
    fused: dict[int, float] = {}
    for ranking in rankings:
        for position, i in enumerate(ranking):
            fused[i] = fused.get(i, 0.0) + 1 / (position + RRF_K)  # 1/((pos+1)+k-1)
    q_vectors = np.asarray(flag["colbert_vecs"][q])
    maxsim = {i: float((q_vectors @ np.asarray(flag["colbert_vecs"][i]).T).max(1).sum())
              for i in fused}  # fmt: skip
    return fused, sorted(fused, key=lambda i: -maxsim[i])[:5]


def test_qdrant_hybrid_search_on_the_gateways_vectors_finds_what_numpy_finds_on_flagembeddings(
    gateway: Gateway, flagembedding: dict[str, Any]
) -> None:
    answer = m3_answer(gateway, REAL_TEXTS + QUERIES)
    client = qdrant_collection(answer)

    for q in range(len(REAL_TEXTS), len(REAL_TEXTS) + len(QUERIES)):
        fused = hybrid_query(client, answer, q, rescore=False)
        rescored = hybrid_query(client, answer, q, rescore=True)

        want_fused, want_ids = numpy_hybrid(flagembedding, q)
        assert len(want_fused) > len(want_ids)  # MaxSim picks among more than it keeps
        # RRF gives equal scores to ids at swapped ranks: compare scores per id, not the order
        assert {p.id: p.score for p in fused} == pytest.approx(want_fused, rel=1e-6)
        assert [p.id for p in rescored] == want_ids


def test_a_real_pylate_export_answers_as_pylate_encodes(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    from pylate import models

    model = models.ColBERT(str(retrieval["made"][REAL_COLBERT]["checkpoint"]), device="cpu")
    for is_query, texts in ((True, REAL_TEXTS[:4]), (False, REAL_TEXTS[:8])):
        want = model.encode(texts, is_query=is_query, convert_to_numpy=True)

        reply = _post(gateway, f"/v1/models/{REAL_COLBERT}:embed",
                      {"texts": texts, "is_query": is_query})  # fmt: skip

        assert reply.status_code == 200, reply.text
        for ours, theirs in zip(reply.json()["multivectors"], want, strict=True):
            assert ours["rows"] == len(theirs)
            np.testing.assert_allclose(ours["vectors"], theirs, atol=1e-4)


def test_rerank_scores_by_maxsim_and_bge_m3_weights(
    gateway: Gateway, retrieval: dict[str, Any]
) -> None:
    body = {"query": TEXTS[0], "documents": TEXTS}
    colbert = _post(gateway, f"/v1/models/{COLBERT}:rerank", body)
    q = _post(gateway, f"/v1/models/{COLBERT}:embed",
              {"texts": TEXTS[:1], "is_query": True}).json()["multivectors"][0]  # fmt: skip
    docs = _post(gateway, f"/v1/models/{COLBERT}:embed", {"texts": TEXTS}).json()["multivectors"]

    assert colbert.status_code == 200, colbert.text
    scores = {r["index"]: r["relevance_score"] for r in colbert.json()["results"]}
    for index, d in enumerate(docs):
        maxsim = (np.asarray(q["vectors"]) @ np.asarray(d["vectors"]).T).max(axis=1).sum()
        assert scores[index] == pytest.approx(maxsim, rel=1e-4)

    m3 = _post(gateway, f"/v1/models/{M3}:embed",
               {"texts": TEXTS, "outputs": ["dense", "sparse", "multivector"]}).json()  # fmt: skip
    weighted = _post(gateway, f"/v1/models/{M3}:rerank", {**body, "weights": [0.4, 0.2, 0.4]})
    assert weighted.status_code == 200, weighted.text
    scores = {r["index"]: r["relevance_score"] for r in weighted.json()["results"]}
    e, s, v = m3["embeddings"], m3["sparse"], m3["multivectors"]
    for index in range(len(TEXTS)):
        dense = float(np.dot(e[0], e[index]))
        a = dict(zip(s[0]["indices"], s[0]["values"], strict=True))
        b = dict(zip(s[index]["indices"], s[index]["values"], strict=True))
        lexical = sum(a[t] * b[t] for t in a.keys() & b.keys())
        maxsim = (np.asarray(v[0]["vectors"]) @ np.asarray(v[index]["vectors"]).T).max(1).mean()
        assert scores[index] == pytest.approx((0.4 * dense + 0.2 * lexical + 0.4 * maxsim),
                                              rel=1e-4)  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "status", "says"),
    [
        (f"/v1/models/{COLBERT}:embed", {"texts": ["a"], "outputs": ["dense"]}, 422,
         "its outputs: multivector"),
        (f"/v1/models/{SPLADE}:embed", {"texts": ["a"], "top_k": TOP_K + 1}, 422, "own top-k"),
        ("/v1/embeddings", {"input": "a", "model": COLBERT}, 422, ":embed"),
        (f"/v1/models/{COLBERT}:rerank", {"query": "a", "documents": ["b"], "weights": [1, 1, 1]},
         422, "weights"),
        (f"/v1/models/{M3}:embed", {"texts": ["a"], "is_query": False,
                                    "input_type": "search_query"}, 422, "contradicts"),
    ],
)  # fmt: skip
def test_what_a_model_lacks_is_a_422_naming_it(
    gateway: Gateway, path: str, body: dict[str, Any], status: int, says: str
) -> None:
    reply = _post(gateway, path, body)
    assert reply.status_code == status, reply.text
    assert says in reply.text


def test_an_answer_over_the_answer_budget_is_a_413_before_the_model_runs(
    retrieval: dict[str, Any],
) -> None:
    from backend.app import create_app

    # gRPC: the reply is only the outputs asked (over REST this table model, which has no
    # output-subset signatures, sends all three, and the reply is what is over: below)
    app = create_app({
        "upstream": "grpc", "tfs_grpc_target": retrieval["server"].grpc_target,
        "model_base_path": str(retrieval["base"]), "model_config_file": str(retrieval["config"]),
        "max_answer_bytes": 2000,
    })  # fmt: skip
    client = app.test_client()
    body = {"texts": TEXTS, "outputs": ["multivector"]}
    before = _predicts(retrieval, M3)

    reply = client.post(f"/v1/models/{M3}:embed", json=body)
    refused = _predicts(retrieval, M3)
    small = client.post(f"/v1/models/{M3}:embed", json={"texts": ["a"], "outputs": ["sparse"]})

    assert reply.status_code == 413, reply.text
    assert "GATEWAY_MAX_ANSWER_BYTES" in reply.json["error"]["message"]
    assert refused == before  # the model server never ran it
    assert small.status_code == 200, small.text
    assert _predicts(retrieval, M3) > refused  # and the count does count this model's calls


def _predicts(retrieval: dict[str, Any], model: str) -> int:
    """Return the calls the model server has answered for ``model`` (its request_count, every
    status), from its Prometheus page."""
    from ops.tfs_metrics import scrape

    counts = scrape(f"{retrieval['server'].rest_url}/monitoring/prometheus/metrics", model)
    assert counts is not None, "the model server's metrics page did not answer"
    return sum(counts.values())


def _dense_body(path: str, model: str, texts: list[str]) -> dict[str, Any]:
    """Return the body of a dense-only route's request for ``texts``."""
    if path == "/v1/embeddings":
        return {"model": model, "input": texts}
    if path == "/v2/embed":
        return {"model": model, "texts": texts, "input_type": "search_document"}
    return {"texts": texts}  # :embed


class Recording:
    """The real upstream client, keeping each predict's output filter and the outputs it got."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: list[tuple[tuple[str, ...], set[str]]] = []
        self.bytes: list[int] = []  # each reply's tensors, as the model server sent them

    def predict(self, model: str, inputs: Any, **kwargs: Any) -> Any:
        outputs, served = self._client.predict(model, inputs, **kwargs)
        self.calls.append((tuple(kwargs.get("output_filter", ())), set(outputs)))
        self.bytes.append(sum(int(v.nbytes) for v in outputs.values()))
        return outputs, served

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _recorded_app(
    retrieval: dict[str, Any], upstream: str, **settings: Any
) -> tuple[Any, Recording]:
    """Return an in-process gateway app on the retrieval model server whose upstream client
    (the real one) records each call's filter, outputs and bytes."""
    from backend.app import create_app
    from backend.clients import make_client
    from backend.service import Gateway as Service

    app = create_app({"upstream": upstream, "tfs_grpc_target": retrieval["server"].grpc_target,
                      "tfs_rest_url": retrieval["server"].rest_url,
                      "model_base_path": str(retrieval["base"]),
                      "model_config_file": str(retrieval["config"]), **settings})  # fmt: skip
    made = app.extensions["gateway_settings"]
    recording = Recording(make_client(made))
    app.extensions["gateway"] = Service(made, client=recording)
    return app, recording


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_only_the_outputs_asked_for_leave_the_model_server(
    retrieval: dict[str, Any], upstream: str
) -> None:
    """gRPC filters the outputs (``output_filter``); REST asks the narrowest output-subset
    signature the export wrote (modelformat/outputs.py ``kind_signatures``): either way the
    upstream answer of a dense-only call holds no token outputs."""
    app, recording = _recorded_app(retrieval, upstream)
    client = app.test_client()
    path = f"/v1/models/{REAL_M3}:embed"

    dense = client.post(path, json={"texts": TEXTS})
    sparse = client.post(path, json={"texts": TEXTS, "outputs": ["sparse"]})
    hybrid = client.post(path, json={"texts": TEXTS, "outputs": ["dense", "sparse"]})
    every = client.post(path, json={"texts": TEXTS, "outputs": ["dense", "sparse", "multivector"]})

    assert {r.status_code for r in (dense, sparse, hybrid, every)} == {200}, dense.text
    assert recording.calls == [
        (("embedding",), {"embedding"}),
        (("token_weights",), {"token_weights"}),
        (("embedding", "token_weights"), {"embedding", "token_weights"}),
        ((), {"embedding", "token_weights", "token_vectors"}),
    ]
    assert dense.json["embeddings"] == hybrid.json["embeddings"] == every.json["embeddings"]
    assert sparse.json["sparse"] == hybrid.json["sparse"] == every.json["sparse"]


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_dense_only_routes_bring_back_the_dense_vectors_alone(
    retrieval: dict[str, Any], upstream: str
) -> None:
    """OpenAI's /v1/embeddings and Cohere's /v2/embed read only the dense vector: of a BGE-M3
    export the model server sends back rows x dim float32s and nothing else, as for a dense
    :embed (they used to bring back every token vector and weight as well)."""
    app, recording = _recorded_app(retrieval, upstream)
    client = app.test_client()
    paths = ("/v1/embeddings", "/v2/embed", f"/v1/models/{REAL_M3}:embed")
    seen = {}

    for path in paths:
        recording.calls.clear()
        recording.bytes.clear()
        reply = client.post(path, json=_dense_body(path, REAL_M3, TEXTS))
        assert reply.status_code == 200, reply.text
        seen[path] = ({(f, tuple(sorted(o))) for f, o in recording.calls}, sum(recording.bytes))

    dim = 32  # export/tiny_retrieval.py's hidden size: the dense vector's
    dense = ({(("embedding",), ("embedding",))}, len(TEXTS) * dim * 4)
    assert seen == dict.fromkeys(paths, dense)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v2/embed"])
def test_a_dense_answer_over_the_budget_is_a_413_before_the_model_runs(
    retrieval: dict[str, Any], path: str
) -> None:
    """GATEWAY_MAX_ANSWER_BYTES bounds the dense-only routes' answers too (texts x dims numbers),
    counted before the call: over it a 413 naming the setting and the numbers, and the model
    server's request count shows it never ran."""
    # tiny M3's 8 dims: a float vector is counted as 8 x 16 = 128 answer bytes
    app, _ = _recorded_app(retrieval, "grpc", max_answer_bytes=300)
    client = app.test_client()
    before = _predicts(retrieval, M3)

    over = client.post(path, json=_dense_body(path, M3, ["a", "b", "c"]))
    refused = _predicts(retrieval, M3)
    within = client.post(path, json=_dense_body(path, M3, ["a", "b"]))

    assert over.status_code == 413, over.text
    assert "GATEWAY_MAX_ANSWER_BYTES" in over.text and "384 bytes" in over.text, over.text
    assert "limit of 300" in over.text, over.text
    assert refused == before
    assert within.status_code == 200, within.text
    assert _predicts(retrieval, M3) == refused + 1


def test_a_reply_rest_cant_narrow_is_counted_whole_before_the_call(
    retrieval: dict[str, Any],
) -> None:
    """REST has no output filter: a version without output-subset signatures (the tiny BGE-M3
    table) sends back every output, so its reply is counted whole against
    GATEWAY_MAX_ANSWER_BYTES and refused (413) before the call; the real export's dense
    signature keeps the same request within it."""
    app, recording = _recorded_app(retrieval, "rest", max_answer_bytes=600)
    client = app.test_client()
    before = _predicts(retrieval, M3)

    whole = client.post("/v1/embeddings", json=_dense_body("/v1/embeddings", M3, ["hello"]))
    refused = _predicts(retrieval, M3)
    narrowed = client.post("/v1/embeddings", json=_dense_body("/v1/embeddings", REAL_M3,
                                                               ["hello"]))  # fmt: skip

    assert whole.status_code == 413, whole.text
    message = whole.json["error"]["message"]
    assert "model server's reply" in message and "GATEWAY_MAX_ANSWER_BYTES" in message, message
    assert "token_vectors" in message, message
    assert refused == before
    assert narrowed.status_code == 200, narrowed.text
    assert recording.calls == [(("embedding",), {"embedding"})]


@pytest.mark.parametrize(("shadow", "agrees"), [(2, True), (3, False)])
def test_a_shadow_compares_sparse_overlap_and_maxsim_and_the_rollout_decides_on_them(
    retrieval: dict[str, Any], tmp_path: Path, shadow: int, agrees: bool
) -> None:
    """v1 serves and ``shadow`` shadows every default :embed of sparse and multi-vectors: the
    shadow metrics' top-10 sparse overlap and MaxSim agreement are 1.0 for a re-export (v2) and
    low for another seed (v3), and the rollout's shadow step (ops/rollout: MaxSim decides when
    no dense vector is compared) says go, then roll back."""
    from backend.app import create_app
    from backend.worker import get_gateway
    from ops.rollout.decisions import GO, ROLLBACK, Step, Thresholds, decide
    from ops.rollout.metrics import figures, increase, parse_metrics_text

    routing = tmp_path / "routing.yaml"
    routing.write_text(f"{SHADOWED}:\n  weights: {{1: 1}}\n  shadow: {{version: {shadow}}}\n")
    app = create_app({"tfs_grpc_target": retrieval["server"].grpc_target,
                      "model_base_path": str(retrieval["base"]),
                      "model_config_file": str(retrieval["config"]),
                      "routing_file": str(routing), "shadow_queue_size": 64,
                      "shadow_timeout_s": 30})  # fmt: skip
    service = get_gateway(app)
    client = app.test_client()
    texts = [t for t in REAL_TEXTS if len(t) > 20][:12]
    before = parse_metrics_text(client.get("/metrics").text, SHADOWED)
    try:
        for text in texts:  # one text a request: the step's error check counts requests
            reply = client.post(
                f"/v1/models/{SHADOWED}:embed",
                json={"texts": [text], "outputs": ["sparse", "multivector"]},
            )
            assert reply.status_code == 200, reply.text
            assert reply.json["model"]["version"] == 1
        assert service.shadows.join(timeout_s=30)
    finally:
        service.close()
    after = parse_metrics_text(client.get("/metrics").text, SHADOWED)
    figs = figures(increase(before, after), SHADOWED, 1, shadow)
    assert figs.shadow.compared == len(texts) and figs.shadow.errors == figs.shadow.dropped == 0
    mean = {name: total / n for name, (total, n) in figs.shadow.agreement.items() if n}
    assert set(mean) == {"sparse_overlap", "maxsim"}, mean  # only the kinds asked
    decision = decide(Step(100, shadow=True), figs, Thresholds(min_samples=len(texts)), None,
                      final=True)  # fmt: skip
    print(f"shadow v{shadow}: {mean}, {decision.verdict}: {decision.reasons}")
    if agrees:
        assert mean == pytest.approx({"sparse_overlap": 1.0, "maxsim": 1.0})
        assert decision.verdict == GO, decision.reasons
    else:
        assert max(mean.values()) < 0.9, mean
        assert decision.verdict == ROLLBACK, decision.reasons
    assert decision.figures["measure"] == "maxsim"
