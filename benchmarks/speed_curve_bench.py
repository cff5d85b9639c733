"""What a ``speed`` means on two different models: calibrated (issue 23 item 4) against raw.

Two MiniLM-L6 teachers fine-tuned on data/tickets that differ in how sure they are: the demo's
(2 epochs at 1e-4, 56 steps: mean normalised entropy ~0.72 on dev) and one trained 6 epochs
(168 steps), each with students distilled by ``python -m finetune distill-exits``, which
calibrates the speed on dev: speed s skips s of the skippable layers, mean exit layer
L − s·(L−1). Checkpoints: ``$SPEED_CURVE_CHECKPOINTS`` (two paths, comma-separated), else
``run/finetune-demo/tickets-v1-exits`` and ``tickets-6ep-exits`` when there, else trained here
(~8 min on 2 AVX2 cores). ``--quick``: two random 3-layer BERTs, distilled (the figures are noise).

For each model and each speed, the compacting early-exit graph in process (early_exit_bench's
``Graphs``: the 200 test tickets, length-sorted batches of 32) twice: calibrated (the exported
map from speed to entropy threshold) and raw (the same students, speed taken as the threshold,
what the graph did before calibration). Figures: test accuracy, mean exit layer, texts/s against
the full model. The plot (results/speed_curve.png) draws all three against speed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BenchContext, Row, median
from benchmarks.early_exit_bench import DATA, Graphs

REPO = Path(__file__).resolve().parent.parent
PLOT = REPO / "results" / "speed_curve.png"
SPEEDS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
DEMO = REPO / "run" / "finetune-demo"
MODELS = (("demo teacher, 2 epochs", "tickets-v1-exits", 2), ("6 epochs", "tickets-6ep-exits", 6))


def _say(message: str) -> None:
    print(f"  speed_curve: {message}", flush=True)


def checkpoints(ctx: BenchContext) -> list[tuple[str, Path]]:
    """Return (name, distilled checkpoint) of the two models, reused or made here."""
    given = os.environ.get("SPEED_CURVE_CHECKPOINTS")
    if given:
        paths = [Path(p) for p in given.split(",")]
        return [(p.name, p) for p in paths]
    from finetune.exits import DistillConfig, distill_exits

    work = ctx.work_dir / "speed-curve"
    out = []
    for name, folder, epochs in MODELS:
        if not ctx.quick and (DEMO / folder / "config.json").is_file():
            out.append((name, DEMO / folder))
            continue
        teacher = work / f"teacher-{epochs}"
        if ctx.quick:
            from export.tiny import write_hf_checkpoint
            from finetune.data import read_examples

            labels = sorted(set(read_examples(DATA / "train.tsv").labels))
            write_hf_checkpoint(teacher, labels=labels, layers=3, seed=epochs)
            name = f"random 3-layer BERT, seed {epochs}"
        else:
            from finetune.demo import minilm_dir
            from finetune.run import finetune
            from finetune.training import TrainConfig

            _say(f"fine-tuning MiniLM {epochs} epochs (no {DEMO / folder})")
            finetune(minilm_dir(), DATA / "train.tsv", DATA / "dev.tsv", teacher,
                     config=TrainConfig(epochs=epochs, batch_size=32, learning_rate=1e-4,
                                        patience=epochs, verbose=False),
                     precision="fp32", max_seq_len=128, say=_say)  # fmt: skip
        distilled = work / f"{teacher.name}-exits"
        distill_exits(teacher, DATA / "train.tsv", DATA / "dev.tsv", distilled,
                      config=DistillConfig(epochs=3 if ctx.quick else 30), say=_say)  # fmt: skip
        out.append((name, distilled))
    return out


class _Curves(Graphs):
    """early_exit_bench's graphs plus the same students with the speed read raw."""

    def __init__(self, checkpoint: Path, texts: Sequence[str], labels: Sequence[str]) -> None:
        super().__init__(checkpoint, texts, labels)
        from export.model import EncoderModule

        ckpt = self.ckpt
        raw = {k: v for k, v in (ckpt.exits or {}).items() if k != "calibration"}
        self.raw = EncoderModule(ckpt.config, ckpt.weights, task="classify", pooling="cls",
                              early_exit=raw).serve  # fmt: skip
        self.table = ((ckpt.exits or {}).get("calibration") or {}).get("thresholds")


def measure_model(curves: _Curves, repeats: int) -> dict[str, Any]:
    """Return the full model's accuracy and texts/s, and per mode and speed the figures."""
    from benchmarks.early_exit_bench import BATCH

    n = curves.texts[BATCH]
    modes = {"calibrated": curves.compact, "raw": curves.raw}
    plan: list[tuple[str, float | None, Any]] = [("full", None, curves.full)]
    plan += [(mode, s, fn) for mode, fn in modes.items() for s in SPEEDS]
    times: dict[tuple[str, float | None], list[float]] = {}
    outs: dict[tuple[str, float | None], dict[str, np.ndarray]] = {}
    for _mode, speed, fn in plan:  # trace, untimed
        curves.run(fn, BATCH, speed)
    for _ in range(repeats):
        for mode, speed, fn in plan:
            seconds, out = curves.run(fn, BATCH, speed)
            times.setdefault((mode, speed), []).append(seconds)
            outs.setdefault((mode, speed), out)
    full_pred = outs[("full", None)]["logits"].argmax(-1)
    full_tps = n / median(times[("full", None)])
    result: dict[str, Any] = {
        "num_layers": curves.num_layers,
        "texts": n,
        "full": {"accuracy": float((full_pred == curves.truth).mean()), "texts_s": full_tps},
        "thresholds": curves.table,
    }
    for mode in modes:
        result[mode] = {}
        for speed in SPEEDS:
            out = outs[(mode, speed)]
            pred = out["logits"].argmax(-1)
            result[mode][str(speed)] = {
                "accuracy": float((pred == curves.truth).mean()),
                "agreement": float((pred == full_pred).mean()),
                "layers": float(out["exit_layer"].mean()),
                "speedup": n / median(times[(mode, speed)]) / full_tps,
            }
    return result


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Three panels against speed: mean exit layer, test accuracy, texts/s ÷ full model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    panels = (("layers", "mean exit layer"), ("accuracy", "test accuracy (%)"),
              ("speedup", "texts/s ÷ full model (batch 32)"))  # fmt: skip
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for (name, r), colour in zip(results.items(), colours, strict=False):
        for mode, style in (("calibrated", "-o"), ("raw", ":s")):
            for ax, (key, _) in zip(axes, panels, strict=True):
                ys = [r[mode][str(s)][key] * (100 if key == "accuracy" else 1) for s in SPEEDS]
                ax.plot(
                    SPEEDS,
                    ys,
                    style,
                    color=colour,
                    ms=4,
                    alpha=1.0 if mode == "calibrated" else 0.6,
                    label=f"{name}, {mode}",
                )
    layers = next(iter(results.values()))["num_layers"]
    axes[0].plot(SPEEDS, [layers - s * (layers - 1) for s in SPEEDS], "k--", lw=1,
                 label="calibration's aim L − s·(L−1)")  # fmt: skip
    for ax, (_, label) in zip(axes, panels, strict=True):
        ax.set_xlabel("speed")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows(results: dict[str, dict[str, Any]], cpu_class: str) -> list[Row]:
    """Return one row per model and speed (calibrated, raw beside it), and the spread."""
    out = []
    for name, r in results.items():
        full = r["full"]
        out.append(Row(f"speed curve, {name}: full model accuracy / texts/s b32",
                       f"{full['accuracy']:.3f} / {full['texts_s']:.0f}", "", "",
                       f"{r['texts']} test tickets, in process; {cpu_class}"))  # fmt: skip
        for speed in SPEEDS:
            c, w = r["calibrated"][str(speed)], r["raw"][str(speed)]
            out.append(Row(
                f"  {name}, speed {speed:g}: layers / accuracy / speed-up",
                f"calibrated {c['layers']:.2f} / {c['accuracy']:.3f} / {c['speedup']:.2f}×; "
                f"raw {w['layers']:.2f} / {w['accuracy']:.3f} / {w['speedup']:.2f}×",
                "", f"layers {r['num_layers'] - speed * (r['num_layers'] - 1):.2f}",
                "calibrated: the exported map; raw: the same students, speed = threshold",
            ))  # fmt: skip
    if len(results) == 2:
        a, b = results.values()
        for mode in ("calibrated", "raw"):
            gaps = [abs(a[mode][str(s)]["layers"] - b[mode][str(s)]["layers"]) for s in SPEEDS]
            speeds = ", ".join(f"{s:g}" for s in SPEEDS)
            out.append(Row(
                f"speed curve: largest gap in mean exit layer between the models, {mode}",
                f"{max(gaps):.2f} layers", "", "", f"over speeds {speeds}; {cpu_class}",
            ))  # fmt: skip
    return out


def run(ctx: BenchContext) -> list[Row]:
    """Get both models, measure both curves, plot them (not in --quick), return the rows."""
    from finetune.data import read_examples

    test = read_examples(DATA / "test.tsv")
    results = {}
    for name, checkpoint in checkpoints(ctx):
        _say(f"{name}: {checkpoint}")
        curves = _Curves(checkpoint, test.texts, test.labels)
        results[name] = measure_model(curves, 1 if ctx.quick else min(ctx.repeats, 3))
    out = rows(results, ctx.cpu.cpu_class)
    if not ctx.quick:
        plot(
            results, PLOT, f"What a speed means on two fine-tuned MiniLM-L6 ({ctx.cpu.describe()})"
        )
        PLOT.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        ctx.notes.append(f"speed_curve_bench: plot in {PLOT.relative_to(REPO)}")
    return out
