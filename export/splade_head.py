"""The graph side of export/splade.py: masked-LM logits pooled over tokens, top-k out.

``SpladeHead`` is what sentence-transformers' ``MLMTransformer`` + ``SpladePooling`` compute,
``x = logits · mask``, ``a = log1p(relu(x))`` (``log1p`` once more for ``log1p_relu``), max or
sum over the sequence, then ``tf.math.top_k``: ``sparse_indices`` int32 ``[batch, k]`` and
``sparse_values`` float32 ``[batch, k]``, values descending, 0 where a text has fewer non-zero
entries. The ``[batch, seq, vocab]`` logits never leave the graph, nor are they ever whole in it:

- only the real tokens (attention mask 1) go through the head (a padded position contributes 0
  to either pooling, as ``logits · mask`` makes it in sentence-transformers);
- they go through the vocabulary projection ``TOKEN_CHUNK`` tokens at a time (a ``While``
  loop), each chunk reduced into the ``[batch, vocab]`` accumulator by ``UnsortedSegmentMax`` /
  ``Sum`` on the tokens' row ids: at most ``TOKEN_CHUNK × vocab`` floats live at once (62 MB
  for BERT's 30,522 at 512 tokens) whatever the batch;
- for max pooling the activation runs after the max (``relu`` and ``log1p`` are monotone, so
  ``max log1p(relu(x)) = log1p(relu(max x))`` exactly; the accumulator starts at 0, the padded
  positions' value), on ``[batch, vocab]`` instead of every token's logits.

Precision: the transform's dense, the decoder matmul (the word table itself when tied) run in
the export dtype; the layer norm, activation, pooling and top-k in float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from export.layers import Dense, LayerNorm, activation
from modelformat.outputs import SPARSE_INDICES_OUTPUT, SPARSE_VALUES_OUTPUT

TOKEN_CHUNK = 512  # tokens per pass through the vocabulary projection


class SpladeHead(tf.Module):
    """Masked-LM head → SPLADE pooling → top-k, over an encoder's last hidden states."""

    def __init__(self, weights: Mapping[str, np.ndarray], *, pooling: str, act: str,
                 transform_act: str, top_k: int, eps: float, dtype: tf.DType,
                 word: tf.Variable | None = None, chunk: int = TOKEN_CHUNK) -> None:  # fmt: skip
        """``weights``: export/splade.py's ``read_mlm_head``; ``word`` the encoder's word table,
        used as the decoder when ``mlm/tied`` (no second copy is stored). ``top_k`` 0 returns
        the pooled ``[batch, vocab]`` vector itself as ``sparse_pooled`` (what the benchmark
        compares the top-k with; never exported)."""
        super().__init__(name="splade")
        self.pooling, self.act, self.transform_act = pooling, act, transform_act
        self.top_k, self.chunk = int(top_k), int(chunk)
        self.dense = Dense(weights["mlm/dense/kernel"], weights.get("mlm/dense/bias"), dtype,
                           "mlm_dense")  # fmt: skip
        self.norm = LayerNorm(weights["mlm/ln/gamma"], weights.get("mlm/ln/beta"), eps, dtype,
                              "mlm_ln")  # fmt: skip
        tied = bool(np.asarray(weights.get("mlm/tied", False))) and word is not None
        self.decoder: tf.Variable = word if tied and word is not None else tf.Variable(
            tf.cast(weights["mlm/decoder"], dtype), trainable=False, name="mlm_decoder"
        )  # fmt: skip
        self.bias = tf.Variable(tf.cast(weights["mlm/bias"], dtype), trainable=False,
                                name="mlm_bias")  # fmt: skip
        self.vocab = int(weights["mlm/bias"].shape[0])

    def _activation(self, x: tf.Tensor) -> tf.Tensor:
        a = tf.math.log1p(tf.nn.relu(x))
        return tf.math.log1p(a) if self.act == "log1p_relu" else a

    def __call__(self, hidden: tf.Tensor, attention_mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """Return ``sparse_indices`` / ``sparse_values`` ``[batch, k]`` of ``hidden`` [B, S, H]."""
        batch, seq = tf.shape(hidden)[0], tf.shape(hidden)[1]
        real = tf.reshape(attention_mask, [-1]) > 0
        rows = tf.boolean_mask(tf.repeat(tf.range(batch), seq), real)
        tokens = tf.boolean_mask(tf.reshape(hidden, [batch * seq, -1]), real)
        x = self.norm(activation(self.transform_act, self.dense(tokens)))  # [N, width] float32
        n = tf.shape(x)[0]
        decoder = self.decoder
        dtype = decoder.dtype
        bias = tf.cast(self.bias, tf.float32)

        def body(start: tf.Tensor, acc: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            part = x[start : start + self.chunk]
            ids = rows[start : start + self.chunk]
            logits = tf.cast(tf.matmul(tf.cast(part, dtype), decoder, transpose_b=True),
                             tf.float32) + bias  # fmt: skip
            if self.pooling == "max":
                return start + self.chunk, tf.maximum(
                    acc, tf.math.unsorted_segment_max(logits, ids, batch)
                )
            return start + self.chunk, acc + tf.math.unsorted_segment_sum(
                self._activation(logits), ids, batch
            )

        zeros = tf.zeros([batch, self.vocab], tf.float32)
        _, pooled = tf.while_loop(lambda start, _: start < n, body, (tf.constant(0), zeros))
        if self.pooling == "max":
            pooled = self._activation(pooled)
        if self.top_k == 0:
            return {"sparse_pooled": pooled}
        values, indices = tf.math.top_k(pooled, k=self.top_k)
        return {SPARSE_INDICES_OUTPUT: tf.cast(indices, tf.int32), SPARSE_VALUES_OUTPUT: values}


def splade_head(spec: Any, dtype: tf.DType, word: tf.Variable) -> SpladeHead:
    """Return the head of ``spec`` (export/splade.py's ``SpladeSpec``) in ``dtype``."""
    return SpladeHead(spec.weights, pooling=spec.pooling, act=spec.activation,
                      transform_act=spec.transform_act, top_k=spec.top_k, eps=spec.eps,
                      dtype=dtype, word=word)  # fmt: skip
