"""The architectures' parity matrix through a real model server and gunicorn gateway (issue 33).

Every architecture of tests/export/test_architectures.py, saved by transformers with a tokenizer
of its own kind (tokenizer.json + tokenizer_config.json, no vocab.txt), is exported (as
``python -m export build`` does) three times: a single-label classifier, a base model for
embeddings (mean pooling) and a BIO token classifier. One model server serves the 33 versions
behind one gRPC gateway; transformers (torch, test-only) on the same checkpoints is the reference:
classifier logits and probabilities within 1e-4, embeddings at cosine >= 0.99999 to the mean of
the last hidden state, tag entities equal to ``pipeline("token-classification",
aggregation_strategy="simple")``, and :tokenize ids and offsets equal to the tokenizer's.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from ops.procs import REPO, child_env
from tests.backend.heads_reference import (
    TAG_TEXTS,
    assert_same_entities,
    reference_entities,
    token_pipeline,
)
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config
from tests.export.test_architectures import ARCHITECTURES, save_checkpoint

MAX_LEN = 48  # every text below fits whole for every tokenizer kind (38 tokens at most)
HEADS = {"single": "classify", "embed": "embed", "tag": "tag"}
TEXTS = [
    "my card was charged twice",
    "Thé pâckage never arrived 😀",
    "我的订单还没到 please help",
    "Hello World, where is my order #12345?",
]
# exports every model in one child: TensorFlow there, torch here, loading the references meanwhile
_EXPORT = """
import json, sys
from export.build import build
for name, path, task, base, max_len in json.loads(sys.argv[1]):
    build(path, name, base, version=1, task=task, max_seq_len=max_len,
          pooling="mean" if task == "embed" else None, warmup=False)
"""


def _name(arch: str, head: str) -> str:
    return f"{arch}-{head}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return {gateway, checkpoints}: every architecture × head exported, served by one model
    server behind one gRPC gateway."""
    import json

    root = tmp_path_factory.mktemp("architectures-e2e")
    base = root / "models"
    checkpoints = {_name(a, h): save_checkpoint(a, h, root) for a in ARCHITECTURES for h in HEADS}
    jobs = [[name, str(path), HEADS[name.rsplit("-", 1)[1]], str(base), MAX_LEN]
            for name, path in checkpoints.items()]  # fmt: skip
    logs = root / "logs"
    logs.mkdir()
    with (logs / "export.log").open("w") as log:
        command = [sys.executable, "-c", _EXPORT, json.dumps(jobs)]
        exporting = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        try:
            for name, path in checkpoints.items():  # the references load meanwhile
                _model(path, name.rsplit("-", 1)[1])
                _tokenizer(path)
            code = exporting.wait(timeout=900)
        finally:
            if exporting.poll() is None:
                exporting.kill()
    assert code == 0, (logs / "export.log").read_text()[-3000:]
    config = root / "models.config"
    config.write_text(model_config(base, {}, list(checkpoints)), encoding="utf-8")
    server = ModelServer(config, logs)
    gateway: Gateway | None = None
    try:
        for name in checkpoints:
            server.wait_available(name, 1, timeout_s=300)
        gateway = Gateway(gateway_env(server, "grpc", base, config), logs, workers=1)
        yield {"gateway": gateway, "checkpoints": checkpoints}
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()


def _post(stack: dict[str, Any], name: str, verb: str, body: dict[str, Any]) -> Any:
    response = requests.post(f"{stack['gateway'].url}/v1/models/{name}:{verb}", json=body,
                             timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


# -- the reference: transformers on the same checkpoints --------------------------------------


@functools.cache
def _model(path: Path, head: str) -> Any:
    import transformers

    cls = {"single": transformers.AutoModelForSequenceClassification,
           "tag": transformers.AutoModelForTokenClassification,
           "embed": transformers.AutoModel}[head]  # fmt: skip
    return cls.from_pretrained(str(path), local_files_only=True).eval()


@functools.cache
def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                         model_max_length=MAX_LEN)  # fmt: skip


def _reference(path: Path, head: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Return transformers' logits (or last hidden state) of ``texts`` and the attention mask."""
    import torch

    batch = _tokenizer(path)(texts, truncation=True, padding=True, return_tensors="pt")
    if int(getattr(_model(path, head).config, "type_vocab_size", 0) or 0) < 2:
        batch.pop("token_type_ids", None)
    with torch.no_grad():
        out = _model(path, head)(**batch)
    value = out.last_hidden_state if head == "embed" else out.logits
    return value.numpy(), batch["attention_mask"].numpy()


# -- the matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_classifier_logits_and_probabilities_match_transformers(
    arch: str, stack: dict[str, Any]
) -> None:
    name = _name(arch, "single")
    reply = _post(stack, name, "classify", {"texts": TEXTS, "return_logits": True})
    want, _ = _reference(stack["checkpoints"][name], "single", TEXTS)
    got = np.asarray([p["logits"] for p in reply["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    exp = np.exp(want - want.max(-1, keepdims=True))
    probabilities = exp / exp.sum(-1, keepdims=True)
    labels = _model(stack["checkpoints"][name], "single").config.id2label
    for prediction, row in zip(reply["predictions"], probabilities, strict=True):
        assert prediction["label"] == labels[int(row.argmax())]
        assert prediction["score"] == pytest.approx(float(row.max()), abs=1e-4)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_embeddings_match_transformers_mean_pooling(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "embed")
    reply = _post(stack, name, "embed", {"texts": TEXTS})
    hidden, mask = _reference(stack["checkpoints"][name], "embed", TEXTS)
    weights = mask[..., None].astype(np.float32)
    want = (hidden * weights).sum(1) / weights.sum(1)
    want /= np.linalg.norm(want, axis=-1, keepdims=True)
    got = np.asarray(reply["embeddings"], dtype=np.float32)
    got /= np.linalg.norm(got, axis=-1, keepdims=True)
    assert float((got * want).sum(-1).min()) >= 0.99999


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_tag_entities_match_the_transformers_pipeline(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "tag")
    path = stack["checkpoints"][name]
    reply = _post(stack, name, "tag", {"texts": TAG_TEXTS, "aggregation": "simple"})
    pipe = token_pipeline(_model(path, "tag"), _tokenizer(path), "simple")
    for text, prediction in zip(TAG_TEXTS, reply["predictions"], strict=True):
        assert (prediction["truncated"], prediction["windows"]) == (False, 1)
        want = reference_entities(pipe(text), text, "simple")
        assert_same_entities(prediction["entities"], want, atol=1e-4)
    assert any(p["entities"] for p in reply["predictions"])


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_tokenize_ids_and_offsets_match_the_tokenizer(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "single")
    reply = _post(stack, name, "tokenize", {"texts": TEXTS})
    hf = _tokenizer(stack["checkpoints"][name])
    for text, tokens in zip(TEXTS, reply["tokens"], strict=True):
        want = hf(text, truncation=True, return_offsets_mapping=True,
                  return_special_tokens_mask=True)  # fmt: skip
        assert tokens["ids"] == want["input_ids"]
        assert tokens["special"] == [bool(s) for s in want["special_tokens_mask"]]
        offsets = [list(o) for o, s in zip(want["offset_mapping"], tokens["special"], strict=True)
                   if not s]  # fmt: skip
        assert [list(o) for o, s in zip(tokens["offsets"], tokens["special"], strict=True)
                if not s] == offsets  # fmt: skip
