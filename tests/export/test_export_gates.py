"""The FP16/BF16 gate has a rule for each head, and each rule refuses a broken conversion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import export.build
from export.build import build
from export.checkpoint import read_checkpoint
from export.errors import ExportError
from export.gates import (
    EXIT_GATE_SPEED,
    EXIT_MARGIN,
    Tolerance,
    bio_entities,
    exit_figures,
    exit_gate_speeds,
    exit_probes,
    exit_violations,
    gate_metric,
    measure,
    within,
)
from export.tiny import write_hf_checkpoint
from export.warmup import token_batch
from modelformat.heads import MULTI, REGRESSION, Head

TAG_LABELS = ["O", "B-ORDER", "I-ORDER", "B-EMAIL", "I-EMAIL"]
LOOSE = Tolerance(max_prob_diff=1.0, max_token_prob_diff=1.0)  # only the decision rules left

HEADS: dict[str, dict[str, Any]] = {
    "tag": {"task": "tag"},
    "multi_label": {"labels": ("billing", "shipping", "account", "bug"), "problem_type": MULTI,
                    "thresholds": {"billing": 0.3, "bug": 0.6}},
    "one_logit": {"labels": ("relevant",), "text_pair": True},
    "regression": {"labels": ("score",), "problem_type": REGRESSION},
}  # fmt: skip


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny checkpoint of each head."""
    root = tmp_path_factory.mktemp("gates")
    return {name: write_hf_checkpoint(root / name, seed=21, **kw) for name, kw in HEADS.items()}


def _head_of(result_or_info: dict[str, Any]) -> Head:
    from modelformat.heads import head_from_info

    return head_from_info(result_or_info)


def _one_hot(tags: list[list[str]], confident: float = 0.9) -> np.ndarray:
    """Return tag probabilities [rows, tokens, labels]: ``confident`` on each tag."""
    rest = (1.0 - confident) / (len(TAG_LABELS) - 1)
    out = np.full((len(tags), len(tags[0]), len(TAG_LABELS)), rest, np.float32)
    for r, row in enumerate(tags):
        for t, tag in enumerate(row):
            out[r, t, TAG_LABELS.index(tag)] = confident
    return out


def _outputs(probs: np.ndarray) -> dict[str, np.ndarray]:
    return {"logits": np.log(probs), "probabilities": probs}


def test_bio_entities_read_b_and_i_as_transformers_does() -> None:
    tags = ["O", "B-A", "I-A", "I-B", "O", "I-A", "B-A", "B-A"]
    assert bio_entities(tags) == [(1, 3, "A"), (3, 4, "B"), (5, 6, "A"), (6, 7, "A"), (7, 8, "A")]


def test_tag_gate_refuses_a_changed_entity_and_ignores_padding() -> None:
    tag = Head(task="tag", label_scheme="BIO")
    fp32 = [["O", "B-ORDER", "I-ORDER", "O", "O"]]
    mask = np.array([[1, 1, 1, 1, 0]])
    # the entity shrinks: I-ORDER → O at a decisive token
    shrunk = [["O", "B-ORDER", "O", "O", "O"]]
    changed = measure(_outputs(_one_hot(fp32)), _outputs(_one_hot(shrunk)), head=tag,
                      labels=TAG_LABELS, attention_mask=mask)  # fmt: skip
    assert changed["decisive_entity_agreement"] == 0.0
    assert gate_metric(changed) == "decisive_entity_agreement"
    assert not within(changed, LOOSE)
    # padding (mask 0) may say anything
    padded = measure(_outputs(_one_hot(fp32)), _outputs(_one_hot([["O", "B-ORDER", "I-ORDER",
                                                                    "O", "B-EMAIL"]])),
                     head=tag, labels=TAG_LABELS, attention_mask=mask)  # fmt: skip
    assert padded["entity_agreement"] == 1.0 and within(padded, Tolerance())


def test_tag_gate_lets_a_tie_token_flip() -> None:
    tag = Head(task="tag", label_scheme="BIO")
    probs = _one_hot([["O", "B-ORDER", "I-ORDER", "O"]])
    probs[0, 3] = [0.46, 0.02, 0.44, 0.04, 0.04]  # O vs I-ORDER: a tie at 16-bit precision
    flipped = probs.copy()
    flipped[0, 3] = [0.44, 0.02, 0.46, 0.04, 0.04]
    figures = measure(_outputs(probs), _outputs(flipped), head=tag, labels=TAG_LABELS,
                      attention_mask=np.ones((1, 4)))  # fmt: skip
    assert figures["entity_agreement"] == 0.0  # the entity grew by the tie token...
    assert figures["decisive_entity_agreement"] == 1.0  # ...which the gate forgives
    assert within(figures, Tolerance())


def test_multi_label_gate_holds_each_decision_at_its_own_threshold() -> None:
    head = Head(problem_type=MULTI, activation="sigmoid", thresholds={"a": 0.3, "b": 0.5})
    fp32 = np.array([[0.35, 0.504]], np.float32)

    def figures(got: list[float]) -> dict[str, Any]:
        return measure({"logits": fp32, "probabilities": fp32},
                       {"logits": fp32, "probabilities": np.array([got], np.float32)},
                       head=head, labels=["a", "b"])  # fmt: skip

    assert not within(figures([0.28, 0.504]), LOOSE)  # "a" flips at its 0.3, 0.05 away: refused
    assert within(figures([0.35, 0.497]), Tolerance())  # "b" 0.004 from 0.5 (a tie) may flip
    assert figures([0.35, 0.497])["decision_agreement"] == 0.5


def test_regression_gate_bounds_the_score_error_on_the_score_scale() -> None:
    head = Head(problem_type=REGRESSION, activation="none")
    fp32 = np.array([[12.0], [-3.0]], np.float32)

    def figures(delta: float) -> dict[str, Any]:
        got = {"logits": fp32 + delta, "probabilities": fp32 + delta}
        return measure({"logits": fp32, "probabilities": fp32}, got, head=head)

    assert figures(0.1)["max_score_diff"] == pytest.approx(0.1 / 12, rel=1e-4)
    assert within(figures(0.1), Tolerance()) and not within(figures(0.2), Tolerance())


@pytest.mark.parametrize("name", list(HEADS))
def test_a_broken_conversion_is_refused_by_its_heads_rule(
    checkpoints: dict[str, Path], name: str
) -> None:
    from export.heads import resolve_head
    from export.model import EncoderModule, run

    ckpt = read_checkpoint(checkpoints[name])
    task = HEADS[name].get("task", "classify")
    head = resolve_head(task, ckpt.head_config, ckpt.labels)
    broken = dict(ckpt.weights)
    kernel = broken["classifier/kernel"]  # the head's weights, perturbed
    broken["classifier/kernel"] = kernel + np.random.default_rng(0).normal(0, 1, kernel.shape)
    feeds = token_batch(8, 32, ckpt.config.vocab_size, 2, 3, seed=1234)

    def module(weights: dict[str, np.ndarray], precision: str) -> Any:
        return EncoderModule(ckpt.config, weights, task=task, precision=precision,
                          activation=head.activation)  # fmt: skip

    def gate(weights: dict[str, np.ndarray]) -> dict[str, Any]:
        return measure(run(module(ckpt.weights, "fp32").serve, feeds),
                       run(module(weights, "bf16").serve, feeds), head=head,
                       labels=ckpt.labels, attention_mask=feeds["attention_mask"])  # fmt: skip

    figures = gate(broken)
    # the head's own rule refuses even with the probability bounds switched off
    assert not within(figures, LOOSE if name != "regression" else Tolerance()), figures
    assert gate_metric(figures) == {
        "tag": "decisive_entity_agreement", "multi_label": "decisive_decision_agreement",
        "one_logit": "decisive_decision_agreement", "regression": "max_score_diff",
    }[name]  # fmt: skip


@pytest.mark.parametrize(("name", "precision"), [("tag", "bf16"), ("multi_label", "fp16"),
                                                 ("regression", "fp16")])  # fmt: skip
def test_a_sound_conversion_is_published_with_its_heads_figures(
    checkpoints: dict[str, Path], tmp_path: Path, name: str, precision: str
) -> None:
    result = build(checkpoints[name], name, tmp_path, task=HEADS[name].get("task", "classify"),
                   precision=precision, max_seq_len=32, warmup=False)  # fmt: skip
    info = json.loads((result.path / "assets" / "model.json").read_text(encoding="utf-8"))
    assert info["conversion"]["metric"] == gate_metric(info["conversion"])
    assert within(info["conversion"], Tolerance())
    if name == "tag":
        assert info["conversion"]["entities"] > 0  # the probe really has entities to compare


def test_build_refuses_a_broken_tag_conversion_and_publishes_nothing(
    checkpoints: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion fault injected after the reference is built: the export's gate stops it."""
    original = export.build._build_modules

    def broken_modules(ckpt: Any, *args: Any, **kwargs: Any) -> Any:
        reference, _, labels, scale = original(ckpt, *args, **kwargs)
        from export.model import EncoderModule

        weights = dict(ckpt.weights)
        weights["layer_1/output/kernel"] = np.random.default_rng(0).normal(
            0, 1, weights["layer_1/output/kernel"].shape).astype(np.float32)  # fmt: skip
        target = EncoderModule(ckpt.config, weights, task="tag", precision="bf16")
        return reference, target, labels, scale

    monkeypatch.setattr(export.build, "_build_modules", broken_modules)
    with pytest.raises(ExportError, match=r"beyond tolerance.*decisive_entity_agreement"):
        build(checkpoints["tag"], "t", tmp_path, task="tag", precision="bf16", max_seq_len=32,
              warmup=False)  # fmt: skip
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").iterdir())


def _exit_outputs(layers: list[int], probs: list[list[float]]) -> dict[str, np.ndarray]:
    p = np.array(probs, np.float32)
    return {"logits": np.log(p), "probabilities": p, "exit_layer": np.array(layers, np.int32)}


def test_exit_gate_speeds_are_the_default_or_08_and_one() -> None:
    assert exit_gate_speeds(0.0) == (EXIT_GATE_SPEED, 1.0) == (0.8, 1.0)
    assert exit_gate_speeds(0.25) == (0.25, 1.0)
    assert exit_gate_speeds(1.0) == (1.0,)


def test_exit_figures_count_exits_per_layer_and_compare_rows_that_leave_together() -> None:
    fp32 = _exit_outputs([1, 2, 4, 4], [[0.9, 0.1], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    got = _exit_outputs([1, 2, 4, 4], [[0.895, 0.105], [0.8, 0.2], [0.6, 0.4], [0.3, 0.7]])
    figures = exit_figures(fp32, got, np.ones(4, bool), num_layers=4)
    assert figures["exit_rows"] == [1, 1, 0, 2] and figures["early_rows"] == 2
    assert figures["exit_agreement"] == figures["decisive_exit_agreement"] == 1.0
    assert figures["max_abs_prob_diff"] == pytest.approx(0.005, abs=1e-6)
    assert exit_violations(figures, Tolerance()) == []


def test_a_steady_row_leaving_at_another_layer_is_refused_and_named() -> None:
    fp32 = _exit_outputs([1, 4], [[0.9, 0.1], [0.3, 0.7]])
    moved = _exit_outputs([1, 2], [[0.9, 0.1], [0.6, 0.4]])  # row 1 leaves early, argmax flipped
    figures = exit_figures(fp32, moved, np.array([True, True]), num_layers=4)
    assert figures["decisive_exit_agreement"] == 0.5 and figures["same_exit_rows"] == 1
    assert figures["max_abs_prob_diff"] == 0.0  # only rows that left together are compared
    assert exit_violations(figures, Tolerance(max_prob_diff=1.0)) == ["decisive_exit_agreement"]
    # the same move on a row whose FP32 exit is a tie (entropy within the margin) is forgiven
    tie = exit_figures(fp32, moved, np.array([True, False]), num_layers=4)
    assert tie["exit_agreement"] == 0.5 and tie["decisive_exit_agreement"] == 1.0
    assert tie["exit_ties"] == 1 and exit_violations(tie, Tolerance()) == []


def test_a_student_answering_differently_at_the_same_exit_is_refused() -> None:
    fp32 = _exit_outputs([2, 2], [[0.9, 0.1], [0.52, 0.48]])
    got = _exit_outputs([2, 2], [[0.3, 0.7], [0.48, 0.52]])  # row 0 decisive and flipped
    figures = exit_figures(fp32, got, np.ones(2, bool), num_layers=3)
    assert figures["decisive_agreement"] == 0.0 and figures["argmax_agreement"] == 0.0
    assert exit_violations(figures, Tolerance()) == ["decisive_agreement", "max_abs_prob_diff"]


def test_exit_probes_mark_rows_within_the_margin_of_the_speed_as_ties() -> None:
    """A numpy model of the graph's rule: leave at the first layer whose entropy < speed."""
    entropies = np.array([[0.5, 0.1], [0.79, 0.1], [0.9, 0.84], [0.95, 0.95], [0.82, 0.7]])

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        leaves = entropies < feeds["speed"][:, None]
        layer = np.where(leaves.any(1), leaves.argmax(1) + 1, 3).astype(np.int32)
        probs = np.full((len(layer), 2), 0.5, np.float32)
        return {"logits": probs, "probabilities": probs, "exit_layer": layer}

    probe = {"input_ids": np.zeros((5, 4), np.int32)}
    (at,) = exit_probes(reference, probe, [0.8])
    assert at.speed == 0.8 and at.feeds["speed"].tolist() == pytest.approx([0.8] * 5)
    assert at.expected["exit_layer"].tolist() == [1, 1, 3, 3, 2]
    # 0.79 and 0.84 and 0.82 lie within EXIT_MARGIN of 0.8; 0.5, 0.9, 0.95 do not
    assert at.steady.tolist() == [True, False, False, True, False]
    assert EXIT_MARGIN == 0.05
