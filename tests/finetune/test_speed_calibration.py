"""finetune/calibration.py: FastBERT's rule simulated on dev entropies, and the knots it fits."""

from __future__ import annotations

import numpy as np
import pytest

from finetune.calibration import calibration_table, config_entry, exit_layers, fit_thresholds


def test_a_row_leaves_at_its_first_student_below_the_threshold_else_at_the_teacher() -> None:
    entropies = np.array([[0.2, 0.9, 0.6], [0.1, 0.3, 0.95]])  # [students, rows]

    assert exit_layers(entropies, 0.5).tolist() == [1, 2, 3]
    assert exit_layers(entropies, 0.0).tolist() == [3, 3, 3]
    assert exit_layers(entropies, 1.0).tolist() == [1, 1, 1]


def test_evenly_spread_entropies_give_each_knot_its_exact_share_of_rows() -> None:
    """One student, 20 rows at entropies 0.025, 0.075, ...: knot k must let exactly k rows leave,
    its threshold midway between the k-th and the (k+1)-th entropy, which is k/20."""
    entropies = ((np.arange(20) + 0.5) / 20)[None]

    thresholds = fit_thresholds(entropies)
    table = calibration_table(entropies, np.zeros((1, 20), int), np.zeros(20, int), None)

    np.testing.assert_allclose(thresholds, np.arange(21) / 20, rtol=0, atol=1e-12)
    assert [row["mean_exit_layer"] for row in table] == pytest.approx(2 - np.arange(21) / 20)
    assert config_entry(table, 20)["accuracy"] is None


def test_a_later_student_surer_than_an_earlier_one_counts_once_per_row() -> None:
    """Row 0 is unsure after layer 1 (0.8) and sure after layer 2 (0.1); row 1 sure after layer 1
    (0.2), less after layer 2 (0.9). The layer-rows skipped at t are the prefix minima below t:
    row 0's {0.8, 0.1}, row 1's {0.2, 0.2}."""
    entropies = np.array([[0.8, 0.2], [0.1, 0.9]])
    table = calibration_table(entropies, np.array([[0, 1], [1, 1]]), np.array([1, 1]),
                              np.array([1, 0]))  # fmt: skip

    by_speed = {round(row["speed"], 2): row for row in table}
    assert by_speed[0.25]["threshold"] == pytest.approx(0.15)  # 1 of 4 layer-rows skipped
    assert by_speed[0.25]["mean_exit_layer"] == 2.5 and by_speed[0.25]["agreement"] == 1.0
    assert by_speed[0.75]["threshold"] == pytest.approx(0.5)  # row 1 leaves at layer 1: +2
    assert by_speed[0.75]["mean_exit_layer"] == 1.5 and by_speed[0.75]["accuracy"] == 0.5
    assert [r["threshold"] for r in table] == sorted(r["threshold"] for r in table)
