"""The model fine-tuning trains: export's ``EncoderModule``, trainable, with a fresh head.

One model definition: the module export builds SavedModels from (export/model.py), built with
``trainable=True`` and the compute dtype of the Keras mixed-precision policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from export.checkpoint import Checkpoint

INIT_STD = 0.02  # BERT's initializer_range


def head_weights(
    ckpt: Checkpoint, labels: Sequence[str], seed: int, task: str = "classify"
) -> tuple[dict, list[str]]:
    """Return the weights to start from and the head's label order.

    A checkpoint whose head already has exactly these labels keeps it (and its order), as does a
    one-logit head trained on as one (``labels`` names it); otherwise
    the classifier (and, for a pooled ``classify`` head, a missing head dense and norm, as the
    checkpoint's architecture has them) starts from BERT's initialiser, labels in the order
    given (sorted, or O, B-X, I-X, … for tags). A ``tag`` head reads every token, not the
    pooled [CLS]: it has no pooler (BertForTokenClassification; ModernBERT's reads its dense).
    """
    from export.architectures import architecture

    arch = architecture(ckpt.config.model_type)
    # the head's dense (+ norm): a pooled classifier's, and ModernBERT's token classifier's
    dense_head = task != "tag" or arch.tag_head_dense
    weights = dict(ckpt.weights)
    if not dense_head:
        weights = {k: v for k, v in weights.items() if not k.startswith("pooler/")}
    if ckpt.has_head and sorted(ckpt.labels) == sorted(labels):
        return weights, list(ckpt.labels)
    if ckpt.has_head and len(ckpt.labels) == len(labels) == 1:
        # a cross-encoder's one logit is relevance whatever its name (hub ones say LABEL_0):
        # fine-tuning one further keeps its head
        return weights, list(labels)
    rng = np.random.default_rng(seed)
    hidden = ckpt.config.hidden_size
    if dense_head and "pooler/kernel" not in weights:
        weights["pooler/kernel"] = rng.normal(0, INIT_STD, (hidden, hidden)).astype(np.float32)
        if ckpt.config.head_bias:
            weights["pooler/bias"] = np.zeros(hidden, np.float32)
    if dense_head and arch.head_norm and "head_ln/gamma" not in weights:
        weights["head_ln/gamma"] = np.ones(hidden, np.float32)
        if ckpt.config.norm_bias:
            weights["head_ln/beta"] = np.zeros(hidden, np.float32)
    weights["classifier/kernel"] = rng.normal(0, INIT_STD, (hidden, len(labels))).astype(np.float32)
    weights["classifier/bias"] = np.zeros(len(labels), np.float32)
    return weights, list(labels)


def build_model(
    ckpt: Checkpoint, weights: dict[str, np.ndarray], compute_dtype: str, task: str = "classify"
) -> Any:
    """Return a trainable ``EncoderModule`` with a ``classify`` (pooled) or ``tag`` (per-token)
    head: float32 variables, matmuls in ``compute_dtype``."""
    import tensorflow as tf

    from export.model import EncoderModule

    return EncoderModule(
        ckpt.config, weights, task=task, pooling="cls", trainable=True,
        compute_dtype=tf.as_dtype(compute_dtype),
    )  # fmt: skip
