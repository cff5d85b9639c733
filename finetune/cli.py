"""Command line: ``python -m finetune [train]`` and ``python -m finetune distill-exits``.

Argument parsing and printing only (finetune/run.py fine-tunes, finetune/exits.py distils
early-exit students). ``--task`` picks the head and its file format: classify (default),
pair-classify, multi-label, tag. Progress lines and the Keras progress bar go to stdout; the last
line names the written checkpoint and its dev/test figures. Refusals (bad rows, a one-class
training set, dev labels train lacks, a checkpoint of an unsupported architecture, an existing
``--out``) print one ``error: ...`` line to stderr and exit with status 2; an interrupted
fine-tuning run exits with 130 and continues with ``--resume``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from finetune.data import DEFAULT_LABEL_DELIMITER
from finetune.exits import DistillConfig
from finetune.tasks import TASKS, TaskOptions
from finetune.training import TrainConfig
from modelformat.errors import FormatError

DEFAULTS = TrainConfig()
DISTILL_DEFAULTS = DistillConfig()
DISTILL = "distill-exits"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m finetune",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add(
        "--checkpoint",
        required=True,
        type=Path,
        help="HF dir of a supported architecture (or a Google BERT checkpoint)",
    )
    add("--task", choices=list(TASKS), default="classify",
        help="classify: text<TAB>label TSV; pair-classify: text_a<TAB>text_b<TAB>label TSV; "
        "multi-label: text<TAB>labels TSV; tag: entity-span JSONL (see finetune/README.md)",
    )  # fmt: skip
    add("--train", required=True, type=Path, help="training file, in the --task's format")
    add("--dev", required=True, type=Path, help="file for early stopping (labels ⊆ train's)")
    add("--test", type=Path, help="file scored once at the end (metrics.json)")
    add("--num-labels", type=int,
        help="pair-classify only: 1 trains a one-logit cross-encoder (relevance score, sigmoid, "
        "binary cross-entropy; labels 0/1 or irrelevant/relevant)")  # fmt: skip
    add("--label-delimiter", default=DEFAULT_LABEL_DELIMITER,
        help="multi-label only: what separates a row's labels (default %(default)r)")  # fmt: skip
    add("--out", required=True, type=Path, help="directory to create (HF layout)")
    add("--epochs", type=int, default=DEFAULTS.epochs)
    add("--batch-size", type=int, default=DEFAULTS.batch_size)
    add("--lr", type=float, default=DEFAULTS.learning_rate, help="peak learning rate")
    add("--max-seq-len", type=int, default=128)
    add("--seed", type=int, default=DEFAULTS.seed)
    add("--patience", type=int, default=DEFAULTS.patience,
        help="stop after this many epochs without a better dev figure (accuracy; micro-F1 for "
        "multi-label and tag)")  # fmt: skip
    add("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
        help="auto: mixed_float16 on a GPU, mixed_bfloat16 on native bf16, else fp32")  # fmt: skip
    add("--pipeline", choices=["optimised", "naive"], default="optimised")
    add("--resume", action="store_true", help="continue a killed run from its last checkpoint")
    add("--quiet", action="store_true", help="no progress bar")
    return parser


def _distill_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python -m finetune {DISTILL}",
        description="Train early-exit students (one per layer 1..L-1) to match a fine-tuned "
        "checkpoint's head (self-distillation; labels not needed) and write the checkpoint with "
        "them (finetune/README.md, 'Early exits').",
    )
    add = parser.add_argument
    add("--checkpoint", required=True, type=Path, help="fine-tuned HF dir (trained head)")
    add("--texts", required=True, type=Path, help="text<TAB>label TSV or one text per line")
    add("--dev", required=True, type=Path, help="texts for agreement (labels: also accuracy)")
    add("--out", required=True, type=Path, help="directory to create (HF layout)")
    add("--pooling", choices=["auto", "mean", "cls"], default=DISTILL_DEFAULTS.pooling,
        help="auto: train both, keep the higher mean dev agreement")  # fmt: skip
    add("--width", type=int, default=DISTILL_DEFAULTS.width, help="student hidden width")
    add("--epochs", type=int, default=DISTILL_DEFAULTS.epochs)
    add("--lr", type=float, default=DISTILL_DEFAULTS.learning_rate)
    add("--batch-size", type=int, default=DISTILL_DEFAULTS.batch_size)
    add("--seed", type=int, default=DISTILL_DEFAULTS.seed)
    add("--max-seq-len", type=int, help="default: the checkpoint's fine-tuning length, else 128")
    return parser


def _sayer() -> Callable[[str], None]:
    started = time.perf_counter()

    def say(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    return say


def distill_main(argv: Sequence[str]) -> int:
    """Run ``distill-exits`` and return the exit status."""
    args = _distill_parser().parse_args(argv)
    config = DistillConfig(
        pooling=args.pooling, width=args.width, epochs=args.epochs, learning_rate=args.lr,
        batch_size=args.batch_size, seed=args.seed, max_seq_len=args.max_seq_len,
    )  # fmt: skip
    try:
        from finetune.exits import distill_exits

        result = distill_exits(args.checkpoint, args.texts, args.dev, args.out, config=config,
                               say=_sayer())  # fmt: skip
    except (
        FormatError
    ) as exc:  # FinetuneError, ExportError (unsupported), the publish rule's errors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    print(f"\nexits on {args.dev} ({result.report['dev']['texts']} texts):\n{result.table()}\n")
    print(result.summary(), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == [DISTILL]:
        return distill_main(argv[1:])
    if argv[:1] == ["train"]:
        argv = argv[1:]
    args = _parser().parse_args(argv)
    say = _sayer()

    config = TrainConfig(
        epochs=args.epochs, batch_size=args.batch_size, learning_rate=args.lr, seed=args.seed,
        patience=args.patience, pipeline=args.pipeline, verbose=not args.quiet,
    )  # fmt: skip
    try:
        from finetune.run import finetune

        result = finetune(
            args.checkpoint, args.train, args.dev, args.out, test_path=args.test, config=config,
            precision=args.precision, max_seq_len=args.max_seq_len, resume=args.resume, say=say,
            task=TaskOptions(task=args.task, num_labels=args.num_labels,
                             label_delimiter=args.label_delimiter),
        )  # fmt: skip
    except (
        FormatError
    ) as exc:  # FinetuneError, ExportError (unsupported), the publish rule's errors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        print("interrupted; continue with the same command and --resume", file=sys.stderr,
              flush=True)  # fmt: skip
        return 130
    print(result.summary(), flush=True)
    return 0
