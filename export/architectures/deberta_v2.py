"""DeBERTa-v2/v3: disentangled attention (content→position and position→content scores over
log-bucketed relative positions, keys shared with the content projections or their own), the
relative embeddings' layer norm, optional absolute positions and token types, and a context
pooler dense → GELU on ``[CLS]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
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
    "query": "attention.self.query_proj", "key": "attention.self.key_proj",
    "value": "attention.self.value_proj", "attention_out": "attention.output.dense",
    "attention_ln": "attention.output.LayerNorm", "intermediate": "intermediate.dense",
    "output": "output.dense", "output_ln": "output.LayerNorm",
}  # fmt: skip


def _att_types(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split("|") if isinstance(value, str) else list(value)
    kinds = tuple(str(v).strip().lower() for v in items if str(v).strip())
    unknown = sorted(set(kinds) - {"c2p", "p2c"})
    if unknown:
        raise ValueError(f"pos_att_type {unknown} (supported: c2p, p2c)")
    return kinds


def read_config(data: Mapping[str, Any]) -> BertConfig:
    if int(data.get("conv_kernel_size", 0) or 0) > 0:
        raise ValueError("conv_kernel_size > 0 (DeBERTa-v2-xlarge's convolution) is not supported")
    max_position = int(data.get("max_position_embeddings", 512))
    max_relative = int(data.get("max_relative_positions", -1))
    norm_rel = [x.strip() for x in str(data.get("norm_rel_ebd", "none")).lower().split("|")]
    values = common(
        data,
        type_vocab_size=int(data.get("type_vocab_size", 0)),
        layer_norm_eps=float(data.get("layer_norm_eps", 1e-7)),
        embedding_size=int(data.get("embedding_size") or data["hidden_size"]),
        pos_att_type=_att_types(data.get("pos_att_type")),
        position_buckets=int(data.get("position_buckets", -1)),
        max_relative_positions=max_relative if max_relative >= 1 else max_position,
        share_att_key=bool(data.get("share_att_key", False)),
        position_biased_input=bool(data.get("position_biased_input", True)),
        norm_rel_ebd="layer_norm" in norm_rel,
        relative_attention=bool(data.get("relative_attention", False)),
        pooler_act=str(data.get("pooler_hidden_act", "gelu")),
    )
    pooler = int(data.get("pooler_hidden_size") or values["hidden_size"])
    if pooler != values["hidden_size"]:
        raise ValueError(f"pooler_hidden_size {pooler} differs from hidden_size")
    return BertConfig(**values)


def attention_span(config: BertConfig) -> int:
    """Return how many relative positions each side the embeddings cover (``att_span``)."""
    return config.position_buckets if config.position_buckets > 0 else config.max_relative_positions


def names(config: BertConfig) -> list[TensorName]:
    h, e = config.hidden_size, config.embedding_width
    out = [table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, e)]
    if config.position_biased_input:
        out.append(table("embeddings/position", "embeddings.position_embeddings",
                         config.max_position, e))  # fmt: skip
    if config.type_vocab_size:
        out.append(table("embeddings/token_type", "embeddings.token_type_embeddings",
                         config.type_vocab_size, e))  # fmt: skip
    if e != h:
        out += linear("embeddings/projection", "embeddings.embed_proj", e, h, bias=False)
    out += norm("embeddings_ln", "embeddings.LayerNorm", h)
    for i in range(config.num_layers):
        out += bert_layer(f"encoder.layer.{i}.", i, config, LAYER_PARTS)
        if config.relative_attention and not config.share_att_key:
            where = f"encoder.layer.{i}.attention.self."
            if "c2p" in config.pos_att_type:
                out += linear(f"layer_{i}/pos_key", f"{where}pos_key_proj", h, h)
            if "p2c" in config.pos_att_type:
                out += linear(f"layer_{i}/pos_query", f"{where}pos_query_proj", h, h)
    if config.relative_attention:
        out.append(table("relative/embeddings", "encoder.rel_embeddings",
                         2 * attention_span(config), h))  # fmt: skip
    if config.norm_rel_ebd:
        out += norm("relative_ln", "encoder.LayerNorm", h)
    out += linear("pooler", "pooler.dense", h, h, optional=True, head=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return DebertaV2ForMaskedLM's head: ``cls.predictions`` when config.json's ``legacy`` is
    true (transformers' default: dense hidden → embedding_size, LayerNorm, tied decoder), else
    ``lm_predictions.lm_head`` (dense hidden → hidden, LayerNorm, then always the word
    embeddings, no decoder of its own)."""
    if bool(data.get("legacy", True)):
        return mlm_head(config, dense="cls.predictions.transform.dense",
                        ln="cls.predictions.transform.LayerNorm",
                        decoder="cls.predictions.decoder",
                        biases=("cls.predictions.bias", "cls.predictions.decoder.bias"),
                        width=config.embedding_width)  # fmt: skip
    where = "lm_predictions.lm_head"
    return mlm_head(config, dense=f"{where}.dense", ln=f"{where}.LayerNorm", decoder=None,
                    biases=(f"{where}.bias",))  # fmt: skip


ARCHITECTURES = (
    Architecture(
        model_type="deberta-v2", title="DeBERTa-v2/v3", prefix="deberta.",
        read_config=read_config, names=names, attention="disentangled",
        mask_embeddings=True, project_before_norm=True,
        classes={"classify": "DebertaV2ForSequenceClassification",
                 "tag": "DebertaV2ForTokenClassification", "embed": "DebertaV2Model"},
        mlm=MaskedLMHead("DebertaV2ForMaskedLM", mlm_names, hidden_act),
    ),
)  # fmt: skip
