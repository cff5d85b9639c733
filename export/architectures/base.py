"""What an architecture entry is (``Architecture``), and the helpers the architecture modules
name their weights and read their config.json with (export/architectures/__init__.py has the
table)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from export.config import ROPE_TYPES, BertConfig, Rope
from export.names import TensorName

SUPPORTED_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "tanh", "silu", "swish")


@dataclass(frozen=True)
class MaskedLMHead:
    """An architecture's masked-LM head (``...ForMaskedLM``, what SPLADE pools), as data.

    ``names(config, data)`` gives its tensors (``data``: config.json, for the flags that change
    the head: DeBERTa's ``legacy``, ModernBERT's ``decoder_bias``) under the canonical names
    ``mlm/dense/*`` (hidden → ``width``), ``mlm/ln/*`` (at ``width``), ``mlm/decoder``
    (``[vocab, width]``, torch's layout; optional: a tied decoder is the word embedding table),
    ``mlm/bias`` (the head's own bias) and ``mlm/decoder_bias`` (the decoder Linear's, the same
    tensor where transformers ties them; either may be all the file has). ``activation(config)``
    is the transform's activation.
    """

    cls: str  # the Hugging Face class (config.json "architectures")
    names: Callable[[BertConfig, Mapping[str, Any]], list[TensorName]]
    activation: Callable[[BertConfig], str]


@dataclass(frozen=True)
class Architecture:
    """What one architecture does differently from the shared encoder."""

    model_type: str
    title: str  # the name users know (docs/reference/supported-models.md)
    prefix: str  # the base model's prefix in a task checkpoint (``bert.``)
    read_config: Callable[[Mapping[str, Any]], BertConfig]
    names: Callable[[BertConfig], list[TensorName]]  # HF names relative to ``prefix``
    # "absolute" (0..S-1), "padded" (from pad_token_id + 1 over non-pad tokens), "none"
    position_ids: str = "absolute"
    # "standard", "relative_bias" (MPNet), "disentangled" (DeBERTa-v2), "rotary" (ModernBERT,
    # NomicBERT, GTE, jina-embeddings-v3)
    attention: str = "standard"
    norm: str = "post"  # "post" (BERT) or "pre" (ModernBERT: norm before each block)
    # "mlp" (dense, activation, dense); gated: "glu" (one dense, the activation on its first half:
    # ModernBERT), "glu_up_first" (one dense, the activation on its second half: GTE),
    # "gated" (a ``gate`` dense of its own under the activation, times ``intermediate``: NomicBERT)
    feed_forward: str = "mlp"
    head_norm: bool = False  # the classification head's dense is followed by a layer norm
    tag_head_dense: bool = False  # the token classifier reads the head's dense (+ norm) first
    mask_embeddings: bool = False  # padded positions' embeddings are zeroed (DeBERTa)
    # factorised embeddings: projected, then normed at the hidden size (DeBERTa); else normed at
    # the embedding size, then projected (ELECTRA, ALBERT)
    project_before_norm: bool = False
    # the Hugging Face classes of each task (config.json "architectures")
    classes: Mapping[str, str] = field(default_factory=dict)
    # the masked-LM head (SPLADE; export/splade.py), None where transformers has none
    mlm: MaskedLMHead | None = None


# -- helpers the architecture modules share -------------------------------------------------


def linear(canonical: str, source: str, n_in: int | str, n_out: int | str, *, bias: bool = True,
           optional: bool = False, head: bool = False) -> list[TensorName]:  # fmt: skip
    """Return a torch ``nn.Linear``'s tensors: ``[out, in]`` weight (transposed) and bias."""
    out = [TensorName(f"{canonical}/kernel", (n_in, n_out), f"{source}.weight",
                      transposed=True, optional=optional, head=head)]  # fmt: skip
    if bias:
        out.append(TensorName(f"{canonical}/bias", (n_out,), f"{source}.bias",
                              optional=optional, head=head))  # fmt: skip
    return out


def norm(canonical: str, source: str, width: int, *, bias: bool = True, optional: bool = False,
         head: bool = False) -> list[TensorName]:  # fmt: skip
    """Return a torch ``nn.LayerNorm``'s tensors (``gamma``/``beta``)."""
    out = [TensorName(f"{canonical}/gamma", (width,), f"{source}.weight", optional=optional,
                      head=head)]  # fmt: skip
    if bias:
        out.append(TensorName(f"{canonical}/beta", (width,), f"{source}.bias", optional=optional,
                              head=head))  # fmt: skip
    return out


def table(canonical: str, source: str, rows: int, width: int) -> TensorName:
    """Return a torch ``nn.Embedding``'s table."""
    return TensorName(canonical, (rows, width), f"{source}.weight")


def classifier(source: str, width: int) -> list[TensorName]:
    """Return the last linear layer of every head: ``classifier/*``, optional, outside the base."""
    return linear("classifier", source, width, "labels", optional=True, head=True)


def bert_layer(prefix: str, i: int, config: BertConfig, parts: Mapping[str, str],
               ) -> list[TensorName]:  # fmt: skip
    """Return one post-norm layer's tensors; ``parts`` maps the canonical parts to HF names."""
    h, n = config.hidden_size, config.intermediate_size
    shapes = {"query": (h, h), "key": (h, h), "value": (h, h), "attention_out": (h, h),
              "intermediate": (h, n), "output": (n, h)}  # fmt: skip
    out: list[TensorName] = []
    for part, (n_in, n_out) in shapes.items():
        out += linear(f"layer_{i}/{part}", f"{prefix}{parts[part]}", n_in, n_out)
    for part in ("attention_ln", "output_ln"):
        out += norm(f"layer_{i}/{part}", f"{prefix}{parts[part]}", h)
    return out


def mlm_head(config: BertConfig, *, dense: str, ln: str, decoder: str | None,
             biases: tuple[str, ...], width: int | None = None, dense_bias: bool = True,
             ln_bias: bool = True) -> list[TensorName]:  # fmt: skip
    """Return a masked-LM head's tensors (``MaskedLMHead``'s canonical names), all outside the
    base model's prefix: ``dense`` (hidden → ``width``, default hidden), its layer norm ``ln``,
    the ``decoder`` weight (None: always the word embeddings) and the ``biases`` (the head's own,
    then the decoder's; each optional)."""
    h, w, v = config.hidden_size, width or config.hidden_size, config.vocab_size
    out = linear("mlm/dense", dense, h, w, bias=dense_bias, head=True)
    out += norm("mlm/ln", ln, w, bias=ln_bias, head=True)
    if decoder is not None:
        out.append(TensorName("mlm/decoder", (v, w), f"{decoder}.weight", optional=True,
                              head=True))  # fmt: skip
    for canonical, source in zip(("mlm/bias", "mlm/decoder_bias"), biases, strict=False):
        out.append(TensorName(canonical, (v,), source, optional=True, head=True))
    return out


def gelu(config: BertConfig) -> str:
    """Return ``gelu``: the masked-LM heads that apply the exact GELU whatever hidden_act says
    (RoBERTa's and MPNet's ``gelu``, ELECTRA's generator ``get_activation("gelu")``)."""
    return "gelu"


def hidden_act(config: BertConfig) -> str:
    """Return the encoder's ``hidden_act`` (the activation most masked-LM heads apply)."""
    return config.hidden_act


def common(data: Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Return the BERT-named numbers of a config.json as ``BertConfig`` keyword arguments."""
    values = {
        "vocab_size": int(data["vocab_size"]),
        "hidden_size": int(data["hidden_size"]),
        "num_layers": int(data["num_hidden_layers"]),
        "num_heads": int(data["num_attention_heads"]),
        "intermediate_size": int(data["intermediate_size"]),
        "max_position": int(data.get("max_position_embeddings", 512)),
        "type_vocab_size": int(data.get("type_vocab_size", 2)),
        "hidden_act": str(data.get("hidden_act", "gelu")),
        "layer_norm_eps": float(data.get("layer_norm_eps", 1e-12)),
        "hidden_dropout": float(data.get("hidden_dropout_prob", 0.1)),
        "attention_dropout": float(data.get("attention_probs_dropout_prob", 0.1)),
        "model_type": str(data.get("model_type", "bert")),
        "pad_token_id": int(data.get("pad_token_id") or 0),
    }
    values.update(overrides)
    return values


def absolute_positions_only(data: Mapping[str, Any]) -> None:
    """Raise ValueError for BERT's relative_key position variants (no checkpoint people serve)."""
    kind = data.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        raise ValueError(f"only absolute position embeddings are supported, not {kind!r}")


def rope(data: Mapping[str, Any], *, default_theta: float, max_position: int,
         kind: str | None = None) -> Rope:  # fmt: skip
    """Return the rotary parameters of a config.json as transformers reads them. ``kind`` None:
    the one rotary of every layer (jina-embeddings-v3, NomicBERT, GTE): ``rope_parameters``, or
    the older ``rope_scaling`` in its place, ``rope_theta`` in it else top-level, and a top-level
    ``original_max_position_embeddings`` over the entry's (standardize_rope_params' order).
    ``kind`` "full" / "sliding": ModernBERT's ``rope_parameters["<kind>_attention"]``, a legacy
    ``rope_scaling`` over both kinds, yarn's ``truncate`` read from the outer dict.

    Transformers' defaults: ``rope_theta`` else ``default_theta``; yarn's
    ``original_max_position_embeddings`` else ``max_position``, its ``factor`` else their ratio.
    ValueError naming any other ``rope_type`` (dynamic, longrope, llama3, gte's remote-code ntk:
    their tables change with the input's length or are not an encoder's) or a partial rotary."""
    legacy = data.get("rope_scaling") or {}
    if kind is None:
        params = {"rope_theta": data.get("rope_theta"),
                  **(legacy or data.get("rope_parameters") or {})}  # fmt: skip
        original = data.get("original_max_position_embeddings")
        truncate = params.get("truncate", True)
    else:
        nested = data.get("rope_parameters") or {}
        params = {**(nested.get(f"{kind}_attention") or {}), **legacy}
        original, truncate = None, nested.get("truncate", True)
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r}: export computes {', '.join(ROPE_TYPES)} only")
    if float(params.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ValueError("partial_rotary_factor: export turns the whole head (1.0) only")
    theta = float(params.get("rope_theta") or default_theta)
    if rope_type == "default":
        return Rope(theta)
    if rope_type == "linear":
        return Rope(theta, rope_type, factor=float(params["factor"]))
    original = int(original or params.get("original_max_position_embeddings") or max_position)
    factor = params.get("factor")
    given = params.get("attention_factor")
    return Rope(
        theta, rope_type, factor=float(factor) if factor is not None else max_position / original,
        original_max_position=original,
        attention_factor=None if given is None else float(given),
        mscale=float(params.get("mscale") or 0.0),
        mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        truncate=bool(truncate),
    )  # fmt: skip
