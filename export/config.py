"""The architecture numbers of an encoder, shared by the checkpoint readers and the model.

One dataclass for every architecture of the family (export/architectures/): the BERT numbers
every encoder has, and the few that only some architectures read (their defaults are BERT's, so a
BERT config says nothing of them). ``model_type`` picks the architecture's entry in the table.
"""

from __future__ import annotations

from dataclasses import dataclass

ROPE_TYPES = ("default", "linear", "yarn")  # what export computes (transformers' rope_type)


@dataclass(frozen=True)
class Rope:
    """Rotary positions as transformers' ``rope_parameters`` say them (one set per attention
    kind): ``rope_type`` default, linear (positions divided by ``factor``) or yarn (the
    frequencies blended between interpolated and extrapolated over a ramp set by
    ``beta_fast``/``beta_slow`` at ``original_max_position``, and cos/sin scaled by the attention
    factor). export/architectures/base.py's ``rope`` reads them from config.json,
    export/layers.py's ``rope_frequencies`` turns them into the rotary tables."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position: int = 0  # yarn: the pretraining length the ramp is computed at
    attention_factor: float | None = None  # yarn: None = from factor (and mscale, mscale_all_dim)
    mscale: float = 0.0
    mscale_all_dim: float = 0.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True  # yarn: the correction range rounded outward to whole dimensions


@dataclass(frozen=True)
class BertConfig:
    """The architecture numbers of an encoder of the BERT family (BERT's by default)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position: int  # the longest input the positions allow (RoBERTa's table less its offset)
    type_vocab_size: int = 2  # 0: no token type embeddings (the input is ignored)
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1  # training only (finetune/); inference never drops
    attention_dropout: float = 0.1
    model_type: str = "bert"
    # the rows of the position table (RoBERTa's has max_position + pad + 1); 0: max_position
    position_table: int = 0
    embedding_size: int = 0  # factorised embeddings (ALBERT, ELECTRA, DeBERTa): 0 = hidden_size
    pad_token_id: int = 0  # the id whose positions RoBERTa/MPNet skip
    # the unique layers' weights each step of the layer loop runs (ALBERT shares them); () = own
    layer_plan: tuple[tuple[int, ...], ...] = ()
    pooler_act: str = "tanh"  # the activation after the classification head's first dense
    classifier_pooling: str = "cls"  # what the classification head reads (ModernBERT: cls/mean)
    # DeBERTa-v2: disentangled attention
    pos_att_type: tuple[str, ...] = ()
    position_buckets: int = 0
    max_relative_positions: int = 0
    share_att_key: bool = False
    position_biased_input: bool = True
    norm_rel_ebd: bool = False
    relative_attention: bool = False  # c2p/p2c scores over relative embeddings
    # ModernBERT: sliding-window attention on the "sliding" layers
    layer_types: tuple[str, ...] = ()  # "full" / "sliding", one per layer
    local_attention: int = 0  # the sliding window's total width (a token sees ± half of it)
    # rotary positions (ModernBERT, NomicBERT, GTE, jina-embeddings-v3): of the "full" layers
    # (every layer where none slides) and the "sliding" ones
    rope_full: Rope = Rope(160_000.0)
    rope_sliding: Rope = Rope(10_000.0)
    bias: bool = True  # dense layers have biases (ModernBERT's have none)
    norm_bias: bool = True  # layer norms have a beta
    head_bias: bool = True  # the classification head's first dense has a bias

    @property
    def unique_layers(self) -> int:
        """Return how many layers have weights of their own (fewer than steps under sharing)."""
        if not self.layer_plan:
            return self.num_layers
        return 1 + max(i for step in self.layer_plan for i in step)

    @property
    def plan(self) -> tuple[tuple[int, ...], ...]:
        """Return, for each step of the layer loop, the unique layers it runs."""
        return self.layer_plan or tuple((i,) for i in range(self.num_layers))

    @property
    def embedding_width(self) -> int:
        """Return the width of the embedding tables (hidden_size unless factorised)."""
        return self.embedding_size or self.hidden_size


EncoderConfig = BertConfig  # the name that says what it is now; BertConfig stays for callers
