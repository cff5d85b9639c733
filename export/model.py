"""The BERT encoder and its heads as a plain TF2 ``tf.Module`` (no Keras, no TF1 graph code).

Precision: in ``fp16``/``bf16`` the embedding tables, kernels and biases are stored in that dtype
and every matmul runs in it, while the residual stream, layer norm, softmax, GELU and all outputs
stay float32. Low-precision accumulation across layers is what loses accuracy; keeping the
residual stream float32 keeps the error at the level of one matmul's rounding.
The serving signature is always int32 in, float32 out (DESIGN.md contract 1).

Training (finetune/) uses this same module with ``trainable=True``: variables stay float32 and a
``compute_dtype`` (from a Keras mixed-precision policy) runs the matmuls in bf16/fp16, while
``logits(..., dropout_seed=...)`` adds BERT's dropout, stateless so a resumed run repeats its masks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from export.config import BertConfig
from export.heads import head_outputs, token_logits
from modelformat.buckets import signature_name

DTYPES = {"fp32": tf.float32, "fp16": tf.float16, "bf16": tf.bfloat16}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
SPEED = "speed"  # the early-exit graph's extra input: float32 [batch], one threshold per row
# A large negative (not -inf) so a fully padded row still gives a finite softmax.
_MASK_NEG = -1e9


class _Dense(tf.Module):
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


class _LayerNorm(tf.Module):
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


def _activation(name: str, x: tf.Tensor) -> tf.Tensor:
    if name == "relu":
        return tf.nn.relu(x)
    # "gelu" in HF/Google configs is the exact erf form; the *_tanh/_new names are the approximation
    return tf.nn.gelu(x, approximate=name != "gelu")


def _dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None, site: int) -> tf.Tensor:
    """Return ``x`` with stateless dropout at ``rate`` (identity when ``seed`` is None)."""
    if seed is None or rate <= 0.0:
        return x
    return tf.nn.experimental.stateless_dropout(x, rate, seed=seed + tf.constant([0, site]) * 7919)


class _Layer(tf.Module):
    """One transformer encoder layer (post-layer-norm, as in BERT)."""

    def __init__(self, w: Mapping[str, np.ndarray], config: BertConfig, dtype: tf.DType,
                 name: str, *, trainable: bool = False,
                 compute_dtype: tf.DType | None = None) -> None:  # fmt: skip
        super().__init__(name=name)
        eps = config.layer_norm_eps

        def dense(part: str) -> _Dense:
            return _Dense(w[f"{part}/kernel"], w[f"{part}/bias"], dtype, part,
                          trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip

        def norm(part: str) -> _LayerNorm:
            return _LayerNorm(w[f"{part}/gamma"], w[f"{part}/beta"], eps, dtype, part,
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
        probs = _dropout(tf.nn.softmax(scores, axis=-1), self.attention_dropout, dropout_seed, 1)
        context = tf.transpose(tf.matmul(tf.cast(probs, self.dtype), v), [0, 2, 1, 3])
        context = tf.reshape(context, [batch * seq, self.num_heads * self.head_dim])
        attended = _dropout(self.attention_out(context), self.hidden_dropout, dropout_seed, 2)
        x = self.attention_ln(x + attended)
        hidden = _activation(self.act, self.intermediate(x))
        out = _dropout(self.output(hidden), self.hidden_dropout, dropout_seed, 3)
        return self.output_ln(x + out)


def pool(hidden: tf.Tensor, attention_mask: tf.Tensor, pooling: str) -> tf.Tensor:
    """Return one float32 vector per row of ``hidden`` [b, S, H]: ``cls`` or the masked mean."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = tf.cast(attention_mask, tf.float32)[:, :, tf.newaxis]
    total = tf.reduce_sum(hidden * mask, axis=1)
    return total / tf.maximum(tf.reduce_sum(mask, axis=1), 1e-9)


def normalized_entropy(logits: tf.Tensor) -> tf.Tensor:
    """Return FastBERT's uncertainty per row: ``-Σ p log p / log N`` in [0, 1] (float32)."""
    logits = tf.cast(logits, tf.float32)
    log_p = tf.nn.log_softmax(logits, axis=-1)
    entropy = -tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1)
    return entropy / math.log(max(int(logits.shape[-1]), 2))


class Student(tf.Module):
    """An early-exit classifier after one encoder layer: pooled → dense tanh → classifier."""

    def __init__(self, w: Mapping[str, np.ndarray], dtype: tf.DType, name: str, *,
                 pooling: str, trainable: bool = False,
                 compute_dtype: tf.DType | None = None) -> None:  # fmt: skip
        super().__init__(name=name)
        self.dense = _Dense(w["dense/kernel"], w["dense/bias"], dtype, "dense",
                            trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip
        self.classifier = _Dense(w["classifier/kernel"], w["classifier/bias"], dtype,
                                 "classifier", trainable=trainable,
                                 compute_dtype=compute_dtype)  # fmt: skip
        self.pooling = pooling

    def __call__(self, pooled: tf.Tensor) -> tf.Tensor:
        """Return float32 logits for ``pooled`` [b, H] (see ``pool``)."""
        return self.classifier(tf.tanh(self.dense(pooled)))

    def named_variables(self) -> dict[str, tf.Variable]:
        """Return the variables under the names the constructor takes (``dense/kernel``, ...)."""
        return {
            f"{part}/{kind}": getattr(getattr(self, part), kind)
            for part in ("dense", "classifier")
            for kind in ("kernel", "bias")
        }


def exit_weight_names(num_layers: int) -> list[str]:
    """Return the canonical names of every student's weights (students after layers 1..L-1)."""
    return [
        f"exit_{k}/{part}/{kind}"
        for k in range(num_layers - 1)
        for part in ("dense", "classifier")
        for kind in ("kernel", "bias")
    ]


class BertModule(tf.Module):
    """A BERT encoder with a ``classify`` (trained or zero-shot), ``tag`` or ``embed`` head.

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
        trainable: bool = False,
        compute_dtype: tf.DType | None = None,
        early_exit: Mapping[str, Any] | None = None,
        compaction: bool = True,
        activation: str = "softmax",
    ) -> None:
        """Build the module; ``trainable``/``compute_dtype`` are for training (see module doc).

        ``early_exit`` (a checkpoint's ``early_exits`` entry: ``pooling``) serves the students in
        ``weights`` (``exit_{k}/...``): ``serve`` then takes a per-row ``speed`` and returns
        ``exit_layer``. ``compaction=False`` keeps exited rows in the batch until every row has
        exited (the baseline the benchmark compares against); the outputs are the same.
        ``activation`` turns a classifier's logits into ``probabilities`` (export/heads.py); a
        ``tag`` head is a classifier over every token (no pooler), its scores a softmax.
        """
        super().__init__(name="bert")
        dtype = DTYPES[precision]
        self.task, self.pooling, self.activation = task, pooling, activation
        self.compaction = compaction
        self.hidden_size = config.hidden_size
        self.hidden_dropout = config.hidden_dropout

        def table(name: str) -> tf.Variable:
            return tf.Variable(tf.cast(weights[name], dtype), trainable=trainable,
                               name=name.replace("/", "_"))  # fmt: skip

        self.word = table("embeddings/word")
        self.position = table("embeddings/position")
        self.token_type = table("embeddings/token_type")
        self.embeddings_ln = _LayerNorm(weights["embeddings_ln/gamma"],
                                        weights["embeddings_ln/beta"], config.layer_norm_eps,
                                        dtype, "embeddings_ln", trainable=trainable)  # fmt: skip
        self.layers = [
            _Layer(
                _layer_weights(weights, i),
                config,
                dtype,
                f"layer_{i}",
                trainable=trainable,
                compute_dtype=compute_dtype,
            )
            for i in range(config.num_layers)
        ]
        self.zero_shot = label_embeddings is not None
        if task == "classify" and self.zero_shot:
            assert label_embeddings is not None
            unit = label_embeddings / np.linalg.norm(label_embeddings, axis=1, keepdims=True)
            self.label_matrix = tf.Variable(unit.T.astype(np.float32), trainable=False)
            self.scale = tf.constant(zero_shot_scale, tf.float32)
        elif task == "classify":
            self.pooler = _Dense(weights["pooler/kernel"], weights["pooler/bias"], dtype, "pooler",
                                 trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip
            self.classifier = _Dense(weights["classifier/kernel"], weights["classifier/bias"],
                                     dtype, "classifier", trainable=trainable,
                                     compute_dtype=compute_dtype)  # fmt: skip
        elif task == "tag":
            self.classifier = _Dense(weights["classifier/kernel"], weights["classifier/bias"],
                                     dtype, "classifier", trainable=trainable,
                                     compute_dtype=compute_dtype)  # fmt: skip
        self.students: list[Student] = []
        self.exit_pooling = ""
        if early_exit is not None:
            self.exit_pooling = str(early_exit.get("pooling", "mean"))
            self.students = [
                Student(_prefixed(weights, f"exit_{k}/"), dtype, f"exit_{k}",
                        pooling=self.exit_pooling, trainable=trainable,
                        compute_dtype=compute_dtype)
                for k in range(config.num_layers - 1)
            ]  # fmt: skip
        specs = [tf.TensorSpec([None, None], tf.int32, name=n) for n in INPUT_NAMES]
        self.serve = tf.function(self._serving_fn(), input_signature=self._specs(None))
        self.encode = tf.function(self._encode, input_signature=specs)

    @property
    def early_exit(self) -> bool:
        """Whether the served graph has early exits (``speed`` in, ``exit_layer`` out)."""
        return bool(self.students)

    def _specs(self, seq_len: int | None) -> list[tf.TensorSpec]:
        specs = [tf.TensorSpec([None, seq_len], tf.int32, name=n) for n in INPUT_NAMES]
        if self.early_exit:
            specs.append(tf.TensorSpec([None], tf.float32, name=SPEED))
        return specs

    def _serving_fn(self) -> Any:
        return self._serve_exits if self.early_exit else self._serve

    def _hidden(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                token_type_ids: tf.Tensor, dropout_seed: tf.Tensor | None = None
                ) -> tf.Tensor:  # fmt: skip
        """Return the last hidden states ``[batch, seq, hidden]`` in float32."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x, mask_bias = self._embed(input_ids, attention_mask, token_type_ids, dropout_seed)
        for i, layer in enumerate(self.layers):
            layer_seed = None if dropout_seed is None else dropout_seed + tf.constant([0, i + 1])
            x = layer(x, mask_bias, batch, seq, layer_seed)
        return tf.reshape(x, [batch, seq, -1])

    def layer_outputs(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                      token_type_ids: tf.Tensor) -> list[tf.Tensor]:  # fmt: skip
        """Return the hidden states ``[batch, seq, hidden]`` (float32) after layers 1..L."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x, mask_bias = self._embed(input_ids, attention_mask, token_type_ids)
        out = []
        for layer in self.layers:
            x = layer(x, mask_bias, batch, seq)
            out.append(tf.reshape(x, [batch, seq, -1]))
        return out

    def _embed(self, input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor,
               dropout_seed: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:  # fmt: skip
        """Return the embeddings ``[batch * seq, hidden]`` and the attention mask's bias."""
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        x = (
            tf.cast(tf.gather(self.word, input_ids), tf.float32)
            + tf.cast(tf.gather(self.position, tf.range(seq)), tf.float32)[tf.newaxis]
            + tf.cast(tf.gather(self.token_type, token_type_ids), tf.float32)
        )
        x = tf.reshape(self.embeddings_ln(x), [batch * seq, -1])
        x = _dropout(x, self.hidden_dropout, dropout_seed, 0)
        return x, _mask_bias(attention_mask)

    def _pool(self, hidden: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
        return pool(hidden, attention_mask, self.pooling)

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
            logits = self.head(hidden)
        return head_outputs(self.task, logits, self.activation)

    def _serve_exits(self, input_ids: tf.Tensor, attention_mask: tf.Tensor,
                     token_type_ids: tf.Tensor, speed: tf.Tensor
                     ) -> dict[str, tf.Tensor]:  # fmt: skip
        """Run the layers with early exits; return logits, probabilities and exit_layer.

        After layer i (< L) each row still running asks its student; a row whose normalised
        entropy is below its ``speed`` takes the student's logits and leaves. With compaction the
        rows left are gathered and the next layers run on them only; the exited rows' results are
        scattered back into the input order at the end. ``speed`` 0 exits nowhere: every row
        runs all L layers, exactly the full model.
        """
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        speed = _checked_speed(speed, batch)
        x, _ = self._embed(input_ids, attention_mask, token_type_ids)
        if not self.compaction:
            return self._exits_masked(x, attention_mask, speed, batch, seq)
        rows, mask = tf.range(batch), attention_mask
        done_rows, done_logits, done_layers = [], [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            left = tf.shape(rows)[0]
            x = layer(x, _mask_bias(mask), left, seq)
            # explicit sizes: once every row has exited the batch is empty and -1 is ambiguous
            hidden = tf.reshape(x, [left, seq, self.hidden_size])
            if i == last:
                logits, leave = self.head(hidden), tf.ones([left], tf.bool)
            else:
                logits = self.students[i](pool(hidden, mask, self.exit_pooling))
                leave = normalized_entropy(logits) < speed
            done_rows.append(tf.boolean_mask(rows, leave))
            done_logits.append(tf.boolean_mask(logits, leave))
            done_layers.append(tf.fill(tf.shape(done_rows[-1]), i + 1))
            if i < last:  # the rows left, gathered: the next layer runs on them only
                stay = tf.logical_not(leave)
                rows, mask, speed = (tf.boolean_mask(t, stay) for t in (rows, mask, speed))
                x = tf.reshape(tf.boolean_mask(hidden, stay), [-1, self.hidden_size])
        where = tf.concat(done_rows, axis=0)[:, tf.newaxis]
        logits = tf.scatter_nd(where, tf.concat(done_logits, axis=0),
                               [batch, tf.shape(done_logits[-1])[-1]])  # fmt: skip
        exit_layer = tf.scatter_nd(where, tf.concat(done_layers, axis=0), [batch])
        return {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "exit_layer": exit_layer,
        }

    def _exits_masked(self, x: tf.Tensor, attention_mask: tf.Tensor, speed: tf.Tensor,
                      batch: tf.Tensor, seq: tf.Tensor) -> dict[str, tf.Tensor]:  # fmt: skip
        """The no-compaction baseline: every row runs until the batch's last row has exited."""
        mask_bias = _mask_bias(attention_mask)
        running = tf.ones([batch], tf.bool)
        logits = tf.zeros([batch, self.classifier.bias.shape[0]], tf.float32)
        exit_layer = tf.zeros([batch], tf.int32)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):

            def step(x=x, running=running, logits=logits, exit_layer=exit_layer,
                     i=i, layer=layer) -> tuple[tf.Tensor, ...]:  # fmt: skip
                x = layer(x, mask_bias, batch, seq)
                hidden = tf.reshape(x, [batch, seq, -1])
                if i == last:
                    out, leave = self.head(hidden), running
                else:
                    out = self.students[i](pool(hidden, attention_mask, self.exit_pooling))
                    leave = tf.logical_and(running, normalized_entropy(out) < speed)
                logits = tf.where(leave[:, tf.newaxis], out, logits)
                exit_layer = tf.where(leave, i + 1, exit_layer)
                return x, tf.logical_and(running, tf.logical_not(leave)), logits, exit_layer

            def skip(x=x, running=running, logits=logits,
                     exit_layer=exit_layer) -> tuple[tf.Tensor, ...]:  # fmt: skip
                return x, running, logits, exit_layer

            x, running, logits, exit_layer = tf.cond(tf.reduce_any(running), step, skip)
        return {
            "logits": logits,
            "probabilities": tf.nn.softmax(logits, axis=-1),
            "exit_layer": exit_layer,
        }

    def head(self, hidden: tf.Tensor, dropout_seed: tf.Tensor | None = None) -> tf.Tensor:
        """Return a trained head's float32 logits: pooler tanh([CLS]) → dropout → classifier.

        A ``tag`` head: dropout → classifier on every token, ``[batch, seq, labels]``.
        """
        if self.task == "tag":
            dropped = _dropout(hidden, self.hidden_dropout, dropout_seed, 4)
            return token_logits(self.classifier, dropped)
        pooled = tf.tanh(self.pooler(hidden[:, 0]))
        pooled = _dropout(pooled, self.hidden_dropout, dropout_seed, 4)
        return self.classifier(pooled)

    def logits(self, input_ids: tf.Tensor, attention_mask: tf.Tensor, token_type_ids: tf.Tensor,
               dropout_seed: tf.Tensor | None = None) -> tf.Tensor:  # fmt: skip
        """Return a trained head's float32 logits; ``dropout_seed`` (int32 ``[2]``) = training."""
        hidden = self._hidden(input_ids, attention_mask, token_type_ids, dropout_seed)
        return self.head(hidden, dropout_seed)

    def weights(self) -> dict[str, np.ndarray]:
        """Return the current weights in the canonical names the constructor takes (float32)."""
        named: dict[str, Any] = {
            "embeddings/word": self.word,
            "embeddings/position": self.position,
            "embeddings/token_type": self.token_type,
            "embeddings_ln/gamma": self.embeddings_ln.gamma,
            "embeddings_ln/beta": self.embeddings_ln.beta,
        }
        for i, layer in enumerate(self.layers):
            for part in ("query", "key", "value", "attention_out", "intermediate", "output"):
                dense = getattr(layer, part)
                named[f"layer_{i}/{part}/kernel"], named[f"layer_{i}/{part}/bias"] = (
                    dense.kernel,
                    dense.bias,
                )
            for part in ("attention_ln", "output_ln"):
                norm = getattr(layer, part)
                named[f"layer_{i}/{part}/gamma"], named[f"layer_{i}/{part}/beta"] = (
                    norm.gamma,
                    norm.beta,
                )
        if self.task in ("classify", "tag") and not self.zero_shot:
            for part in ("pooler", "classifier") if self.task == "classify" else ("classifier",):
                dense = getattr(self, part)
                named[f"{part}/kernel"], named[f"{part}/bias"] = dense.kernel, dense.bias
        for k, student in enumerate(self.students):
            named.update({f"exit_{k}/{n}": v for n, v in student.named_variables().items()})
        return {k: tf.cast(v, tf.float32).numpy() for k, v in named.items()}

    def signatures(self, bucket_lens: Sequence[int] = ()) -> dict[str, Any]:
        """Return the signatures to save: ``serving_default`` and one ``seq_<L>`` per bucket.

        TF Serving's batching keeps one queue per signature (distinct feed/fetch tensors), so
        a fixed-length signature per bucket lets requests of one length batch together with
        no padding (TF Serving pads with each task's first element, which changes BERT's
        outputs). Each is its own traced function over the same variables.
        """
        out = {"serving_default": self.serve.get_concrete_function()}
        for seq_len in bucket_lens:
            fn = tf.function(self._serving_fn(), input_signature=self._specs(seq_len))
            out[signature_name(seq_len)] = fn.get_concrete_function()
        return out


def _layer_weights(weights: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    return _prefixed(weights, f"layer_{index}/")


def _prefixed(weights: Mapping[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}


def _mask_bias(attention_mask: tf.Tensor) -> tf.Tensor:
    """Return the additive attention bias ``[batch, 1, 1, seq]`` for a 0/1 mask."""
    bias = (1.0 - tf.cast(attention_mask, tf.float32)) * _MASK_NEG
    return bias[:, tf.newaxis, tf.newaxis, :]


def _checked_speed(speed: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
    """Return ``speed`` with one value per row, each clamped into [0, 1] and NaN read as 0.

    Per row, never per batch: TF Serving's batching merges rows of several callers into one call,
    and an assertion over the merged batch would fail every caller for one bad value. A row below
    0 or NaN runs the full model (0), above 1 exits as early as 1 allows. A wrong length still
    fails (INVALID_ARGUMENT; with batching on the batching layer refuses it per request first).
    """
    shape_ok = tf.debugging.assert_equal(
        tf.shape(speed)[0], batch, message="speed must have one value per row of input_ids"
    )
    with tf.control_dependencies([shape_ok]):
        clamped = tf.clip_by_value(speed, 0.0, 1.0)
        return tf.where(tf.math.is_nan(speed), tf.zeros_like(speed), clamped)


def run(fn: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Call a ``tf.function`` / signature with numpy inputs and return numpy outputs.

    The three token inputs go in as int32; ``speed``, when given, as float32.
    """
    feeds = {name: tf.constant(np.asarray(inputs[name], dtype=np.int32)) for name in INPUT_NAMES}
    if SPEED in inputs:
        feeds[SPEED] = tf.constant(np.asarray(inputs[SPEED], dtype=np.float32))
    out = fn(**feeds)
    if isinstance(out, dict):
        return {name: value.numpy() for name, value in out.items()}
    return {"output": out.numpy()}
