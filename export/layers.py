"""The BERT encoder's building blocks: dense, layer norm, one encoder layer, pooling, masks.

Shared by the model (export/model.py) and the early exits (export/exits.py). Precision: weights
are stored in the export dtype and matmuls run in the compute dtype; everything else is float32
(see export/model.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from export.config import BertConfig

# A large negative (not -inf) so a fully padded row still gives a finite softmax.
MASK_NEG = -1e9


class Dense(tf.Module):
    """``x @ kernel + bias`` in the compute dtype (default: the storage dtype); returns float32."""

    def __init__(self, kernel: np.ndarray, bias: np.ndarray, dtype: tf.DType, name: str, *,
                 trainable: bool = False, compute_dtype: tf.DType | None = None
                 ) -> None:  # fmt: skip
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.cast(kernel, dtype), trainable=trainable, name="kernel")
        self.bias = tf.Variable(tf.cast(bias, dtype), trainable=trainable, name="bias")
        self.compute_dtype = compute_dtype or dtype

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        # tf.cast is the identity when the dtypes already match (inference: storage = compute)
        kernel = tf.cast(self.kernel, self.compute_dtype)
        y = tf.matmul(tf.cast(x, self.compute_dtype), kernel)
        return tf.cast(y + tf.cast(self.bias, self.compute_dtype), tf.float32)


class LayerNorm(tf.Module):
    """Layer norm over the last axis: parameters stored in ``dtype``, arithmetic in float32."""

    def __init__(self, gamma: np.ndarray, beta: np.ndarray, eps: float, dtype: tf.DType,
                 name: str, *, trainable: bool = False) -> None:  # fmt: skip
        super().__init__(name=name)
        self.gamma = tf.Variable(tf.cast(gamma, dtype), trainable=trainable, name="gamma")
        self.beta = tf.Variable(tf.cast(beta, dtype), trainable=trainable, name="beta")
        self.eps = eps

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        gamma, beta = tf.cast(self.gamma, tf.float32), tf.cast(self.beta, tf.float32)
        return (x - mean) * tf.math.rsqrt(variance + self.eps) * gamma + beta


def activation(name: str, x: tf.Tensor) -> tf.Tensor:
    if name == "relu":
        return tf.nn.relu(x)
    # "gelu" in HF/Google configs is the exact erf form; the *_tanh/_new names are the approximation
    return tf.nn.gelu(x, approximate=name != "gelu")


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Return ``x`` with stateless dropout at ``rate`` (identity when ``seed`` is None)."""
    if seed is None or rate <= 0.0:
        return x
    return tf.nn.experimental.stateless_dropout(x, rate, seed=seed + tf.constant([0, site]) * 7919)


class Layer(tf.Module):
    """One transformer encoder layer (post-layer-norm, as in BERT)."""

    def __init__(self, w: Mapping[str, np.ndarray], config: BertConfig, dtype: tf.DType,
                 name: str, *, trainable: bool = False,
                 compute_dtype: tf.DType | None = None) -> None:  # fmt: skip
        super().__init__(name=name)
        eps = config.layer_norm_eps

        def dense(part: str) -> Dense:
            return Dense(w[f"{part}/kernel"], w[f"{part}/bias"], dtype, part,
                          trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip

        def norm(part: str) -> LayerNorm:
            return LayerNorm(w[f"{part}/gamma"], w[f"{part}/beta"], eps, dtype, part,
                              trainable=trainable)  # fmt: skip

        self.query, self.key, self.value = dense("query"), dense("key"), dense("value")
        self.attention_out, self.attention_ln = dense("attention_out"), norm("attention_ln")
        self.intermediate, self.output = dense("intermediate"), dense("output")
        self.output_ln = norm("output_ln")
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.act = config.hidden_act
        self.dtype = compute_dtype or dtype
        self.hidden_dropout = config.hidden_dropout
        self.attention_dropout = config.attention_dropout

    def _split(self, x: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(tf.cast(x, self.dtype), [batch, seq, self.num_heads, self.head_dim])
        return tf.transpose(x, [0, 2, 1, 3])

    def __call__(self, x: tf.Tensor, mask_bias: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor,
                 dropout_seed: tf.Tensor | None = None) -> tf.Tensor:  # fmt: skip
        """Return the layer's output for ``x`` of shape ``[batch * seq, hidden]`` (float32).

        ``dropout_seed`` (int32 ``[2]``) switches BERT's training dropout on.
        """
        q = self._split(self.query(x), batch, seq)
        k = self._split(self.key(x), batch, seq)
        v = self._split(self.value(x), batch, seq)
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.cast(scores, tf.float32) / math.sqrt(self.head_dim) + mask_bias
        probs = dropout(tf.nn.softmax(scores, axis=-1), self.attention_dropout, dropout_seed, 1)
        context = tf.transpose(tf.matmul(tf.cast(probs, self.dtype), v), [0, 2, 1, 3])
        context = tf.reshape(context, [batch * seq, self.num_heads * self.head_dim])
        attended = dropout(self.attention_out(context), self.hidden_dropout, dropout_seed, 2)
        x = self.attention_ln(x + attended)
        hidden = activation(self.act, self.intermediate(x))
        out = dropout(self.output(hidden), self.hidden_dropout, dropout_seed, 3)
        return self.output_ln(x + out)


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
