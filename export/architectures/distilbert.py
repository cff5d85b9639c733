"""DistilBERT: no token types, its own weight names, a ``pre_classifier`` → ReLU head."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
    bert_layer,
    classifier,
    hidden_act,
    linear,
    mlm_head,
    norm,
    table,
)
from export.config import BertConfig
from export.names import TensorName

LAYER_PARTS = {
    "query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
    "attention_out": "attention.out_lin", "attention_ln": "sa_layer_norm",
    "intermediate": "ffn.lin1", "output": "ffn.lin2", "output_ln": "output_layer_norm",
}  # fmt: skip


def read_config(data: Mapping[str, Any]) -> BertConfig:
    return BertConfig(
        vocab_size=int(data["vocab_size"]), hidden_size=int(data["dim"]),
        num_layers=int(data["n_layers"]), num_heads=int(data["n_heads"]),
        intermediate_size=int(data["hidden_dim"]),
        max_position=int(data.get("max_position_embeddings", 512)), type_vocab_size=0,
        hidden_act=str(data.get("activation", "gelu")), layer_norm_eps=1e-12,
        hidden_dropout=float(data.get("dropout", 0.1)),
        attention_dropout=float(data.get("attention_dropout", 0.1)),
        model_type="distilbert", pad_token_id=int(data.get("pad_token_id") or 0),
        pooler_act="relu",
    )  # fmt: skip


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = [
        table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, h),
        table("embeddings/position", "embeddings.position_embeddings", config.max_position, h),
        *norm("embeddings_ln", "embeddings.LayerNorm", h),
    ]
    for i in range(config.num_layers):
        out += bert_layer(f"transformer.layer.{i}.", i, config, LAYER_PARTS)
    out += linear("pooler", "pre_classifier", h, h, optional=True, head=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return DistilBertForMaskedLM's head: vocab_transform → activation → vocab_layer_norm →
    vocab_projector (its bias the only one)."""
    return mlm_head(
        config,
        dense="vocab_transform",
        ln="vocab_layer_norm",
        decoder="vocab_projector",
        biases=("vocab_projector.bias",),
    )


ARCHITECTURES = (
    Architecture(
        model_type="distilbert", title="DistilBERT", prefix="distilbert.",
        read_config=read_config, names=names,
        classes={"classify": "DistilBertForSequenceClassification",
                 "tag": "DistilBertForTokenClassification", "embed": "DistilBertModel"},
        mlm=MaskedLMHead("DistilBertForMaskedLM", mlm_names, hidden_act),
    ),
)  # fmt: skip
