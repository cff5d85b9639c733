"""SPLADE exports answer what sentence-transformers' ``SparseEncoder.encode`` answers.

Tiny random checkpoints saved by sentence-transformers itself (export/tiny_splade.py: a
transformers ``...ForMaskedLM`` of each architecture with a masked-LM head, wrapped in
``MLMTransformer`` + ``SpladePooling``, or in a ``Router`` for the inference-free layout), read
by export and built in-process, against ``SparseEncoder.encode(..., max_active_dims=k)`` on the
same token ids: the same top-k indices and values within 1e-4 (fp32). Every pooling ×
activation is covered (cycled over the architectures); one bf16 and the inference-free model are
exported end to end (gate, model.json, the IDF asset), and the inference-free model's queries
come from the asset by modelformat/sparse_idf.py's rule. The pinned sentence-transformers 5.x
saves and answers these; one more is saved and answered by 6.x (its modules' new class paths) in a
child process (tests/export/st6.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)

from export.architectures import architecture
from export.errors import ExportError
from export.gates import Tolerance, sparse_figures, within
from export.tiny_splade import save_tiny_inference_free, save_tiny_splade
from modelformat.outputs import parse_outputs
from modelformat.sparse_idf import encode_queries, read_idf
from tests.export.test_architectures import ARCHITECTURES, TOKENIZERS

TEXTS = ["the quick brown fox jumps over the lazy dog", "where is my order?",
         "refund", "please help me with my account, the app crashed again today"]  # fmt: skip
COMBOS = [("max", "relu"), ("sum", "log1p_relu"), ("max", "log1p_relu"), ("sum", "relu")]
TOP_K = 24
# architectures with a masked-LM head in transformers: ELECTRA's is the generator's
# (ElectraForMaskedLM); DeBERTa-v2's the legacy cls.predictions (transformers' default) and,
# with legacy false, lm_predictions.lm_head over the word embeddings
CONFIGS = {**ARCHITECTURES, "deberta-v3-head": {**ARCHITECTURES["deberta-v3"], "legacy": False}}
TOKENIZER_KINDS = {**TOKENIZERS, "deberta-v3-head": TOKENIZERS["deberta-v3"]}
# NomicBERT's and GTE's masked-LM heads are not read yet (their MaskedLMHead is None)
SPLADE_ARCHS = [name for name, spec in CONFIGS.items()
                if architecture(spec["model_type"]).mlm is not None]  # fmt: skip


def _combo(arch: str) -> tuple[str, str]:
    return COMBOS[SPLADE_ARCHS.index(arch) % len(COMBOS)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Return a function saving (once per module) a tiny SPLADE checkpoint."""
    where = tmp_path_factory.mktemp("splade")
    cache: dict[tuple[Any, ...], Path] = {}

    def get(arch: str, pooling: str, act: str, free: bool = False) -> Path:
        key = (arch, pooling, act, free)
        if key not in cache:
            save = save_tiny_inference_free if free else save_tiny_splade
            cache[key] = save(where / "-".join(map(str, key)), config=CONFIGS[arch],
                              tokenizer_kind=TOKENIZER_KINDS[arch], pooling=pooling,
                              activation=act, seed=SPLADE_ARCHS.index(arch))  # fmt: skip
        return cache[key]

    return get


Rows = list[dict[int, float]]


def _reference(path: Path, k: int, query: bool = False) -> tuple[dict[str, np.ndarray], Rows]:
    """Return sentence-transformers' token features and top-k ``{id: value}`` per text."""
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(path), device="cpu", local_files_only=True)
    # the document tokenizer's ids (specials added), which the gateway sends for queries too
    features = model.tokenize(TEXTS)
    feeds = {name: features[name].numpy().astype(np.int32)
             for name in ("input_ids", "attention_mask")}  # fmt: skip
    types = features.get("token_type_ids")
    feeds["token_type_ids"] = (np.zeros_like(feeds["input_ids"]) if types is None
                               else types.numpy().astype(np.int32))  # fmt: skip
    with torch.no_grad():
        if query:
            # no max_active_dims: sentence-transformers 5.3 passes it to Router.tokenize, whose
            # TypeError makes SentenceTransformer.tokenize fall back to the default (document)
            # route's tokenizer, specials added, unlike SparseStaticEmbedding's own tokenize
            # (add_special_tokens=False); the top k is taken below
            dense = model.encode_query(TEXTS, convert_to_sparse_tensor=False,
                                       convert_to_tensor=True).numpy()  # fmt: skip
        else:
            dense = model.encode_document(TEXTS, max_active_dims=k, convert_to_sparse_tensor=False,
                                          convert_to_tensor=True).numpy()  # fmt: skip
    rows = [{int(i): float(row[i]) for i in np.flatnonzero(row)} for row in dense]
    return feeds, [dict(sorted(r.items(), key=lambda kv: -kv[1])[:k]) for r in rows]


def _ours(path: Path, feeds: dict[str, np.ndarray], k: int, precision: str = "fp32"
          ) -> dict[str, np.ndarray]:  # fmt: skip
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run
    from export.splade import read_splade, splade_spec

    found = read_splade(path)
    assert found is not None
    ckpt = read_checkpoint(found.model_dir)
    spec = splade_spec(found, ckpt.config, ckpt.weights["embeddings/word"], k)
    module = EncoderModule(ckpt.config, ckpt.weights, task="embed", precision=precision,
                           splade=spec)  # fmt: skip
    # eagerly (6x quicker than tracing here); the traced, saved graph: the end-to-end tests below
    return run(module._serve, feeds)


def _as_dicts(out: dict[str, np.ndarray]) -> list[dict[int, float]]:
    return [
        {int(i): float(v) for i, v in zip(idx, val, strict=True) if v != 0}
        for idx, val in zip(out["sparse_indices"], out["sparse_values"], strict=True)
    ]


def _same(ours: list[dict[int, float]], theirs: list[dict[int, float]], tol: float) -> None:
    for row, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        assert set(a) == set(b), f"row {row}: indices differ {sorted(set(a) ^ set(b))}"
        got, want = np.array([a[i] for i in sorted(a)]), np.array([b[i] for i in sorted(a)])
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"row {row}")


@pytest.mark.parametrize("arch", SPLADE_ARCHS)
def test_splade_top_k_matches_sparse_encoder(arch: str, saved: Callable[..., Path]) -> None:
    pooling, act = _combo(arch)
    path = saved(arch, pooling, act)
    feeds, expected = _reference(path, TOP_K)
    out = _ours(path, feeds, TOP_K)
    assert out["sparse_indices"].dtype == np.int32 and out["sparse_values"].shape == (4, TOP_K)
    values = out["sparse_values"]
    assert (np.diff(values, axis=1) <= 0).all(), "values descend"
    assert all(len(row) == TOP_K for row in expected), "the probe fills k (a test of the top-k)"
    _same(_as_dicts(out), expected, 1e-4)


def _saved_model(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, dict[str, np.ndarray]]:
    """Return each signature's answer to ``feeds`` (padded to the bucket for ``seq_<L>``)."""
    import tensorflow as tf

    from export.model import run

    loaded = tf.saved_model.load(str(path))
    info = json.loads((path / "assets" / "model.json").read_text(encoding="utf-8"))
    seq = feeds["input_ids"].shape[1]
    bucket = min(int(n) for n in info["bucket_signatures"] if int(n) >= seq)
    padded = {k: np.pad(v, ((0, 0), (0, bucket - seq))) for k, v in feeds.items()}
    bucket_signature = loaded.signatures[info["bucket_signatures"][str(bucket)]]
    return {"serving_default": run(loaded.signatures["serving_default"], feeds),
            "bucket": run(bucket_signature, padded)}  # fmt: skip


@pytest.mark.parametrize("module", ["MLMTransformer", "Transformer"])
def test_a_sentence_transformers_6_sparse_encoder_matches_its_encode(
    tmp_path: Path, module: str
) -> None:
    from tests.export.st6 import answers

    k = 24
    theirs = answers("splade", st6=True, dest=str(tmp_path / "st6"), texts=TEXTS, k=k,
                     config=CONFIGS["bert"], tokenizer_kind=TOKENIZER_KINDS["bert"],
                     pooling="max", activation="relu", mlm_module=module)  # fmt: skip
    types = [m["type"] for m in json.loads((tmp_path / "st6" / "modules.json").read_text())]
    paths = {"MLMTransformer": "sentence_transformers.sparse_encoder.modules.mlm_transformer",
             "Transformer": "sentence_transformers.base.modules.transformer"}  # 6.x's  # fmt: skip
    assert types[0] == f"{paths[module]}.{module}"
    feeds = {name[len("feed_") :]: value.astype(np.int32) for name, value in theirs.items()
             if name.startswith("feed_")}  # fmt: skip
    feeds.setdefault("token_type_ids", np.zeros_like(feeds["input_ids"]))
    want = [dict(sorted(((int(i), float(row[i])) for i in np.flatnonzero(row)),
                        key=lambda kv: -kv[1])[:k]) for row in theirs["want"]]  # fmt: skip
    _same(_as_dicts(_ours(tmp_path / "st6", feeds, k)), want, 1e-4)


def test_inference_free_export_serves_documents_and_its_idf_answers_queries(
    saved: Callable[..., Path], tmp_path: Path
) -> None:
    from export.build import build

    path = saved("bert", "max", "log1p_relu", True)
    result = build(path, "free", tmp_path, task="embed", top_k=TOP_K, warmup=False)
    info = result.model_info
    outputs = parse_outputs(info)
    assert outputs is not None and outputs.kinds == ("sparse",)
    sparse = outputs.sparse
    assert sparse is not None
    assert (sparse.form, sparse.top_k, sparse.pooling, sparse.activation) == (
        "topk",
        TOP_K,
        "max",
        "log1p_relu",
    )
    assert (sparse.query_form, sparse.query_asset) == ("idf", "sparse_idf.json")
    assert info["outputs"]["sparse"]["outputs"] == ["sparse_indices", "sparse_values"]
    feeds, documents = _reference(path, TOP_K)
    for name, answer in _saved_model(result.path, feeds).items():
        assert set(answer) == {"sparse_indices", "sparse_values"}, name
        _same(_as_dicts(answer), documents, 1e-4)
    # queries: no model call, the asset's weight for each present token id
    query_feeds, queries = _reference(path, TOP_K, query=True)
    table = read_idf(result.path / "assets" / sparse.query_asset, sparse.vocab_size)
    answered = encode_queries(query_feeds["input_ids"], query_feeds["attention_mask"], table,
                              TOP_K)  # fmt: skip
    _same([{int(i): float(v) for i, v in zip(*row, strict=True)} for row in answered], queries,
          1e-6)  # fmt: skip


def test_bf16_export_passes_its_top_k_gate(saved: Callable[..., Path], tmp_path: Path) -> None:
    from export.build import build

    path = saved("bert", "max", "relu")
    result = build(path, "splade", tmp_path, task="embed", precision="bf16", top_k=TOP_K,
                   warmup=False)  # fmt: skip
    conversion = result.conversion
    assert conversion["metric"] == "topk_overlap"
    assert conversion["decisive_topk_agreement"] == 1.0
    assert conversion["topk_overlap"] >= 0.9 and conversion["max_sparse_value_diff"] <= 0.05
    feeds, expected = _reference(path, TOP_K)
    answer = _saved_model(result.path, feeds)["serving_default"]
    figures = sparse_figures(_as_arrays(expected, TOP_K), answer)
    assert figures["decisive_topk_agreement"] == 1.0, figures
    print(f"bf16 vs SparseEncoder fp32: {figures}; gate: {conversion}")


def _as_arrays(rows: list[dict[int, float]], k: int) -> dict[str, np.ndarray]:
    indices, values = np.zeros((len(rows), k), np.int32), np.zeros((len(rows), k), np.float32)
    for r, row in enumerate(rows):
        items = sorted(row.items(), key=lambda kv: -kv[1])[:k]
        indices[r, : len(items)] = [i for i, _ in items]
        values[r, : len(items)] = [v for _, v in items]
    return {"sparse_indices": indices, "sparse_values": values}


def test_gate_refuses_a_top_k_that_lost_its_largest_entries() -> None:
    rng = np.random.default_rng(0)
    values = -np.sort(-rng.uniform(0.1, 3.0, (4, 16)), axis=1).astype(np.float32)
    indices = np.stack([rng.permutation(100)[:16] for _ in range(4)]).astype(np.int32)
    fp32 = {"sparse_indices": indices, "sparse_values": values}
    assert within(sparse_figures(fp32, fp32), Tolerance())
    drifted = {"sparse_indices": indices, "sparse_values": values * 1.01}
    assert within(sparse_figures(fp32, drifted), Tolerance())
    lost = indices.copy()
    lost[:, 0] = 100 + np.arange(4)  # each text's largest entry replaced by another token
    figures = sparse_figures(fp32, {"sparse_indices": lost, "sparse_values": values})
    assert figures["decisive_topk_agreement"] < 1.0 and not within(figures, Tolerance())
    shifted = {"sparse_indices": indices, "sparse_values": values + 0.5}
    assert not within(sparse_figures(fp32, shifted), Tolerance())


def test_refusals_name_what_is_wrong(saved: Callable[..., Path], tmp_path: Path) -> None:
    import shutil

    from safetensors.numpy import load_file, save_file

    from export.build import build
    from export.tiny import write_hf_checkpoint

    path = saved("bert", "max", "relu")
    with pytest.raises(ExportError, match="--task embed"):
        build(path, "a", tmp_path, task="classify")
    with pytest.raises(ExportError, match=r"top_k must be in \[1, "):
        build(path, "a", tmp_path, task="embed", top_k=10**6)
    with pytest.raises(ExportError, match="drop --pooling"):
        build(path, "a", tmp_path, task="embed", pooling="mean")
    plain = write_hf_checkpoint(tmp_path / "plain", task="embed")
    with pytest.raises(ExportError, match="--top-k is for SPLADE"):
        build(plain, "a", tmp_path, task="embed", top_k=8)
    headless = tmp_path / "headless"
    shutil.copytree(path, headless)
    tensors = load_file(str(headless / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if not k.startswith("cls.")},
              str(headless / "model.safetensors"))  # fmt: skip
    with pytest.raises(ExportError, match=r"no masked-LM head.*BertForMaskedLM"):
        build(headless, "a", tmp_path, task="embed")
    config = json.loads((path / "1_SpladePooling" / "config.json").read_text())
    (headless / "1_SpladePooling" / "config.json").write_text(
        json.dumps({**config, "pooling_strategy": "mean"})
    )
    with pytest.raises(ExportError, match="pooling_strategy 'mean' is not served"):
        build(headless, "a", tmp_path, task="embed")
    assert not list((tmp_path / "a").glob("[0-9]*")) if (tmp_path / "a").exists() else True


def test_an_older_idf_json_reads_as_the_same_table(
    saved: Callable[..., Path], tmp_path: Path
) -> None:
    import shutil

    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    from export.splade import read_splade

    path = saved("bert", "max", "log1p_relu", True)
    older = tmp_path / "older"
    shutil.copytree(path, older)
    query = older / "query_0_SparseStaticEmbedding"
    weights = load_file(str(query / "model.safetensors"))["weight"]
    (query / "model.safetensors").unlink()
    vocab = Tokenizer.from_file(str(query / "tokenizer.json")).get_vocab(with_added_tokens=True)
    # OpenSearch's idf.json: {token: weight}, beside the model
    (older / "idf.json").write_text(json.dumps({t: float(weights[i]) for t, i in vocab.items()}))
    found = read_splade(older)
    assert found is not None and found.query_source == str(older / "idf.json")
    assert found.query_idf is not None
    np.testing.assert_array_equal(found.query_idf, weights[: len(found.query_idf)])
