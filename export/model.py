"""The BERT encoder and its heads as a plain TF2 ``tf.Module`` (no Keras, no TF1 graph code).

Precision: in ``fp16``/``bf16`` the embedding tables, kernels and biases are stored in that dtype
and every matmul runs in it, while the residual stream, layer norm, softmax, GELU and all outputs
stay float32. Low-precision accumulation across layers is what loses accuracy; keeping the
residual stream float32 keeps the error at the level of one matmul's rounding.
The serving signature is always int32 in, float32 out (DESIGN.md contract 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from export.config import BertConfig
from modelformat.buckets import signature_name

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
# A large negative (not -inf) so a fully padded row still gives a finite softmax.
_MASK_NEG = -1e9


def output_names(task: str) -> list[str]:
    """Return the signature's output names for ``task``."""
    return ["logits", "probabilities"] if task == "classify" else ["embedding"]


class _Dense(tf.Module):
    """``x @ kernel + bias`` in the storage dtype; returns float32."""

    def __init__(self, kernel: np.ndarray, bias: np.ndarray, dtype: tf.DType, name: str) -> None:
        super().__init__(name=name)
        self.kernel = tf.Variable(tf.cast(kernel, dtype), trainable=False, name="kernel")
        self.bias = tf.Variable(tf.cast(bias, dtype), trainable=False, name="bias")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        y = tf.matmul(tf.cast(x, self.kernel.dtype), self.kernel) + self.bias
        return tf.cast(y, tf.float32)


class _LayerNorm(tf.Module):
    """Layer norm over the last axis: parameters stored in ``dtype``, arithmetic in float32."""

    def __init__(self, gamma: np.ndarray, beta: np.ndarray, eps: float, dtype: tf.DType,
                 name: str) -> None:  # fmt: skip
        super().__init__(name=name)
        self.gamma = tf.Variable(tf.cast(gamma, dtype), trainable=False, name="gamma")
        self.beta = tf.Variable(tf.cast(beta, dtype), trainable=False, name="beta")
        self.eps = eps

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        gamma, beta = tf.cast(self.gamma, tf.float32), tf.cast(self.beta, tf.float32)
        return (x - mean) * tf.math.rsqrt(variance + self.eps) * gamma + beta


def _activation(name: str, x: tf.Tensor) -> tf.Tensor:
    if name == "relu":
        return tf.nn.relu(x)
    # "gelu" in HF/Google configs is the exact erf form; the *_tanh/_new names are the approximation
    return tf.nn.gelu(x, approximate=name != "gelu")


class _Layer(tf.Module):
    """One transformer encoder layer (post-layer-norm, as in BERT)."""

    def __init__(self, w: Mapping[str, np.ndarray], config: BertConfig, dtype: tf.DType,
                 name: str) -> None:  # fmt: skip
        super().__init__(name=name)
        eps = config.layer_norm_eps
        self.query = _Dense(w["query/kernel"], w["query/bias"], dtype, "query")
        self.key = _Dense(w["key/kernel"], w["key/bias"], dtype, "key")
        self.value = _Dense(w["value/kernel"], w["value/bias"], dtype, "value")
        self.attention_out = _Dense(w["attention_out/kernel"], w["attention_out/bias"], dtype,
                                    "attention_out")  # fmt: skip
        self.attention_ln = _LayerNorm(w["attention_ln/gamma"], w["attention_ln/beta"], eps,
                                       dtype, "attention_ln")  # fmt: skip
        self.intermediate = _Dense(w["intermediate/kernel"], w["intermediate/bias"], dtype,
                                   "intermediate")  # fmt: skip
        self.output = _Dense(w["output/kernel"], w["output/bias"], dtype, "output")
        self.output_ln = _LayerNorm(w["output_ln/gamma"], w["output_ln/beta"], eps, dtype,
                                    "output_ln")  # fmt: skip
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.act = config.hidden_act
        self.dtype = dtype

    def _split(self, x: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor) -> tf.Tensor:
        x = tf.reshape(tf.cast(x, self.dtype), [batch, seq, self.num_heads, self.head_dim])
        return tf.transpose(x, [0, 2, 1, 3])

    def __call__(self, x: tf.Tensor, mask_bias: tf.Tensor, batch: tf.Tensor, seq: tf.Tensor
                 ) -> tf.Tensor:  # fmt: skip
        """Return the layer's output for ``x`` of shape ``[batch * seq, hidden]`` (float32)."""
        q = self._split(self.query(x), batch, seq)
        k = self._split(self.key(x), batch, seq)
        v = self._split(self.value(x), batch, seq)
        scores = tf.matmul(q, k, transpose_b=True)
        scores = tf.cast(scores, tf.float32) / math.sqrt(self.head_dim) + mask_bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), self.dtype)
        context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
        context = tf.reshape(context, [batch * seq, self.num_heads * self.head_dim])
        x = self.attention_ln(x + self.attention_out(context))
        hidden = _activation(self.act, self.intermediate(x))
        return self.output_ln(x + self.output(hidden))


class BertModule(tf.Module):
    """A BERT encoder with a ``classify`` (trained or zero-shot) or ``embed`` head.

    ``serve`` is the ``serving_default`` function; ``encode`` returns pooled float32 sentence
    vectors and is what the zero-shot head uses to embed label descriptions at export time.
    """

    def __init__(
        self,
        config: BertConfig,
        weights: Mapping[str, np.ndarray],
        *,
        task: str,
        precision: str = "fp32",
        pooling: str = "mean",
        label_embeddings: np.ndarray | None = None,
        zero_shot_scale: float = 20.0,
    ) -> None:
        super().__init__(name="bert")
        dtype = DTYPES[precision]
        self.task, self.pooling = task, pooling
        self.word = tf.Variable(tf.cast(weights["embeddings/word"], dtype), trainable=False)
        self.position = tf.Variable(tf.cast(weights["embeddings/position"], dtype),
                                    trainable=False)  # fmt: skip
        self.token_type = tf.Variable(tf.cast(weights["embeddings/token_type"], dtype),
                                      trainable=False)  # fmt: skip
        self.embeddings_ln = _LayerNorm(weights["embeddings_ln/gamma"],
                                        weights["embeddings_ln/beta"], config.layer_norm_eps,
                                        dtype, "embeddings_ln")  # fmt: skip
        self.layers = [
            _Layer(_layer_weights(weights, i), config, dtype, f"layer_{i}")
            for i in range(config.num_layers)
        ]
        self.zero_shot = label_embeddings is not None
        if task == "classify" and self.zero_shot:
            assert label_embeddings is not None
            unit = label_embeddings / np.linalg.norm(label_embeddings, axis=1, keepdims=True)
            self.label_matrix = tf.Variable(unit.T.astype(np.float32), trainable=False)
            self.scale = tf.constant(zero_shot_scale, tf.float32)
        elif task == "classify":
            self.pooler = _Dense(weights["pooler/kernel"], weights["pooler/bias"], dtype, "pooler")
            self.classifier = _Dense(weights["classifier/kernel"], weights["classifier/bias"],
                                     dtype, "classifier")  # fmt: skip
        specs = [tf.TensorSpec([None, None], tf.int32, name=n) for n in INPUT_NAMES]
        self.serve = tf.function(self._serve, input_signature=specs)
        self.encode = tf.function(self._encode, input_signature=specs)

    def _hidden(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                token_type_ids: tf.Tensor) -> tf.Tensor:  # fmt: skip
        """Return the last hidden states ``[batch, seq, hidden]`` in float32."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x = (
            tf.cast(tf.gather(self.word, input_ids), tf.float32)
            + tf.cast(tf.gather(self.position, tf.range(seq)), tf.float32)[tf.newaxis]
            + tf.cast(tf.gather(self.token_type, token_type_ids), tf.float32)
        )
        x = tf.reshape(self.embeddings_ln(x), [batch * seq, -1])
        mask_bias = (1.0 - tf.cast(attention_mask, tf.float32)) * _MASK_NEG
        mask_bias = mask_bias[:, tf.newaxis, tf.newaxis, :]
        for layer in self.layers:
            x = layer(x, mask_bias, batch, seq)
        return tf.reshape(x, [batch, seq, -1])

    def _pool(self, hidden: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        mask = tf.cast(attention_mask, tf.float32)[:, :, tf.newaxis]
        total = tf.reduce_sum(hidden * mask, axis=1)
        return total / tf.maximum(tf.reduce_sum(mask, axis=1), 1e-9)

    def _encode(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                token_type_ids: tf.Tensor) -> tf.Tensor:  # fmt: skip
        return self._pool(self._hidden(input_ids, attention_mask, token_type_ids), attention_mask)

    def _serve(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
               token_type_ids: tf.Tensor) -> dict[str, tf.Tensor]:  # fmt: skip
        hidden = self._hidden(input_ids, attention_mask, token_type_ids)
        if self.task == "embed":
            return {"embedding": self._pool(hidden, attention_mask)}
        if self.zero_shot:
            unit = tf.math.l2_normalize(self._pool(hidden, attention_mask), axis=-1)
            logits = self.scale * tf.matmul(unit, self.label_matrix)
        else:
            pooled = tf.tanh(self.pooler(hidden[:, 0]))
            logits = self.classifier(pooled)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    def signatures(self, bucket_lens: Sequence[int] = ()) -> dict[str, Any]:
        """Return the signatures to save: ``serving_default`` and one ``seq_<L>`` per bucket.

        TF Serving's batching keeps one queue per signature (distinct feed/fetch tensors), so
        a fixed-length signature per bucket lets requests of one length batch together with
        no padding (TF Serving pads with each task's first element, which changes BERT's
        outputs). Each is its own traced function over the same variables.
        """
        out = {"serving_default": self.serve.get_concrete_function()}
        for seq_len in bucket_lens:
            specs = [tf.TensorSpec([None, seq_len], tf.int32, name=n) for n in INPUT_NAMES]
            fn = tf.function(self._serve, input_signature=specs)
            out[signature_name(seq_len)] = fn.get_concrete_function()
        return out


def _layer_weights(weights: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    prefix = f"layer_{index}/"
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def run(fn: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call a ``tf.function`` / signature with numpy int32 inputs and return numpy outputs."""
    feeds = {name: tf.constant(np.asarray(inputs[name], dtype=np.int32)) for name in INPUT_NAMES}
    out = fn(**feeds)
    if isinstance(out, dict):
        return {name: value.numpy() for name, value in out.items()}
    return {"output": out.numpy()}
