"""``finetune``: a BERT-family checkpoint and labelled files in, a fine-tuned HF checkpoint out.

The task (finetune/tasks.py) decides the file format, the head, the loss and the figures:
single-text classification by default, sentence pairs, multi-label or token tagging.

Steps: check the arguments and ``--out``, read the checkpoint (export's reader) and the data (every
bad row reported), choose the precision (export's machine-based rule, as a Keras policy), tokenize
with the gateway's tokenizer, train (finetune/training.py, resumable), score dev and test, and
publish ``--out`` atomically (finetune/output.py). Every refusal is a ``FinetuneError`` or
``ExportError`` raised before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from export.checkpoint import read_checkpoint
from export.hardware import CpuInfo, cpu_info
from finetune.data import check_eval_set
from finetune.errors import FinetuneError
from finetune.metrics import scores
from finetune.output import publishing, state_dir, write_checkpoint
from finetune.pipeline import PIPELINES, UNCUT
from finetune.tasks import Task, TaskOptions, make_task
from finetune.training import Say, Split, TrainConfig
from modelformat.publish import remove_tree

RUN_JSON = "run.json"  # the settings a run's state was made with (checked on --resume)


@dataclass(frozen=True)
class FinetuneResult:
    """The published checkpoint and what metrics.json says about it."""

    out: Path
    metrics: dict[str, Any]

    def summary(self) -> str:
        """Return the one-line summary the CLI prints last."""
        m = self.metrics
        if m.get("task", "classify") == "classify":
            test = m.get("test")
            test_part = f", test accuracy {test['accuracy']:.4f}" if test else ""
            figures = (f"dev accuracy {m['dev']['accuracy']:.4f}, macro-F1 "
                       f"{m['dev']['macro_f1']:.4f}{test_part}")  # fmt: skip
        else:
            figures = "; ".join(f"{split} {m['headline'][split]}" for split in ("dev", "test")
                                if split in m["headline"])  # fmt: skip
            figures = f"{m['task']}: {figures}"
        return (
            f"wrote {self.out} ({figures}; {m['precision']['used']}, "
            f"{m['pipeline']} pipeline, {m['wall_s']:.1f}s)"
        )


def check_out(out: Path, resume: bool) -> None:
    """Refuse an existing ``out`` and leftover state that ``resume`` does not claim."""
    if out.exists():
        if resume:
            raise FinetuneError(f"{out} is already a finished checkpoint; nothing to resume")
        raise FinetuneError(f"{out} exists; choose another --out (or --resume a killed run)")
    state = state_dir(out)
    if state.exists() and not resume:
        raise FinetuneError(
            f"a killed run left its training state in {state}: pass --resume to continue it, "
            "or delete that directory to start over"
        )


def _claim_state(state: Path, settings: dict[str, Any]) -> None:
    """Create the training-state directory, or check a resumed one was made by the same run."""
    path = state / RUN_JSON
    try:
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            changed = sorted(
                k for k in settings if saved.get(k) != settings[k] and k != "data_sha256"
            )
            if changed:
                raise FinetuneError(
                    f"--resume with other settings than the killed run ({', '.join(changed)} "
                    f"differ; see {path}): rerun it with the same ones"
                )
            if saved.get("data_sha256") != settings["data_sha256"]:
                files = sorted(
                    name for name, digest in settings["data_sha256"].items()
                    if saved.get("data_sha256", {}).get(name) != digest
                )  # fmt: skip
                raise FinetuneError(
                    f"--resume with other data than the killed run: the {', '.join(files)} "
                    f"file{'s' if len(files) > 1 else ''} changed since it started (see {path}); "
                    "resume with the same files, or delete the state directory to start over"
                )
            return
        state.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise FinetuneError(f"cannot write training state in {state}: {exc.strerror}") from exc


def _check_config(config: TrainConfig, max_seq_len: int) -> None:
    if config.pipeline not in PIPELINES:
        raise FinetuneError(f"pipeline must be one of {list(PIPELINES)}, got {config.pipeline!r}")
    at_least_one = (
        ("epochs", config.epochs), ("batch size", config.batch_size),
        ("patience", config.patience), ("save_every_steps", config.save_every_steps),
    )  # fmt: skip
    for name, value in at_least_one:
        if value < 1:
            raise FinetuneError(f"{name} must be at least 1, got {value}")
    if not 0 <= config.warmup_fraction < 1:
        raise FinetuneError(f"warmup fraction must be in [0, 1), got {config.warmup_fraction}")
    if config.weight_decay < 0 or config.clip_norm <= 0:
        raise FinetuneError(
            f"weight decay must be >= 0 and clip norm > 0, got {config.weight_decay} and "
            f"{config.clip_norm}"
        )
    if not 0 < config.learning_rate < 1:
        raise FinetuneError(f"learning rate must be in (0, 1), got {config.learning_rate}")
    if max_seq_len < 2:
        raise FinetuneError(f"max_seq_len must be at least 2, got {max_seq_len}")


def finetune(
    checkpoint: str | Path,
    train_path: str | Path,
    dev_path: str | Path,
    out: str | Path,
    *,
    test_path: str | Path | None = None,
    config: TrainConfig | None = None,
    precision: str = "auto",
    max_seq_len: int = 128,
    resume: bool = False,
    say: Say | None = None,
    cpu: CpuInfo | None = None,
    gpus: Sequence[str] | None = None,
    on_step: Callable[[int], None] | None = None,
    task: TaskOptions | None = None,
) -> FinetuneResult:
    """Fine-tune ``checkpoint`` on ``train_path`` and publish it as ``out``; return its metrics.

    ``task`` picks the head and its file format (finetune/tasks.py; default: single-text
    classification). ``cpu`` and ``gpus`` default to this machine's (tests inject others);
    ``on_step`` is called with the global step after every training step (tests interrupt runs
    with it).
    """
    started = time.perf_counter()
    say = say or (lambda _message: None)
    config = config or TrainConfig()
    out = Path(out)
    options = task or TaskOptions()
    head = make_task(options)
    _check_config(config, max_seq_len)
    if head.name != "classify" and config.pipeline != "optimised":
        raise FinetuneError(
            f"--pipeline {config.pipeline} is the classify benchmark's baseline; --task "
            f"{head.name} trains with the optimised pipeline only"
        )
    if head.name == "pair-classify" and max_seq_len < 4:
        raise FinetuneError(f"max_seq_len must be at least 4 for pairs, got {max_seq_len}")
    check_out(out, resume)
    ckpt = read_checkpoint(checkpoint)
    if max_seq_len > ckpt.config.max_position:
        raise FinetuneError(
            f"max_seq_len {max_seq_len} exceeds the checkpoint's max_position_embeddings "
            f"{ckpt.config.max_position}"
        )
    train = head.read(train_path, None)
    head.labels = head.label_set(train)
    dev = head.read(dev_path, head.known())
    check_eval_set(dev, "dev")
    test = head.read(test_path, head.known()) if test_path is not None else None
    if test is not None:
        check_eval_set(test, "test")

    from export.precision import visible_gpus
    from finetune.modeling import build_model, head_weights
    from finetune.pipeline import checkpoint_tokenizer
    from finetune.precision import training_precision
    from finetune.training import Trainer

    cpu = cpu or cpu_info()
    chosen = training_precision(precision, cpu, visible_gpus() if gpus is None else gpus)
    choice = chosen.choice
    say(f"precision {choice.precision} (Keras policy {chosen.policy}; {choice.reason})")
    for warning in chosen.choice.warnings:
        say(f"warning: {warning}")
    weights, labels = head_weights(ckpt, head.labels, config.seed, head.model_task)
    head.labels = labels
    say(f"{len(train)} train / {len(dev)} dev examples, task {head.name}, labels {labels}")
    tokenizer = checkpoint_tokenizer(ckpt, max_seq_len)
    full = checkpoint_tokenizer(ckpt, UNCUT)
    splits = {
        name: head.encode(tokenizer, full, ex, config.pipeline)
        for name, ex in (("train", train), ("dev", dev), ("test", test))
        if ex is not None
    }
    model = build_model(ckpt, weights, chosen.compute_dtype, head.model_task)
    state = state_dir(out)
    settings = {
        **asdict(config), "verbose": None, "max_seq_len": max_seq_len, "policy": chosen.policy,
        "labels": labels, "checkpoint_sha256": ckpt.source.get("sha256"),
        **({"task": asdict(options)} if head.name != "classify" else {}),
        # --resume must read the same data: a changed train.tsv would silently skip new batches
        "data_sha256": {
            name: file_sha256(path) for name, path in
            (("train", train_path), ("dev", dev_path), ("test", test_path)) if path is not None
        },
    }  # fmt: skip
    _claim_state(state, settings)
    trainer = Trainer(model, tokenizer, config, chosen, state, say, task=head)
    outcome = trainer.fit(splits["train"], splits["dev"], on_step)
    figures = _figures(trainer, head, splits)
    metrics = {
        "task": head.name,
        "dev": figures["dev"],
        "test": figures.get("test"),
        "labels": labels,
        "precision": {
            "requested": precision, "used": chosen.choice.precision, "policy": chosen.policy,
            "reason": chosen.choice.reason, "loss_scaling": chosen.loss_scaling,
        },
        "pipeline": config.pipeline,
        "cpu": cpu.describe(),
        "best_epoch": outcome.best_epoch,
        "stopped_early": outcome.stopped_early,
        "steps": outcome.steps,
        "epochs": outcome.history,
        "train_wall_s": sum(e["train_wall_s"] for e in outcome.history),
        "hyperparameters": {**asdict(config), "max_seq_len": max_seq_len},
        "data": {name: {"path": str(ex.path), "examples": len(ex)}
                 for name, ex in (("train", train), ("dev", dev), ("test", test)) if ex},
        "source": ckpt.source,
    }  # fmt: skip
    if head.name != "classify":
        metrics["selection"] = f"dev {head.selection}"
        metrics["headline"] = {name: head.headline(f) for name, f in figures.items() if f}
    with publishing(out) as temp:
        metrics["wall_s"] = time.perf_counter() - started
        write_checkpoint(temp, ckpt.config, model.weights(), labels, ckpt.vocab,
                         ckpt.do_lower_case, max_seq_len, metrics, head.config(),
                         _source_config(ckpt.source), tokenizer_files(ckpt))  # fmt: skip
    remove_tree(state)
    return FinetuneResult(out=out, metrics=metrics)


def tokenizer_files(ckpt: Any) -> dict[str, str] | None:
    """Return the source checkpoint's tokenizer files (name → text) to write beside the fine-tuned
    weights: its tokenizer.json (any kind) with tokenizer_config.json and
    special_tokens_map.json where present; None for a vocab.txt-only checkpoint (the output then
    gets a BERT vocab.txt)."""
    assets = getattr(ckpt, "tokenizer", None)
    if assets is None or assets.source != "tokenizer.json":
        return None
    files = {"tokenizer.json": assets.json_text}
    where = Path(ckpt.source["path"])
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (where / name).is_file():
            files[name] = (where / name).read_text(encoding="utf-8")
    return files


def _source_config(source: dict[str, str]) -> dict[str, Any] | None:
    """Return the input checkpoint's config.json (Hugging Face checkpoints; None for Google's)."""
    if source.get("format") != "hf":
        return None
    data = json.loads((Path(source["path"]) / "config.json").read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else None


def _figures(trainer: Any, head: Task, splits: dict[str, Split]) -> dict[str, Any]:
    """Return dev and test metrics of the restored best epoch (what is tuned on dev first)."""
    if head.name == "classify":  # argmax in the graph, as before the other heads
        out = {}
        for name, split in splits.items():
            if name != "train":
                truth, predicted = trainer.predict(split)
                out[name] = scores(truth, predicted, head.labels)
        return out
    logits = {name: trainer.logits(split) for name, split in splits.items() if name != "train"}
    head.finish(splits["dev"], logits["dev"])
    return {name: head.figures(splits[name], rows) for name, rows in logits.items()}


def file_sha256(path: str | Path) -> str:
    """Return the hex SHA-256 of a data file (a missing one is reported when it is read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()
