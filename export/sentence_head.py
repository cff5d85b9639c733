"""The graph side of export/sentence_modules.py: pooling -> dense -> normalize."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from export.sentence_modules import SentenceModules


class SentenceHead(tf.Module):
    """pooling -> dense -> normalize in TensorFlow, as sentence-transformers encodes (float32:
    the encoder's last hidden states are float32 whatever its precision)."""

    def __init__(self, modules: SentenceModules) -> None:
        super().__init__(name="sentence_head")
        self.poolings = list(modules.poolings)
        self.normalize = modules.normalize
        self.dense = [
            (
                tf.Variable(d.kernel, trainable=False, name=f"st_dense_{i}_kernel"),
                None if d.bias is None else tf.Variable(d.bias, trainable=False,
                                                         name=f"st_dense_{i}_bias"),
                d.activation,
            )
            for i, d in enumerate(modules.dense)
        ]  # fmt: skip

    def __call__(self, hidden: Any, attention_mask: Any) -> Any:
        """Return the sentence vectors of ``hidden`` [batch, seq, H] (float32)."""
        mask = tf.cast(attention_mask, tf.float32)[:, :, tf.newaxis]
        count = tf.maximum(tf.reduce_sum(mask, axis=1), 1e-9)
        parts = []
        for mode in self.poolings:
            if mode == "cls":
                parts.append(hidden[:, 0])
            elif mode == "max":  # padding set to a large negative first, as sentence-transformers
                parts.append(tf.reduce_max(hidden + (mask - 1.0) * 1e9, axis=1))
            elif mode == "mean":
                parts.append(tf.reduce_sum(hidden * mask, axis=1) / count)
            elif mode == "mean_sqrt_len":
                parts.append(tf.reduce_sum(hidden * mask, axis=1) / tf.sqrt(count))
            else:  # lasttoken: the last position the mask keeps (right padding)
                last = tf.maximum(tf.reduce_sum(tf.cast(attention_mask, tf.int32), axis=1) - 1, 0)
                parts.append(tf.gather(hidden, last, axis=1, batch_dims=1))
        x = parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)
        x = apply_dense(x, self.dense)
        if self.normalize:
            x = tf.math.l2_normalize(x, axis=-1, epsilon=1e-24)
        return x


def apply_dense(x: Any, layers: Any) -> Any:
    """Return ``x`` (``[..., in]``) through the (kernel, bias, activation) Dense ``layers``."""
    for kernel, bias, activation in layers:
        # a [batch, in] input goes through tf.matmul as it always did (tensordot's kernel rounds
        # differently in the last bit, which the gateway's golden answers would see); token
        # vectors [batch, seq, in] are flattened to that same matmul
        if x.shape.rank == 2:
            x = tf.matmul(x, kernel)
        else:
            shape = tf.shape(x)
            x = tf.reshape(tf.matmul(tf.reshape(x, [-1, shape[-1]]), kernel),
                           tf.concat([shape[:-1], [-1]], axis=0))  # fmt: skip
        x = x + (bias if bias is not None else 0.0)
        if activation == "tanh":
            x = tf.tanh(x)
        elif activation == "relu":
            x = tf.nn.relu(x)
        elif activation == "gelu":
            x = tf.nn.gelu(x, approximate=False)
        elif activation == "sigmoid":
            x = tf.sigmoid(x)
    return x
