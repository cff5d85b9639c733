"""BERT: learned absolute positions, token types, post-norm layers, pooler tanh([CLS]) head."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
    absolute_positions_only,
    bert_layer,
    classifier,
    common,
    hidden_act,
    linear,
    mlm_head,
    norm,
    table,
)
from export.config import BertConfig
from export.names import TensorName

LAYER_PARTS = {
    "query": "attention.self.query", "key": "attention.self.key",
    "value": "attention.self.value", "attention_out": "attention.output.dense",
    "attention_ln": "attention.output.LayerNorm", "intermediate": "intermediate.dense",
    "output": "output.dense", "output_ln": "output.LayerNorm",
}  # fmt: skip


def read_config(data: Mapping[str, Any]) -> BertConfig:
    absolute_positions_only(data)
    return BertConfig(**common(data, model_type="bert"))


def embeddings(config: BertConfig) -> list[TensorName]:
    """Return BERT-style embeddings: word, position, token type tables and their layer norm."""
    e = config.embedding_width
    out = [
        table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, e),
        table("embeddings/position", "embeddings.position_embeddings",
              config.position_table or config.max_position, e),
    ]  # fmt: skip
    if config.type_vocab_size:
        out.append(table("embeddings/token_type", "embeddings.token_type_embeddings",
                         config.type_vocab_size, e))  # fmt: skip
    return out + norm("embeddings_ln", "embeddings.LayerNorm", e)


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = embeddings(config)
    for i in range(config.num_layers):
        out += bert_layer(f"encoder.layer.{i}.", i, config, LAYER_PARTS)
    out += linear("pooler", "pooler.dense", h, h, optional=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return BertForMaskedLM's head: ``cls.predictions`` (BertLMPredictionHead)."""
    return mlm_head(config, dense="cls.predictions.transform.dense",
                    ln="cls.predictions.transform.LayerNorm", decoder="cls.predictions.decoder",
                    biases=("cls.predictions.bias", "cls.predictions.decoder.bias"))  # fmt: skip


ARCHITECTURES = (
    Architecture(
        model_type="bert", title="BERT", prefix="bert.", read_config=read_config, names=names,
        classes={"classify": "BertForSequenceClassification",
                 "tag": "BertForTokenClassification", "embed": "BertModel"},
        mlm=MaskedLMHead("BertForMaskedLM", mlm_names, hidden_act),
    ),
)  # fmt: skip
