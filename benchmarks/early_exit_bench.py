"""Early exits (FastBERT): accuracy, agreement, layers and texts/s per ``speed``, side by side.

Model: all-MiniLM-L6-v2 fine-tuned on data/tickets/train.tsv (2 epochs, as ``make finetune-demo``)
with students distilled on the same texts (``python -m finetune distill-exits``), both made in
this run. Data: the 200 tickets of data/tickets/test.tsv, tokenized with the model's vocabulary,
sorted by length and padded to the gateway's buckets (batches of similar lengths, as the gateway
groups a request's texts). Graphs: export's module run in process as ``tf.function`` s with the
served signature (``[None, None]`` token inputs, per-row ``speed``) — the graph TF Serving would
run, without the RPC; three of them over the same weights:

- the full model (no students): the baseline every ratio is against;
- early exits with compaction: exited rows leave the batch (what ``--early-exit`` exports);
- early exits without compaction: every row runs until the batch's last row exits (FastBERT's
  batch behaviour), outputs selected afterwards.

At batch 1 the two early-exit graphs do the same work, so batch 1 is measured with compaction
only, on every 4th ticket of the length-sorted split (50 texts, all lengths) to keep the run
short. Accuracy, agreement and layers come from the batch-32 pass over all 200. Each figure is
the median over repeats, modes interleaved within a repeat.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BenchContext, Row, median

DATA = Path(__file__).resolve().parent.parent / "data" / "tickets"
PLOT = Path(__file__).resolve().parent.parent / "results" / "early_exit.png"
# the thresholds, plus 0.6 and 0.7 where a fine-tuned teacher's students start to exit
SPEEDS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8)
BATCH = 32
MAX_SEQ_LEN = 128
EPOCHS = 2


def distilled_checkpoint(work: Path, say: Callable[[str], None]) -> Path:
    """Fine-tune MiniLM on the tickets and distill its students; return the checkpoint."""
    from finetune.demo import minilm_dir
    from finetune.exits import DistillConfig, distill_exits
    from finetune.run import finetune
    from finetune.training import TrainConfig

    tuned = work / "minilm-tickets"
    finetune(
        minilm_dir(), DATA / "train.tsv", DATA / "dev.tsv", tuned,
        config=TrainConfig(epochs=EPOCHS, batch_size=32, learning_rate=1e-4, verbose=False),
        precision="fp32", max_seq_len=MAX_SEQ_LEN, say=say,
    )  # fmt: skip
    out = work / "minilm-tickets-exits"
    distill_exits(tuned, DATA / "train.tsv", DATA / "dev.tsv", out, config=DistillConfig(),
                  say=say)  # fmt: skip
    return out


class Graphs:
    """The three graphs over one checkpoint's weights, and the test split as padded batches."""

    def __init__(self, checkpoint: Path, texts: Sequence[str], labels: Sequence[str]) -> None:
        import tensorflow as tf

        from backend.tokenization import BertTokenizer
        from export.checkpoint import read_checkpoint
        from export.model import EncoderModule
        from finetune.pipeline import sorted_batches

        ckpt = read_checkpoint(checkpoint)
        self.ckpt = ckpt  # subclasses build more graphs over the same weights
        self.num_layers = ckpt.config.num_layers

        def module(**kwargs: Any) -> Any:
            return EncoderModule(
                ckpt.config, ckpt.weights, task="classify", pooling="cls", **kwargs
            )

        self.full = module().serve
        self.compact = module(early_exit=ckpt.exits).serve
        self.masked = module(early_exit=ckpt.exits, compaction=False).serve
        tokenizer = BertTokenizer.from_files(checkpoint / "vocab.txt", max_seq_len=MAX_SEQ_LEN,
                                             do_lower_case=ckpt.do_lower_case)  # fmt: skip
        rows = [e.ids for e in tokenizer.encode(list(texts))]

        def batches(size: int, rows: list[Any]) -> list[tuple[list[int], dict[str, Any]]]:
            return [(chunk, {k: tf.constant(v) for k, v in feeds.items()})
                    for chunk, feeds in sorted_batches(rows, size, MAX_SEQ_LEN,
                                                       tokenizer.pad_id)]  # fmt: skip

        by32 = batches(BATCH, rows)
        self.order = [i for chunk, _ in by32 for i in chunk]  # the length-sorted test split
        self.truth = np.array([ckpt.labels.index(y) for y in labels])[self.order]
        # batch 1: every 4th of the length-sorted texts
        every_4th = [rows[i] for i in self.order[::4]]
        self.batches = {BATCH: [f for _, f in by32], 1: [f for _, f in batches(1, every_4th)]}
        self.texts = {size: sum(int(f["input_ids"].shape[0]) for f in feeds)
                      for size, feeds in self.batches.items()}  # fmt: skip

    def run(self, fn: Any, size: int, speed: float | None) -> tuple[float, dict[str, np.ndarray]]:
        """Return (seconds, outputs in sorted-test order) of one pass over the test split."""
        import tensorflow as tf

        feeds = self.batches[size]
        speeds = [None if speed is None else tf.fill([f["input_ids"].shape[0]], speed)
                  for f in feeds]  # fmt: skip
        outs = []
        started = time.perf_counter()
        for batch, s in zip(feeds, speeds, strict=True):
            outs.append(fn(**batch) if s is None else fn(**batch, speed=s))
        seconds = time.perf_counter() - started
        merged = {k: np.concatenate([o[k].numpy() for o in outs]) for k in outs[0]}
        return seconds, merged


def measure(graphs: Graphs, repeats: int) -> dict[str, Any]:
    """Return per speed: accuracy, agreement, mean layers, texts/s per mode; and the full model."""
    n, n1 = graphs.texts[BATCH], graphs.texts[1]
    times: dict[tuple[str, Any], list[float]] = {}
    outputs: dict[Any, dict[str, np.ndarray]] = {}
    plan: list[tuple[str, Any, Any, int, float | None]] = [
        ("full b1", None, graphs.full, 1, None),
        ("full b32", None, graphs.full, BATCH, None),
    ]
    for speed in SPEEDS:
        plan += [
            ("compact b1", speed, graphs.compact, 1, speed),
            ("compact b32", speed, graphs.compact, BATCH, speed),
            ("masked b32", speed, graphs.masked, BATCH, speed),
        ]
    for _, _, fn, size, arg in plan:  # trace every shape once, untimed
        graphs.run(fn, size, arg)
    for _ in range(repeats):
        for mode, speed, fn, size, arg in plan:
            seconds, out = graphs.run(fn, size, arg)
            times.setdefault((mode, speed), []).append(seconds)
            if mode in ("full b32", "compact b32"):
                outputs.setdefault(speed, out)
    full_pred = outputs[None]["logits"].argmax(-1)
    result: dict[str, Any] = {
        "texts": n,
        "num_layers": graphs.num_layers,
        "full": {
            "accuracy": float((full_pred == graphs.truth).mean()),
            "b1": n1 / median(times[("full b1", None)]),
            "b32": n / median(times[("full b32", None)]),
        },
        "speeds": {},
    }
    for speed in SPEEDS:
        out = outputs[speed]
        pred = out["logits"].argmax(-1)
        result["speeds"][speed] = {
            "accuracy": float((pred == graphs.truth).mean()),
            "agreement": float((pred == full_pred).mean()),
            "layers": float(out["exit_layer"].mean()),
            "b1": n1 / median(times[("compact b1", speed)]),
            "b32": n / median(times[("compact b32", speed)]),
            "b32_masked": n / median(times[("masked b32", speed)]),
        }
    return result


def chosen_speed(result: dict[str, Any]) -> float | None:
    """Return the fastest speed (batch 32) that costs at most 1 point of accuracy, or None."""
    floor = result["full"]["accuracy"] - 0.01 - 1e-9
    ok = [s for s, f in result["speeds"].items() if f["accuracy"] >= floor]
    return max(ok, key=lambda s: result["speeds"][s]["b32"]) if ok else None


def plot(result: dict[str, Any], path: Path, title: str) -> None:
    """Accuracy against texts/s, one curve per mode, each point labelled with its speed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    speeds = result["speeds"]
    full = result["full"]
    curves = (("b32", "batch 32, compaction", "o", "tab:blue"),
              ("b32_masked", "batch 32, no compaction", "s", "tab:orange"),
              ("b1", "batch 1", "^", "tab:green"))  # fmt: skip
    for key, label, marker, colour in curves:
        xs = [speeds[s][key] for s in SPEEDS]
        ys = [100 * speeds[s]["accuracy"] for s in SPEEDS]
        ax.plot(xs, ys, marker=marker, color=colour, label=label)
        if key == "b32_masked":
            continue
        for s, x, y in zip(SPEEDS, xs, ys, strict=True):
            # speeds where no text exits yet sit on one point: label only the first of them
            if s > 0 and speeds[s]["layers"] >= result["num_layers"] - 1e-9:
                continue
            ax.annotate(f"{s:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8, color=colour)  # fmt: skip
    for key, label, colour in (("b32", "full model, batch 32", "black"),
                               ("b1", "full model, batch 1", "grey")):  # fmt: skip
        ax.scatter([full[key]], [100 * full["accuracy"]], marker="*", s=160, zorder=5,
                   color=colour, label=label)  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("texts/s (log scale; in process, same graph TF Serving runs)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rows(result: dict[str, Any], cpu_class: str) -> list[Row]:
    """Return the benchmark table's rows for ``result``."""
    how = (f"{result['texts']} test tickets, fine-tuned MiniLM-L6 + distilled students, in "
           f"process, median of repeats")  # fmt: skip
    full = result["full"]
    out = [
        Row("early exit: full model (no students), test accuracy / texts/s b1 / b32",
            f"{full['accuracy']:.3f} / {full['b1']:.0f} / {full['b32']:.0f}", how=how),
    ]  # fmt: skip
    for speed, f in result["speeds"].items():
        out.append(Row(
            f"early exit speed {speed:g}: accuracy / agreement / mean layers",
            f"{f['accuracy']:.3f} / {f['agreement']:.3f} / {f['layers']:.2f}",
            f"b1 {f['b1'] / full['b1']:.2f}×, b32 {f['b32'] / full['b32']:.2f}×, b32 no "
            f"compaction {f['b32_masked'] / full['b32']:.2f}× the full model",
            how=f"texts/s b1 {f['b1']:.0f}, b32 {f['b32']:.0f}, b32 no compaction "
                f"{f['b32_masked']:.0f}",
        ))  # fmt: skip
    speed = chosen_speed(result)
    if speed is None:
        out.append(Row("early exit: speed costing ≤ 1 point of accuracy", "none of the speeds"))
        return out
    f = result["speeds"][speed]
    out += [
        Row(f"early exit at speed {speed:g} (fastest ≤ 1 point): b32 texts/s vs the full model",
            f"{f['b32']:.0f} vs {full['b32']:.0f}", f"{f['b32'] / full['b32']:.2f}×", "≥ 2×",
            how=f"accuracy {f['accuracy']:.3f} vs {full['accuracy']:.3f}; {cpu_class}"),
        Row(f"early exit at speed {speed:g}: b32 compaction vs no compaction",
            f"{f['b32']:.0f} vs {f['b32_masked']:.0f} texts/s",
            f"{f['b32'] / f['b32_masked']:.2f}×", "≥ 1.5×", how=how),
    ]  # fmt: skip
    return out


def run(ctx: BenchContext) -> list[Row]:
    """Make the checkpoint, measure every speed and mode, draw the plot, return the rows."""
    from finetune.data import read_examples

    def say(message: str) -> None:
        print(f"  {message}", flush=True)

    with tempfile.TemporaryDirectory(prefix="early-exit-", dir=ctx.work_dir) as tmp:
        checkpoint = distilled_checkpoint(Path(tmp), say)
        test = read_examples(DATA / "test.tsv")
        graphs = Graphs(checkpoint, test.texts, test.labels)
        result = measure(graphs, 1 if ctx.quick else min(ctx.repeats, 3))
    title = f"Early exits on data/tickets/test.tsv, MiniLM-L6 fine-tuned ({ctx.cpu.describe()})"
    plot(result, PLOT, title)
    PLOT.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    ctx.notes.append(f"early_exit_bench: plot in {PLOT.relative_to(PLOT.parent.parent)} "
                     "(figures in early_exit.json beside it)")  # fmt: skip
    return rows(result, ctx.cpu.cpu_class)
