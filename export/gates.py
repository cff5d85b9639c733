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
- SPLADE (``sparse_indices`` / ``sparse_values``, the top-k of a pooled vocabulary vector):
  every *decisive* FP32 entry (its value at least ``SPARSE_MARGIN`` × the row's largest, floor 1,
  above the row's k-th value, so 16-bit rounding cannot push it out of the top k) is in the
  converted top k, the top-k index overlap (shared non-zero indices / FP32's non-zero ones, the
  worst row) is at least ``min_topk_overlap``, and the values of the shared indices differ by at
  most ``max_sparse_value_diff`` × the row's largest value (floor 1);
- ``tag``: the BIO entities decoded from the argmax over real tokens (attention mask 1) are the
  same, except entities that touch a token whose FP32 top-two probabilities are closer than
  ``DECISIVE_GAP`` (a tie at 16-bit precision), and ``|Δprobability|`` over real tokens is bounded
  (``max_token_prob_diff``).

An early-exit export is also gated at the speeds of ``exit_gate_speeds`` (its default speed, and
1), where the students answer and the exit decisions matter: every row whose FP32 exit is not a
tie (no FP32 normalised entropy up to its exit within ``EXIT_MARGIN`` of the entropy threshold
the speed maps to, export/calibration.py) leaves at the
same layer, and the rows that leave at the same layer are held to the softmax rule above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from export.calibration import speed_for, threshold_at
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
    "token_agreement", "exit_agreement", "decisive_exit_agreement", "topk_overlap",
    "decisive_topk_agreement",
)  # fmt: skip
# The speed an early-exit export is gated at when its default is 0 (which never exits): the speed
# docs/guides/early-exits.md quotes (the fastest within a point of the full model on the demo).
EXIT_GATE_SPEED = 0.8
# A row is an exit tie when an FP32 normalised entropy at a layer up to its exit is closer than
# this to the exit threshold (its speed mapped through the checkpoint's calibration): 16-bit
# rounding may move its exit. A |Δp| of 0.01 (the default bound) moves a 2-label entropy by
# 0.040 at 0.3, 0.029 at 0.5, 0.016 at 0.8 (README).
EXIT_MARGIN = 0.05
# A SPLADE entry whose FP32 value is closer than this (× the row's largest value, floor 1) to
# the row's k-th value may leave the top k at 16-bit precision; every other entry must stay.
SPARSE_MARGIN = 0.05


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
    # SPLADE: the top-k index overlap with FP32 (worst row) and |Δvalue| / max(1, row's largest)
    min_topk_overlap: float = 0.9
    max_sparse_value_diff: float = 5e-2


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
    if "sparse_indices" in expected:
        return sparse_figures(expected, got)
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


def sparse_figures(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> dict[str, Any]:
    """Return how a converted SPLADE top-k ``got`` differs from FP32's ``expected`` (module doc):
    ``topk_overlap``, ``decisive_topk_agreement``, ``max_sparse_value_diff``, and how many
    entries were decisive."""
    overlap, decisive_kept, decisive_all, worst = 1.0, 0, 0, 0.0
    rows = zip(expected["sparse_indices"], expected["sparse_values"], got["sparse_indices"],
               got["sparse_values"], strict=True)  # fmt: skip
    for ids, values, other_ids, other_values in rows:
        mine = {int(i): float(v) for i, v in zip(ids, values, strict=True) if v > 0}
        theirs = {int(i): float(v) for i, v in zip(other_ids, other_values, strict=True) if v > 0}
        scale = max(1.0, max(mine.values(), default=0.0))
        shared = mine.keys() & theirs.keys()
        if mine:
            overlap = min(overlap, len(shared) / len(mine))
        kth = float(values[-1])  # the k-th value (0 where the row has fewer non-zero entries)
        decisive = [i for i, v in mine.items() if v - kth >= SPARSE_MARGIN * scale]
        decisive_all += len(decisive)
        decisive_kept += sum(i in theirs for i in decisive)
        diffs = [abs(mine[i] - theirs[i]) / scale for i in shared]
        worst = max(worst, *diffs) if diffs else worst
    return {
        "topk_overlap": overlap,
        "decisive_topk_agreement": decisive_kept / decisive_all if decisive_all else 1.0,
        "max_sparse_value_diff": worst,
        "decisive_entries": decisive_all,
    }


def _embedding_figures(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    cosine = (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                          1e-12)  # fmt: skip
    return {"min_cosine": float(cosine.min()), "max_abs_diff": float(np.abs(a - b).max())}


def worse(key: str, a: Any, b: Any) -> Any:
    """Return the worse of two measurements of ``key`` (minima for agreement/cosine)."""
    return min(a, b) if key in LOWER_IS_WORSE else max(a, b)


def gate_metric(figures: dict[str, Any]) -> str:
    """Return the name of the head-specific figure the gate applies to these measurements."""
    for key in ("topk_overlap", "decisive_entity_agreement", "decisive_decision_agreement",
                "max_score_diff", "max_cos_diff"):  # fmt: skip
        if key in figures:
            return key
    return "max_abs_prob_diff" if "max_abs_prob_diff" in figures else "min_cosine"


def within(figures: dict[str, Any], tolerance: Tolerance) -> bool:
    """Return True when measured figures are inside ``tolerance`` (the rule of their head)."""
    metric = gate_metric(figures)
    if metric == "topk_overlap":
        return bool(
            figures["decisive_topk_agreement"] >= 1.0
            and figures["topk_overlap"] >= tolerance.min_topk_overlap
            and figures["max_sparse_value_diff"] <= tolerance.max_sparse_value_diff
        )
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


Outputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class ExitProbe:
    """The probe at one ``speed``: its feeds, the FP32 outputs, and which rows' exits are steady."""

    speed: float
    feeds: Outputs
    expected: Outputs
    steady: np.ndarray  # bool [rows]: the FP32 exit layer is the same at threshold ± EXIT_MARGIN


def exit_gate_speeds(default_speed: float) -> tuple[float, ...]:
    """Return the speeds an early-exit conversion is gated at, ascending.

    The model's default speed (``EXIT_GATE_SPEED`` when it is 0, which never exits) is what the
    gateway sends; 1 makes nearly every row leave after layer 1, so the first student is compared
    on the whole probe even when the probe's random rows are too unsure to leave at the default.
    """
    return tuple(sorted({float(default_speed) if default_speed > 0 else EXIT_GATE_SPEED, 1.0}))


def exit_probes(
    reference: Callable[[Outputs], Outputs],
    probe: Outputs,
    speeds: Sequence[float],
    thresholds: Sequence[float] | None = None,
) -> list[ExitProbe]:
    """Return the FP32 ``reference``'s answers to ``probe`` at each speed, with its exit ties.

    The exit rule is ``entropy < threshold`` at each layer (export/exits.py), the threshold being
    the speed mapped through the calibration's ``thresholds`` (None: the speed itself). So a
    row's exit layer is the same at the speeds whose thresholds are ``threshold ± EXIT_MARGIN``
    exactly when none of its entropies up to that exit lies within the margin of the threshold:
    such a row is steady.
    """

    def at(speed: float) -> Outputs:
        rows = len(probe["input_ids"])
        return {**probe, "speed": np.full(rows, min(1.0, max(0.0, speed)), np.float32)}

    out = []
    for speed in speeds:
        threshold = float(threshold_at(speed, thresholds))
        low = reference(at(speed_for(threshold - EXIT_MARGIN, thresholds)))["exit_layer"]
        high = reference(at(speed_for(threshold + EXIT_MARGIN, thresholds)))["exit_layer"]
        feeds = at(speed)
        out.append(ExitProbe(speed, feeds, reference(feeds), np.asarray(low == high)))
    return out


def exit_figures(
    expected: Outputs, got: Outputs, steady: np.ndarray, num_layers: int
) -> dict[str, Any]:
    """Return how the converted early-exit outputs ``got`` differ from FP32's at one speed.

    ``exit_rows``: how many probe rows leave after each layer 1..L in FP32 (``early_rows``: before
    the last); ``exit_agreement``: the share leaving at the same layer (``decisive_`` over the
    ``steady`` rows, the rest are ``exit_ties``); then the softmax figures over the rows that leave
    at the same layer (``same_exit_rows``), so a student is compared with itself.
    """
    want, have = np.asarray(expected["exit_layer"]), np.asarray(got["exit_layer"])
    same = want == have
    steady = np.asarray(steady, bool)
    counts = np.bincount(want, minlength=num_layers + 1)[1 : num_layers + 1]
    figures: dict[str, Any] = {
        "exit_rows": [int(n) for n in counts],
        "early_rows": int((want < num_layers).sum()),
        "exit_agreement": float(same.mean()),
        "decisive_exit_agreement": float(same[steady].mean()) if steady.any() else 1.0,
        "exit_ties": int((~steady).sum()),
        "same_exit_rows": int(same.sum()),
    }
    if same.any():
        rows = {k: expected[k][same] for k in ("logits", "probabilities")}
        figures.update(_softmax_figures(rows, {k: got[k][same] for k in rows}, None))
    else:  # nothing to compare: the exit rule above has already failed every steady row
        figures.update(max_abs_prob_diff=0.0, max_abs_logit_diff=0.0, argmax_agreement=1.0,
                       decisive_agreement=1.0)  # fmt: skip
    return figures


def measure_exits(probe: ExitProbe, outputs: Sequence[Outputs], num_layers: int) -> dict[str, Any]:
    """Return ``{"speed": ..., **exit_figures}``, the worst over the converted ``outputs``.

    ``outputs`` are the converted graph's answers to ``probe.feeds``, one per signature checked.
    """
    each = [exit_figures(probe.expected, got, probe.steady, num_layers) for got in outputs]
    worst = each[0]
    for other in each[1:]:
        worst = {k: v if isinstance(v, list) else worse(k, v, other[k]) for k, v in worst.items()}
    return {"speed": probe.speed, **worst}


def exit_violations(figures: dict[str, Any], tolerance: Tolerance) -> list[str]:
    """Return the names of the early-exit figures beyond ``tolerance`` (empty: publishable)."""
    bad = [k for k in ("decisive_exit_agreement", "decisive_agreement") if figures[k] < 1.0]
    if figures["max_abs_prob_diff"] > tolerance.max_prob_diff:
        bad.append("max_abs_prob_diff")
    return bad
