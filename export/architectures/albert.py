"""ALBERT: factorised embeddings projected to the hidden size; layer groups whose weights every
step of the layer loop in that group shares; BERT's pooler tanh head."""

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
)
from export.architectures.bert import embeddings
from export.config import BertConfig
from export.names import TensorName

LAYER_PARTS = {
    "query": "attention.query", "key": "attention.key", "value": "attention.value",
    "attention_out": "attention.dense", "attention_ln": "attention.LayerNorm",
    "intermediate": "ffn", "output": "ffn_output", "output_ln": "full_layer_layer_norm",
}  # fmt: skip


def read_config(data: Mapping[str, Any]) -> BertConfig:
    absolute_positions_only(data)
    layers, groups = int(data["num_hidden_layers"]), int(data.get("num_hidden_groups", 1))
    inner = int(data.get("inner_group_num", 1))
    if groups < 1 or inner < 1:
        raise ValueError(f"num_hidden_groups {groups} and inner_group_num {inner} must be >= 1")
    # AlbertTransformer: step i runs every inner layer of group int(i / (layers / groups))
    plan = tuple(
        tuple(range(g * inner, (g + 1) * inner))
        for g in (int(i / (layers / groups)) for i in range(layers))
    )
    return BertConfig(**common(data, embedding_size=int(data.get("embedding_size", 128)),
                               hidden_act=str(data.get("hidden_act", "gelu_new")),
                               layer_plan=plan))  # fmt: skip


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = embeddings(config)
    out += linear("embeddings/projection", "encoder.embedding_hidden_mapping_in",
                  config.embedding_width, h)  # fmt: skip
    inner = len(config.plan[0])
    for k in range(config.unique_layers):
        where = f"encoder.albert_layer_groups.{k // inner}.albert_layers.{k % inner}."
        out += bert_layer(where, k, config, LAYER_PARTS)
    out += linear("pooler", "pooler", h, h, optional=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return AlbertForMaskedLM's head ``predictions`` (AlbertMLMHead: dense hidden →
    embedding_size → hidden_act → LayerNorm → decoder)."""
    return mlm_head(config, dense="predictions.dense", ln="predictions.LayerNorm",
                    decoder="predictions.decoder",
                    biases=("predictions.bias", "predictions.decoder.bias"),
                    width=config.embedding_width)  # fmt: skip


ARCHITECTURES = (
    Architecture(
        model_type="albert", title="ALBERT", prefix="albert.", read_config=read_config,
        names=names,
        classes={"classify": "AlbertForSequenceClassification",
                 "tag": "AlbertForTokenClassification", "embed": "AlbertModel"},
        mlm=MaskedLMHead("AlbertForMaskedLM", mlm_names, hidden_act),
    ),
)  # fmt: skip
