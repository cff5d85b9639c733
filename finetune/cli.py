"""Command line: ``python -m finetune`` (argument parsing and printing only; see finetune/run.py).

Progress lines and the Keras progress bar go to stdout; the last line names the written checkpoint
and its dev/test accuracy. Refusals (bad rows, a one-class training set, dev labels train lacks,
a non-BERT checkpoint, an existing ``--out``) print one ``error: ...`` line to stderr and exit
with status 2; an interrupted run exits with 130 and continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from finetune.training import TrainConfig
from modelformat.errors import FormatError

DEFAULTS = TrainConfig()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m finetune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--checkpoint", required=True, type=Path, help="HF BERT dir (or Google BERT checkpoint)")
    add("--train", required=True, type=Path, help="text<TAB>label TSV")
    add("--dev", required=True, type=Path, help="TSV for early stopping (labels ⊆ train's)")
    add("--test", type=Path, help="TSV scored once at the end (metrics.json)")
    add("--out", required=True, type=Path, help="directory to create (HF layout)")
    add("--epochs", type=int, default=DEFAULTS.epochs)
    add("--batch-size", type=int, default=DEFAULTS.batch_size)
    add("--lr", type=float, default=DEFAULTS.learning_rate, help="peak learning rate")
    add("--max-seq-len", type=int, default=128)
    add("--seed", type=int, default=DEFAULTS.seed)
    add("--patience", type=int, default=DEFAULTS.patience,
        help="stop after this many epochs without a better dev accuracy")  # fmt: skip
    add("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
        help="auto: mixed_float16 on a GPU, mixed_bfloat16 on native bf16, else fp32")  # fmt: skip
    add("--pipeline", choices=["optimised", "naive"], default="optimised")
    add("--resume", action="store_true", help="continue a killed run from its last checkpoint")
    add("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status."""
    args = _parser().parse_args(argv)
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed,
        patience=args.patience, pipeline=args.pipeline, verbose=not args.quiet,
    )  # fmt: skip
    try:
        from finetune.run import finetune

        result = finetune(
            args.checkpoint, args.train, args.dev, args.out, test_path=args.test, config=config,
            precision=args.precision, max_seq_len=args.max_seq_len, resume=args.resume, say=say,
        )  # fmt: skip
    except FormatError as exc:  # FinetuneError, ExportError (not BERT), the publish rule's errors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted; continue with the same command and --resume", file=sys.stderr,
              flush=True)  # fmt: skip
        return 130
    print(result.summary(), flush=True)
    return 0
