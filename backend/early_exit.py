"""Early-exit classifiers: what model.json says about their exits, and each text's speed.

A version exported with exits (``"early_exit"`` in its assets/model.json) takes one more input,
``speed`` float32 [rows] (0 = the full model; a row leaves after layer i once that layer's student
is confident enough for its speed), and returns ``exit_layer`` int32 [rows]: how many encoder
layers the row ran. Versions without exits take no speed at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SPEED_INPUT = "speed"
EXIT_OUTPUT = "exit_layer"


@dataclass(frozen=True)
class EarlyExit:
    """The ``early_exit`` entry of an early-exit version's model.json."""

    default_speed: float
    num_layers: int
    layers: tuple[int, ...]  # the layers with a student after them (1..num_layers-1)


def parse_early_exit(info: dict[str, Any]) -> EarlyExit | None:
    """Return the version's exits from model.json ``info``; None for a model without them.

    Raises ValueError (or TypeError) on an entry the gateway cannot use.
    """
    entry = info.get("early_exit")
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ValueError(f"early_exit must be an object, not {type(entry).__name__}")
    default_speed = float(entry.get("default_speed", 0.0))
    if not 0.0 <= default_speed <= 1.0:  # NaN fails this too
        raise ValueError(f"early_exit.default_speed {default_speed} is not in [0, 1]")
    return EarlyExit(
        default_speed=default_speed,
        num_layers=int(entry.get("num_layers", 0)),
        layers=tuple(int(layer) for layer in entry.get("layers", ())),
    )


def valid_speed(value: Any) -> bool:
    """Return True for a JSON number (not a bool) in [0, 1]."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 <= value <= 1
    )


def text_speeds(
    requested: float | Sequence[float] | None,
    setting: float | None,
    early_exit: EarlyExit,
    count: int,
) -> np.ndarray:
    """Return each text's speed, float32 [count]: the request's, else the gateway's
    GATEWAY_DEFAULT_SPEED, else the model's ``early_exit.default_speed`` (itself 0 by default)."""
    if requested is None:
        requested = setting if setting is not None else early_exit.default_speed
    if isinstance(requested, int | float):
        return np.full(count, requested, dtype=np.float32)
    speeds = np.asarray(requested, dtype=np.float32)
    if speeds.shape != (count,):
        raise ValueError(f"{speeds.shape[0] if speeds.ndim else 0} speeds for {count} texts")
    return speeds


def chunk_speeds(speeds: np.ndarray, indices: Sequence[int]) -> np.ndarray:
    """Return the speeds of one chunk's rows, in the chunk's row order (float32 [rows])."""
    return speeds[np.asarray(indices, dtype=np.intp)]


def ignored_note(model: str, version: int) -> str:
    """Return the note of a response whose request gave a speed its model cannot use."""
    return f"speed ignored: model {model!r} version {version} has no early exits"
