"""NomicBERT (nomic-embed-text): BERT's post-norm layers and token types with rotary positions
(no position table), a fused QKV projection, a SwiGLU feed-forward (``fc12`` the gate, ``fc11``
the up projection), no biases in attention or feed-forward, and BERT's pooler tanh([CLS]) head.

The names are those ``save_pretrained`` writes (transformers turns them into its own on load:
conversion_mapping.py's ``nomic_bert``), which are also nomic's own checkpoints' names."""

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

DEFAULT_THETA = 1000.0  # NomicBertConfig.default_theta


# nomic's own config.json (its remote code's, which nomic-embed-text's repos ship) names the numbers
# GPT-2's way; transformers' NomicBertConfig ignores these keys and takes its defaults, which are
# nomic-embed-text-v1.5's numbers, so reading them gives the same model on those checkpoints
NOMIC_KEYS = {"hidden_size": "n_embd", "num_hidden_layers": "n_layer",
              "num_attention_heads": "n_head", "intermediate_size": "n_inner",
              "max_position_embeddings": "n_positions", "layer_norm_eps": "layer_norm_epsilon",
              "rope_theta": "rotary_emb_base"}  # fmt: skip
# what nomic's remote code can do that this graph does not: refused by name
NOMIC_REFUSED = {"prenorm": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
                 "mlp_fc2_bias": False, "use_rms_norm": False, "rotary_emb_interleaved": False,
                 "parallel_block": False, "rotary_emb_fraction": 1.0}  # fmt: skip


def _transformers_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``data`` with nomic's own keys read as transformers' (theirs win where both are);
    ValueError for what nomic's code does that export does not."""
    out = dict(data)
    for ours, theirs in NOMIC_KEYS.items():
        if out.get(ours) is None and data.get(theirs) is not None:
            out[ours] = data[theirs]
    for key, served in NOMIC_REFUSED.items():
        if data.get(key, served) not in (served, None):
            raise ValueError(f"{key} {data[key]!r} (export serves nomic's {key} {served!r})")
    act = data.get("activation_function")
    if act is not None and "hidden_act" not in data:
        if act != "swiglu":
            raise ValueError(f"activation_function {act!r} (export serves swiglu)")
        out["hidden_act"] = "silu"
    if data.get("rotary_scaling_factor") is not None:  # the remote code's dynamic NTK scaling
        out["rope_parameters"] = {"rope_type": "dynamic",
                                  "factor": data["rotary_scaling_factor"]}  # fmt: skip
    return out


def read_config(data: Mapping[str, Any]) -> BertConfig:
    data = _transformers_keys(data)
    head_dim = data.get("head_dim")
    heads, hidden = int(data["num_attention_heads"]), int(data["hidden_size"])
    if head_dim is not None and int(head_dim) * heads != hidden:
        raise ValueError(f"head_dim {head_dim} x {heads} heads is not hidden_size {hidden}")
    values = common(data, model_type="nomic_bert", hidden_act=str(data.get("hidden_act", "silu")),
                    max_position=int(data.get("max_position_embeddings", 2048)),
                    hidden_dropout=float(data.get("hidden_dropout_prob", 0.0)),
                    attention_dropout=float(data.get("attention_probs_dropout_prob", 0.0)),
                    bias=False)  # fmt: skip
    positions = rope(data, default_theta=DEFAULT_THETA, max_position=values["max_position"])
    return BertConfig(**values, rope_full=positions)


def names(config: BertConfig) -> list[TensorName]:
    h, n = config.hidden_size, config.intermediate_size
    out = [table("embeddings/word", "embeddings.word_embeddings", config.vocab_size, h)]
    if config.type_vocab_size:
        out.append(table("embeddings/token_type", "embeddings.token_type_embeddings",
                         config.type_vocab_size, h))  # fmt: skip
    out += norm("embeddings_ln", "emb_ln", h)
    for i in range(config.num_layers):
        where = f"encoder.layers.{i}."
        out += linear(f"layer_{i}/qkv", f"{where}attn.Wqkv", h, 3 * h, bias=False)
        out += linear(f"layer_{i}/attention_out", f"{where}attn.out_proj", h, h, bias=False)
        out += norm(f"layer_{i}/attention_ln", f"{where}norm1", h)
        out += linear(f"layer_{i}/intermediate", f"{where}mlp.fc11", h, n, bias=False)
        out += linear(f"layer_{i}/gate", f"{where}mlp.fc12", h, n, bias=False)
        out += linear(f"layer_{i}/output", f"{where}mlp.fc2", n, h, bias=False)
        out += norm(f"layer_{i}/output_ln", f"{where}norm2", h)
    out += linear("pooler", "pooler.dense", h, h, optional=True)
    return out + classifier("classifier", h)


ARCHITECTURES = (
    Architecture(
        model_type="nomic_bert", title="NomicBERT", prefix="nomic_bert.",
        read_config=read_config, names=names, position_ids="none", attention="rotary",
        feed_forward="gated",
        classes={"classify": "NomicBertForSequenceClassification",
                 "tag": "NomicBertForTokenClassification", "embed": "NomicBertModel"},
    ),
)  # fmt: skip
