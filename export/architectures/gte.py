"""GTE (Alibaba's "new" architecture: gte-base-en-v1.5, gte-multilingual-base,
snowflake-arctic-embed-m-v2.0): BERT's post-norm layers with rotary positions (no position
table), token types where ``type_vocab_size`` has any, a fused QKV projection with biases, a
gated feed-forward (``up_gate_proj``: the up projection, then the gate under the activation; no
bias) and BERT's pooler tanh([CLS]) head.

The names are those ``save_pretrained`` writes (transformers turns them into its own on load:
conversion_mapping.py's ``gte``), which are also Alibaba's own checkpoints' names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    classifier,
    common,
    linear,
    norm,
    rope,
    table,
)
from export.config import BertConfig
from export.names import TensorName

DEFAULT_THETA = 160_000.0  # GteConfig.default_theta


def read_config(data: Mapping[str, Any]) -> BertConfig:
    values = common(data, model_type="gte", type_vocab_size=int(data.get("type_vocab_size", 1)),
                    max_position=int(data.get("max_position_embeddings", 8192)),
                    attention_dropout=float(data.get("attention_probs_dropout_prob", 0.0)),
                    pad_token_id=int(data.get("pad_token_id", 1) or 0))  # fmt: skip
    positions = rope(data, default_theta=DEFAULT_THETA, max_position=values["max_position"])
    return BertConfig(**values, rope_full=positions)


def names(config: BertConfig) -> list[TensorName]:
    h, n = config.hidden_size, config.intermediate_size
    out = [table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, h)]
    if config.type_vocab_size:
        out.append(table("embeddings/token_type", "embeddings.token_type_embeddings",
                         config.type_vocab_size, h))  # fmt: skip
    out += norm("embeddings_ln", "embeddings.LayerNorm", h)
    for i in range(config.num_layers):
        where = f"encoder.layer.{i}."
        out += linear(f"layer_{i}/qkv", f"{where}attention.qkv_proj", h, 3 * h)
        out += linear(f"layer_{i}/attention_out", f"{where}attention.o_proj", h, h)
        out += norm(f"layer_{i}/attention_ln", f"{where}attn_ln", h)
        out += linear(f"layer_{i}/intermediate", f"{where}mlp.up_gate_proj", h, 2 * n,
                      bias=False)  # fmt: skip
        out += linear(f"layer_{i}/output", f"{where}mlp.down_proj", n, h)
        out += norm(f"layer_{i}/output_ln", f"{where}mlp_ln", h)
    out += linear("pooler", "pooler.dense", h, h, optional=True)
    return out + classifier("classifier", h)


ARCHITECTURES = (
    Architecture(
        model_type="gte", title="GTE", prefix="gte.", read_config=read_config, names=names,
        position_ids="none", attention="rotary", feed_forward="glu_up_first",
        classes={"classify": "GteForSequenceClassification",
                 "tag": "GteForTokenClassification", "embed": "GteModel"},
    ),
)  # fmt: skip
