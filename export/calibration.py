"""What a client's ``speed`` means: the map from speed to the exit rule's entropy threshold (numpy).

A checkpoint distilled by ``python -m finetune distill-exits`` carries a calibration in
config.json's ``early_exits.calibration`` (finetune/calibration.py fits it on the dev set): 21
knots ``speed = k/20`` and one raw normalised-entropy threshold per knot, chosen so that at speed
``s`` the expected share of the skippable layers skipped is ``s`` (mean exit layer
``L - s·(L-1)``). Between knots the threshold is interpolated linearly; knot 0 is 0 (the full
model) and knot 20 is 1 (every row leaves at the first student that is not maximally unsure).

A checkpoint without a calibration (distilled before it existed) keeps the old meaning: the speed
is the raw threshold. The graph's twin of ``threshold_at`` is export/exits.py's
``speed_thresholds``; the conversion gate (export/gates.py) uses this module's map and its inverse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from export.errors import ExportError

KNOTS = 21  # speeds 0, 0.05, ..., 1: uniform, so the graph finds a speed's knot by floor(20·s)
MEANING = "layers_skipped"
UNCALIBRATED = {"meaning": "raw_entropy_threshold"}


def knot_speeds() -> list[float]:
    """Return the calibration's knot speeds ``k/20``, k = 0..20."""
    return [k / (KNOTS - 1) for k in range(KNOTS)]


def threshold_at(speed: Any, thresholds: Sequence[float] | None) -> np.ndarray:
    """Return the entropy threshold(s) for ``speed`` (already in [0, 1]); identity without a table.

    Written as ``lo·(1-f) + hi·f`` so a knot's speed gives its threshold exactly (speed 1 → the
    last knot), as the graph computes it.
    """
    s = np.asarray(speed, np.float32)
    if thresholds is None:
        return s
    table = np.asarray(thresholds, np.float32)
    scaled = s * np.float32(KNOTS - 1)
    index = np.minimum(np.floor(scaled), KNOTS - 2).astype(np.int64)
    fraction = scaled - index.astype(np.float32)
    return table[index] * (np.float32(1) - fraction) + table[index + 1] * fraction


def speed_for(threshold: float, thresholds: Sequence[float] | None) -> float:
    """Return a speed whose threshold is ``threshold`` (clamped into [0, 1]): the map's inverse.

    The map is continuous and non-decreasing from 0 to 1, so every threshold in [0, 1] is reached;
    on a flat stretch any of its speeds will do, this returns the first.
    """
    t = min(1.0, max(0.0, float(threshold)))
    if thresholds is None:
        return t
    table = [float(v) for v in thresholds]
    k = next(i for i, v in enumerate(table) if v >= t)
    if k == 0:
        return 0.0
    lo, hi = table[k - 1], table[k]
    return (k - 1 + (t - lo) / (hi - lo)) / (KNOTS - 1)


def checked_calibration(entry: Any, where: object) -> dict[str, Any] | None:
    """Return config.json's ``early_exits.calibration`` once its table is valid (None: absent).

    Raises ``ExportError`` naming ``where`` for a table the graph could not serve: not 21 knots,
    thresholds outside [0, 1] or decreasing, or not 0 at speed 0 and 1 at speed 1.
    """
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or entry.get("meaning") != MEANING:
        raise ExportError(f"{where}: early_exits.calibration must be a table with meaning "
                          f"{MEANING!r}")  # fmt: skip
    speeds, thresholds = entry.get("speeds"), entry.get("thresholds")
    if not all(_numbers(v) for v in (speeds, thresholds)):
        raise ExportError(f"{where}: early_exits.calibration needs {KNOTS} speeds and thresholds")
    if not np.allclose(np.asarray(speeds, np.float64), knot_speeds()):
        raise ExportError(f"{where}: early_exits.calibration speeds must be k/20, k = 0..20")
    t = np.asarray(thresholds, np.float64)
    if not (np.all(np.diff(t) >= 0) and t[0] == 0.0 and t[-1] == 1.0):
        raise ExportError(f"{where}: early_exits.calibration thresholds must rise from 0 at speed "
                          "0 to 1 at speed 1")  # fmt: skip
    return dict(entry)


def _numbers(values: Any) -> bool:
    """Return whether ``values`` is a list of KNOTS JSON numbers (bools are not numbers)."""
    if not isinstance(values, list) or len(values) != KNOTS:
        return False
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def model_json_entry(exits: Mapping[str, Any]) -> dict[str, Any]:
    """Return model.json's ``speed_calibration``: the checkpoint's table, or the raw meaning."""
    calibration = exits.get("calibration")
    return dict(UNCALIBRATED) if calibration is None else dict(calibration)


def thresholds_of(exits: Mapping[str, Any] | None) -> list[float] | None:
    """Return an ``early_exits`` entry's calibrated thresholds (None: speed is the threshold)."""
    calibration = None if exits is None else exits.get("calibration")
    return None if calibration is None else [float(v) for v in calibration["thresholds"]]
