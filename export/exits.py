"""Early exits: the students after layers 1..L-1, the one exit rule, and the two ways to serve it.

After layer i < L each row still running asks student i (pooled hidden state → dense tanh →
classifier); FastBERT's rule (``leaves``): a row whose normalised entropy is below its threshold
takes the student's logits and leaves. The threshold is the row's ``speed`` mapped through the
checkpoint's calibration (``speed_thresholds``; export/calibration.py), or the speed itself for a
checkpoint without one. After the last layer every row still running takes the
trained head's logits. ``serve_compacted`` gathers the rows left after each layer so the next
layers run on them only; ``serve_masked`` (the baseline the benchmark compares against) keeps
every row in the batch until the last one has exited. Both ask ``decide`` at every layer, so the
rule is written once and the two give the same answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from export.calibration import KNOTS
from export.layers import Dense, mask_bias, pool


def normalized_entropy(logits: tf.Tensor) -> tf.Tensor:
    """Return FastBERT's uncertainty per row: ``-Σ p log p / log N`` in [0, 1] (float32)."""
    logits = tf.cast(logits, tf.float32)
    log_p = tf.nn.log_softmax(logits, axis=-1)
    entropy = -tf.reduce_sum(tf.exp(log_p) * log_p, axis=-1)
    return entropy / math.log(max(int(logits.shape[-1]), 2))


def leaves(logits: tf.Tensor, threshold: tf.Tensor) -> tf.Tensor:
    """Return, per row, whether a student's ``logits`` are sure enough to exit at ``threshold``.

    The exit rule: normalised entropy strictly below the row's threshold, so 0 never exits.
    """
    return normalized_entropy(logits) < threshold


def speed_thresholds(speed: tf.Tensor, thresholds: Sequence[float] | None) -> tf.Tensor:
    """Return each row's entropy threshold for its (checked) ``speed``; identity without a table.

    ``thresholds``: the calibration's 21 knots (speed k/20), interpolated linearly between them
    as ``lo·(1-f) + hi·f`` so a knot's speed gives its threshold exactly: speed 0 gives 0 (never
    exits), speed 1 the last knot. export/calibration.py's ``threshold_at`` is the numpy twin.
    """
    if thresholds is None:
        return speed
    table = tf.constant(np.asarray(thresholds, np.float32))
    scaled = speed * float(KNOTS - 1)
    index = tf.minimum(tf.cast(tf.floor(scaled), tf.int32), KNOTS - 2)
    fraction = scaled - tf.cast(index, tf.float32)
    return tf.gather(table, index) * (1.0 - fraction) + tf.gather(table, index + 1) * fraction


class Student(tf.Module):
    """An early-exit classifier after one encoder layer: pooled → dense tanh → classifier."""

    def __init__(self, w: Mapping[str, np.ndarray], dtype: tf.DType, name: str, *,
                 pooling: str, trainable: bool = False,
                 compute_dtype: tf.DType | None = None) -> None:  # fmt: skip
        super().__init__(name=name)
        self.dense = Dense(w["dense/kernel"], w["dense/bias"], dtype, "dense",
                           trainable=trainable, compute_dtype=compute_dtype)  # fmt: skip
        self.classifier = Dense(w["classifier/kernel"], w["classifier/bias"], dtype,
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


def checked_speed(speed: tf.Tensor, batch: tf.Tensor) -> tf.Tensor:
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


def decide(model: Any, i: int, hidden: tf.Tensor, attention_mask: tf.Tensor,
           threshold: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor | None]:  # fmt: skip
    """Return the logits after layer ``i`` and which rows leave there (None: every row left).

    ``model`` is the EncoderModule (its ``students``, ``exit_pooling``, ``head`` and ``layers``).
    """
    if i == len(model.layers) - 1:
        return model.head(hidden, attention_mask=attention_mask), None
    logits = model.students[i](pool(hidden, attention_mask, model.exit_pooling))
    return logits, leaves(logits, threshold)


def serve_compacted(model: Any, x: tf.Tensor, attention_mask: tf.Tensor, threshold: tf.Tensor,
                    batch: tf.Tensor, seq: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:  # fmt: skip
    """Return (logits, exit_layer) with exited rows leaving the batch after each layer.

    ``x`` is the embeddings ``[batch * seq, hidden]``. The rows left are gathered and the next
    layers run on them only; the exited rows' results are scattered back into the input order.
    Work that cannot change an answer is skipped with a ``tf.cond``: the later layers once no row
    is left (on an empty batch they would still cost each op's dispatch), a student when no row's
    threshold allows leaving (speed 0), and the gather when no row left at that layer.
    """
    rows, mask = tf.range(batch), attention_mask
    positions = model.positions(seq)  # row-independent: computed once, read by every layer
    done_rows, done_logits, done_layers = [], [], []
    last = len(model.layers) - 1
    labels = int(model.classifier.bias.shape[0])
    for i, layer in enumerate(model.layers):
        state = (rows, mask, threshold, x)

        def step(i: int = i, layer: Any = layer, state: tuple[tf.Tensor, ...] = state
                 ) -> tuple[tf.Tensor, ...]:  # fmt: skip
            rows, mask, threshold, x = state
            left = tf.shape(rows)[0]
            x = layer(x, mask_bias(mask), left, seq, None, positions)
            # explicit sizes: once every row has exited the batch is empty and -1 is ambiguous
            hidden = tf.reshape(x, [left, seq, model.hidden_size])
            if i == last:  # every row still here takes the trained head's logits
                return (rows, model.head(hidden, attention_mask=mask), *state)

            def ask() -> tuple[tf.Tensor, tf.Tensor]:
                return decide(model, i, hidden, mask, threshold)  # type: ignore[return-value]

            def stay_all() -> tuple[tf.Tensor, tf.Tensor]:  # every threshold 0 (speed 0)
                return tf.zeros([left, labels], tf.float32), tf.zeros([left], tf.bool)

            # no row may leave: the student is not asked
            logits, leave = tf.cond(tf.reduce_any(threshold > 0.0), ask, stay_all)
            out = (tf.boolean_mask(rows, leave), tf.boolean_mask(logits, leave))  # float32 logits

            def gather() -> tuple[tf.Tensor, ...]:  # the rows left: the next layer runs on them
                stay = tf.logical_not(leave)
                kept = [tf.boolean_mask(t, stay) for t in (rows, mask, threshold)]
                return (*kept, tf.reshape(tf.boolean_mask(hidden, stay), [-1, model.hidden_size]))

            def keep() -> tuple[tf.Tensor, ...]:  # nobody left: no copy
                return rows, mask, threshold, x

            return (*out, *tf.cond(tf.reduce_any(leave), gather, keep))

        def skip(state: tuple[tf.Tensor, ...] = state) -> tuple[tf.Tensor, ...]:
            return (state[0], tf.zeros([0, labels], tf.float32), *state)

        if i == 0:
            leaving, logits, *state_left = step()
        else:  # every row gone: the empty batch needs none of this layer's ops
            leaving, logits, *state_left = tf.cond(tf.size(rows) > 0, step, skip)
        rows, mask, threshold, x = state_left
        done_rows.append(leaving)
        done_logits.append(logits)
        done_layers.append(tf.fill(tf.shape(leaving), i + 1))
    where = tf.concat(done_rows, axis=0)[:, tf.newaxis]
    logits = tf.scatter_nd(where, tf.concat(done_logits, axis=0), [batch, labels])
    exit_layer = tf.scatter_nd(where, tf.concat(done_layers, axis=0), [batch])
    return logits, exit_layer


def serve_masked(model: Any, x: tf.Tensor, attention_mask: tf.Tensor, threshold: tf.Tensor,
                 batch: tf.Tensor, seq: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:  # fmt: skip
    """Return (logits, exit_layer) with every row kept until the batch's last row has exited."""
    bias = mask_bias(attention_mask)
    positions = model.positions(seq)
    running = tf.ones([batch], tf.bool)
    logits = tf.zeros([batch, model.classifier.bias.shape[0]], tf.float32)
    exit_layer = tf.zeros([batch], tf.int32)
    for i, layer in enumerate(model.layers):

        def step(x=x, running=running, logits=logits, exit_layer=exit_layer,
                 i=i, layer=layer) -> tuple[tf.Tensor, ...]:  # fmt: skip
            x = layer(x, bias, batch, seq, None, positions)
            hidden = tf.reshape(x, [batch, seq, -1])
            out, leave = decide(model, i, hidden, attention_mask, threshold)
            leave = running if leave is None else tf.logical_and(running, leave)
            logits = tf.where(leave[:, tf.newaxis], out, logits)
            exit_layer = tf.where(leave, i + 1, exit_layer)
            return x, tf.logical_and(running, tf.logical_not(leave)), logits, exit_layer

        def skip(x=x, running=running, logits=logits,
                 exit_layer=exit_layer) -> tuple[tf.Tensor, ...]:  # fmt: skip
            return x, running, logits, exit_layer

        x, running, logits, exit_layer = tf.cond(tf.reduce_any(running), step, skip)
    return logits, exit_layer
