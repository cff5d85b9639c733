"""MPNet: positions counted from ``padding_idx + 1`` (RoBERTa's rule), no token types, and a
relative position bias (32 log buckets, one table shared by every layer) added to the scores."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
    bert_layer,
    classifier,
    common,
    gelu,
    linear,
)
from export.architectures.bert import embeddings
from export.architectures.roberta import mlm_names
from export.config import BertConfig
from export.names import TensorName

LAYER_PARTS = {
    "query": "attention.attn.q", "key": "attention.attn.k", "value": "attention.attn.v",
    "attention_out": "attention.attn.o", "attention_ln": "attention.LayerNorm",
    "intermediate": "intermediate.dense", "output": "output.dense",
    "output_ln": "output.LayerNorm",
}  # fmt: skip
BUCKETS = 32  # MPNetEncoder.compute_position_bias always buckets into 32 (max distance 128)


def read_config(data: Mapping[str, Any]) -> BertConfig:
    # MPNetEmbeddings hard-codes padding_idx 1 whatever pad_token_id says
    rows = int(data.get("max_position_embeddings", 514))
    buckets = int(data.get("relative_attention_num_buckets", 32))
    values = common(data, type_vocab_size=0, pad_token_id=1, position_table=rows,
                    max_position=rows - 2, position_buckets=buckets)  # fmt: skip
    return BertConfig(**values)


def names(config: BertConfig) -> list[TensorName]:
    h = config.hidden_size
    out = embeddings(config)
    for i in range(config.num_layers):
        out += bert_layer(f"encoder.layer.{i}.", i, config, LAYER_PARTS)
    out.append(TensorName("relative/bias", (config.position_buckets, config.num_heads),
                          "encoder.relative_attention_bias.weight"))  # fmt: skip
    out += linear("pooler", "classifier.dense", h, h, optional=True, head=True)
    out += linear("classifier", "classifier.out_proj", h, "labels", optional=True, head=True)
    return out + classifier("classifier", h)


ARCHITECTURES = (
    Architecture(
        model_type="mpnet", title="MPNet", prefix="mpnet.", read_config=read_config,
        names=names, position_ids="padded", attention="relative_bias",
        classes={"classify": "MPNetForSequenceClassification",
                 "tag": "MPNetForTokenClassification", "embed": "MPNetModel"},
        mlm=MaskedLMHead("MPNetForMaskedLM", mlm_names, gelu),
    ),
)  # fmt: skip
