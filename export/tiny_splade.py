"""Tiny SPLADE checkpoints for tests, saved by sentence-transformers itself (test-time only).

``save_tiny_splade`` writes a ``SparseEncoder`` directory (``MLMTransformer`` at the root,
``1_SpladePooling``) of a tiny random masked-LM model of any architecture of the family;
``save_tiny_inference_free`` writes an inference-free one (a ``Router``: the query side a
``SparseStaticEmbedding`` IDF table, the document side ``MLMTransformer`` + ``SpladePooling``),
as OpenSearch's doc-only models are laid out. Both need torch, transformers and
sentence-transformers (requirements-dev.txt), imported when called: nothing in the product
imports this module. The tokenizer is one of export/tiny_tokenizers.py's kinds, the model's
vocabulary sized to it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# tiny: 2 layers, hidden 32 (the parity matrix's sizes, tests/export/test_architectures.py)
SIZE = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48,
        "num_hidden_layers": 2, "max_position_embeddings": 64,
        "initializer_range": 0.3}  # fmt: skip


def _masked_lm(where: Path, config: Mapping[str, Any], tokenizer_kind: str, seed: int) -> Path:
    """Save a tiny random ``AutoModelForMaskedLM`` with its tokenizer under ``where``."""
    import torch
    import transformers

    from export.tiny_tokenizers import build_tokenizer, write_tokenizer

    trained: Any = build_tokenizer(tokenizer_kind)
    values = {**SIZE, "vocab_size": trained.get_vocab_size(with_added_tokens=True), **config}
    model_type = str(values.pop("model_type", "bert"))
    torch.manual_seed(seed)
    model = transformers.AutoModelForMaskedLM.from_config(
        transformers.AutoConfig.for_model(model_type, **values)
    ).eval()
    vocab = int(values["vocab_size"])
    with torch.no_grad():  # visible vocabulary biases (transformers initialises them to zeros)
        for name, param in model.named_parameters():
            if name.endswith("bias") and tuple(param.shape) == (vocab,):
                param.normal_(0.0, 0.5)
    model.save_pretrained(where)
    write_tokenizer(where, tokenizer_kind, trained=trained)
    return where


def _splade_modules(source: Path, pooling: str, activation: str, max_len: int,
                    mlm_module: str = "MLMTransformer") -> list[Any]:  # fmt: skip
    from sentence_transformers.sparse_encoder.models import MLMTransformer, SpladePooling

    if mlm_module == "Transformer":  # sentence-transformers 6's: MLMTransformer is deprecated
        from sentence_transformers.base.modules import Transformer  # type: ignore[import-not-found]

        mlm = Transformer(str(source), max_seq_length=max_len, transformer_task="fill-mask")
    else:
        mlm = MLMTransformer(str(source), max_seq_length=max_len)
    return [mlm, SpladePooling(pooling_strategy=pooling, activation_function=activation)]  # type: ignore[arg-type]


def save_tiny_splade(
    dest: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    tokenizer_kind: str = "wordpiece",
    pooling: str = "max",
    activation: str = "relu",
    seed: int = 0,
    max_len: int = 64,
    mlm_module: str = "MLMTransformer",
) -> Path:
    """Save a tiny SPLADE ``SparseEncoder`` at ``dest`` and return it.

    ``config`` is transformers config keywords (``model_type`` first of all; BERT by default),
    ``pooling`` max or sum, ``activation`` relu or log1p_relu (``SpladePooling``'s);
    ``mlm_module`` ``Transformer`` builds the masked-LM model as sentence-transformers 6 does (a
    ``Transformer`` with ``transformer_task="fill-mask"``; 6.x only).
    """
    from sentence_transformers import SparseEncoder

    dest = Path(dest)
    with tempfile.TemporaryDirectory() as tmp:
        source = _masked_lm(Path(tmp) / "mlm", config or {}, tokenizer_kind, seed)
        modules = _splade_modules(source, pooling, activation, max_len, mlm_module)
        SparseEncoder(modules=modules).save(str(dest))
    return dest


def save_tiny_inference_free(
    dest: str | Path,
    *,
    config: Mapping[str, Any] | None = None,
    tokenizer_kind: str = "wordpiece",
    pooling: str = "max",
    activation: str = "log1p_relu",
    seed: int = 0,
    max_len: int = 64,
) -> Path:
    """Save a tiny inference-free SPLADE model (a ``Router``) at ``dest`` and return it.

    Queries: ``SparseStaticEmbedding`` with a random positive IDF weight per token id (frozen);
    documents: the SPLADE side of ``save_tiny_splade`` (OpenSearch's doc-only layout).
    """
    import torch
    from sentence_transformers import SparseEncoder
    from sentence_transformers.models import Router
    from sentence_transformers.sparse_encoder.models import SparseStaticEmbedding

    dest = Path(dest)
    with tempfile.TemporaryDirectory() as tmp:
        source = _masked_lm(Path(tmp) / "mlm", config or {}, tokenizer_kind, seed)
        documents = _splade_modules(source, pooling, activation, max_len)
        tokenizer = documents[0].tokenizer  # the document side's, as MLMTransformer loaded it
        generator = torch.Generator().manual_seed(seed + 1)
        weight = torch.rand(len(tokenizer.get_vocab()), generator=generator) * 5.0
        query = SparseStaticEmbedding(tokenizer=tokenizer, weight=weight, frozen=True)  # type: ignore[arg-type]
        router = Router.for_query_document(
            query_modules=[query],
            document_modules=documents,
        )
        SparseEncoder(modules=[router]).save(str(dest))
    return dest
