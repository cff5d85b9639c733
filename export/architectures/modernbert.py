"""ModernBERT: rotary positions (one base for global layers, one for sliding ones), a fused QKV
projection, GeGLU feed-forward, pre-norm layers (none before layer 0's attention), no biases,
alternating sliding-window / global attention, a final norm, and a head dense → GELU → norm over
the ``cls`` or mean-pooled vector."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from export.architectures.base import (
    Architecture,
    MaskedLMHead,
    classifier,
    linear,
    mlm_head,
    norm,
    rope,
    table,
)
from export.config import BertConfig, Rope
from export.names import TensorName

DEFAULT_THETA = {"full": 160_000.0, "sliding": 10_000.0}  # ModernBertConfig.default_theta


def _layer_types(data: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    given = data.get("layer_types")
    if given is None:
        every = int(data.get("global_attn_every_n_layers", 3))
        given = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    kinds = {"full_attention": "full", "sliding_attention": "sliding"}
    if len(given) != layers or any(k not in kinds for k in given):
        raise ValueError(f"layer_types must be {layers} of {list(kinds)}, got {given!r}")
    return tuple(kinds[k] for k in given)


def _rope(data: Mapping[str, Any], kind: str) -> Rope:
    """Return the rotary parameters of ``kind``'s layers (base.rope's nested reading), the
    legacy ``global_rope_theta`` / ``local_rope_theta`` before the default base."""
    legacy = data.get("global_rope_theta" if kind == "full" else "local_rope_theta")
    return rope(
        data,
        default_theta=float(legacy or DEFAULT_THETA[kind]),
        max_position=int(data.get("max_position_embeddings", 8192)),
        kind=kind,
    )


def read_config(data: Mapping[str, Any]) -> BertConfig:
    layers = int(data["num_hidden_layers"])
    if any(bool(data.get(k, False)) for k in ("attention_bias", "mlp_bias")):
        raise ValueError("attention_bias / mlp_bias true: ModernBERT checkpoints have none")
    pooling = str(data.get("classifier_pooling", "cls"))
    if pooling not in ("cls", "mean"):
        raise ValueError(f"classifier_pooling must be cls or mean, got {pooling!r}")
    return BertConfig(
        vocab_size=int(data["vocab_size"]), hidden_size=int(data["hidden_size"]),
        num_layers=layers, num_heads=int(data["num_attention_heads"]),
        intermediate_size=int(data["intermediate_size"]),
        max_position=int(data.get("max_position_embeddings", 8192)), type_vocab_size=0,
        hidden_act=str(data.get("hidden_activation", "gelu")),
        layer_norm_eps=float(data.get("norm_eps", 1e-5)),
        hidden_dropout=float(data.get("mlp_dropout", 0.0)),
        attention_dropout=float(data.get("attention_dropout", 0.0)),
        model_type="modernbert", pad_token_id=int(data.get("pad_token_id") or 0),
        pooler_act=str(data.get("classifier_activation", "gelu")),
        classifier_pooling=pooling, layer_types=_layer_types(data, layers),
        local_attention=int(data.get("local_attention", 128)),
        rope_full=_rope(data, "full"), rope_sliding=_rope(data, "sliding"),
        bias=False, norm_bias=bool(data.get("norm_bias", False)),
        head_bias=bool(data.get("classifier_bias", False)),
    )  # fmt: skip


def names(config: BertConfig) -> list[TensorName]:
    h, n, nb = config.hidden_size, config.intermediate_size, config.norm_bias
    out = [table("embeddings/word", "embeddings.tok_embeddings", config.vocab_size, h),
           *norm("embeddings_ln", "embeddings.norm", h, bias=nb)]  # fmt: skip
    for i in range(config.num_layers):
        where = f"layers.{i}."
        if i:  # layer 0's attention reads the embeddings' norm directly (attn_norm = Identity)
            out += norm(f"layer_{i}/attention_ln", f"{where}attn_norm", h, bias=nb)
        out += linear(f"layer_{i}/qkv", f"{where}attn.Wqkv", h, 3 * h, bias=False)
        out += linear(f"layer_{i}/attention_out", f"{where}attn.Wo", h, h, bias=False)
        out += norm(f"layer_{i}/output_ln", f"{where}mlp_norm", h, bias=nb)
        out += linear(f"layer_{i}/intermediate", f"{where}mlp.Wi", h, 2 * n, bias=False)
        out += linear(f"layer_{i}/output", f"{where}mlp.Wo", n, h, bias=False)
    out += norm("final_ln", "final_norm", h, bias=nb)
    out += linear("pooler", "head.dense", h, h, bias=config.head_bias, optional=True, head=True)
    out += norm("head_ln", "head.norm", h, bias=nb, optional=True, head=True)
    return out + classifier("classifier", h)


def mlm_names(config: BertConfig, data: Mapping[str, Any]) -> list[TensorName]:
    """Return ModernBertForMaskedLM's head (``head``: dense → classifier_activation → norm, the
    classification head's names) and ``decoder`` (its bias as ``decoder_bias`` says)."""
    biases = ("decoder.bias",) if bool(data.get("decoder_bias", True)) else ()
    return mlm_head(config, dense="head.dense", ln="head.norm", decoder="decoder", biases=biases,
                    dense_bias=config.head_bias, ln_bias=config.norm_bias)  # fmt: skip


def head_act(config: BertConfig) -> str:
    """Return ``classifier_activation`` (ModernBertPredictionHead's, read as ``pooler_act``)."""
    return config.pooler_act


ARCHITECTURES = (
    Architecture(
        model_type="modernbert", title="ModernBERT", prefix="model.", read_config=read_config,
        names=names, position_ids="none", attention="rotary", norm="pre", feed_forward="glu",
        head_norm=True, tag_head_dense=True,
        classes={"classify": "ModernBertForSequenceClassification",
                 "tag": "ModernBertForTokenClassification", "embed": "ModernBertModel"},
        mlm=MaskedLMHead("ModernBertForMaskedLM", mlm_names, head_act),
    ),
)  # fmt: skip
