"""The architectures of the BERT family as data: one entry per ``model_type``, what differs.

One encoder (export/model.py) runs every architecture; each module here says only what its
architecture does differently: the weight names in its Hugging Face checkpoints, how it reads
config.json, its position ids (learned absolute, counted from ``padding_idx + 1``, none), its
attention variant (standard, relative bias, disentangled, rotary with or without sliding
windows), its feed-forward (GELU MLP, GeGLU or another gated variant), where its norms sit, and
its classification head. ``BERT`` is the first entry of the table, not the model. Nothing here
imports TensorFlow or torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from export.architectures import (
    albert,
    bert,
    deberta_v2,
    distilbert,
    electra,
    gte,
    jina_embeddings_v3,
    modernbert,
    mpnet,
    nomic_bert,
    roberta,
)
from export.architectures.base import SUPPORTED_ACTIVATIONS, Architecture
from export.config import BertConfig
from export.errors import ExportError
from export.names import TensorName, exit_tensor_names

__all__ = ["SUPPORTED_ACTIVATIONS", "Architecture", "architecture", "architectures",
           "config_from", "supported", "tensor_names"]  # fmt: skip

# the table: BERT first, then the order docs/reference/supported-models.md lists them in
_MODULES = (bert, roberta, distilbert, electra, albert, mpnet, deberta_v2, modernbert, nomic_bert,
            gte, jina_embeddings_v3)  # fmt: skip
_TABLE: dict[str, Architecture] = {
    arch.model_type: arch for module in _MODULES for arch in module.ARCHITECTURES
}


def architectures() -> dict[str, Architecture]:
    """Return every supported architecture by its config.json ``model_type``."""
    return dict(_TABLE)


def supported() -> list[str]:
    """Return the supported ``model_type`` values, BERT first."""
    return list(architectures())


def architecture(model_type: str, where: str = "config.json") -> Architecture:
    """Return the architecture of ``model_type``; ExportError naming the supported ones if none."""
    table = _TABLE
    if model_type not in table:
        raise ExportError(
            f"{where}: unknown architecture model_type={model_type!r} (supported: "
            f"{', '.join(table)}); export a checkpoint of one of these, as transformers' "
            "save_pretrained writes it (config.json + model.safetensors)"
        )
    return table[model_type]


def config_from(data: Mapping[str, Any], path: Path | str) -> BertConfig:
    """Return the encoder config of a config.json, checked; ExportError naming ``path``."""
    arch = architecture(str(data.get("model_type", "bert")), str(path))
    try:
        config = arch.read_config(data)
    except KeyError as exc:
        raise ExportError(f"{path}: missing key {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ExportError(f"{path}: bad value: {exc}") from exc
    if config.hidden_act not in SUPPORTED_ACTIVATIONS:
        raise ExportError(f"{path}: unsupported hidden_act {config.hidden_act!r}")
    if config.pooler_act not in SUPPORTED_ACTIVATIONS:
        raise ExportError(f"{path}: unsupported classifier activation {config.pooler_act!r}")
    if config.num_heads < 1 or config.hidden_size % config.num_heads:
        raise ExportError(
            f"{path}: hidden_size {config.hidden_size} is not a multiple of "
            f"num_attention_heads {config.num_heads}"
        )
    return config


def tensor_names(config: BertConfig) -> list[TensorName]:
    """Return every tensor of ``config``'s architecture (HF names, encoder ones unprefixed)."""
    return [*architecture(config.model_type).names(config), *exit_tensor_names(config)]
