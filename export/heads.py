"""The heads on top of the encoder, in TensorFlow: scores from logits, per-token logits, outputs.

What a head *is* (task, problem type, activation, thresholds) is modelformat/heads.py, shared with
the gateway and finetune; this module is the graph side of it:

- ``classify``: ``logits [batch, labels]`` and ``probabilities`` = the head's score activation of
  the logits (softmax for single-label, sigmoid for multi-label and one-logit heads, identity for
  regression: transformers' text-classification rule, ``score_activation``);
- ``tag``: ``logits`` and ``probabilities`` (softmax over the labels) ``[batch, seq, labels]``,
  a classifier over every token's last hidden state (``BertForTokenClassification``);
- ``embed``: ``embedding [batch, dim]``.

``resolve_head`` reads the head a checkpoint's config.json describes and checks it against the
task asked for. TensorFlow is imported only by the graph functions (build imports it lazily).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from export.errors import ExportError
from modelformat.heads import ACTIVATIONS, MULTI, PROBLEM_TYPES, SINGLE, Head, score_activation

if TYPE_CHECKING:
    import tensorflow as tf


def output_names(task: str, early_exit: bool = False) -> list[str]:
    """Return the signature's output names for ``task`` (``exit_layer`` with early exits)."""
    if task == "embed":
        return ["embedding"]
    return ["logits", "probabilities", "exit_layer"] if early_exit else ["logits", "probabilities"]


def scores(logits: tf.Tensor, activation: str) -> tf.Tensor:
    """Return float32 scores of ``logits`` under ``activation`` (softmax over the last axis)."""
    import tensorflow as tf

    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {activation!r}")
    if activation == "softmax":
        return tf.nn.softmax(logits, axis=-1)
    if activation == "sigmoid":
        return tf.math.sigmoid(logits)
    return tf.identity(logits)  # regression: the raw score is the answer


def token_logits(classifier: tf.Module, hidden: tf.Tensor) -> tf.Tensor:
    """Return per-token float32 logits ``[batch, seq, labels]`` of ``hidden`` ``[batch, seq, H]``.

    ``classifier`` is a dense layer over one vector; the tokens are flattened into its batch so
    that one matmul serves every position (padding positions too: the reader ignores them).
    """
    import tensorflow as tf

    batch, seq = tf.shape(hidden)[0], tf.shape(hidden)[1]
    flat = classifier(tf.reshape(hidden, [batch * seq, tf.shape(hidden)[-1]]))
    # explicit sizes: an empty batch makes -1 ambiguous
    return tf.reshape(flat, [batch, seq, tf.shape(flat)[-1]])


def head_outputs(task: str, logits: tf.Tensor, activation: str) -> dict[str, tf.Tensor]:
    """Return the signature outputs of a classify or tag head for its ``logits``."""
    import tensorflow as tf

    if task == "tag":
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}
    return {"logits": logits, "probabilities": scores(logits, activation)}


# config.json's ``architectures`` entry of each task's Hugging Face class (BERT's; every
# architecture's classes end the same way: RobertaForTokenClassification, ...)
ARCHITECTURES = {"classify": "BertForSequenceClassification", "tag": "BertForTokenClassification"}
_SUFFIXES = {"classify": "ForSequenceClassification", "tag": "ForTokenClassification"}


def resolve_head(
    task: str,
    head_config: Mapping[str, Any],
    labels: Sequence[str],
    *,
    problem_type: str | None = None,
    text_pair: bool | None = None,
    zero_shot: bool = False,
) -> Head:
    """Return the head to export for ``task`` from a checkpoint's config.json head keys.

    ``problem_type`` / ``text_pair`` given here win over config.json (a hub cross-encoder's
    config.json says neither). Raises ExportError for a checkpoint of another head (a
    ``BertForTokenClassification`` exported as classify, or the reverse), an unknown problem
    type, thresholds naming unknown labels or outside [0, 1], and tag labels that are not BIO.
    """
    where = "config.json"
    architectures = [str(a) for a in head_config.get("architectures") or []]
    for other, suffix in _SUFFIXES.items():
        arch = next((a for a in architectures if a.endswith(suffix)), None)
        if other != task and task != "embed" and arch is not None:
            raise ExportError(
                f"{where}: the checkpoint is a {arch} ({other} head), not a {task} model; "
                f"export it with --task {other}"
            )
    if task == "embed":
        return Head(task="embed", activation="none")
    if task == "tag":
        _check_bio(labels, where)
        return Head(task="tag", problem_type=SINGLE, activation="softmax", label_scheme="BIO")
    kind = problem_type or head_config.get("problem_type") or SINGLE
    if kind not in PROBLEM_TYPES:
        raise ExportError(
            f"{where}: problem_type must be one of {list(PROBLEM_TYPES)}, got {kind!r}"
        )
    if zero_shot and kind != SINGLE:
        raise ExportError(f"a zero-shot head is single-label; problem_type {kind!r} does not apply")
    pair = bool(head_config.get("text_pair", False)) if text_pair is None else text_pair
    # a zero-shot head's logits are scale * cosine over its label prompts: a softmax
    activation = "softmax" if zero_shot else score_activation(kind, len(labels))
    return Head(
        task="classify", problem_type=kind, activation=activation,
        text_pair=pair, thresholds=_thresholds(kind, head_config.get("thresholds"), labels, where),
    )  # fmt: skip


def _thresholds(kind: str, given: Any, labels: Sequence[str], where: str) -> dict[str, float]:
    """Return every label's threshold for a multi-label head (0.5 where config.json has none)."""
    given = given or {}
    if not isinstance(given, Mapping):
        raise ExportError(f"{where}: thresholds must map labels to numbers, got {given!r}")
    unknown = sorted(set(given) - set(labels))
    if unknown:
        raise ExportError(
            f"{where}: thresholds for unknown labels {unknown} (labels {list(labels)})"
        )
    out: dict[str, float] = {}
    for label, value in given.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise ExportError(f"{where}: threshold of {label!r} must be a number, got {value!r}")
        out[str(label)] = float(value)
    if kind != MULTI:
        return out
    if any(not 0.0 <= v <= 1.0 for v in out.values()):
        raise ExportError(f"{where}: multi-label thresholds are probabilities in [0, 1], got {out}")
    # every label explicit, so that a reader never has to know the default
    return {label: out.get(label, 0.5) for label in labels}


def _check_bio(labels: Sequence[str], where: str) -> None:
    """Raise ExportError unless ``labels`` are a BIO label set (``O``, ``B-X``, ``I-X``)."""
    bad = [label for label in labels if label != "O" and label[:2] not in ("B-", "I-")]
    if bad or not labels:
        raise ExportError(
            f"{where}: a tag model's labels must be BIO (O, B-<TYPE>, I-<TYPE>), "
            f"got {bad or labels}"
        )
