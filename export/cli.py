"""Command line: ``python -m export build|inspect|verify`` (argument parsing and printing only).

Progress lines go to stdout as they happen; the last line of ``build`` names the published
directory, its size and the measured conversion error. Failures print ``error: ...`` to stderr
and exit with status 1 (2 for bad arguments, 130 when interrupted).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelformat.errors import FormatError
from modelformat.heads import PROBLEM_TYPES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="export a checkpoint as a new model version")
    b.add_argument("--checkpoint", required=True, type=Path,
                   help="HF dir of a supported architecture (docs/reference/supported-models.md), "
                        "Google BERT dir, or a Google ckpt prefix")  # fmt: skip
    b.add_argument("--name", required=True, help="model name (directory under --base-path)")
    b.add_argument("--base-path", required=True, type=Path)
    b.add_argument("--version", type=int, help="default: newest + 1")
    b.add_argument("--task", choices=["classify", "embed", "tag"], default="classify",
                   help="tag: token classification (NER), ...ForTokenClassification")  # fmt: skip
    b.add_argument("--problem-type", choices=list(PROBLEM_TYPES),
                   help="classify: override config.json's problem_type (default: its value, "
                        "else single_label_classification)")  # fmt: skip
    b.add_argument(
        "--text-pair",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="classify: a sentence-pair model (default: config.json's text_pair)",
    )
    b.add_argument("--precision", choices=["auto", "fp32", "fp16", "bf16"], default="fp32",
                   help="auto: fp16 on a GPU, bf16 on native-bf16 CPUs, else fp32")  # fmt: skip
    b.add_argument("--max-seq-len", type=int, default=None,
                   help="longest input in tokens, specials included; longer texts are cut or "
                   "windowed (default: 128, or the tokenizer's model_max_length where that is "
                   "lower; model.json's max_seq_len_source says which)")  # fmt: skip
    b.add_argument("--labels", type=Path, help="file with one label per line (head order)")
    b.add_argument("--label-prompts", type=Path,
                   help="zero-shot head: lines of 'label<TAB>description'")  # fmt: skip
    b.add_argument("--pooling", choices=["mean", "cls"],
                   help="embed: sentence vectors of a checkpoint that doesn't say (default mean); "
                        "a sentence-transformers checkpoint's modules.json decides")  # fmt: skip
    b.add_argument("--top-k", type=int, default=None,
                   help="SPLADE (a sentence-transformers SparseEncoder): the largest pooled "
                        "weights per text (default 256, at most the vocabulary)")  # fmt: skip
    b.add_argument("--outputs", metavar="KINDS",
                   help="embed: the kinds to serve, some of dense,sparse,multivector (default: "
                        "what the checkpoint has: FlagEmbedding's sparse_linear.pt + "
                        "colbert_linear.pt give all three, a ColBERT multivector); a kind the "
                        "checkpoint lacks is refused")  # fmt: skip
    b.add_argument("--no-warmup", action="store_true", help="skip the warmup records")
    b.add_argument("--cased", action="store_true", help="do not lower-case (Google checkpoints)")
    b.add_argument("--early-exit", action="store_true",
                   help="serve the checkpoint's distilled students (finetune distill-exits): "
                        "a per-row speed input, an exit_layer output")  # fmt: skip
    b.add_argument("--default-speed", type=float, default=0.0,
                   help="--early-exit: the gateway's speed for requests without one")  # fmt: skip
    _tolerance_flags(b)

    i = sub.add_parser("inspect", help="show a version's signature, model.json and size")
    i.add_argument("path", type=Path)
    i.add_argument("--json", action="store_true", help="print JSON")

    v = sub.add_parser("verify", help="run a version's warmup records; compare with another")
    v.add_argument("path", type=Path)
    v.add_argument("--against", type=Path, help="another version directory to compare with")
    _tolerance_flags(v)
    return parser


def _tolerance_flags(parser: argparse.ArgumentParser) -> None:
    """Add the conversion gate's flags (defaults from export.build.Tolerance)."""
    parser.add_argument("--max-prob-diff", type=float, default=1e-2,
                        help="trained heads: max |Δprobability| vs fp32")  # fmt: skip
    parser.add_argument("--max-cos-diff", type=float, default=1e-2,
                        help="zero-shot heads: max |Δlogit|/scale vs fp32")  # fmt: skip
    parser.add_argument("--min-cosine", type=float, default=0.999,
                        help="embeddings: min cosine vs fp32")  # fmt: skip
    parser.add_argument("--max-token-prob-diff", type=float, default=5e-2,
                        help="tag heads: max |Δprobability| over real tokens vs fp32")  # fmt: skip
    parser.add_argument("--max-score-diff", type=float, default=1e-2,
                        help="regression: max |Δscore| / max(1, max |score|) vs fp32")  # fmt: skip
    parser.add_argument("--min-topk-overlap", type=float, default=0.9,
                        help="SPLADE: min share of fp32's top-k kept (worst text)")  # fmt: skip
    parser.add_argument("--max-sparse-value-diff", type=float, default=5e-2,
                        help="SPLADE: max |Δvalue| / max(1, a text's largest) vs fp32")  # fmt: skip
    parser.add_argument("--min-token-weight-cosine", type=float, default=0.99,
                        help="retrieval token weights (BGE-M3's sparse): min cosine of each "
                             "text's weights vs fp32")  # fmt: skip


def _tolerance(args: argparse.Namespace) -> Any:
    from export.gates import Tolerance

    return Tolerance(
        max_prob_diff=args.max_prob_diff, max_cos_diff=args.max_cos_diff,
        min_cosine=args.min_cosine, max_score_diff=args.max_score_diff,
        max_token_prob_diff=args.max_token_prob_diff, min_topk_overlap=args.min_topk_overlap,
        max_sparse_value_diff=args.max_sparse_value_diff,
        min_token_weight_cosine=args.min_token_weight_cosine,
    )  # fmt: skip


def _build(args: argparse.Namespace) -> int:
    from export.build import build
    from export.checkpoint import read_labels_file

    started = time.perf_counter()

    def progress(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", flush=True)

    result = build(
        args.checkpoint, args.name, args.base_path, version=args.version, task=args.task,
        precision=args.precision, max_seq_len=args.max_seq_len,
        labels=read_labels_file(args.labels) if args.labels else None,
        label_prompts=args.label_prompts, pooling=args.pooling, warmup=not args.no_warmup,
        tolerance=_tolerance(args),
        progress=progress, do_lower_case=False if args.cased else None,
        early_exit=args.early_exit, default_speed=args.default_speed,
        problem_type=args.problem_type, text_pair=args.text_pair, top_k=args.top_k,
        outputs=args.outputs,
    )  # fmt: skip
    print(result.summary(), flush=True)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    return 0


def _print_inspection(report: dict[str, Any]) -> None:
    model = report["model"]
    print(f"version          {report['path']}")
    print(f"size             {report['size_bytes'] / 1e6:.2f} MB "
          f"(variables {report['variables_bytes'] / 1e6:.2f} MB)")  # fmt: skip
    for key in ("name", "task", "problem_type", "score_activation", "text_pair", "thresholds",
                "label_scheme", "precision", "max_seq_len", "do_lower_case", "pooling",
                "zero_shot", "labels", "hidden_size", "num_layers", "vocab_size",
                "embedding_dim", "outputs", "tokenizer", "sentence_transformers", "early_exit",
                "exporter_version", "created_at"):  # fmt: skip
        print(f"{key:<17}{model.get(key)}")
    if "precision_requested" in model:  # versions exported before auto existed lack these
        print(f"precision choice {model['precision_requested']}: {model.get('precision_reason')}")
        machine = model.get("verified_on") or {}
        print(f"verified on      {machine.get('cpu_model')} ({machine.get('cpu_class')}: "
              f"{' '.join(machine.get('cpu_flags', []))}), GPU {machine.get('gpu')}")  # fmt: skip
    print(f"source           {model.get('source')}")
    print(f"conversion       {model.get('conversion')}")
    print(f"warmup           {report['warmup_records']} records")
    for kind in ("inputs", "outputs"):
        for name, desc in report["signature"][kind].items():
            print(f"{kind[:-1]:<17}{name}: {desc}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line and return the exit status."""
    args = _parser().parse_args(argv)
    from export.lean_tf import import_tensorflow

    import_tensorflow()  # every command reads or writes a SavedModel
    try:
        if args.command == "build":
            return _build(args)
        if args.command == "inspect":
            from export.inspection import inspect_version

            report = inspect_version(args.path)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                _print_inspection(report)
            return 0
        from export.inspection import verify_version

        figures = verify_version(args.path, args.against, _tolerance(args))
        print(json.dumps(figures, indent=2))
        ok = figures["all_finite"] and figures.get("within_tolerance", True)
        return 0 if ok else 1
    except FormatError as exc:  # ExportError and the publish rule's errors
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("interrupted; nothing was published", file=sys.stderr, flush=True)
        return 130
