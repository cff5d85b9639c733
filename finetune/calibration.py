"""Speed calibration at distill time: an entropy threshold per knot speed, fitted on dev (numpy).

A speed ``s`` means the expected share of the skippable layers skipped: on the dev set the mean
exit layer at speed ``s`` is ``L - s·(L-1)`` (L layers; the teacher answers after layer L, so
``L-1`` layers can be skipped). FastBERT's rule with one threshold ``t`` for every layer: a row
leaves after the first layer ``i < L`` whose student's normalised entropy is below ``t``, else
after layer L. This module simulates that rule on the students' dev entropies and, for each knot
``s_k = k/20``, picks the threshold whose simulated mean exit layer is nearest the target.
export/calibration.py is the other half: the map from a client's speed to the threshold.

Why it is a search over the entropies: a row leaves by layer ``i+1`` exactly when ``t`` exceeds
the smallest of its first ``i+1`` entropies (its prefix minimum), so the number of layers the dev
set skips at ``t`` is the number of prefix minima below ``t``, a step function that rises only at
those values. Each knot's threshold sits midway between two consecutive distinct values, as far
from both as it can be: an entropy that moves a little (another batch's padding, 16-bit weights)
does not change any dev row's exit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from export.calibration import MEANING, knot_speeds

# The knots printed in the distill output (the whole table is in exits.json and config.json).
SHOWN_SPEEDS = (0.0, 0.25, 0.5, 0.7, 0.8, 0.9, 1.0)


def exit_layers(entropies: np.ndarray, threshold: float) -> np.ndarray:
    """Return each row's exit layer (1..L) under FastBERT's rule at one entropy ``threshold``.

    ``entropies``: the students' normalised entropies ``[L-1, n]`` (student after layer i first).
    """
    leaves = np.asarray(entropies) < threshold
    first = leaves.argmax(axis=0) + 1  # argmax: the first True
    return np.where(leaves.any(axis=0), first, leaves.shape[0] + 1).astype(np.int64)


def fit_thresholds(entropies: np.ndarray) -> list[float]:
    """Return the 21 knot thresholds (0 at speed 0, 1 at speed 1, non-decreasing in between).

    Knot ``k`` aims at ``k/20·(L-1)·n`` layers skipped over the ``n`` dev rows; of the steps of the
    simulated count it takes the one nearest that aim (a tie: the one skipping fewer layers) and
    the threshold midway across it.
    """
    minima = np.minimum.accumulate(np.asarray(entropies, np.float64), axis=0).ravel()
    values = np.unique(minima)  # sorted distinct: the count of minima < t steps up after each
    skipped = np.searchsorted(np.sort(minima), values, side="right")  # minima <= each value
    steps = np.concatenate([[0], skipped])  # step j: t in (values[j-1], values[j]] skips steps[j]
    edges = np.concatenate([[0.0], values, [max(1.0, float(values[-1]))]])
    middles = (edges[:-1] + edges[1:]) / 2  # step j's threshold: midway across it
    thresholds = []
    for speed in knot_speeds()[1:-1]:
        aim = speed * minima.size
        j = int(np.argmin(np.abs(steps - aim)))  # the first of equally near steps: fewer skipped
        thresholds.append(float(min(1.0, middles[j])))
    return [0.0, *thresholds, 1.0]


def calibration_table(
    entropies: np.ndarray, student_labels: np.ndarray, teacher_labels: np.ndarray,
    truth: np.ndarray | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Return the calibration, one row per knot: speed, threshold and the simulated dev figures.

    ``student_labels`` ``[L-1, n]``: each student's argmax; ``teacher_labels`` ``[n]``; ``truth``
    the dev labels (None: unlabelled). ``layers_skipped`` is the share of the L-1 skippable layers.
    """
    entropies = np.asarray(entropies)
    layers = entropies.shape[0] + 1
    answers = np.concatenate([np.asarray(student_labels), np.asarray(teacher_labels)[None]])
    rows = np.arange(entropies.shape[1])
    table = []
    for speed, threshold in zip(knot_speeds(), fit_thresholds(entropies), strict=True):
        exits = exit_layers(entropies, threshold)
        predicted = answers[exits - 1, rows]
        mean_exit = float(exits.mean())
        table.append({
            "speed": speed, "threshold": threshold, "mean_exit_layer": mean_exit,
            "layers_skipped": (layers - mean_exit) / (layers - 1),
            "agreement": float(np.mean(predicted == teacher_labels)),
            "accuracy": None if truth is None else float(np.mean(predicted == truth)),
        })  # fmt: skip
    return table


def config_entry(table: list[dict[str, Any]], dev_texts: int) -> dict[str, Any]:
    """Return config.json's ``early_exits.calibration`` (export/calibration.py reads it)."""
    labelled = table[0]["accuracy"] is not None
    return {
        "meaning": MEANING,
        "speeds": [row["speed"] for row in table],
        "thresholds": [row["threshold"] for row in table],
        "mean_exit_layer": [row["mean_exit_layer"] for row in table],
        "agreement": [row["agreement"] for row in table],
        "accuracy": [row["accuracy"] for row in table] if labelled else None,
        "dev_texts": dev_texts,
    }


def shown(table: list[dict[str, Any]]) -> str:
    """Return a short markdown table of the knots in ``SHOWN_SPEEDS`` (the distill output)."""
    lines = ["| speed | threshold | mean exit layer | layers skipped | agreement | accuracy |",
             "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in table:
        if not any(abs(row["speed"] - s) < 1e-9 for s in SHOWN_SPEEDS):
            continue
        accuracy = "-" if row["accuracy"] is None else f"{row['accuracy']:.3f}"
        lines.append(f"| {row['speed']:.2f} | {row['threshold']:.3f} | "
                     f"{row['mean_exit_layer']:.2f} | {row['layers_skipped']:.2f} | "
                     f"{row['agreement']:.3f} | {accuracy} |")  # fmt: skip
    return "\n".join(lines)
