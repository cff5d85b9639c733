"""``--precision auto`` and the conversion gate, for every CPU class by injected CPU facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from export.build import Tolerance, build, measure, within
from export.checkpoint import read_checkpoint
from export.hardware import CpuInfo
from export.precision import choose_precision
from export.warmup import token_batch
from modelformat.layout import MODEL_JSON
from ops.procs import REPO

AVX2 = CpuInfo("AMD EPYC", frozenset({"avx2", "fma", "f16c"}), 2)
AVX512 = CpuInfo("Intel Xeon", frozenset({"avx2", "fma", "avx512f"}), 2)
AVX512_BF16 = CpuInfo("AMD EPYC 9R14", frozenset({"avx2", "avx512f", "avx512_bf16"}), 2)
AMX = CpuInfo("Intel Xeon 8488C", frozenset({"avx2", "avx512f", "amx_bf16", "amx_tile"}), 2)
GPU = ["/physical_device:GPU:0"]


@pytest.mark.parametrize(
    "cpu,gpus,expected",
    [
        (AVX2, [], "fp32"),
        (AVX512, [], "fp32"),
        (AVX512_BF16, [], "bf16"),
        (AMX, [], "bf16"),
        (AVX2, GPU, "fp16"),
        (AMX, GPU, "fp16"),
    ],
)
def test_auto_picks_the_fastest_correct_precision(
    cpu: CpuInfo, gpus: list[str], expected: str
) -> None:
    choice = choose_precision("auto", cpu, gpus)
    assert choice.precision == expected
    assert choice.requested == "auto"
    assert choice.reason and not choice.warnings


def test_auto_says_why_it_kept_fp32() -> None:
    reason = choose_precision("auto", AVX2, []).reason
    assert "no native bf16" in reason and "AVX2" in reason


@pytest.mark.parametrize("cpu", [AVX2, AVX512])
def test_explicit_bf16_without_native_bf16_is_kept_but_warns_it_is_slower(cpu: CpuInfo) -> None:
    choice = choose_precision("bf16", cpu, [])
    assert choice.precision == "bf16"
    assert len(choice.warnings) == 1 and "slower" in choice.warnings[0]


@pytest.mark.parametrize("cpu", [AVX512_BF16, AMX])
def test_explicit_bf16_on_native_bf16_does_not_warn(cpu: CpuInfo) -> None:
    assert choose_precision("bf16", cpu, []).warnings == ()


def test_explicit_fp16_without_a_gpu_warns() -> None:
    assert choose_precision("fp16", AVX512_BF16, []).warnings
    assert not choose_precision("fp16", AVX2, GPU).warnings


# Figures of all-MiniLM-L6-v2's zero-shot intent head (scale 20) in bf16 vs fp32 on the seeded
# probe batch, measured on an AVX2-only EPYC: refused by the old |Δp| <= 0.01 gate.
MINILM_BF16_AVX2 = {
    "max_abs_prob_diff": 0.0189,
    "max_abs_logit_diff": 0.0630,
    "argmax_agreement": 1.0,
    "decisive_agreement": 1.0,
    "max_cos_diff": 0.00315,
}


def test_zero_shot_gate_reads_the_cosine_error_not_the_scaled_probability() -> None:
    assert within(MINILM_BF16_AVX2, Tolerance())
    assert not within({**MINILM_BF16_AVX2, "max_cos_diff": 0.05}, Tolerance())


def test_a_flipped_decisive_row_is_refused_whatever_the_drift() -> None:
    assert not within({**MINILM_BF16_AVX2, "decisive_agreement": 0.875}, Tolerance())


def test_trained_head_gate_bounds_the_probability_drift() -> None:
    trained = {k: v for k, v in MINILM_BF16_AVX2.items() if k != "max_cos_diff"}
    assert not within(trained, Tolerance())
    assert within({**trained, "max_abs_prob_diff": 0.004}, Tolerance())


def test_rows_closer_than_the_decisive_gap_may_flip() -> None:
    expected = {
        "logits": np.array([[0.0, 0.02], [0.0, 3.0]], np.float32),
        "probabilities": np.array([[0.495, 0.505], [0.047, 0.953]], np.float32),
    }
    got = {
        "logits": np.array([[0.02, 0.0], [0.0, 3.0]], np.float32),
        "probabilities": np.array([[0.505, 0.495], [0.047, 0.953]], np.float32),
    }
    figures = measure(expected, got, zero_shot_scale=20.0)
    assert figures["argmax_agreement"] == 0.5 and figures["decisive_agreement"] == 1.0
    assert figures["max_cos_diff"] == pytest.approx(0.001)
    assert within(figures, Tolerance())


def test_a_broken_bf16_conversion_is_refused(hf_classify: Path) -> None:
    from export.model import EncoderModule, run

    ckpt = read_checkpoint(hf_classify)
    broken = dict(ckpt.weights)
    name = "layer_1/output/kernel"  # the last layer's FFN output, scrambled
    broken[name] = np.random.default_rng(0).normal(0, 1, broken[name].shape).astype(np.float32)
    feeds = token_batch(8, 32, ckpt.config.vocab_size, 2, 3, seed=1234)
    reference = run(EncoderModule(ckpt.config, ckpt.weights, task="classify").serve, feeds)
    got = run(EncoderModule(ckpt.config, broken, task="classify", precision="bf16").serve, feeds)
    assert not within(measure(reference, got), Tolerance())


@pytest.mark.parametrize(
    "cpu,expected", [(AVX2, "fp32"), (AVX512_BF16, "bf16")], ids=["avx2", "avx512_bf16"]
)
def test_model_json_records_the_choice_and_the_machine_it_was_verified_on(
    hf_classify: Path, tmp_path: Path, cpu: CpuInfo, expected: str
) -> None:
    result = build(
        hf_classify, "auto", tmp_path, precision="auto", max_seq_len=32, warmup=False,
        cpu=cpu, gpus=[],
    )  # fmt: skip
    info = json.loads((result.path / MODEL_JSON).read_text())
    assert info["precision"] == expected and info["precision_requested"] == "auto"
    assert info["precision_reason"]
    assert info["verified_on"] == {
        "cpu_model": cpu.model,
        "cpu_class": cpu.cpu_class,
        "cpu_flags": cpu.notable_flags,
        "gpu": None,
    }
    assert result.conversion["metric"] == "max_abs_prob_diff"


def _cli(*args: str, flags: str) -> subprocess.CompletedProcess[str]:
    # CUDA_VISIBLE_DEVICES hides any GPU so the injected CPU flags decide.
    env = {**os.environ, "BERTGW_CPU_FLAGS": flags, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, "-m", "export", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip


def test_cli_auto_follows_the_cpu_flags_and_inspect_shows_why(
    hf_classify: Path, tmp_path: Path
) -> None:
    build_args = ["build", "--checkpoint", str(hf_classify), "--name", "c",
                  "--base-path", str(tmp_path), "--max-seq-len", "32", "--no-warmup"]  # fmt: skip
    native = _cli(*build_args, "--precision", "auto", flags="avx2 avx512f avx512_bf16")
    assert native.returncode == 0, native.stderr
    assert "precision bf16 (the CPU has native bf16" in native.stdout
    plain = _cli(*build_args, "--precision", "bf16", flags="avx2 fma")
    assert plain.returncode == 0, plain.stderr
    assert "warning: bf16 on a CPU without native bf16" in plain.stderr
    shown = _cli("inspect", str(tmp_path / "c" / "1"), flags="avx2")
    assert "precision choice auto: the CPU has native bf16" in shown.stdout
    assert "(AVX-512 + bf16: avx2 avx512f avx512_bf16), GPU None" in shown.stdout
