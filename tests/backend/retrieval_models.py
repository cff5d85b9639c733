"""Tiny retrieval versions for the gateway's end-to-end tests: BGE-M3-like (dense, token
weights, token vectors), ColBERT-like (token vectors with query/document markers), SPLADE-like
(top-k sparse, an inference-free IDF query side) and a hybrid with a query side (dense, token
weights and ColBERT-marked token vectors: a query's tokens differ from a document's, whatever
kinds are asked).

Each is a tiny exported embed version (export/tiny.py: its tokenizer and assets) whose SavedModel
is replaced by a graph of a random embedding table with no context, so every output is a known
function of the ids the gateway sent: a test recomputes it from the table and checks the ids
(markers, expansions), the rows kept and the post-processing end to end. The export side's own
tiny checkpoints (BGE-M3, PyLate, SPLADE) replace this once they exist.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from modelformat.outputs import (
    DenseOutput,
    MarkerSide,
    MultiVectorOutput,
    Outputs,
    SparseOutput,
)

DIM, TOP_K = 8, 6
M3, COLBERT, SPLADE = "tiny-m3", "tiny-colbert", "tiny-splade"
HYBRID = "tiny-hybrid-marked"
SPECIAL_IDS = (0, 1, 2, 3)  # the tiny vocabulary's [PAD] [UNK] [CLS] [SEP]; [MASK] is 4
CLS_ID, MASK_ID = 2, 4


def table(seed: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Return a version's embedding table [vocab, DIM] and sparse weight vector [DIM]."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(vocab_size, DIM)).astype(np.float32),
            rng.normal(size=DIM).astype(np.float32))  # fmt: skip


def colbert_outputs(vocab_size: int) -> Outputs:
    """Return the ColBERT version's outputs entry (markers: the vocabulary's last two ids)."""
    return Outputs(multivector=MultiVectorOutput(
        dim=DIM, normalized=True, rows="attention", skiplist_ids=(5, 6), score="sum",
        query=MarkerSide(prefix_id=vocab_size - 1, length=12, expansion_id=MASK_ID),
        document=MarkerSide(prefix_id=vocab_size - 2, length=16),
    ))  # fmt: skip


def write_versions(base: Path) -> dict[str, Any]:
    """Write the three versions (v1 each) under ``base``; return what tests recompute from."""
    from export.tiny import export_tiny_model

    made: dict[str, Any] = {}
    for seed, name in enumerate((M3, COLBERT, SPLADE), start=40):
        version = export_tiny_model(base, name, task="embed", version=1, seed=seed,
                                    max_seq_len=32, warmup=False)  # fmt: skip
        info = json.loads((version / "assets" / "model.json").read_text(encoding="utf-8"))
        vocab_size = int(info["vocab_size"])
        weights, sparse_w = table(seed, vocab_size)
        if name == M3:
            outputs = Outputs(
                dense=DenseOutput(DIM, normalized=True),
                sparse=SparseOutput(form="token_weights", drop_ids=SPECIAL_IDS),
                multivector=MultiVectorOutput(dim=DIM, rows="after_cls", score="mean"),
            )
        elif name == COLBERT:
            outputs = colbert_outputs(vocab_size)
        else:
            idf = {str(i): float(abs(w)) for i, w in enumerate(sparse_w.tolist() * 3) if i > 4}
            idf = {k: v for k, v in idf.items() if int(k) < vocab_size}
            (version / "assets" / "sparse_idf.json").write_text(json.dumps(idf), encoding="utf-8")
            outputs = Outputs(sparse=SparseOutput(
                form="topk", top_k=TOP_K, vocab_size=vocab_size, pooling="max",
                activation="log1p_relu", query_form="idf", query_asset="sparse_idf.json",
            ))  # fmt: skip
        _save_graph(version, weights, sparse_w, outputs)
        info.update(outputs=outputs.to_info(), bucket_signatures={}, dim=DIM)
        (version / "assets" / "model.json").write_text(json.dumps(info), encoding="utf-8")
        made[name] = {"table": weights, "sparse": sparse_w, "outputs": outputs,
                      "vocab_size": vocab_size}  # fmt: skip
    return made


def write_m3_versions(base: Path, name: str, seeds: dict[int, int]) -> None:
    """Write BGE-M3-like versions of ``name`` (version -> the seed of its tables): the same
    seed twice is a re-export (the same outputs), another seed a different model."""
    from export.tiny import export_tiny_model

    outputs = Outputs(
        dense=DenseOutput(DIM, normalized=True),
        sparse=SparseOutput(form="token_weights", drop_ids=SPECIAL_IDS),
        multivector=MultiVectorOutput(dim=DIM, rows="after_cls", score="mean"),
    )
    for version, seed in seeds.items():
        path = export_tiny_model(base, name, task="embed", version=version, seed=seed,
                                 max_seq_len=32, warmup=False)  # fmt: skip
        info = json.loads((path / "assets" / "model.json").read_text(encoding="utf-8"))
        weights, sparse_w = table(seed, int(info["vocab_size"]))
        _save_graph(path, weights, sparse_w, outputs)
        info.update(outputs=outputs.to_info(), bucket_signatures={}, dim=DIM)
        (path / "assets" / "model.json").write_text(json.dumps(info), encoding="utf-8")


def write_hybrid_version(base: Path, name: str = HYBRID, seed: int = 60) -> None:
    """Write ``name`` v1: dense, token weights and ColBERT token vectors with query and document
    markers (``colbert_outputs``), so a text's tokens depend on its side for every kind."""
    from export.tiny import export_tiny_model

    path = export_tiny_model(base, name, task="embed", version=1, seed=seed, max_seq_len=32,
                             warmup=False)  # fmt: skip
    info = json.loads((path / "assets" / "model.json").read_text(encoding="utf-8"))
    vocab_size = int(info["vocab_size"])
    marked = colbert_outputs(vocab_size).multivector
    outputs = Outputs(dense=DenseOutput(DIM, normalized=True),
                      sparse=SparseOutput(form="token_weights", drop_ids=SPECIAL_IDS),
                      multivector=marked)  # fmt: skip
    weights, sparse_w = table(seed, vocab_size)
    _save_graph(path, weights, sparse_w, outputs)
    info.update(outputs=outputs.to_info(), bucket_signatures={}, dim=DIM)
    (path / "assets" / "model.json").write_text(json.dumps(info), encoding="utf-8")


def _save_graph(version: Path, weights: np.ndarray, sparse_w: np.ndarray, outputs: Outputs) -> None:
    """Replace ``version``'s SavedModel by the table graph answering ``outputs``' kinds."""
    import tensorflow as tf

    spec = [tf.TensorSpec([None, None], tf.int32, name=n)
            for n in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip

    class Graph(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = tf.Variable(weights)
            self.weight = tf.Variable(sparse_w)

        @tf.function(input_signature=spec)
        def serve(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            mask = tf.cast(attention_mask, tf.float32)
            x = tf.gather(self.table, input_ids)
            out = {}
            if outputs.dense is not None:
                out["embedding"] = tf.math.l2_normalize(x[:, 0], axis=-1)
            if outputs.sparse is not None and outputs.sparse.form == "token_weights":
                out["token_weights"] = tf.nn.relu(tf.tensordot(x, self.weight, 1)) * mask
            if outputs.sparse is not None and outputs.sparse.form == "topk":
                logits = tf.einsum("bld,vd->blv", x, self.table) * mask[..., None]
                pooled = tf.reduce_max(tf.math.log1p(tf.math.log1p(tf.nn.relu(logits))), axis=1)
                values, indices = tf.math.top_k(pooled, k=TOP_K)
                out["sparse_indices"], out["sparse_values"] = indices, values
            if outputs.multivector is not None:
                out["token_vectors"] = tf.math.l2_normalize(x, axis=-1)
            return out

    graph = Graph()
    with tempfile.TemporaryDirectory(prefix="retrieval-") as tmp:
        tf.saved_model.save(graph, tmp, signatures={"serving_default": graph.serve})
        for item in ("saved_model.pb", "variables", "fingerprint.pb"):
            target = version / item
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
            if (Path(tmp) / item).exists():
                shutil.move(str(Path(tmp) / item), str(target))
