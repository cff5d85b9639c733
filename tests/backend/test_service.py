"""The pipeline against a scripted gRPC model server: bounded concurrent chunks, caller order."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backend.schemas import EmbedRequest
from backend.service import Gateway
from backend.settings import load_settings
from backend.tensors import from_tensor_proto, to_tensor_proto
from modelformat.protos import serving_pb2
from tests.backend.fake_grpc import predict_server


class SlowEmbedder:
    """Answers each Predict with one row per text: [row length, first word id].

    Calls are held until ``hold_until`` of them have been in flight at once (or 30 s pass),
    so reaching the limit does not depend on how fast this machine dispatches them; a short
    pause after that gives calls beyond the limit, if the gateway sent any, time to show.
    """

    def __init__(self, hold_until: int) -> None:
        self.hold_until = hold_until
        self.lock = threading.Condition()
        self.in_flight = 0
        self.most_in_flight = 0
        self.shapes: list[tuple[int, ...]] = []

    def __call__(self, request: serving_pb2.PredictRequest, context: object) -> object:
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.most_in_flight >= self.hold_until, timeout=30)
        time.sleep(0.2)
        ids = from_tensor_proto(request.inputs["input_ids"])
        mask = from_tensor_proto(request.inputs["attention_mask"])
        with self.lock:
            self.in_flight -= 1
            self.shapes.append(ids.shape)
        rows = np.stack([mask.sum(axis=1), ids[:, 1]], axis=1).astype(np.float32)
        reply = serving_pb2.PredictResponse()
        reply.model_spec.name = request.model_spec.name
        reply.model_spec.version.value = request.model_spec.version.value
        reply.outputs["embedding"].CopyFrom(to_tensor_proto(rows))
        return reply


@pytest.fixture()
def embedder() -> Iterator[tuple[SlowEmbedder, str]]:
    script = SlowEmbedder(hold_until=3)
    with predict_server(script, max_workers=16) as target:
        yield script, target


@pytest.fixture()
def base(tmp_path: Path, tiny_vocab_file: Path) -> Path:
    assets = tmp_path / "emb" / "1" / "assets"
    assets.mkdir(parents=True)
    (assets / "vocab.txt").write_bytes(tiny_vocab_file.read_bytes())
    (assets / "model.json").write_text(json.dumps({"task": "embed", "max_seq_len": 64}))
    return tmp_path


def test_chunks_run_concurrently_but_never_more_than_the_limit(
    embedder: tuple[SlowEmbedder, str], base: Path
) -> None:
    script, target = embedder
    settings = load_settings(
        {"tfs_grpc_target": target, "model_base_path": str(base), "max_batch_size": 2,
         "max_concurrent_chunks": 3},
        environ={},
    )  # fmt: skip
    gateway = Gateway(settings)
    texts = [("hello " * n).strip() for n in (7, 1, 30, 2, 12, 1, 3, 20, 5, 9, 1, 4)]

    answer = gateway.embed("emb", EmbedRequest(texts=texts, version=1, normalize=False))
    gateway.close()

    assert script.most_in_flight == 3 and len(script.shapes) == 6
    assert all(shape[0] <= 2 and shape[1] in (16, 32, 64) for shape in script.shapes)
    # Row i came back for text i: its real length is 2 + the number of words.
    lengths = [2 + len(t.split()) for t in texts]
    np.testing.assert_array_equal(np.asarray(answer["embeddings"])[:, 0], lengths)


def test_the_plan_keeps_the_retry_state_in_one_record_and_its_deadline_is_set_once() -> None:
    from dataclasses import fields, replace

    from backend.plan import Attempt, Plan

    with pytest.raises(TypeError):
        Plan("m", ["a"], deadline=5.0)  # type: ignore[call-arg]  # set when the request starts
    plan = Plan("m", ["a"])
    plan.attempt.choice, plan.attempt.weighted, plan.deadline = (3, None), True, 9.0
    # a shadow's plan (dataclasses.replace) starts a fresh attempt and has no deadline yet
    again = replace(plan, version=3)
    assert again.attempt == Attempt() and again.deadline == float("inf")
    # the retry state is the attempt's alone, and each stage's findings are fields of the plan
    names = {f.name for f in fields(Plan)}
    assert not names & {"reached", "weighted", "choice"}
    assert {"attempt", "owners", "windows", "characters"} <= names
