"""Which precision a version is exported in: chosen from the machine's capabilities (TF-free).

``auto`` picks the fastest precision that stays correct on the machine that will serve it:
FP16 where a GPU is visible (tensor cores), BF16 only where the CPU computes bf16 natively
(``avx512_bf16`` / ``amx_bf16``: 1.3-1.5x faster than FP32 at batch >= 8), FP32 otherwise. On an
AVX2-only CPU TensorFlow emulates bf16: measured 1.2-1.7x *slower* than FP32 and 10x further
from it, so BF16 there is a mistake worth a warning, not a default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from export.hardware import CpuInfo

PRECISIONS = ("fp32", "fp16", "bf16")
CHOICES = ("auto", *PRECISIONS)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision to export in, what was asked for, why, and what the user should know."""

    precision: str
    requested: str
    reason: str
    warnings: tuple[str, ...] = field(default=())


def choose_precision(requested: str, cpu: CpuInfo, gpus: Sequence[str]) -> PrecisionChoice:
    """Return the precision for ``requested`` (``auto`` or explicit) on this CPU and these GPUs."""
    if requested not in CHOICES:
        raise ValueError(f"precision must be one of {list(CHOICES)}, got {requested!r}")
    flags = " ".join(cpu.notable_flags) or "no AVX2"
    if requested == "auto":
        if gpus:
            return PrecisionChoice("fp16", requested, f"a GPU is visible ({gpus[0]})")
        if cpu.native_bf16:
            return PrecisionChoice("bf16", requested, f"the CPU has native bf16 ({flags})")
        return PrecisionChoice(
            "fp32", requested, f"no GPU and no native bf16 on this CPU ({cpu.cpu_class}: {flags})"
        )
    warnings: list[str] = []
    if requested == "bf16" and not cpu.native_bf16 and not gpus:
        warnings.append(
            f"bf16 on a CPU without native bf16 ({cpu.cpu_class}: {flags}) is emulated: "
            "slower and less accurate than fp32 here; serve it on a CPU with avx512_bf16/amx_bf16"
        )
    if requested == "fp16" and not gpus:
        warnings.append("fp16 with no GPU visible: CPUs run fp16 slower than fp32; it is for GPUs")
    return PrecisionChoice(requested, requested, "requested", tuple(warnings))


def visible_gpus() -> list[str]:
    """Return the names of the GPUs TensorFlow sees (imports TensorFlow)."""
    import tensorflow as tf

    return [device.name for device in tf.config.list_physical_devices("GPU")]


def verified_on(cpu: CpuInfo, gpus: Sequence[str]) -> dict[str, Any]:
    """Return what ``model.json`` records of the machine a conversion was verified on."""
    return {
        "cpu_model": cpu.model,
        "cpu_class": cpu.cpu_class,
        "cpu_flags": cpu.notable_flags,
        "gpu": gpus[0] if gpus else None,
    }
