"""The architecture numbers of a BERT encoder, shared by the checkpoint readers and the model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BertConfig:
    """The architecture numbers of a BERT encoder."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position: int
    type_vocab_size: int = 2
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1  # training only (finetune/); inference never drops
    attention_dropout: float = 0.1
