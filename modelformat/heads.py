"""What a model's head is and how its scores are read: the ``model.json`` keys every reader shares.

A version's ``model.json`` names its ``task``; export writes the rest, the gateway's
post-processing and finetune's output read it (docs/guides/heads.md):

- ``classify``: ``problem_type`` as Hugging Face names it (``single_label_classification``: one
  label per text, softmax; ``multi_label_classification``: independent sigmoids, every label
  over its threshold; ``regression``: raw scores), ``score_activation`` (``softmax`` /
  ``sigmoid`` / ``none``, the rule of transformers' text-classification pipeline), ``thresholds``
  per label for multi-label heads, and ``text_pair`` for sentence-pair models (cross-encoders,
  NLI): their inputs are two segments, ``token_type_ids`` 1 on the second.
- ``tag``: token classification (NER); logits ``[batch, seq, labels]``, ``label_scheme`` ``BIO``.
- ``embed``: sentence vectors.
No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

TASKS = ("classify", "embed", "tag")
SINGLE = "single_label_classification"
MULTI = "multi_label_classification"
REGRESSION = "regression"
PROBLEM_TYPES = (SINGLE, MULTI, REGRESSION)
ACTIVATIONS = ("softmax", "sigmoid", "none")
DEFAULT_THRESHOLD = 0.5


def score_activation(problem_type: str | None, num_labels: int, given: str | None = None) -> str:
    """Return how a classifier's logits become scores: transformers' text-classification rule
    (regression: none; multi-label or one logit: sigmoid; else softmax) unless ``given``."""
    if given:
        if given not in ACTIVATIONS:
            raise ValueError(f"score_activation must be one of {list(ACTIVATIONS)}, got {given!r}")
        return given
    if problem_type == REGRESSION:
        return "none"
    if problem_type == MULTI or num_labels == 1:
        return "sigmoid"
    return "softmax"


@dataclass(frozen=True)
class Head:
    """A version's head as model.json describes it (older exports: single-label or embed)."""

    task: str = "classify"
    problem_type: str = SINGLE
    activation: str = "softmax"
    text_pair: bool = False
    thresholds: Mapping[str, float] = field(default_factory=dict)
    label_scheme: str = ""

    @property
    def multi_label(self) -> bool:
        """Whether every label over its threshold is an answer (independent sigmoids)."""
        return self.task == "classify" and self.problem_type == MULTI

    def threshold(self, label: str) -> float:
        """Return ``label``'s decision threshold (multi-label and one-logit sigmoid heads)."""
        return float(self.thresholds.get(label, DEFAULT_THRESHOLD))

    def describe(self) -> str:
        """Return the head in a few words, for error messages ("a sentence-pair classifier")."""
        if self.task == "embed":
            return "an embedding model"
        if self.task == "tag":
            return "a token-classification (tag) model"
        kind = {SINGLE: "classifier", MULTI: "multi-label classifier", REGRESSION: "scorer"}
        name = kind.get(self.problem_type, "classifier")
        return f"a sentence-pair {name}" if self.text_pair else f"a single-text {name}"

    def to_info(self) -> dict[str, Any]:
        """Return the model.json keys of this head."""
        info: dict[str, Any] = {"task": self.task}
        if self.task == "classify":
            info.update(problem_type=self.problem_type, score_activation=self.activation,
                        text_pair=self.text_pair)  # fmt: skip
            if self.thresholds:
                info["thresholds"] = dict(self.thresholds)
        if self.task == "tag":
            info["label_scheme"] = self.label_scheme or "BIO"
        return info


def head_from_info(info: Mapping[str, Any]) -> Head:
    """Return the head a model.json describes; raise ValueError for values no reader knows."""
    task = str(info.get("task", "classify"))
    if task not in TASKS:
        raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
    problem_type = str(info.get("problem_type") or SINGLE)
    if problem_type not in PROBLEM_TYPES:
        raise ValueError(f"problem_type must be one of {list(PROBLEM_TYPES)}, got {problem_type!r}")
    labels = info.get("labels") or []
    activation = score_activation(problem_type, len(labels), info.get("score_activation"))
    thresholds = info.get("thresholds") or {}
    if not isinstance(thresholds, Mapping) or not all(
        isinstance(v, int | float) for v in thresholds.values()
    ):
        raise ValueError("thresholds must map labels to numbers")
    return Head(
        task=task, problem_type=problem_type, activation=activation,
        text_pair=bool(info.get("text_pair", False)),
        thresholds={str(k): float(v) for k, v in thresholds.items()},
        label_scheme=str(info.get("label_scheme", "BIO" if task == "tag" else "")),
    )  # fmt: skip


def bio_types(labels: Sequence[str]) -> list[str]:
    """Return the entity types of a BIO label set (``B-ORDER``, ``I-ORDER`` → ``ORDER``), sorted."""
    return sorted({label.split("-", 1)[1] for label in labels if label[:2] in ("B-", "I-")})
