"""CPU facts that precision and thread counts are decided from, for every CPU class by injection."""

from __future__ import annotations

import pytest

from export.hardware import CpuInfo, cpu_info, parse_cpuinfo

AVX2_EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx f16c fma avx2 bmi2
"""
AVX512_BF16_EPYC = """processor\t: 0
model name\t: AMD EPYC 9R14
flags\t\t: fpu avx2 fma f16c avx512f avx512bw avx512_vnni avx512_bf16
processor\t: 1
model name\t: AMD EPYC 9R14
flags\t\t: fpu
"""
AMX_XEON = """model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: avx2 fma avx512f amx_bf16 amx_tile amx_int8
"""
AVX512_NO_BF16 = "model name\t: Intel Xeon\nflags\t\t: avx2 fma avx512f avx512bw\n"


@pytest.mark.parametrize(
    "text,cpu_class,native_bf16",
    [
        (AVX2_EPYC, "AVX2", False),
        (AVX512_BF16_EPYC, "AVX-512 + bf16", True),
        (AMX_XEON, "AVX-512 + bf16", True),
        (AVX512_NO_BF16, "AVX-512", False),
        ("model name\t: Old\nflags\t\t: sse2\n", "other", False),
    ],
)
def test_cpu_class_and_native_bf16_come_from_the_flags(
    text: str, cpu_class: str, native_bf16: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BERTGW_CPU_FLAGS", raising=False)
    info = cpu_info(text)
    assert info.cpu_class == cpu_class
    assert info.native_bf16 is native_bf16
    assert info.cores >= 1


def test_first_processor_describes_the_machine() -> None:
    model, flags = parse_cpuinfo(AVX512_BF16_EPYC)
    assert model == "AMD EPYC 9R14"
    assert "avx512_bf16" in flags


def test_flags_env_replaces_the_machines_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTGW_CPU_FLAGS", "avx2 avx512f avx512_bf16")
    info = cpu_info(AVX2_EPYC)
    assert info.model == "AMD EPYC"
    assert info.native_bf16 and info.cpu_class == "AVX-512 + bf16"


def test_description_names_model_class_flags_and_cores() -> None:
    info = CpuInfo(model="AMD EPYC", flags=frozenset({"avx2", "fma", "sse2"}), cores=2)
    assert info.notable_flags == ["avx2", "fma"]
    assert info.describe() == "AMD EPYC (AVX2: avx2 fma), 2 cores"
