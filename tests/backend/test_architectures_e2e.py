"""The parity matrix through a real model server and gunicorn gateway: every tokenizer kind ×
every head (issue 33; one architecture per kind since issue 42).

What the gateway does with a model (tokenize, pair templates and their cuts, token types, the
head's activation, :tokenize offsets) depends on its tokenizer's kind and its head, not on its
architecture: every architecture's numbers are checked in process, head by head and at every
precision, by tests/export/test_architectures.py. So this matrix serves one architecture per
tokenizer kind the product serves (export/tiny_tokenizers.py's KINDS: WordPiece, byte-level
BPE, SentencePiece Unigram with and without [CLS]-style templates, SentencePiece BPE), saved by
transformers with a tokenizer of that kind (tokenizer.json + tokenizer_config.json, no
vocab.txt), exported as ``python -m export build`` does, once per head the product serves:

- ``single``: a single-label classifier, version 1 in fp32, versions 2 and 3 the same checkpoint
  in bf16 and fp16 (``--precision``, through the build's conversion gate at
  ``GATE_TOLERANCE``; the build is given a fixed AVX2 CPU, so it takes the same path on every
  machine: bf16 without native bf16 is exported with a warning, never refused or rewritten);
- ``pair``: the same checkpoint as a sentence-pair classifier (``--text-pair``);
- ``multi``: a multi-label classifier with a threshold per label in its config.json;
- ``regression``: a one-logit ``problem_type: regression`` scorer (raw score);
- ``cross``: the same weights as a hub cross-encoder has them (one logit, no problem_type,
  ``text_pair``): a sigmoid score, and ``:rerank``;
- ``embed``: the base model, mean pooling; ``tag``: a BIO token classifier.

Two export children write the versions (each model's in one of them) while one model server,
given each model as its first version is published, loads them, behind one gRPC gateway;
transformers (torch, test-only) on the same checkpoints is the reference, at fp32: logits within
1e-4 (texts, and pairs tokenized by ``tokenizer(a, b, truncation=True)``), scores by the head's
activation, labels over the thresholds, embeddings at cosine >= 0.99999 to the mean of the last
hidden state, tag entities equal to ``pipeline("token-classification",
aggregation_strategy="simple")``, and :tokenize ids and offsets equal to the tokenizer's. The
bf16 and fp16 versions answer within the gate's own figures of transformers' fp32 (every
decisive argmax kept, |Δprobability| within twice the gate's bound: ``SERVED_TOLERANCE``), and
their model.json says the precision.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from export.gates import Tolerance
from export.tiny_tokenizers import KINDS
from ops.procs import REPO, child_env
from tests.backend.heads_reference import (
    TAG_TEXTS,
    assert_same_entities,
    reference_entities,
    token_pipeline,
)
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config
from tests.export.test_architectures import (
    ARCHITECTURES,
    GATE_TOLERANCE,
    LOW_PRECISIONS,
    TOKENIZERS,
    save_checkpoint,
)

# ~45 exports and their loads on 2 shared cores: the first test's setup takes minutes
pytestmark = pytest.mark.timeout(1500)

# max_seq_len: TEXTS fit 32 tokens whole in every tokenizer kind (30 at most), TAG_TEXTS 48 (38);
# the pairs below are cut or not depending on the kind. 32 rather than 48 spares each export one
# bucket signature to trace, save and check (16, 32 and serving_default rather than 16, 32, 48).
MAX_LEN, TAG_MAX_LEN = 32, 48
# a served head → (the checkpoint it is exported from, export's task)
HEADS = {"single": ("single", "classify"), "pair": ("single", "classify"),
         "multi": ("multi", "classify"), "regression": ("regression", "classify"),
         "cross": ("cross", "classify"), "embed": ("embed", "embed"),
         "tag": ("tag", "tag")}  # fmt: skip
# the single-label classifier's versions: 1 the fp32 reference, then the low precisions
VERSIONS = {"fp32": 1, **{p: i + 2 for i, p in enumerate(LOW_PRECISIONS)}}
# the CPU every export is told it runs on (export/hardware.py): AVX2 without native bf16
CPU = {"model": "injected AVX2 CPU", "flags": ["avx2", "fma", "f16c"], "cores": 2}
THRESHOLDS = {"LABEL_0": 0.35, "LABEL_1": 0.6, "LABEL_2": 0.5}  # the multi-label head's
# What the bf16/fp16 versions' answers are held to against transformers' fp32: the gate's own
# figures, every decisive argmax kept (top-two gap >= 0.1) and |Δprobability| bounded, at twice
# the bound the export's gate applied to its probe (8 random rows). Texts other than the probe,
# and another signature's kernels (a bucket, serving_default; native bf16 or emulated), move
# these random weights' probabilities about as far again: ALBERT's bf16 reached 0.056 here.
SERVED_TOLERANCE = Tolerance(max_prob_diff=2 * GATE_TOLERANCE.max_prob_diff)
# an architecture per tokenizer kind → that kind: each the architecture's own kind (TOKENIZERS),
# but SentencePiece BPE, which no architecture's tiny checkpoint has of its own: it goes on
# DeBERTa-v2 (a template with token types on a model that has them); and what this matrix checks
# of each, for docs/reference/supported-models.md
GATEWAY = {"bert": "wordpiece", "roberta": "bpe", "xlm-roberta": "unigram",
           "albert": "unigram-cls", "deberta-v2": "sp-bpe"}  # fmt: skip
CHECKED = (*HEADS, *LOW_PRECISIONS, "tokenize")

TEXTS = [
    "my card was charged twice",
    "Thé pâckage never arrived 😀",
    "我的订单还没到 please help",
    "Hello World, where is my order #12345?",
]
PAIRS = [
    ["where is my order", "your package ships in two days"],
    # accents, emoji, CJK (in the second segment: 28 byte-level tokens, more than half of 32)
    ["Thé órder 😀", "我的订单还没到 hello refund refunding"],
    ["help", " ".join(["refund money"] * 30)],  # the second segment cut
    # both cut, the longer first (refund: one token in every kind, so the first segment is
    # longer than half of max_seq_len yet fits it)
    [" ".join(["refund"] * 25), " ".join(["order"] * 30)],
]
QUERY = "where is my order"
DOCUMENTS = ["your package ships in two days", "reset the password", "我的订单还没到",
             "refund " * 40, "Thé órder 😀"]  # fmt: skip
# exports its share of the versions in a child: TensorFlow there, torch here, loading the
# references meanwhile; each build's warnings and model.json's precision go back in a JSON file.
# One child left the second core partly idle (tracing and saving run mostly in one thread): two
# children took the setup from 129 s to 96 s, run back to back on a shared 2-core AVX-512 host.
# Each child runs TensorFlow's ops on one thread (intra- and inter-op): two children already
# fill both cores, and a tiny model's ops split over threads spent more CPU than they saved
# (the children's CPU fell by about a tenth); what is exported does not change.
EXPORTERS = 2
_EXPORT = """
import json, sys
from export.lean_tf import import_tensorflow
tf = import_tensorflow()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
from export.build import build
from export.gates import Tolerance
from export.tiny_tokenizers import KINDS
from export.hardware import CpuInfo
jobs, cpu, tolerance, out = json.loads(sys.argv[1])
cpu = CpuInfo(cpu["model"], frozenset(cpu["flags"]), cpu["cores"])
done = {}
for name, path, task, version, precision, pair, max_len in jobs:
    result = build(path, name, out["base"], version=version, task=task,
                   precision=precision, max_seq_len=max_len, text_pair=pair or None,
                   pooling="mean" if task == "embed" else None, warmup=False,
                   tolerance=Tolerance(**tolerance), cpu=cpu, gpus=[])
    done[f"{name}/{version}"] = {"warnings": list(result.warnings),
                                 "precision": result.model_info["precision"]}
with open(out["results"], "w") as f:
    json.dump(done, f)
"""


def _name(arch: str, head: str) -> str:
    return f"{arch}-{head}"


def _checkpoints(root: Path) -> dict[tuple[str, str], Path]:
    """Save every architecture's checkpoints as transformers does; return {(arch, kind): dir}.

    ``multi`` gets per-label thresholds in its config.json (as finetune writes them); ``cross``
    is the regression checkpoint as a hub cross-encoder's config.json has it: no problem_type,
    ``text_pair`` true (transformers reads the same weights to the same logit)."""
    out: dict[tuple[str, str], Path] = {}
    for arch in GATEWAY:
        for kind in ("single", "multi", "regression", "embed", "tag"):
            out[arch, kind] = save_checkpoint(arch, kind, root, GATEWAY[arch])
        config_file = out[arch, "multi"] / "config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "thresholds": THRESHOLDS}, indent=2))
        cross = root / f"{arch}-cross"
        shutil.copytree(out[arch, "regression"], cross)
        config = json.loads((cross / "config.json").read_text())
        config.pop("problem_type")
        (cross / "config.json").write_text(json.dumps({**config, "text_pair": True}, indent=2))
        out[arch, "cross"] = cross
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return {gateway, checkpoints, base, exported}: every architecture × head exported (the
    single-label classifier at every precision), served by one model server behind one gRPC
    gateway."""
    root = tmp_path_factory.mktemp("architectures-e2e")
    base = root / "models"
    saved = _checkpoints(root)
    checkpoints = {_name(a, h): saved[a, kind] for a in GATEWAY
                   for h, (kind, _) in HEADS.items()}  # fmt: skip
    jobs: list[list[Any]] = []
    for arch in GATEWAY:
        for head, (kind, task) in HEADS.items():
            precisions = VERSIONS if head == "single" else {"fp32": 1}
            for precision, version in precisions.items():
                jobs.append([_name(arch, head), str(saved[arch, kind]), task, version, precision,
                             head == "pair", _max_len(head)])  # fmt: skip
    logs = root / "logs"
    logs.mkdir()
    # The model server starts with no models and re-reads its config file every second; each
    # model is added to the file once the export has published its first version (as a model is
    # added to a running stack), so the server's start and its ~45 loads overlap the exports
    config = root / "models.config"
    config.write_text(model_config(base, {}, []), encoding="utf-8")
    server = ModelServer(config, logs, ["--model_config_file_poll_wait_seconds=1"])
    gateway: Gateway | None = None
    exporting: list[subprocess.Popen[bytes]] = []
    try:
        exporting = [_start_export(jobs, part, root) for part in range(EXPORTERS)]
        for name, path in checkpoints.items():  # the references load meanwhile
            _model(path, name.rsplit("-", 1)[1])
            _tokenizer(path, _max_len(name.rsplit("-", 1)[1]))
        server.process.wait_until(lambda: _answers(server), 120)
        names = sorted({name for name, *_ in jobs})
        served: list[str] = []
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline:
            exited = all(child.poll() is not None for child in exporting)
            published = [name for name in names if _published(base / name)]
            if published != served:
                served = published
                staged = config.with_suffix(".new")
                staged.write_text(model_config(base, {}, served), encoding="utf-8")
                staged.replace(config)  # whole: the server never reads half a file
            if exited:
                break
            time.sleep(2)
        exported: dict[str, Any] = {}
        for part, child in enumerate(exporting):
            log = (logs / f"export-{part}.log").read_text()[-3000:]
            assert child.returncode == 0, log
            exported.update(json.loads((root / f"exported-{part}.json").read_text()))
        for name, _, _, version, *_ in jobs:
            server.wait_available(name, version, timeout_s=300)
        gateway = Gateway(gateway_env(server, "grpc", base, config), logs, workers=1)
        yield {"gateway": gateway, "checkpoints": checkpoints, "base": base,
               "exported": exported}  # fmt: skip
    finally:
        for child in exporting:
            if child.poll() is None:
                child.kill()
        if gateway is not None:
            gateway.stop()
        server.stop()


def _start_export(jobs: list[list[Any]], part: int, root: Path) -> subprocess.Popen[bytes]:
    """Start the export child of every EXPORTERS-th model from the ``part``-th (a model's
    versions in one child, in order); it writes ``exported-<part>.json``."""
    models = sorted({name for name, *_ in jobs})[part::EXPORTERS]
    mine = [job for job in jobs if job[0] in models]
    out = {"base": str(root / "models"), "results": str(root / f"exported-{part}.json")}
    tolerance = {"max_prob_diff": GATE_TOLERANCE.max_prob_diff}
    command = [sys.executable, "-c", _EXPORT, json.dumps([mine, CPU, tolerance, out])]
    with (root / "logs" / f"export-{part}.log").open("w") as log:
        return subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip


def _published(model_dir: Path) -> bool:
    """Whether an export has published a version of the model (a numbered directory)."""
    return model_dir.is_dir() and any(p.name.isdigit() for p in model_dir.iterdir())


def _answers(server: ModelServer) -> bool:
    """Whether the model server answers REST (any answer: it has read its config)."""
    try:
        requests.get(f"{server.rest_url}/v1/models/none", timeout=1)
    except requests.RequestException:
        return False
    return True


def _post(stack: dict[str, Any], name: str, verb: str, body: dict[str, Any]) -> Any:
    response = requests.post(f"{stack['gateway'].url}/v1/models/{name}:{verb}", json=body,
                             timeout=60)  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


# -- the reference: transformers on the same checkpoints --------------------------------------


def _model(path: Path, head: str) -> Any:
    """Return transformers' model of a checkpoint for ``head`` (one per checkpoint and class)."""
    return _load(path, head if head in ("tag", "embed") else "classify")


@functools.cache
def _load(path: Path, family: str) -> Any:
    import transformers

    cls = {"classify": transformers.AutoModelForSequenceClassification,
           "tag": transformers.AutoModelForTokenClassification,
           "embed": transformers.AutoModel}[family]  # fmt: skip
    return cls.from_pretrained(str(path), local_files_only=True).eval()


def _max_len(head: str) -> int:
    return TAG_MAX_LEN if head == "tag" else MAX_LEN


@functools.cache
def _tokenizer(path: Path, max_len: int = MAX_LEN) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                         model_max_length=max_len)  # fmt: skip


def _reference(
    path: Path, head: str, texts: list[str] | list[list[str]]
) -> tuple[np.ndarray, np.ndarray]:
    """Return transformers' logits (or last hidden state) of ``texts`` (or of ``[a, b]`` pairs,
    cut longest-first to max_seq_len) and the attention mask.

    Token types go in where the model has them, as its template sets them (``$B:1``): the
    checkpoints' generic ``PreTrainedTokenizerFast`` returns them only when asked, where a
    ``BertTokenizerFast`` or ``AlbertTokenizerFast`` would by default."""
    import torch

    tokenizer = _tokenizer(path, _max_len(head))
    types = int(getattr(_model(path, head).config, "type_vocab_size", 0) or 0) >= 2
    options = {"truncation": True, "padding": True, "return_tensors": "pt",
               "return_token_type_ids": types}  # fmt: skip
    if isinstance(texts[0], list):
        batch = tokenizer([a for a, _ in texts], [b for _, b in texts], **options)
    else:
        batch = tokenizer(texts, **options)
    if not types:
        batch.pop("token_type_ids", None)
    with torch.no_grad():
        out = _model(path, head)(**batch)
    value = out.last_hidden_state if head == "embed" else out.logits
    return value.numpy(), batch["attention_mask"].numpy()


def _softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits - logits.max(-1, keepdims=True))
    return exp / exp.sum(-1, keepdims=True)


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


def _cut(path: Path, pairs: list[list[str]]) -> list[bool]:
    """Return whether each pair needs more than MAX_LEN tokens whole (so transformers cuts it)."""
    tokenizer = _tokenizer(path)
    return [len(tokenizer(a, b)["input_ids"]) > MAX_LEN for a, b in pairs]


# -- the matrix: fp32 -------------------------------------------------------------------------


def test_the_matrix_serves_every_tokenizer_kind_once() -> None:
    assert sorted(GATEWAY.values()) == sorted(KINDS)
    assert set(GATEWAY) <= set(ARCHITECTURES)
    # the kinds an architecture has of its own are served on that architecture
    assert all(TOKENIZERS[a] == k for a, k in GATEWAY.items() if k in TOKENIZERS.values())


@pytest.mark.parametrize("arch", GATEWAY)
def test_classifier_logits_and_probabilities_match_transformers(
    arch: str, stack: dict[str, Any]
) -> None:
    name = _name(arch, "single")
    body = {"texts": TEXTS, "return_logits": True, "version": VERSIONS["fp32"]}
    reply = _post(stack, name, "classify", body)
    want, _ = _reference(stack["checkpoints"][name], "single", TEXTS)
    got = np.asarray([p["logits"] for p in reply["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    probabilities = _softmax(want)
    labels = _model(stack["checkpoints"][name], "single").config.id2label
    for prediction, row in zip(reply["predictions"], probabilities, strict=True):
        assert prediction["label"] == labels[int(row.argmax())]
        assert prediction["score"] == pytest.approx(float(row.max()), abs=1e-4)


@pytest.mark.parametrize("arch", GATEWAY)
def test_sentence_pair_logits_match_transformers_on_the_same_pairs(
    arch: str, stack: dict[str, Any]
) -> None:
    name = _name(arch, "pair")
    path = stack["checkpoints"][name]
    reply = _post(stack, name, "classify", {"pairs": PAIRS, "return_logits": True})
    want, _ = _reference(path, "pair", PAIRS)
    np.testing.assert_allclose([p["logits"] for p in reply["predictions"]], want, atol=1e-4,
                               rtol=0)  # fmt: skip
    labels = _model(path, "pair").config.id2label
    assert [p["label"] for p in reply["predictions"]] == [labels[int(i)] for i in want.argmax(-1)]
    assert [p["truncated"] for p in reply["predictions"]] == _cut(path, PAIRS)
    assert _cut(path, PAIRS)[2:] == [True, True]  # the long pairs are cut, longest first


@pytest.mark.parametrize("arch", GATEWAY)
def test_multi_label_scores_and_labels_over_their_thresholds_match_transformers(
    arch: str, stack: dict[str, Any]
) -> None:
    name = _name(arch, "multi")
    path = stack["checkpoints"][name]
    reply = _post(stack, name, "classify", {"texts": TEXTS, "return_logits": True})
    want, _ = _reference(path, "multi", TEXTS)
    predictions = reply["predictions"]
    np.testing.assert_allclose([p["logits"] for p in predictions], want, atol=1e-4, rtol=0)
    labels = [_model(path, "multi").config.id2label[i] for i in range(want.shape[1])]
    assert sorted(THRESHOLDS) == labels
    cut = np.array([THRESHOLDS[label] for label in labels])
    for prediction, row in zip(predictions, _sigmoid(want), strict=True):
        # the gateway answers every label at or over its threshold, best first
        got = {x["label"]: x["score"] for x in prediction["labels"]}
        assert [x["score"] for x in prediction["labels"]] == sorted(got.values(), reverse=True)
        for label, score, threshold in zip(labels, row, cut, strict=True):
            if abs(score - threshold) > 1e-4:  # a tie at the threshold may fall either way
                assert (label in got) == (score >= threshold), (label, score, threshold)
            if label in got:
                assert got[label] == pytest.approx(score, abs=1e-5)


@pytest.mark.parametrize("arch", GATEWAY)
def test_a_regression_head_answers_transformers_raw_logit(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "regression")
    reply = _post(stack, name, "classify", {"texts": TEXTS, "return_logits": True})
    want, _ = _reference(stack["checkpoints"][name], "regression", TEXTS)
    assert want.shape == (len(TEXTS), 1)
    predictions = reply["predictions"]
    np.testing.assert_allclose([p["logits"] for p in predictions], want, atol=1e-4, rtol=0)
    # problem_type regression: the score is the logit itself (no activation)
    np.testing.assert_allclose([p["score"] for p in predictions], want[:, 0], atol=1e-4, rtol=0)
    assert "labels" not in predictions[0]


@pytest.mark.parametrize("arch", GATEWAY)
def test_a_one_logit_cross_encoder_scores_and_reranks_by_the_sigmoid_of_transformers_logit(
    arch: str, stack: dict[str, Any]
) -> None:
    name = _name(arch, "cross")
    path = stack["checkpoints"][name]
    reply = _post(stack, name, "classify", {"pairs": PAIRS, "return_logits": True})
    want, _ = _reference(path, "cross", PAIRS)
    predictions = reply["predictions"]
    np.testing.assert_allclose([p["logits"] for p in predictions], want, atol=1e-4, rtol=0)
    # one logit and no problem_type: a sigmoid score (docs/guides/heads.md)
    np.testing.assert_allclose([p["score"] for p in predictions], _sigmoid(want[:, 0]),
                               atol=1e-5)  # fmt: skip
    assert [p["truncated"] for p in predictions] == _cut(path, PAIRS)
    ranked = _post(stack, name, "rerank", {"query": QUERY, "documents": DOCUMENTS})["results"]
    relevance = _sigmoid(_reference(path, "cross", [[QUERY, d] for d in DOCUMENTS])[0][:, 0])
    assert [r["index"] for r in ranked] == np.argsort(-relevance, kind="stable").tolist()
    got = [r["relevance_score"] for r in sorted(ranked, key=lambda r: r["index"])]
    np.testing.assert_allclose(got, relevance, atol=1e-5)


@pytest.mark.parametrize("arch", GATEWAY)
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


@pytest.mark.parametrize("arch", GATEWAY)
def test_tag_entities_match_the_transformers_pipeline(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "tag")
    path = stack["checkpoints"][name]
    reply = _post(stack, name, "tag", {"texts": TAG_TEXTS, "aggregation": "simple"})
    pipe = token_pipeline(_model(path, "tag"), _tokenizer(path, TAG_MAX_LEN), "simple")
    for text, prediction in zip(TAG_TEXTS, reply["predictions"], strict=True):
        assert (prediction["truncated"], prediction["windows"]) == (False, 1)
        want = reference_entities(pipe(text), text, "simple")
        assert_same_entities(prediction["entities"], want, atol=1e-4)
    assert any(p["entities"] for p in reply["predictions"])


@pytest.mark.parametrize("arch", GATEWAY)
def test_tokenize_ids_and_offsets_match_the_tokenizer(arch: str, stack: dict[str, Any]) -> None:
    name = _name(arch, "single")
    reply = _post(stack, name, "tokenize", {"texts": TEXTS, "version": VERSIONS["fp32"]})
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


# -- the matrix: bf16 and fp16 ----------------------------------------------------------------


@pytest.mark.parametrize("precision", LOW_PRECISIONS)
@pytest.mark.parametrize("arch", GATEWAY)
def test_a_low_precision_version_answers_within_the_gate_of_transformers_fp32(
    arch: str, precision: str, stack: dict[str, Any]
) -> None:
    """The gate's own figures (export/gates.py), measured through the stack against
    transformers' fp32 rather than export's: every decisive argmax kept, |Δprobability| within
    SERVED_TOLERANCE; and the version served is the converted one, as model.json says."""
    from export.gates import measure, within
    from modelformat.layout import read_model_info

    name, version = _name(arch, "single"), VERSIONS[precision]
    body = {"texts": TEXTS, "return_logits": True, "return_scores": True, "version": version}
    reply = _post(stack, name, "classify", body)
    assert reply["model"] == {"name": name, "version": version}
    info = read_model_info(stack["base"] / name / str(version)) or {}
    assert (info["precision"], info["precision_requested"]) == (precision, precision)
    assert info["verified_on"]["cpu_class"] == "AVX2"  # the injected CPU, on every machine
    assert within(info["conversion"], GATE_TOLERANCE), info["conversion"]
    warnings = stack["exported"][f"{name}/{version}"]["warnings"]
    assert any(f"{precision} " in w for w in warnings), warnings  # emulated bf16, CPU fp16
    want, _ = _reference(stack["checkpoints"][name], "single", TEXTS)
    got = {"logits": np.asarray([p["logits"] for p in reply["predictions"]]),
           "probabilities": np.asarray([[s["score"] for s in p["scores"]]
                                        for p in reply["predictions"]])}  # fmt: skip
    figures = measure({"logits": want, "probabilities": _softmax(want)}, got)
    assert within(figures, SERVED_TOLERANCE), figures
    assert figures["decisive_agreement"] == 1.0, figures
    assert figures["max_abs_logit_diff"] > 1e-6, figures  # not the fp32 graph under another name
