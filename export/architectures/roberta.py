"""RoBERTa, XLM-RoBERTa, CamemBERT: BERT's layers; positions counted from ``padding_idx + 1``
over the non-pad tokens; a classification head dense → tanh → out_proj on ``<s>``."""

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
    values = common(data, pad_token_id=int(data.get("pad_token_id", 1)))
    table_rows = values["max_position"]
    # positions pad+1 .. pad+S: the table's last pad+1 rows are never reached
    values.update(position_table=table_rows, max_position=table_rows - values["pad_token_id"] - 1)
    return BertConfig(**values)


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = embeddings(config)
    for i in range(config.num_layers):
        out += bert_layer(f"encoder.layer.{i}.", i, config, LAYER_PARTS)
    # RobertaForSequenceClassification: classifier.dense → tanh → classifier.out_proj
    out += linear("pooler", "classifier.dense", h, h, optional=True, head=True)
    out += linear("classifier", "classifier.out_proj", h, "labels", optional=True, head=True)
    # RobertaForTokenClassification: classifier (the same canonical name: a task has one)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return RobertaForMaskedLM's head ``lm_head`` (dense → gelu → layer_norm → decoder; also
    XLM-RoBERTa's and CamemBERT's, and MPNet's MPNetLMHead)."""
    return mlm_head(
        config,
        dense="lm_head.dense",
        ln="lm_head.layer_norm",
        decoder="lm_head.decoder",
        biases=("lm_head.bias", "lm_head.decoder.bias"),
    )


def _roberta(model_type: str, title: str, cls: str) -> Architecture:
    return Architecture(
        model_type=model_type, title=title, prefix="roberta.",
        read_config=read_config, names=names, position_ids="padded",
        classes={"classify": f"{cls}ForSequenceClassification",
                 "tag": f"{cls}ForTokenClassification", "embed": f"{cls}Model"},
        mlm=MaskedLMHead(f"{cls}ForMaskedLM", mlm_names, gelu),
    )  # fmt: skip


ARCHITECTURES = (
    _roberta("roberta", "RoBERTa", "Roberta"),
    _roberta("xlm-roberta", "XLM-RoBERTa", "XLMRoberta"),
    _roberta("camembert", "CamemBERT", "Camembert"),
)
