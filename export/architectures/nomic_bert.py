"""NomicBERT (nomic-embed-text): BERT's post-norm layers and token types with rotary positions
(no position table), a fused QKV projection, a SwiGLU feed-forward (``fc12`` the gate, ``fc11``
the up projection), no biases in attention or feed-forward, and BERT's pooler tanh([CLS]) head.

The names are those ``save_pretrained`` writes (transformers turns them into its own on load:
conversion_mapping.py's ``nomic_bert``), which are also nomic's own checkpoints' names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    classifier,
    common,
    linear,
    norm,
    rope_parameters,
    table,
)
from export.config import BertConfig
from export.names import TensorName

DEFAULT_THETA = 1000.0  # NomicBertConfig.default_theta


def read_config(data: Mapping[str, Any]) -> BertConfig:
    theta, scaling = rope_parameters(data, DEFAULT_THETA)
    head_dim = data.get("head_dim")
    heads, hidden = int(data["num_attention_heads"]), int(data["hidden_size"])
    if head_dim is not None and int(head_dim) * heads != hidden:
        raise ValueError(f"head_dim {head_dim} x {heads} heads is not hidden_size {hidden}")
    values = common(data, model_type="nomic_bert", hidden_act=str(data.get("hidden_act", "silu")),
                    max_position=int(data.get("max_position_embeddings", 2048)),
                    hidden_dropout=float(data.get("hidden_dropout_prob", 0.0)),
                    attention_dropout=float(data.get("attention_probs_dropout_prob", 0.0)),
                    rope_theta_full=theta, rope_scaling=scaling, bias=False)  # fmt: skip
    return BertConfig(**values)


def names(config: BertConfig) -> list[TensorName]:
    h, n = config.hidden_size, config.intermediate_size
    out = [table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, h)]
    if config.type_vocab_size:
        out.append(table("embeddings/token_type", "embeddings.token_type_embeddings",
                         config.type_vocab_size, h))  # fmt: skip
    out += norm("embeddings_ln", "emb_ln", h)
    for i in range(config.num_layers):
        where = f"encoder.layers.{i}."
        out += linear(f"layer_{i}/qkv", f"{where}attn.Wqkv", h, 3 * h, bias=False)
        out += linear(f"layer_{i}/attention_out", f"{where}attn.out_proj", h, h, bias=False)
        out += norm(f"layer_{i}/attention_ln", f"{where}norm1", h)
        out += linear(f"layer_{i}/intermediate", f"{where}mlp.fc11", h, n, bias=False)
        out += linear(f"layer_{i}/gate", f"{where}mlp.fc12", h, n, bias=False)
        out += linear(f"layer_{i}/output", f"{where}mlp.fc2", n, h, bias=False)
        out += norm(f"layer_{i}/output_ln", f"{where}norm2", h)
    out += linear("pooler", "pooler.dense", h, h, optional=True)
    return out + classifier("classifier", h)


ARCHITECTURES = (
    Architecture(
        model_type="nomic_bert", title="NomicBERT", prefix="nomic_bert.",
        read_config=read_config, names=names, position_ids="none", attention="rotary",
        feed_forward="gated",
        classes={"classify": "NomicBertForSequenceClassification",
                 "tag": "NomicBertForTokenClassification", "embed": "NomicBertModel"},
    ),
)  # fmt: skip
