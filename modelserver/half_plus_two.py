"""Build the half_plus_two test model (y = 0.5·x + offset) as a TF2 SavedModel version directory.

Signatures:
  serving_default  x float32 [-1, 1]           -> y float32 [-1, 1]      (y = 0.5·x + offset)
  multi            a, b float32 [-1]           -> sum, diff float32 [-1]
  strings          s string [-1]               -> length int32 [-1], echo_bytes string [-1]
  slow             x float32 [-1, 1], seconds float32 [-1]  -> y, after busy-waiting max(seconds)
  regress_x_to_y   inputs string [-1] (tf.Example with float x) -> outputs float32 [-1]
  classify_x_to_y  inputs string [-1] (tf.Example with float x) -> scores float32 [-1, 1]
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def export_half_plus_two(base_path: str | Path, version: int = 1, offset: float = 2.0) -> Path:
    """Write ``<base_path>/<version>`` atomically (temp dir + rename) and return its path."""
    import tensorflow as tf

    class HalfPlusTwo(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = tf.Variable(0.5, dtype=tf.float32)
            self.b = tf.Variable(offset, dtype=tf.float32)

        @tf.function(input_signature=[tf.TensorSpec([None, 1], tf.float32, name="x")])
        def serve(self, x: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"y": self.a * x + self.b}

        @tf.function(
            input_signature=[
                tf.TensorSpec([None], tf.float32, name="a"),
                tf.TensorSpec([None], tf.float32, name="b"),
            ]
        )
        def multi(self, a: tf.Tensor, b: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"sum": a + b, "diff": a - b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="s")])
        def strings(self, s: tf.Tensor) -> dict[str, tf.Tensor]:
            return {"length": tf.strings.length(s), "echo_bytes": s}

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 1], tf.float32, name="x"),
                tf.TensorSpec([None], tf.float32, name="seconds"),
            ]
        )
        def slow(self, x: tf.Tensor, seconds: tf.Tensor) -> dict[str, tf.Tensor]:
            # A graph has no sleep op: spin on the clock (tests keep the delays short).
            wait = tf.cast(tf.reduce_max(seconds), tf.float64)
            start = tf.timestamp()
            tf.while_loop(lambda t: t - start < wait, lambda t: [tf.timestamp()], [start])
            return {"y": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def regress(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            x = _parse_x(inputs)
            return {"outputs": self.a * x + self.b}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
        def classify(self, inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            x = _parse_x(inputs)
            return {"scores": tf.expand_dims(self.a * x + self.b, 1)}

    def _parse_x(serialized: tf.Tensor) -> tf.Tensor:
        spec = {"x": tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0])}
        return tf.reshape(tf.io.parse_example(serialized, spec)["x"], [-1])

    module = HalfPlusTwo()
    base = Path(base_path)
    base.mkdir(parents=True, exist_ok=True)
    final = base / str(version)
    tmp = base / f".tmp-{version}"
    tf.saved_model.save(
        module,
        str(tmp),
        signatures={
            "serving_default": module.serve,
            "multi": module.multi,
            "strings": module.strings,
            "slow": module.slow,
            "regress_x_to_y": module.regress,
            "classify_x_to_y": module.classify,
        },
    )
    os.replace(tmp, final)
    return final
