"""SPLADE benchmark: the top-k in the graph against returning the pooled vocabulary
vector, and the chunked vocabulary projection against one pass.

In process (no server: the figures are the graph's and the answer's, not the transport's), one
random MiniLM-L6-shaped BERT masked-LM model (6 layers, hidden 384, BERT's 30,522-token
vocabulary: the vocabulary projection, not the encoder, is what SPLADE adds) and a batch of
``BATCH`` texts of ``SEQ`` tokens (each row's real length drawn from [SEQ/4, SEQ]), three graphs
of export/splade_head.py's ``SpladeHead`` built from the same weights, each a traced
``tf.function``, calls interleaved, medians over repeats:

- **top-k**: what export serves — pooled in ``TOKEN_CHUNK`` (512) token chunks, ``top_k`` 256
  out: ``sparse_indices`` int32 + ``sparse_values`` float32 ``[batch, k]``;
- **pooled [B,V]**: the same pooling, the whole ``[batch, vocab]`` float32 vector out (what a
  graph without the top-k would answer; the client then picks its non-zero entries);
- **one pass**: the top-k graph with every token in one chunk (``[tokens, vocab]`` logits at once).

Per batch: graph time, the answer's bytes as TF Serving's gRPC ``PredictResponse`` carries them
(``TensorProto`` with ``tensor_content``) and as its REST JSON (``{"outputs": ...}``), and the time
to encode each. ``compare`` is the function; ``run`` gives its rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks import BenchContext, Row, median

BATCH, SEQ, TOP_K = 32, 128, 256
SHAPE = {"hidden": 384, "layers": 6, "heads": 12, "intermediate": 1536, "vocab": 30522}


def _weights(rng: np.random.Generator, shape: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    """Return a random BERT config and canonical weights, masked-LM head included (tied)."""
    from export.architectures import architecture, tensor_names
    from export.config import BertConfig

    config = BertConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                        num_layers=shape["layers"], num_heads=shape["heads"],
                        intermediate_size=shape["intermediate"], max_position=512)  # fmt: skip
    mlm = architecture("bert").mlm
    assert mlm is not None
    weights: dict[str, Any] = {}
    for spec in [*tensor_names(config), *mlm.names(config, {})]:
        if spec.optional or any(isinstance(d, str) for d in spec.shape):
            continue
        base = 1.0 if spec.canonical.endswith("gamma") else 0.0  # layer norms' scale about 1
        dims = tuple(int(d) for d in spec.shape)
        weights[spec.canonical] = (base + rng.normal(0, 0.05, dims)).astype(np.float32)
    weights["mlm/decoder"] = weights["embeddings/word"]
    weights["mlm/bias"] = rng.normal(0, 0.1, shape["vocab"]).astype(np.float32)
    weights["mlm/tied"] = np.asarray(True)
    return config, weights


def _graphs(config: Any, weights: dict[str, Any], k: int, seq: int
            ) -> dict[str, Callable[..., dict[str, Any]]]:  # fmt: skip
    import tensorflow as tf

    from export.model import EncoderModule
    from export.splade import SpladeSpec
    from export.splade_head import SpladeHead

    spec = SpladeSpec(weights=weights, pooling="max", activation="relu", transform_act="gelu",
                      top_k=k, eps=1e-12)  # fmt: skip
    module = EncoderModule(config, weights, task="embed", splade=spec)
    pooled_head = SpladeHead(weights, pooling="max", act="relu", transform_act="gelu", top_k=0,
                             eps=1e-12, dtype=tf.float32, word=module.word)  # fmt: skip
    one_pass = SpladeHead(weights, pooling="max", act="relu", transform_act="gelu", top_k=k,
                          eps=1e-12, dtype=tf.float32, word=module.word, chunk=1 << 30)  # fmt: skip
    specs = [tf.TensorSpec([None, seq], tf.int32)] * 3

    def with_head(head: Any) -> Callable[..., dict[str, Any]]:
        def fn(ids: Any, mask: Any, types: Any) -> dict[str, Any]:
            return dict(head(module._hidden(ids, mask, types), mask))

        return tf.function(fn, input_signature=specs)

    return {"top-k": tf.function(module._serve, input_signature=specs),
            "pooled [B,V]": with_head(pooled_head), "one pass": with_head(one_pass)}  # fmt: skip


def _wire(out: dict[str, Any]) -> tuple[int, int, float, float]:
    """Return (gRPC bytes, REST JSON bytes, gRPC encode s, JSON encode s) of an answer."""
    import tensorflow as tf

    started = time.perf_counter()
    grpc = sum(len(tf.make_tensor_proto(v.numpy()).SerializeToString()) for v in out.values())
    grpc_s = time.perf_counter() - started
    started = time.perf_counter()
    rest = len(json.dumps({"outputs": {k: v.numpy().tolist() for k, v in out.items()}}))
    return grpc, rest, grpc_s, time.perf_counter() - started


Figures = dict[str, dict[str, float]]


def compare(*, batch: int = BATCH, seq: int = SEQ, k: int = TOP_K, repeats: int = 5,
            shape: dict[str, int] | None = None, seed: int = 0) -> Figures:  # fmt: skip
    """Return, per graph (top-k, pooled [B,V], one pass), the median ``graph_ms`` per batch,
    ``grpc_bytes`` / ``json_bytes`` of its answer and ``grpc_encode_ms`` / ``json_encode_ms``;
    the top-k and one-pass answers are checked equal to the pooled vector's top k."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    config, weights = _weights(rng, shape or SHAPE)
    graphs = _graphs(config, weights, k, seq)
    lengths = rng.integers(seq // 4, seq + 1, batch)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    ids = np.where(mask > 0, rng.integers(1000, config.vocab_size, (batch, seq)), 0)
    feeds = [tf.constant(x.astype(np.int32)) for x in (ids, mask, np.zeros_like(mask))]
    outs = {name: fn(*feeds) for name, fn in graphs.items()}  # traced, warmed
    pooled = outs["pooled [B,V]"]["sparse_pooled"].numpy()
    want = np.sort(pooled, axis=1)[:, ::-1][:, :k]
    for name in ("top-k", "one pass"):
        got = outs[name]["sparse_values"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for _ in range(repeats):
        for name, fn in graphs.items():
            started = time.perf_counter()
            fn(*feeds)
            times[name].append(time.perf_counter() - started)
    figures = {}
    for name, out in outs.items():
        grpc, rest, grpc_s, json_s = _wire(out)
        figures[name] = {"graph_ms": 1e3 * median(times[name]), "grpc_bytes": float(grpc),
                         "json_bytes": float(rest), "grpc_encode_ms": 1e3 * grpc_s,
                         "json_encode_ms": 1e3 * json_s}  # fmt: skip
    return figures


def run(ctx: BenchContext) -> list[Row]:
    """Return the rows: top-k against pooled [B,V] (bytes, time) and chunked against one pass."""
    quick = {"hidden": 32, "layers": 2, "heads": 4, "intermediate": 48, "vocab": 2000}
    batch, seq = (4, 32) if ctx.quick else (BATCH, SEQ)
    k = 64 if ctx.quick else TOP_K
    f = compare(batch=batch, seq=seq, k=k, repeats=2 if ctx.quick else ctx.repeats,
                shape=quick if ctx.quick else None)  # fmt: skip
    top, full, one = f["top-k"], f["pooled [B,V]"], f["one pass"]
    top_ms, full_ms = (x["graph_ms"] + x["grpc_encode_ms"] for x in (top, full))
    model = "tiny" if ctx.quick else "MiniLM-L6-shaped random BERT masked-LM (vocab 30,522)"
    how = (f"{model}, batch {batch} × {seq} tokens (lengths {seq // 4}..{seq}), fp32, in "
           f"process, medians of {ctx.repeats} interleaved calls; bytes as TF Serving's gRPC "
           "TensorProto / REST JSON")  # fmt: skip
    return [
        Row("SPLADE answer per batch: top-k in the graph vs pooled [B,V]",
            f"{top['grpc_bytes'] / 1e3:.1f} kB vs {full['grpc_bytes'] / 1e3:.1f} kB gRPC; "
            f"{top['json_bytes'] / 1e3:.1f} kB vs {full['json_bytes'] / 1e3:.1f} kB JSON",
            f"{full['grpc_bytes'] / top['grpc_bytes']:.0f}× fewer bytes (gRPC)",
            "never [B,S,V] nor [B,V] on the wire", f"k {k}; {how}"),
        Row("SPLADE time per batch: top-k vs pooled [B,V] (graph + answer encode)",
            f"{top_ms:.1f} ms vs {full_ms:.1f} ms gRPC; JSON encode "
            f"{top['json_encode_ms']:.1f} ms vs {full['json_encode_ms']:.1f} ms",
            f"{full_ms / top_ms:.2f}×",
            "", how),
        Row("SPLADE vocabulary projection: 512-token chunks vs one pass",
            f"{top['graph_ms']:.1f} ms vs {one['graph_ms']:.1f} ms",
            f"{one['graph_ms'] / top['graph_ms']:.2f}×",
            "chunks cost ≤ 1.1× one pass; at most 512 × vocab floats at once", how),
    ]  # fmt: skip
