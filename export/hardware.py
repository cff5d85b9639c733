"""What this machine can run fast: CPU model, instruction-set flags, usable cores (TF-free).

Precision and thread counts are decided from these facts, never from constants tuned on one
machine. The machines this project lands on differ by CPU class: AVX-512 with native bf16
(``avx512_bf16`` / ``amx_bf16``), where BF16 matmuls are faster than FP32, and AVX2-only, where
TensorFlow emulates bf16 (slower *and* less accurate than FP32).

Tests inject another machine's facts by passing ``CpuInfo`` values, or for a whole process by
setting ``BERTGW_CPU_FLAGS`` (space-separated flags, replacing those of ``/proc/cpuinfo``).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
FLAGS_ENV = "BERTGW_CPU_FLAGS"
# The flags worth recording beside a figure or a converted model (the rest say nothing about speed).
NOTABLE_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "amx_bf16",
    "amx_tile",
)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class CpuInfo:
    """A CPU as far as precision and threading care: model name, flags, usable cores."""

    model: str
    flags: frozenset[str]
    cores: int

    @property
    def native_bf16(self) -> bool:
        """True when the CPU computes bf16 in hardware (AVX512-BF16 or AMX)."""
        return any(flag in self.flags for flag in NATIVE_BF16_FLAGS)

    @property
    def cpu_class(self) -> str:
        """Return the class figures are quoted by: 'AVX-512 + bf16', 'AVX-512', 'AVX2', 'other'."""
        if "avx512f" in self.flags:
            return "AVX-512 + bf16" if self.native_bf16 else "AVX-512"
        return "AVX2" if "avx2" in self.flags else "other"

    @property
    def notable_flags(self) -> list[str]:
        """Return the speed-relevant flags this CPU has, in a fixed order."""
        return [flag for flag in NOTABLE_FLAGS if flag in self.flags]

    def describe(self) -> str:
        """Return a one-line description for tables and logs."""
        flags = " ".join(self.notable_flags) or "no AVX2"
        return f"{self.model} ({self.cpu_class}: {flags}), {self.cores} cores"


def usable_cores() -> int:
    """Return the CPUs this process may run on (affinity/cgroup set, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """Return (model name, flags) from the text of ``/proc/cpuinfo`` (first processor)."""
    model, flags = "", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = frozenset(value.split())
        if model and flags:
            break
    return model, flags


def cpu_info(cpuinfo_text: str | None = None, flags_override: str | None = None) -> CpuInfo:
    """Return this machine's ``CpuInfo`` (or one parsed from the given texts, for tests)."""
    if cpuinfo_text is None:
        try:
            cpuinfo_text = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo_text = ""
    model, flags = parse_cpuinfo(cpuinfo_text)
    if flags_override is None:
        flags_override = os.environ.get(FLAGS_ENV)
    if flags_override is not None:
        flags = frozenset(flags_override.split())
    return CpuInfo(
        model=model or platform.processor() or platform.machine(),
        flags=flags,
        cores=usable_cores(),
    )
