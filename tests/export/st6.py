"""sentence-transformers 6's own answers, from a child process that has it first on its path.

requirements-refs.txt pins 5.3.0 (PyLate, the ColBERT reference, needs it); `make setup` installs
requirements-st6.txt's 6.x beside it, ``--no-deps`` into ``.venv/st6-site`` (its dependencies are
the venv's own). ``answers(kind, st6=..., **arguments)`` runs ``python -m tests.export.st6`` with
that directory first on ``PYTHONPATH`` (or without it: the pinned 5.x) and returns the arrays it
saved; each ``kind`` below builds, saves or encodes with the sentence-transformers it imports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def site() -> Path:
    """Return the directory sentence-transformers 6 is installed in (``BERT_GATEWAY_ST6_SITE``,
    else the venv's ``st6-site``); AssertionError naming ``make setup`` when it is not there."""
    where = Path(os.environ.get("BERT_GATEWAY_ST6_SITE") or Path(sys.prefix) / "st6-site")
    assert (where / "sentence_transformers").is_dir(), (
        f"sentence-transformers 6 is not installed in {where}: run `make setup` "
        "(requirements-st6.txt)"
    )
    return where


def answers(kind: str, *, st6: bool, **arguments: Any) -> dict[str, np.ndarray]:
    """Return what ``kind`` saved, run in a child with sentence-transformers 6 first on its path
    (``st6``) or the pinned 5.x."""
    paths = [str(site())] if st6 else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO)]),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answers.npz"
        done = subprocess.run(
            [sys.executable, "-m", "tests.export.st6", kind, json.dumps(arguments), str(out)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        with np.load(out) as saved:
            return {name: saved[name] for name in saved.files}


def _save_multivector(dest: str, arch: str) -> dict[str, Any]:
    from export.tiny_retrieval import save_multivector_checkpoint

    save_multivector_checkpoint(dest, arch)
    return {}


def _multivector(path: str, queries: list[str], documents: list[str]) -> dict[str, Any]:
    """Return a MultiVectorEncoder's markers, its ``preprocess`` of each side (the batch and each
    text alone) and its ``encode_query`` / ``encode_document`` rows per text."""
    from sentence_transformers import MultiVectorEncoder  # type: ignore[attr-defined]  # 6.x

    model = MultiVectorEncoder(path, device="cpu", local_files_only=True)
    transformer, tok = model[0], model.tokenizer
    mask = next(m for m in model if type(m).__name__ == "MultiVectorMask")
    skip = mask._skiplist_ids  # as it resolved its skiplist words with the tokenizer
    expansion = transformer.query_expansion or {}
    out: dict[str, Any] = {
        "skiplist_ids": np.asarray([] if skip is None else skip.tolist(), np.int64),
        "query_prefix_id": tok.convert_tokens_to_ids(model.prompts["query"]),
        "document_prefix_id": tok.convert_tokens_to_ids(model.prompts["document"]),
        "mask_id": tok.mask_token_id, "query_length": expansion.get("length", -1),
        "attend": bool(expansion.get("attend", False)),
        "document_length": transformer.document_length, "score": model.similarity_fn_name,
    }  # fmt: skip
    for side, texts in (("query", queries), ("document", documents)):
        prompt = model.prompts[side]
        batch = transformer.preprocess(texts, prompt=prompt, task=side)
        for key in ("input_ids", "attention_mask", "token_type_ids"):
            if key in batch:
                out[f"{side}_{key}"] = batch[key].numpy()
        encode = model.encode_query if side == "query" else model.encode_document
        for i, (text, rows) in enumerate(zip(texts, encode(texts, convert_to_numpy=True),
                                             strict=True)):  # fmt: skip
            alone = transformer.preprocess([text], prompt=prompt, task=side)
            out[f"{side}_ids_{i}"] = alone["input_ids"][0].numpy()
            out[f"{side}_attention_{i}"] = alone["attention_mask"][0].numpy()
            out[f"{side}_want_{i}"] = rows
    return out


def _dense(base: str, dest: str, pooling: list[str], activation: str,
           texts: list[str]) -> dict[str, Any]:  # fmt: skip
    """Build a SentenceTransformer on ``base`` (Transformer, Pooling, Dense to 12, Normalize),
    save it at ``dest`` and return its ``encode`` of ``texts`` and its tokenizer's ids."""
    import sentence_transformers
    import torch
    from sentence_transformers import SentenceTransformer, models

    if int(sentence_transformers.__version__.split(".")[0]) >= 6:  # the modes, in their order
        modes: dict[str, Any] = {"pooling_mode": list(pooling)}
    else:  # 5.x: one flag per mode
        modes = {"pooling_mode_mean_tokens": "mean" in pooling,
                 "pooling_mode_cls_token": "cls" in pooling}  # fmt: skip
    torch.manual_seed(5)
    act = torch.nn.Tanh() if activation == "tanh" else torch.nn.Identity()
    model = SentenceTransformer(modules=[
        models.Transformer(base, max_seq_length=32), models.Pooling(32, **modes),
        models.Dense(32 * len(pooling), 12, activation_function=act), models.Normalize(),
    ], device="cpu")  # fmt: skip
    model.save(dest)
    encoded = model.tokenizer(texts, padding=True, truncation=True, max_length=32,
                              return_tensors="np")  # fmt: skip
    return {"want": model.encode(texts, convert_to_numpy=True),
            "version": np.asarray(sentence_transformers.__version__),
            **{f"feed_{k}": v for k, v in encoded.items()}}  # fmt: skip


def _splade(dest: str, texts: list[str], k: int, **saving: Any) -> dict[str, Any]:
    """Save a tiny SPLADE SparseEncoder at ``dest`` (export/tiny_splade.py's ``saving``
    keywords) and return its tokenizer's ids of ``texts`` and ``encode_document``'s top ``k``
    (dense ``[texts, vocab]``)."""
    import torch
    from sentence_transformers import SparseEncoder

    from export.tiny_splade import save_tiny_splade

    model = SparseEncoder(str(save_tiny_splade(dest, **saving)), device="cpu",
                          local_files_only=True)  # fmt: skip
    features = model.tokenize(texts)
    with torch.no_grad():
        dense = model.encode_document(texts, max_active_dims=k, convert_to_sparse_tensor=False,
                                      convert_to_tensor=True).numpy()  # fmt: skip
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features]
    return {"want": dense, **{f"feed_{name}": features[name].numpy() for name in names}}


KINDS = {"save_multivector": _save_multivector, "multivector": _multivector, "dense": _dense,
         "splade": _splade}  # fmt: skip

if __name__ == "__main__":
    kind, arguments, where = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    import torch

    torch.set_num_threads(1)
    np.savez(where, **KINDS[kind](**arguments))
