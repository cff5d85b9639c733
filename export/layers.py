"""The encoder's shared blocks: dense, layer norm, one encoder layer (every attention variant of
the family), a layer-loop step, rotary turns, pooling, masks.

Shared by the model (export/model.py) and the early exits (export/exits.py). Precision: weights
are stored in the export dtype and matmuls run in the compute dtype; everything else is float32
(see export/model.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from export.config import ROPE_TYPES, BertConfig, Rope

# A large negative (not -inf) so a fully padded row still gives a finite softmax.
MASK_NEG = -1e9


class Dense(tf.Module):
    """``x @ kernel + bias`` in the compute dtype (default: the storage dtype); returns float32.

    ``bias`` None: no bias (ModernBERT's layers have none).
    """

    def __init__(self, kernel: np.ndarray, bias: np.ndarray | None, dtype: tf.DType, name: str,
                 *, trainable: bool = False, compute_dtype: tf.DType | None = None
                 ) -> None:  # fmt: skip
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.cast(kernel, dtype), trainable=trainable, name="kernel")
        self.bias = (
            None if bias is None
            else tf.Variable(tf.cast(bias, dtype), trainable=trainable, name="bias")
        )  # fmt: skip
        self.compute_dtype = compute_dtype or dtype

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        # tf.cast is the identity when the dtypes already match (inference: storage = compute)
        kernel = tf.cast(self.kernel, self.compute_dtype)
        y = tf.matmul(tf.cast(x, self.compute_dtype), kernel)
        if self.bias is None:
            return tf.cast(y, tf.float32)
        return tf.cast(y + tf.cast(self.bias, self.compute_dtype), tf.float32)

    def named_variables(self, prefix: str) -> dict[str, tf.Variable]:
        """Return the variables under their canonical names (``<prefix>/kernel``, ``/bias``)."""
        out = {f"{prefix}/kernel": self.kernel}
        if self.bias is not None:
            out[f"{prefix}/bias"] = self.bias
        return out


class LayerNorm(tf.Module):
    """Layer norm over the last axis: parameters stored in ``dtype``, arithmetic in float32.

    ``beta`` None: no shift (ModernBERT's norms have none unless ``norm_bias``).
    """

    def __init__(self, gamma: np.ndarray, beta: np.ndarray | None, eps: float, dtype: tf.DType,
                 name: str, *, trainable: bool = False) -> None:  # fmt: skip
        super().__init__(name=name)
        self.gamma = tf.Variable(tf.cast(gamma, dtype), trainable=trainable, name="gamma")
        self.beta = (
            None if beta is None
            else tf.Variable(tf.cast(beta, dtype), trainable=trainable, name="beta")
        )  # fmt: skip
        self.eps = eps

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        gamma = tf.cast(self.gamma, tf.float32)
        if self.beta is None:
            return (x - mean) * tf.math.rsqrt(variance + self.eps) * gamma
        return (x - mean) * tf.math.rsqrt(variance + self.eps) * gamma + tf.cast(
            self.beta, tf.float32
        )

    def named_variables(self, prefix: str) -> dict[str, tf.Variable]:
        """Return the variables under their canonical names (``<prefix>/gamma``, ``/beta``)."""
        out = {f"{prefix}/gamma": self.gamma}
        if self.beta is not None:
            out[f"{prefix}/beta"] = self.beta
        return out


def activation(name: str, x: tf.Tensor) -> tf.Tensor:
    if name == "relu":
        return tf.nn.relu(x)
    if name == "tanh":
        return tf.tanh(x)
    if name in ("silu", "swish"):  # NomicBERT's SwiGLU gate
        return tf.nn.silu(x)
    # "gelu" in HF/Google configs is the exact erf form; the *_tanh/_new names are the approximation
    return tf.nn.gelu(x, approximate=name != "gelu")


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Return ``x`` with stateless dropout at ``rate`` (identity when ``seed`` is None)."""
    if seed is None or rate <= 0.0:
        return x
    return tf.nn.experimental.stateless_dropout(x, rate, seed=seed + tf.constant([0, site]) * 7919)


# Positions: what the layer loop computes once per call and every layer reads (export/model.py
# ``positions``): "relative_bias" [1, heads, S, S] (MPNet), "rotary_full"/"rotary_sliding"
# (cos, sin) [S, head_dim] and "window" [1, 1, S, S] (ModernBERT), "c2p"/"p2c" indices [S, S]
# and "relative" embeddings [2 * span, H] (DeBERTa-v2).
Positions = Mapping[str, Any]

# the projections only some architectures have: ModernBERT's fused QKV, DeBERTa's own position
# projections (when it does not share the content ones), NomicBERT's separate gate of a gated
# feed-forward
_EXTRA_PARTS = ("qkv", "pos_key", "pos_query", "gate")


class Layer(tf.Module):
    """One transformer encoder layer: post-norm (BERT) or pre-norm (ModernBERT), its attention
    standard, with a relative bias, disentangled or rotary (``architecture``, default BERT's)."""

    def __init__(self, w: Mapping[str, np.ndarray], config: BertConfig, dtype: tf.DType,
                 name: str, *, trainable: bool = False,
                 compute_dtype: tf.DType | None = None, architecture: Any = None,
                 index: int = 0) -> None:  # fmt: skip
        super().__init__(name=name)
        eps = config.layer_norm_eps

        def dense(part: str) -> Dense:
            return Dense(w[f"{part}/kernel"], w.get(f"{part}/bias"), dtype, part,
                          trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip

        def norm(part: str) -> LayerNorm:
            return LayerNorm(w[f"{part}/gamma"], w.get(f"{part}/beta"), eps, dtype, part,
                              trainable=trainable)  # fmt: skip

        self.parts = {part: dense(part) for part in _EXTRA_PARTS if f"{part}/kernel" in w}
        if "qkv" not in self.parts:
            self.query, self.key, self.value = dense("query"), dense("key"), dense("value")
        self.attention_out = dense("attention_out")
        self.intermediate, self.output = dense("intermediate"), dense("output")
        # a pre-norm architecture's first layer may read its input as it is (ModernBERT)
        self.attention_ln = norm("attention_ln") if "attention_ln/gamma" in w else None
        self.output_ln = norm("output_ln")
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.act = config.hidden_act
        self.dtype = compute_dtype or dtype
        self.hidden_dropout = config.hidden_dropout
        self.attention_dropout = config.attention_dropout
        self.pre_norm = architecture is not None and architecture.norm == "pre"
        self.feed_forward = "mlp" if architecture is None else architecture.feed_forward
        self.variant = "standard" if architecture is None else architecture.attention
        self.sliding = bool(config.layer_types) and config.layer_types[index] == "sliding"
        self.att_types = config.pos_att_type
        self.share_att_key = config.share_att_key

    def named_variables(self) -> dict[str, tf.Variable]:
        """Return the variables under the names the constructor takes (``query/kernel``, ...)."""
        out: dict[str, tf.Variable] = {}
        for part, dense in self.parts.items():
            out.update(dense.named_variables(part))
        plain: tuple[str, ...] = ("attention_out", "intermediate", "output")
        if "qkv" not in self.parts:
            plain = ("query", "key", "value", *plain)
        for part in plain:
            out.update(getattr(self, part).named_variables(part))
        for part in ("attention_ln", "output_ln"):
            if getattr(self, part) is not None:
                out.update(getattr(self, part).named_variables(part))
        return out

    def _split(self, x: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(tf.cast(x, self.dtype), [batch, seq, self.num_heads, self.head_dim])
        return tf.transpose(x, [0, 2, 1, 3])

    def _qkv(self, x: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor
             ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:  # fmt: skip
        if "qkv" not in self.parts:
            split = self._split
            return (split(self.query(x), batch, seq), split(self.key(x), batch, seq),
                    split(self.value(x), batch, seq))  # fmt: skip
        fused = tf.reshape(self.parts["qkv"](x), [batch, seq, 3, self.num_heads, self.head_dim])
        fused = tf.transpose(tf.cast(fused, self.dtype), [2, 0, 3, 1, 4])  # [3, b, heads, S, d]
        return fused[0], fused[1], fused[2]

    def _scores(self, q: tf.Tensor, k: tf.Tensor, positions: Positions) -> tf.Tensor:
        """Return the float32 attention scores ``[b, heads, S, S]`` before the mask."""
        if self.variant == "rotary":
            cos, sin = positions["rotary_sliding" if self.sliding else "rotary_full"]
            q = tf.cast(rotate(q, cos, sin), self.dtype)
            k = tf.cast(rotate(k, cos, sin), self.dtype)
            scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32)
            return scores / math.sqrt(self.head_dim)
        if self.variant == "disentangled":
            return self._disentangled(q, k, positions)
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.cast(scores, tf.float32) / math.sqrt(self.head_dim)
        if self.variant == "relative_bias":
            scores = scores + positions["relative_bias"]
        return scores

    def _disentangled(self, q: tf.Tensor, k: tf.Tensor, positions: Positions) -> tf.Tensor:
        """Return DeBERTa-v2's content + c2p + p2c scores, each over sqrt(d * (1 + #kinds))."""
        scale = math.sqrt(self.head_dim * (1 + len(self.att_types)))
        scores = tf.cast(tf.matmul(q, k, transpose_b=True), tf.float32) / scale
        if "relative" not in positions:  # relative_attention false: content scores only
            return scores
        rel = positions["relative"]  # [2 * span, H], float32, normalised
        span2 = tf.shape(rel)[0]
        shape = tf.shape(scores)

        def project(part: str) -> tf.Tensor:  # [heads, 2 * span, d]
            dense = self.parts.get(part) or getattr(self, "key" if part == "pos_key" else "query")
            out = tf.reshape(tf.cast(dense(rel), self.dtype), [span2, self.num_heads, -1])
            return tf.transpose(out, [1, 0, 2])

        if "c2p" in self.att_types:
            c2p = tf.cast(tf.einsum("bhsd,hrd->bhsr", q, project("pos_key")), tf.float32)
            index = tf.broadcast_to(positions["c2p"], shape)
            scores += tf.gather(c2p, index, axis=3, batch_dims=3) / scale
        if "p2c" in self.att_types:
            p2c = tf.cast(tf.einsum("bhsd,hrd->bhsr", k, project("pos_query")), tf.float32)
            index = tf.broadcast_to(positions["p2c"], shape)
            gathered = tf.gather(p2c, index, axis=3, batch_dims=3)  # [b, h, key, query]
            scores += tf.transpose(gathered, [0, 1, 3, 2]) / scale
        return scores

    def _attention(self, x: tf.Tensor, mask_bias: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor,
                   dropout_seed: tf.Tensor | None, positions: Positions) -> tf.Tensor:  # fmt: skip
        q, k, v = self._qkv(x, batch, seq)
        if self.variant == "rotary" and self.sliding:
            # the window joins the mask's bias before the scores: one add after the matmul, as in
            # every other layer (a second add of [1, 1, S, S] there sent TF's remapper to a kernel
            # ~5x slower at batch 32)
            mask_bias = mask_bias + positions["window"]
        scores = self._scores(q, k, positions) + mask_bias
        probs = dropout(tf.nn.softmax(scores, axis=-1), self.attention_dropout, dropout_seed, 1)
        if self.variant == "disentangled":
            # DeBERTa masks query rows too (transformers' pairwise mask filled with the dtype's
            # min: a padded position attends uniformly to every position). Only padded positions
            # change, which ColBERT's [MASK] query expansion reads.
            real = tf.transpose(tf.cast(tf.equal(mask_bias, 0.0), probs.dtype), [0, 1, 3, 2])
            probs = probs * real + (1.0 - real) / tf.cast(seq, probs.dtype)
        context = tf.matmul(tf.cast(probs, self.dtype), v)
        if self.variant == "rotary" and self.sliding:
            # a padded row whose window holds no real token attends to nothing (transformers'
            # default SDPA gives such a row 0); only padded positions change, which ColBERT's
            # [MASK] query expansion reads
            anything = tf.reduce_max(mask_bias, axis=-1, keepdims=True) > MASK_NEG / 2
            context = context * tf.cast(anything, context.dtype)
        context = tf.transpose(context, [0, 2, 1, 3])
        context = tf.reshape(context, [batch * seq, self.num_heads * self.head_dim])
        return dropout(self.attention_out(context), self.hidden_dropout, dropout_seed, 2)

    def _feed_forward(self, x: tf.Tensor, dropout_seed: tf.Tensor | None) -> tf.Tensor:
        if self.feed_forward == "glu":  # ModernBERT's GeGLU: act(first half) * second half
            inner, gate = tf.split(self.intermediate(x), 2, axis=-1)
            hidden = activation(self.act, inner) * gate
        elif self.feed_forward == "glu_up_first":  # GTE's up_gate_proj: up, then the gate
            up, gate = tf.split(self.intermediate(x), 2, axis=-1)
            hidden = activation(self.act, gate) * up
        elif self.feed_forward == "gated":  # a gate of its own (NomicBERT): act(gate(x)) * up(x)
            hidden = activation(self.act, self.parts["gate"](x)) * self.intermediate(x)
        else:
            hidden = activation(self.act, self.intermediate(x))
        return dropout(self.output(hidden), self.hidden_dropout, dropout_seed, 3)

    def __call__(self, x: tf.Tensor, mask_bias: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor,
                 dropout_seed: tf.Tensor | None = None,
                 positions: Positions | None = None) -> tf.Tensor:  # fmt: skip
        """Return the layer's output for ``x`` of shape ``[batch * seq, hidden]`` (float32).

        ``dropout_seed`` (int32 ``[2]``) switches training dropout on; ``positions`` are the
        loop's position tensors (see ``Positions``) for the attention variants that read them.
        """
        positions = positions or {}
        if self.pre_norm:
            normed = x if self.attention_ln is None else self.attention_ln(x)
            x = x + self._attention(normed, mask_bias, batch, seq, dropout_seed, positions)
            return x + self._feed_forward(self.output_ln(x), dropout_seed)
        attended = self._attention(x, mask_bias, batch, seq, dropout_seed, positions)
        assert self.attention_ln is not None
        x = self.attention_ln(x + attended)
        return self.output_ln(x + self._feed_forward(x, dropout_seed))


class Step(tf.Module):
    """One step of the layer loop: shared layers run in order (ALBERT's groups), and the final
    norm after the last step (ModernBERT). Called like a ``Layer``."""

    def __init__(self, layers: Sequence[Layer], final_norm: LayerNorm | None, name: str) -> None:
        super().__init__(name=name)
        self.inner = list(layers)
        self.final_norm = final_norm

    def __call__(self, x: tf.Tensor, mask_bias: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor,
                 dropout_seed: tf.Tensor | None = None,
                 positions: Positions | None = None) -> tf.Tensor:  # fmt: skip
        for layer in self.inner:
            x = layer(x, mask_bias, batch, seq, dropout_seed, positions)
        return x if self.final_norm is None else self.final_norm(x)


def rotate(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Return ``x`` [b, heads, S, d] turned by the rotary angles (cos/sin [S, d]), in float32."""
    x = tf.cast(x, tf.float32)
    half = tf.shape(x)[-1] // 2
    turned = tf.concat([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + turned * sin


def pool(hidden: tf.Tensor, attention_mask: tf.Tensor, pooling: str) -> tf.Tensor:
    """Return one float32 vector per row of ``hidden`` [b, S, H]: ``cls`` or the masked mean."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = tf.cast(attention_mask, tf.float32)[:, :, tf.newaxis]
    total = tf.reduce_sum(hidden * mask, axis=1)
    return total / tf.maximum(tf.reduce_sum(mask, axis=1), 1e-9)


def mask_bias(attention_mask: tf.Tensor) -> tf.Tensor:
    """Return the additive attention bias ``[batch, 1, 1, seq]`` for a 0/1 mask."""
    bias = (1.0 - tf.cast(attention_mask, tf.float32)) * MASK_NEG
    return bias[:, tf.newaxis, tf.newaxis, :]


def mpnet_bias(table: tf.Variable, seq: tf.Tensor, max_distance: int = 128) -> tf.Tensor:
    """Return MPNet's relative position bias ``[1, heads, S, S]`` (float32) from its table.

    The bucket of ``key - query``: 16 per direction, exact below 8, logarithmic up to
    ``max_distance`` (MPNetEncoder.relative_position_bucket, 32 buckets).
    """
    half, exact = 16, 8
    pos = tf.range(seq)
    n = pos[:, tf.newaxis] - pos[tf.newaxis, :]  # -(key - query)
    bucket = tf.cast(n < 0, tf.int32) * half
    n = tf.abs(n)
    scaled = tf.math.log(tf.cast(n, tf.float32) / exact) / math.log(max_distance / exact)
    large = tf.minimum(exact + tf.cast(scaled * (half - exact), tf.int32), half - 1)
    bucket += tf.where(n < exact, n, large)
    values = tf.cast(tf.gather(table, bucket), tf.float32)  # [S, S, heads]
    return tf.transpose(values, [2, 0, 1])[tf.newaxis]


def rope_frequencies(rope: Rope, head_dim: int) -> tuple[np.ndarray, float]:
    """Return a rotary embedding's inverse frequencies ``[head_dim / 2]`` (float32) and the scale
    of its cos/sin, as transformers' modeling_rope_utils computes them for ``rope.rope_type``:
    default ``1 / theta^(2i/d)``; linear those over ``factor``; yarn a ramp between the
    interpolated (over ``factor``) and the extrapolated ones, and the attention factor.

    Every rotary architecture computes its tables here, at export time: graph constants.
    """
    steps = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    powers = np.float32(rope.theta) ** steps  # float32, as torch computes it
    inv_freq = np.float32(1.0) / powers
    if rope.rope_type == "default":
        return inv_freq, 1.0
    if rope.rope_type == "linear":
        return (inv_freq / np.float32(rope.factor)).astype(np.float32), 1.0
    if rope.rope_type != "yarn":
        raise ValueError(f"rope_type {rope.rope_type!r}: export computes {', '.join(ROPE_TYPES)}")
    factor = rope.factor
    interpolated = np.float32(1.0) / (np.float32(factor) * powers)

    def dimension(rotations: float) -> float:  # the dimension turning ``rotations`` times
        turns = rope.original_max_position / (rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(rope.theta))

    low, high = dimension(rope.beta_fast), dimension(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = (np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low)
    extrapolated = np.float32(1.0) - np.clip(ramp, 0.0, 1.0).astype(np.float32)
    inv_freq = interpolated * (np.float32(1.0) - extrapolated) + inv_freq * extrapolated
    return inv_freq.astype(np.float32), _yarn_attention_factor(rope)


def _yarn_attention_factor(rope: Rope) -> float:
    """Return yarn's cos/sin scale: the given one, else ``0.1 ln(factor) + 1`` (mscale's ratio
    where both ``mscale`` and ``mscale_all_dim`` are given)."""
    if rope.attention_factor is not None:
        return float(rope.attention_factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def rotary(seq: tf.Tensor, rope: Rope, head_dim: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Return the rotary (cos, sin) ``[S, head_dim]`` of positions 0..S-1 (float32), scaled as
    ``rope`` says (``rope_frequencies``)."""
    inv_freq, scale = rope_frequencies(rope, head_dim)
    freqs = tf.cast(tf.range(seq), tf.float32)[:, tf.newaxis] * tf.constant(inv_freq)[tf.newaxis]
    angles = tf.concat([freqs, freqs], axis=-1)
    if scale == 1.0:
        return tf.cos(angles), tf.sin(angles)
    return tf.cos(angles) * scale, tf.sin(angles) * scale


def window_bias(seq: tf.Tensor, half: int) -> tf.Tensor:
    """Return the sliding window's bias ``[1, 1, S, S]``: a token sees those within ``half``."""
    pos = tf.range(seq)
    far = tf.abs(pos[:, tf.newaxis] - pos[tf.newaxis, :]) > half
    return tf.where(far, MASK_NEG, 0.0)[tf.newaxis, tf.newaxis]


def deberta_indices(seq: tf.Tensor, config: BertConfig) -> tuple[tf.Tensor, tf.Tensor]:
    """Return DeBERTa-v2's c2p and p2c gather indices ``[S, S]`` into the relative embeddings.

    The relative position ``query - key`` is log-bucketed beyond half the buckets
    (make_log_bucket_position, in float32 as transformers computes it), then shifted by the span
    and clamped into the table.
    """
    pos = tf.range(seq)
    rel = pos[:, tf.newaxis] - pos[tf.newaxis, :]
    buckets, max_position = config.position_buckets, config.max_relative_positions
    if buckets > 0 and max_position > 0:
        mid = buckets // 2
        sign = tf.cast(tf.sign(rel), tf.float32)
        near = tf.logical_and(rel < mid, rel > -mid)
        abs_pos = tf.where(near, mid - 1, tf.abs(rel))
        ratio = tf.cast(abs_pos, tf.float32) / float(mid)
        top = np.log(np.float32((max_position - 1) / mid))  # float32, as torch.log computes it
        log_pos = tf.math.ceil(tf.math.log(ratio) / top * float(mid - 1)) + float(mid)
        rel = tf.cast(tf.where(abs_pos <= mid, tf.cast(rel, tf.float32), log_pos * sign), tf.int32)
    span = buckets if buckets > 0 else max_position
    c2p = tf.clip_by_value(rel + span, 0, 2 * span - 1)
    p2c = tf.clip_by_value(-rel + span, 0, 2 * span - 1)
    return c2p, p2c
