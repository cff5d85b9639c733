"""ELECTRA (discriminator): BERT's layers; embeddings of ``embedding_size`` projected to the
hidden size when they differ; a two-layer classification head dense → GELU → out_proj."""

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
    gelu,
    linear,
    mlm_head,
)
from export.architectures.bert import LAYER_PARTS, embeddings
from export.config import BertConfig
from export.names import TensorName


def read_config(data: Mapping[str, Any]) -> BertConfig:
    absolute_positions_only(data)
    size = int(data.get("embedding_size") or data["hidden_size"])
    # ElectraClassificationHead uses gelu whatever hidden_act says
    return BertConfig(**common(data, embedding_size=size, pooler_act="gelu"))


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = embeddings(config)
    if config.embedding_width != h:
        out += linear("embeddings/projection", "embeddings_project", config.embedding_width, h)
    for i in range(config.num_layers):
        out += bert_layer(f"encoder.layer.{i}.", i, config, LAYER_PARTS)
    out += linear("pooler", "classifier.dense", h, h, optional=True, head=True)
    out += linear("classifier", "classifier.out_proj", h, "labels", optional=True, head=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return ElectraForMaskedLM's head (the *generator*; a discriminator checkpoint has none):
    generator_predictions dense (hidden → embedding_size) → gelu → LayerNorm →
    generator_lm_head."""
    return mlm_head(config, dense="generator_predictions.dense",
                    ln="generator_predictions.LayerNorm", decoder="generator_lm_head",
                    biases=("generator_lm_head.bias",), width=config.embedding_width)  # fmt: skip


ARCHITECTURES = (
    Architecture(
        model_type="electra", title="ELECTRA (discriminator)", prefix="electra.",
        read_config=read_config, names=names,
        classes={"classify": "ElectraForSequenceClassification",
                 "tag": "ElectraForTokenClassification", "embed": "ElectraModel"},
        mlm=MaskedLMHead("ElectraForMaskedLM", mlm_names, gelu),
    ),
)  # fmt: skip
