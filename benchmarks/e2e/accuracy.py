"""What each setting answers: accuracy and mean exit layer on the test split, and the bucket mix
of the test tickets (what the model server's queues receive)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from benchmarks.e2e.plan import (
    EXITS,
    FULL,
    MODEL,
    SPEEDS,
    TIMEOUT_S,
)
from benchmarks.e2e.senders import (
    Direct,
    HttpConnection,
    predict_request,
)


def measure_accuracy(
    gateway: str, direct: Direct, channel: Any, texts: list[str], labels: list[str]
) -> dict[str, dict[str, float]]:
    """Return accuracy (and mean exit layer) on the test split of every setting."""
    out: dict[str, dict[str, float]] = {}
    http = HttpConnection(gateway)
    for speed in SPEEDS:
        preds, layers = [], []
        for i in range(0, len(texts), 32):
            body = orjson.dumps({"texts": texts[i : i + 32], "version": EXITS, "speed": speed})
            status, data = http.post(f"/v1/models/{MODEL}:classify", body)
            if status != 200:
                raise RuntimeError(f"accuracy pass at speed {speed}: {status} {data[:200]!r}")
            for p in orjson.loads(data)["predictions"]:
                preds.append(p["label"])
                layers.append(p.get("exit_layer") or 0)
        acc = float(np.mean([p == y for p, y in zip(preds, labels, strict=True)]))
        out[f"gateway {speed:g}"] = {"accuracy": acc, "layers": float(np.mean(layers))}
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    names = json.loads((direct.base / MODEL / str(FULL) / "assets" / "model.json").read_text())
    label_names = names["labels"]
    sender_preds = []
    for text in texts:
        sender_preds.append(label_names[int(np.argmax(direct_logits(stub, direct, text)))])
    acc = float(np.mean([p == y for p, y in zip(sender_preds, labels, strict=True)]))
    out["direct"] = {"accuracy": acc, "layers": float("nan")}
    return out


def direct_logits(stub: Any, direct: Direct, text: str) -> np.ndarray:
    """Return one ticket's logits from a direct Predict call."""
    import tensorflow as tf

    reply = stub.Predict(predict_request(direct, text), timeout=TIMEOUT_S)
    return np.asarray(tf.make_ndarray(reply.outputs["logits"])).reshape(-1)


def bucket_mix(direct: Direct, texts: Sequence[str]) -> dict[int, int]:
    """Return how many of ``texts`` fall in each length bucket (what the queues receive)."""
    mix: dict[int, int] = {}
    for text in texts:
        inputs, _ = direct.request(text)
        length = int(inputs["input_ids"].shape[1])
        mix[length] = mix.get(length, 0) + 1
    return dict(sorted(mix.items()))
