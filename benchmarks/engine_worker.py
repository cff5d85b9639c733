"""One inference engine in its own process, timed on command: architectures_bench's worker.

``python benchmarks/engine_worker.py --engine ours|torch|onnxruntime --threads N --work DIR``
sets the engine's thread counts before anything runs (TensorFlow's intra/inter-op pools,
``torch.set_num_threads``, ONNX Runtime's ``intra_op_num_threads``), then answers JSON lines on
stdin, one reply line each (anything the libraries print goes to stderr):

- ``{"op": "load", "name", "path", "seq", "vocab_size", "token_types"}``: build the model of the
  checkpoint at ``path`` (transformers' ``save_pretrained`` directory, a base model) for inputs of
  length ``seq``; reply ``{"load_s", "detail"}``;
- ``{"op": "embed", "name", "batch"}``: the mean-pooled vectors of the fixed inputs, to check that
  the engines compute the same model;
- ``{"op": "time", "name", "batch", "calls"}``: ``calls`` timed calls; reply ``{"times"}`` (s);
- ``{"op": "quit"}``.

The engines: ``ours`` is export's module built from the checkpoint as ``export build`` builds it
(task embed, mean pooling, FP32) and called through its ``seq_<L>`` serving signature; ``torch``
is transformers' ``AutoModel`` under ``torch.inference_mode`` plus the same mean pooling;
``onnxruntime`` is that torch module (model + pooling) exported with ``torch.onnx.export``
(dynamic batch and length) and run by an ``InferenceSession`` at ONNX Runtime's default graph
optimisation. Every engine gets the same token ids (``inputs``: a seeded generator, numpy only).

This file imports nothing of the project at module level: it also runs in ``.venv-onnx`` (ONNX
Runtime's own environment, ``make onnx-env``), which has numpy, torch and transformers only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import numpy as np

ENGINES = ("ours", "torch", "onnxruntime")
FIRST_ID = 5  # random ids start above the special tokens (and RoBERTa's pad id 1)


def inputs(vocab_size: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Return the fixed inputs of one batch: random ids, full-length rows, token type 0."""
    rng = np.random.default_rng(1000 + batch)
    ids = rng.integers(FIRST_ID, vocab_size, size=(batch, seq)).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids)}  # fmt: skip


class Model:
    """One loaded model: ``call(batch)`` runs it once, ``embed(batch)`` returns its vectors."""

    def __init__(self, call: Callable[[int], Any], embed: Callable[[int], np.ndarray], detail: str):
        self.call, self.embed, self.detail = call, embed, detail


def _ours(threads: int) -> Callable[[dict[str, Any], Path], Model]:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)

    def load(cmd: dict[str, Any], work: Path) -> Model:
        from export.checkpoint import read_checkpoint
        from export.model import EncoderModule
        from modelformat.buckets import signature_name

        seq = int(cmd["seq"])
        ckpt = read_checkpoint(cmd["path"])
        module = EncoderModule(ckpt.config, ckpt.weights, task="embed", pooling="mean")
        fn = module.signatures(bucket_lens=[seq])[signature_name(seq)]
        feeds: dict[int, dict[str, Any]] = {}

        def feed(batch: int) -> dict[str, Any]:
            if batch not in feeds:
                arrays = inputs(int(cmd["vocab_size"]), batch, seq)
                feeds[batch] = {k: tf.constant(v.astype(np.int32)) for k, v in arrays.items()}
            return feeds[batch]

        def embed(batch: int) -> np.ndarray:
            return np.asarray(fn(**feed(batch))["embedding"].numpy())

        return Model(lambda batch: fn(**feed(batch)), embed,
                     f"export's module, FP32, signature {signature_name(seq)}")  # fmt: skip

    return load


def _saved_base_model(path: Path) -> Any:
    """Return the base model the bench saved in ``path`` (architectures_bench.save_checkpoint):
    built from its config.json, its weights read from model.safetensors, every tensor matched.
    Only files on disk are read: nothing names a hub repository."""
    import transformers
    from safetensors.torch import load_file

    values = json.loads((path / "config.json").read_text())
    config = transformers.AutoConfig.for_model(values.pop("model_type"), **values)
    model = transformers.AutoModel.from_config(config)
    model.load_state_dict(load_file(path / "model.safetensors"), strict=True)
    return model.eval()


def _pooled(path: str, token_types: bool) -> Any:
    """Return transformers' base model with mean pooling over the mask, as one torch module."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = _saved_base_model(Path(path))

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> Any:
            extra = {"token_type_ids": token_type_ids} if token_types else {}
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                **extra).last_hidden_state  # fmt: skip
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    return Pooled().eval()


def _names(token_types: bool) -> list[str]:
    return ["input_ids", "attention_mask", *(["token_type_ids"] if token_types else [])]


def _torch(threads: int) -> Callable[[dict[str, Any], Path], Model]:
    import torch

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(threads)

    def load(cmd: dict[str, Any], work: Path) -> Model:
        model = _pooled(cmd["path"], bool(cmd["token_types"]))
        names = _names(bool(cmd["token_types"]))
        feeds: dict[int, dict[str, Any]] = {}

        def feed(batch: int) -> dict[str, Any]:
            if batch not in feeds:
                arrays = inputs(int(cmd["vocab_size"]), batch, int(cmd["seq"]))
                feeds[batch] = {k: torch.from_numpy(arrays[k]) for k in names}
            return feeds[batch]

        def call(batch: int) -> Any:
            with torch.inference_mode():
                return model(**feed(batch))

        def embed(batch: int) -> np.ndarray:
            return np.asarray(call(batch).numpy())

        impl = getattr(model.model.config, "_attn_implementation", None) or "default"
        return Model(call, embed, f"transformers AutoModel, inference_mode, attention {impl}")

    return load


def _onnxruntime(threads: int) -> Callable[[dict[str, Any], Path], Model]:
    import onnxruntime as ort
    import torch

    torch.set_num_threads(threads)  # the export only

    def load(cmd: dict[str, Any], work: Path) -> Model:
        token_types = bool(cmd["token_types"])
        names = _names(token_types)
        model = _pooled(cmd["path"], token_types)
        sample = inputs(int(cmd["vocab_size"]), 2, int(cmd["seq"]))
        args = tuple(torch.from_numpy(sample[k]) for k in names)
        onnx_path = work / f"{cmd['name']}.onnx"
        batch, length = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("seq")
        dynamic = {k: {0: batch, 1: length} for k in names}
        started = time.perf_counter()
        with torch.inference_mode(False), torch.no_grad():
            torch.onnx.export(model, args, str(onnx_path), input_names=names,
                              output_names=["sentence_vector"], dynamic_shapes=dynamic,
                              dynamo=True, external_data=False)  # fmt: skip
        export_s = time.perf_counter() - started
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        feeds: dict[int, dict[str, np.ndarray]] = {}

        def feed(batch: int) -> dict[str, np.ndarray]:
            if batch not in feeds:
                arrays = inputs(int(cmd["vocab_size"]), batch, int(cmd["seq"]))
                feeds[batch] = {k: arrays[k] for k in names}
            return feeds[batch]

        def call(batch: int) -> Any:
            return session.run(None, feed(batch))

        def embed(batch: int) -> np.ndarray:
            return np.asarray(call(batch)[0])

        detail = (f"onnxruntime {ort.__version__}, the torch module exported by torch.onnx.export "
                  f"(dynamo, {export_s:.0f} s for the first), ORT_ENABLE_ALL")  # fmt: skip
        return Model(call, embed, detail)

    return load


LOADERS = {"ours": _ours, "torch": _torch, "onnxruntime": _onnxruntime}


def serve(engine: str, threads: int, work: Path, requests: TextIO, replies: TextIO) -> None:
    """Answer the commands on ``requests`` until ``quit`` or end of input."""
    load = LOADERS[engine](threads)
    models: dict[str, Model] = {}
    for line in requests:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "quit":
                break
            if op == "load":
                started = time.perf_counter()
                models[cmd["name"]] = model = load(cmd, work)
                model.call(1)  # trace / warm the first shape
                reply: dict[str, Any] = {"load_s": time.perf_counter() - started,
                                         "detail": model.detail}  # fmt: skip
            elif op == "embed":
                reply = {"embedding": models[cmd["name"]].embed(int(cmd["batch"])).tolist()}
            elif op == "time":
                model, batch, times = models[cmd["name"]], int(cmd["batch"]), []
                for _ in range(int(cmd["calls"])):
                    started = time.perf_counter()
                    model.call(batch)
                    times.append(time.perf_counter() - started)
                reply = {"times": times}
            elif op == "unload":
                models.pop(cmd["name"], None)
                reply = {}
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # the parent reports it and skips this engine's row
            traceback.print_exc()
            reply = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args()
    # replies on a private copy of stdout; whatever the libraries print goes to stderr
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    args.work.mkdir(parents=True, exist_ok=True)
    serve(args.engine, args.threads, args.work, sys.stdin, replies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
