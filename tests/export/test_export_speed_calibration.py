"""What a speed means: the map from a client's speed to the exit rule's entropy threshold.

The numpy map (export/calibration.py, used by the conversion gate and model.json's readers) and
the graph's (export/exits.py) must agree: at a knot exactly, linearly between knots, 0 at speed 0
and the last knot at speed 1; without a calibration the speed is the threshold, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from export.calibration import (
    KNOTS,
    checked_calibration,
    knot_speeds,
    model_json_entry,
    speed_for,
    threshold_at,
)
from export.checkpoint import read_checkpoint
from export.errors import ExportError
from export.exits import speed_thresholds
from export.gates import EXIT_MARGIN, exit_probes
from export.tiny import write_hf_checkpoint

# a convex table with a flat stretch (knots 3..6): what an unsure teacher's calibration looks like
THRESHOLDS = [0.0, 0.4, 0.45, 0.5, 0.5, 0.5, 0.5, *np.linspace(0.55, 0.95, 13).tolist(), 1.0]


def _table(thresholds: list[float] = THRESHOLDS) -> dict[str, Any]:
    return {"meaning": "layers_skipped", "speeds": knot_speeds(), "thresholds": thresholds,
            "mean_exit_layer": [4.0 - 3.0 * s for s in knot_speeds()], "agreement": [1.0] * KNOTS,
            "accuracy": None, "dev_texts": 10}  # fmt: skip


def test_at_every_knot_the_threshold_is_the_knots_in_numpy_and_in_the_graph() -> None:
    speeds = np.asarray(knot_speeds(), np.float32)

    graph = speed_thresholds(tf.constant(speeds), THRESHOLDS).numpy()

    np.testing.assert_allclose(threshold_at(speeds, THRESHOLDS), THRESHOLDS, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(graph, threshold_at(speeds, THRESHOLDS))
    assert graph[0] == 0.0 and graph[-1] == 1.0  # exactly: 0 never exits, 1 as before


BETWEEN = [(0.025, 0.2), (0.0125, 0.1), (0.125, 0.475), (0.175, 0.5), (0.26, 0.5), (0.975, 0.975)]


@pytest.mark.parametrize(("speed", "want"), BETWEEN)
def test_between_knots_the_threshold_is_interpolated_linearly(speed: float, want: float) -> None:
    graph = speed_thresholds(tf.constant([speed], tf.float32), THRESHOLDS).numpy()

    np.testing.assert_allclose(graph, [want], rtol=0, atol=1e-6)
    np.testing.assert_allclose(threshold_at([speed], THRESHOLDS), [want], rtol=0, atol=1e-6)


def test_without_a_calibration_the_speed_is_the_threshold() -> None:
    speeds = np.linspace(0.0, 1.0, 7, dtype=np.float32)

    assert speed_thresholds(tf.constant(speeds), None).numpy().tolist() == speeds.tolist()
    assert threshold_at(speeds, None).tolist() == speeds.tolist()
    assert speed_for(0.3, None) == 0.3 and speed_for(1.2, None) == 1.0
    assert model_json_entry({"pooling": "mean"}) == {"meaning": "raw_entropy_threshold"}


@pytest.mark.parametrize("threshold", [0.0, 0.2, 0.45, 0.5, 0.73, 1.0])
def test_speed_for_inverts_the_map(threshold: float) -> None:
    speed = speed_for(threshold, THRESHOLDS)

    assert 0.0 <= speed <= 1.0
    np.testing.assert_allclose(threshold_at(speed, THRESHOLDS), threshold, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"meaning": "agreement"}, "meaning"), ({"thresholds": THRESHOLDS[:-1]}, "21 speeds"),
     ({"speeds": [s / 2 for s in knot_speeds()]}, "k/20"), ({"speeds": [0.0, 1.0]}, "21 speeds"),
     ({"thresholds": [*THRESHOLDS[:-1], "1"]}, "21 speeds"),
     ({"thresholds": [0.0, 0.5, 0.4, *THRESHOLDS[3:]]}, "rise"),
     ({"thresholds": [*THRESHOLDS[:-1], 0.99]}, "rise")],
)  # fmt: skip
def test_a_table_the_graph_could_not_serve_is_refused(change: dict, message: str) -> None:
    with pytest.raises(ExportError, match=message):
        checked_calibration({**_table(), **change}, "ckpt/config.json")


def test_the_gates_exit_ties_are_measured_around_the_mapped_threshold() -> None:
    """A row is a tie when an entropy up to its exit lies within the margin of the threshold the
    speed maps to (0.5 at speed 0.2 here), not of the speed itself."""
    entropies = np.array([[0.47, 0.9], [0.9, 0.52], [0.3, 0.9], [0.9, 0.9], [0.58, 0.2]])

    def reference(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        t = threshold_at(feeds["speed"], THRESHOLDS)[:, None]
        leaves = entropies < t
        return {"exit_layer": np.where(leaves.any(1), leaves.argmax(1) + 1, 3)}

    probe = {"input_ids": np.zeros((5, 4), np.int32)}
    (at,) = exit_probes(reference, probe, [0.2], THRESHOLDS)

    assert at.speed == 0.2 and at.expected["exit_layer"].tolist() == [1, 3, 1, 3, 2]
    assert at.steady.tolist() == [False, False, True, True, True]
    assert EXIT_MARGIN == 0.05  # the rows above: 0.47 and 0.52 within it of 0.5, 0.58 outside


def test_a_checkpoint_with_a_bad_table_is_refused_when_read(tmp_path: Path) -> None:
    path = write_hf_checkpoint(tmp_path / "ckpt", exits=True, layers=2)
    config = json.loads((path / "config.json").read_text())
    config["early_exits"]["calibration"] = _table([0.0, *THRESHOLDS[1:-1], 0.9])
    (path / "config.json").write_text(json.dumps(config))

    with pytest.raises(ExportError, match=r"config\.json: early_exits\.calibration thresholds"):
        read_checkpoint(path)
