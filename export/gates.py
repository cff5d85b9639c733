"""The FP16/BF16 conversion gate: what a converted model may change, one rule per head (numpy).

A converted version is measured against the FP32 model on a probe batch and published only
within ``Tolerance``. Each head is held to what its readers answer (export/README.md says why):

- ``embed``: the cosine to FP32 (``min_cosine``);
- single-label ``classify`` (softmax): every *decisive* row (FP32 top-two probabilities at least
  ``DECISIVE_GAP`` apart) keeps its argmax, and ``|Δprobability|`` is bounded (``|Δlogit| /
  scale`` for a zero-shot head, whose logits are ``scale · cos``);
- sigmoid ``classify`` (multi-label, one logit): every *decisive* per-label decision ``p ≥
  threshold`` (FP32 ``p`` at least ``DECISION_MARGIN`` from its threshold) stays the same, and
  ``|Δprobability|`` is bounded;
- ``regression`` (raw scores): ``max |Δscore| / max(1, max |score|)`` is bounded;
- ``tag``: the BIO entities decoded from the argmax over real tokens (attention mask 1) are the
  same, except entities that touch a token whose FP32 top-two probabilities are closer than
  ``DECISIVE_GAP`` (a tie at 16-bit precision), and ``|Δprobability|`` over real tokens is bounded
  (``max_token_prob_diff``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelformat.heads import Head

# Rows whose FP32 top-two probabilities are closer than this are ties at 16-bit precision: their
# argmax may flip without anything being wrong. Every other row must keep its argmax.
DECISIVE_GAP = 0.1
# A sigmoid decision whose FP32 probability is closer than this to its threshold is a tie.
DECISION_MARGIN = 0.01
# Figures for which a lower value is worse (agreements, cosines); for the rest higher is worse.
LOWER_IS_WORSE = (
    "argmax_agreement", "decisive_agreement", "min_cosine", "decision_agreement",
    "decisive_decision_agreement", "entity_agreement", "decisive_entity_agreement",
    "token_agreement",
)  # fmt: skip


@dataclass(frozen=True)
class Tolerance:
    """How far a converted model may drift from FP32 on the probe batch and still be published."""

    max_prob_diff: float = 1e-2  # trained heads: |Δprobability| (softmax, sigmoid, tag)
    max_cos_diff: float = 1e-2  # zero-shot heads: |Δlogit| / scale, the cosine-space error
    min_cosine: float = 0.999  # embeddings
    max_score_diff: float = 1e-2  # regression: |Δscore| / max(1, max |score|)
    # tag heads: |Δprobability| over every real token of the probe (~30x more values than a
    # classifier's rows, so a larger maximum for the same precision; README has the figures)
    max_token_prob_diff: float = 5e-2


def measure(
    expected: dict[str, np.ndarray],
    got: dict[str, np.ndarray],
    zero_shot_scale: float | None = None,
    *,
    head: Head | None = None,
    labels: Sequence[str] = (),
    attention_mask: np.ndarray | None = None,
) -> dict[str, Any]:
    """Return the differences between FP32 outputs ``expected`` and ``got`` as plain floats.

    ``head`` (default: a single-label classifier or an embedder, by the outputs) picks the
    figures; ``labels`` and ``attention_mask`` (the probe's) are needed for sigmoid heads'
    thresholds and for tag heads' real tokens. See the module doc for each head's figures.
    """
    if "probabilities" not in expected:
        return _embedding_figures(expected["embedding"], got["embedding"])
    head = head or Head()
    if head.task == "tag":
        shape = expected["logits"].shape[:2]
        mask = np.ones(shape, bool) if attention_mask is None else np.asarray(attention_mask, bool)
        return _tag_figures(expected, got, mask, labels)
    if head.activation == "none":
        scores, other = expected["probabilities"], got["probabilities"]
        scale = max(1.0, float(np.abs(scores).max()))
        return {
            "max_score_diff": float(np.abs(scores - other).max()) / scale,
            "max_abs_logit_diff": float(np.abs(expected["logits"] - got["logits"]).max()),
        }
    if head.activation == "sigmoid":
        return _sigmoid_figures(expected, got, head, labels)
    return _softmax_figures(expected, got, zero_shot_scale)


def _softmax_figures(
    expected: dict[str, np.ndarray], got: dict[str, np.ndarray], zero_shot_scale: float | None
) -> dict[str, Any]:
    probs = expected["probabilities"]
    logit_diff = float(np.abs(expected["logits"] - got["logits"]).max())
    agree = probs.argmax(-1) == got["probabilities"].argmax(-1)
    decisive = _decisive(probs)
    figures = {
        "max_abs_prob_diff": float(np.abs(probs - got["probabilities"]).max()),
        "max_abs_logit_diff": logit_diff,
        "argmax_agreement": float(agree.mean()),
        "decisive_agreement": float(agree[decisive].mean()) if decisive.any() else 1.0,
    }
    if zero_shot_scale:
        figures["max_cos_diff"] = logit_diff / zero_shot_scale
    return figures


def _decisive(probs: np.ndarray) -> np.ndarray:
    """Return where the top-two probabilities (last axis) are at least DECISIVE_GAP apart."""
    top_two = np.sort(probs, axis=-1)[..., -2:]
    return np.asarray((top_two[..., -1] - top_two[..., 0]) >= DECISIVE_GAP)


def _sigmoid_figures(
    expected: dict[str, np.ndarray], got: dict[str, np.ndarray], head: Head, labels: Sequence[str]
) -> dict[str, Any]:
    probs, other = expected["probabilities"], got["probabilities"]
    names = list(labels) or [str(i) for i in range(probs.shape[-1])]
    thresholds = np.array([head.threshold(name) for name in names], np.float32)
    same = (probs >= thresholds) == (other >= thresholds)
    decisive = np.abs(probs - thresholds) >= DECISION_MARGIN
    return {
        "max_abs_prob_diff": float(np.abs(probs - other).max()),
        "max_abs_logit_diff": float(np.abs(expected["logits"] - got["logits"]).max()),
        "decision_agreement": float(same.mean()),
        "decisive_decision_agreement": float(same[decisive].mean()) if decisive.any() else 1.0,
    }


def bio_entities(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """Return the entities ``(start, end_exclusive, type)`` of a BIO tag sequence.

    ``B-X`` starts an entity; ``I-X`` continues an entity of type X and otherwise starts one (the
    lenient reading of seqeval and transformers' pipeline); ``O`` ends one.
    """
    out: list[tuple[int, int, str]] = []
    start, kind = -1, ""
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, name = tag.partition("-")
        continues = prefix == "I" and name == kind and start >= 0
        if start >= 0 and not continues:
            out.append((start, i, kind))
            start, kind = -1, ""
        if prefix in ("B", "I") and not continues:
            start, kind = i, name
    return out


def _tag_figures(
    expected: dict[str, np.ndarray], got: dict[str, np.ndarray], mask: np.ndarray,
    labels: Sequence[str],
) -> dict[str, Any]:  # fmt: skip
    probs, other = expected["probabilities"], got["probabilities"]
    names = np.array(list(labels) or [f"B-{i}" for i in range(probs.shape[-1])], dtype=object)
    a, b = probs.argmax(-1), other.argmax(-1)
    decisive = _decisive(probs)
    ours: set[tuple[int, int, int, str]] = set()
    theirs: set[tuple[int, int, int, str]] = set()
    ties: set[tuple[int, int, int, str]] = set()
    for row in range(probs.shape[0]):
        real = np.flatnonzero(mask[row])  # positions of real tokens, in order
        undecided = {int(k) for k, pos in enumerate(real) if not decisive[row, pos]}
        for found, argmax in ((ours, a), (theirs, b)):
            for start, end, kind in bio_entities(list(names[argmax[row, real]])):
                entity = (row, start, end, kind)
                found.add(entity)
                # its tokens and its neighbours decide an entity (a neighbour flipped to I-X
                # would extend it): a tie at any of them may change it
                if undecided & set(range(start - 1, end + 1)):
                    ties.add(entity)
    union, common = ours | theirs, ours & theirs
    decided = union - ties
    return {
        "max_token_prob_diff": float(np.abs(probs - other)[mask].max()) if mask.any() else 0.0,
        "max_abs_logit_diff": float(np.abs(expected["logits"] - got["logits"])[mask].max())
        if mask.any() else 0.0,
        "token_agreement": float((a == b)[mask].mean()) if mask.any() else 1.0,
        "entity_agreement": len(common) / len(union) if union else 1.0,
        "decisive_entity_agreement": len(common & decided) / len(decided) if decided else 1.0,
        "entities": len(ours),
    }  # fmt: skip


def _embedding_figures(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    cosine = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                          1e-12)  # fmt: skip
    return {"min_cosine": float(cosine.min()), "max_abs_diff": float(np.abs(a - b).max())}


def worse(key: str, a: Any, b: Any) -> Any:
    """Return the worse of two measurements of ``key`` (minima for agreement/cosine)."""
    return min(a, b) if key in LOWER_IS_WORSE else max(a, b)


def gate_metric(figures: dict[str, Any]) -> str:
    """Return the name of the head-specific figure the gate applies to these measurements."""
    for key in ("decisive_entity_agreement", "decisive_decision_agreement", "max_score_diff",
                "max_cos_diff"):  # fmt: skip
        if key in figures:
            return key
    return "max_abs_prob_diff" if "max_abs_prob_diff" in figures else "min_cosine"


def within(figures: dict[str, Any], tolerance: Tolerance) -> bool:
    """Return True when measured figures are inside ``tolerance`` (the rule of their head)."""
    metric = gate_metric(figures)
    if metric == "min_cosine":
        return bool(figures["min_cosine"] >= tolerance.min_cosine)
    if metric == "max_score_diff":
        return bool(figures["max_score_diff"] <= tolerance.max_score_diff)
    for agreement in ("decisive_agreement", "decisive_decision_agreement",
                      "decisive_entity_agreement"):  # fmt: skip
        if figures.get(agreement, 1.0) < 1.0:
            return False
    if metric == "max_cos_diff":
        return bool(figures["max_cos_diff"] <= tolerance.max_cos_diff)
    if metric == "decisive_entity_agreement":
        return bool(figures["max_token_prob_diff"] <= tolerance.max_token_prob_diff)
    return bool(figures["max_abs_prob_diff"] <= tolerance.max_prob_diff)
