"""Training precision: export's machine-based choice, expressed as a Keras mixed-precision policy.

``auto`` is decided by ``export.precision.choose_precision`` from the CPU flags and visible GPUs
(``mixed_float16`` with loss scaling on a GPU, ``mixed_bfloat16`` where the CPU has native bf16,
``float32`` otherwise). Variables, the final softmax and the loss always stay float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from export.hardware import CpuInfo
from export.precision import PrecisionChoice, choose_precision

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


@dataclass(frozen=True)
class TrainingPrecision:
    """The precision choice, its Keras policy name and what the policy computes in."""

    choice: PrecisionChoice
    policy: str
    compute_dtype: str
    loss_scaling: bool


def training_precision(requested: str, cpu: CpuInfo, gpus: Sequence[str]) -> TrainingPrecision:
    """Return the Keras policy for ``requested`` (``auto``/fp32/bf16/fp16) on this machine."""
    import keras

    choice = choose_precision(requested, cpu, gpus)
    policy = keras.mixed_precision.Policy(POLICIES[choice.precision])
    # the module keeps its own float32 variables; only the policy's compute dtype is taken, so
    # no process-wide global policy is set (it would leak into anything else built afterwards)
    return TrainingPrecision(
        choice=choice,
        policy=policy.name,
        compute_dtype=str(policy.compute_dtype),
        loss_scaling=policy.name == "mixed_float16",
    )
