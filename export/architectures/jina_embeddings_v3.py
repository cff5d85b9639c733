"""jina-embeddings-v3's base model: XLM-RoBERTa's post-norm layers with rotary positions instead
of a position table (transformers' ``JinaEmbeddingsV3Model``): embeddings are words + token types,
normed; each layer's fused query/key/value projection, its query and key turned by the rotary
angles of positions 0..S-1 (one ``rope_parameters``: default, linear or yarn); RoBERTa's heads.
Its task adapters (LoRA) are not read here: the base model alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
    classifier,
    common,
    gelu,
    linear,
    norm,
    rope,
    table,
)
from export.architectures.roberta import mlm_names
from export.config import BertConfig
from export.names import TensorName

DEFAULT_THETA = 20_000.0  # JinaEmbeddingsV3Config.default_theta


def read_config(data: Mapping[str, Any]) -> BertConfig:
    values = common(data, pad_token_id=int(data.get("pad_token_id", 1)),
                    type_vocab_size=int(data.get("type_vocab_size", 1)),
                    max_position=int(data.get("max_position_embeddings", 8194)),
                    layer_norm_eps=float(data.get("layer_norm_eps", 1e-5)))  # fmt: skip
    if data.get("head_dim") not in (None, values["hidden_size"] // values["num_heads"]):
        raise ValueError(f"head_dim {data['head_dim']} (only hidden_size / heads)")
    positions = rope(data, default_theta=DEFAULT_THETA, max_position=values["max_position"])
    return BertConfig(**values, rope_full=positions)


def names(config: BertConfig) -> list[TensorName]:
    """Return the weights in the layout transformers saves (and Jina's checkpoints have: the
    names its conversion mapping renames on load): ``emb_ln``, ``encoder.layers.{i}`` with a
    fused ``mixer.Wqkv`` (query, key, value stacked), ``mixer.out_proj``, ``norm1`` after the
    attention, ``mlp.fc1``/``fc2`` and ``norm2`` after the feed-forward."""
    h, n = config.hidden_size, config.intermediate_size
    out = [table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, h),
           table("embeddings/token_type", "embeddings.token_type_embeddings",
                 config.type_vocab_size, h),
           *norm("embeddings_ln", "emb_ln", h)]  # fmt: skip
    for i in range(config.num_layers):
        where = f"encoder.layers.{i}."
        out += linear(f"layer_{i}/qkv", f"{where}mixer.Wqkv", h, 3 * h)
        out += linear(f"layer_{i}/attention_out", f"{where}mixer.out_proj", h, h)
        out += norm(f"layer_{i}/attention_ln", f"{where}norm1", h)
        out += linear(f"layer_{i}/intermediate", f"{where}mlp.fc1", h, n)
        out += linear(f"layer_{i}/output", f"{where}mlp.fc2", n, h)
        out += norm(f"layer_{i}/output_ln", f"{where}norm2", h)
    # JinaEmbeddingsV3ForSequenceClassification: RoBERTa's classifier.dense → tanh → out_proj
    out += linear("pooler", "classifier.dense", h, h, optional=True, head=True)
    out += linear("classifier", "classifier.out_proj", h, "labels", optional=True, head=True)
    # JinaEmbeddingsV3ForTokenClassification: classifier (the same canonical name: a task has one)
    return out + classifier("classifier", h)


ARCHITECTURES = (
    Architecture(
        model_type="jina_embeddings_v3", title="jina-embeddings-v3 (base model)",
        prefix="roberta.", read_config=read_config, names=names, position_ids="none",
        attention="rotary",
        classes={"classify": "JinaEmbeddingsV3ForSequenceClassification",
                 "tag": "JinaEmbeddingsV3ForTokenClassification",
                 "embed": "JinaEmbeddingsV3Model"},
        mlm=MaskedLMHead("JinaEmbeddingsV3ForMaskedLM", mlm_names, gelu),
    ),
)  # fmt: skip
