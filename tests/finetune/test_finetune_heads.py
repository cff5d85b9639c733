"""The other heads end to end: one short run each on the tiny BERT, the HF layout it writes,
transformers' logits on that checkpoint, and metrics.json (issue 22)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.tiny import tiny_vocab
from finetune.pipeline import make_tokenizer, pair_token_ids, token_ids
from finetune.run import FinetuneResult, finetune
from finetune.tasks import TaskOptions
from finetune.training import TrainConfig
from tests.finetune.conftest import FILLER, NEGATIVE, POSITIVE

ONE_EPOCH = {"epochs": 1, "batch_size": 8, "learning_rate": 3e-3, "seed": 7, "verbose": False}
QUERIES = ["where is my order", "my card was charged twice", "the app crashed again",
           "reset my password please"]  # fmt: skip
ANSWERS = ["track the package delivery here", "a refund for a double charge",
           "update the app to fix the crash", "change your password on the login page"]  # fmt: skip


def pair_rows(seed: int) -> list[tuple[str, str, str]]:
    """Return each query against every answer: relevant only with its own answer."""
    rng = random.Random(seed)
    rows = []
    for q, query in enumerate(QUERIES):
        for a, answer in enumerate(ANSWERS):
            extra = " ".join(rng.choice(FILLER) for _ in range(rng.choice([0, 2, 30])))
            rows.append(
                (query, f"{answer} {extra}".strip(), "relevant" if q == a else "irrelevant")
            )
    return rows


def write_pairs(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.write_text("text_a\ttext_b\tlabel\n" + "".join(f"{a}\t{b}\t{y}\n" for a, b, y in rows))
    return path


def multi_rows(n: int, seed: int) -> list[tuple[str, str]]:
    """Return texts labelled pos and/or neg by the word families they use (both: both labels)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kinds = [("pos",), ("neg",), ("pos", "neg")][i % 3]
        words = [rng.choice(POSITIVE if k == "pos" else NEGATIVE) for k in kinds for _ in range(3)]
        words += [rng.choice(FILLER) for _ in range(rng.choice([1, 5, 20]))]
        rng.shuffle(words)
        rows.append((" ".join(words), "|".join(kinds)))
    return rows


def write_multi(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text\tlabels\n" + "".join(f"{t}\t{y}\n" for t, y in rows))
    return path


def _run(tiny_bert: Path, root: Path, train: Path, dev: Path, task: TaskOptions) -> FinetuneResult:
    return finetune(tiny_bert, train, dev, root / "out", test_path=dev,
                    config=TrainConfig(**ONE_EPOCH), precision="fp32", max_seq_len=32,
                    task=task)  # fmt: skip


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> FinetuneResult:
    root = tmp_path_factory.mktemp("cross")
    train = write_pairs(root / "train.tsv", pair_rows(1) * 2)
    dev = write_pairs(root / "dev.tsv", pair_rows(2))
    return _run(tiny_bert, root, train, dev, TaskOptions("pair-classify", num_labels=1))


@pytest.fixture(scope="module")
def multi_label(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> FinetuneResult:
    root = tmp_path_factory.mktemp("multi")
    train = write_multi(root / "train.tsv", multi_rows(48, 1))
    dev = write_multi(root / "dev.tsv", multi_rows(24, 2))
    return _run(tiny_bert, root, train, dev, TaskOptions("multi-label"))


def _ours(path: Path, feeds: dict[str, np.ndarray], task: str = "classify") -> np.ndarray:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule

    ckpt = read_checkpoint(path)
    module = EncoderModule(ckpt.config, ckpt.weights, task=task, pooling="cls")
    return module.logits(*(feeds[k] for k in ("input_ids", "attention_mask",
                                              "token_type_ids"))).numpy()  # fmt: skip


def _theirs(path: Path, feeds: dict[str, np.ndarray], kind: str) -> tuple[np.ndarray, Any]:
    import torch
    import transformers

    model = getattr(transformers, kind).from_pretrained(str(path), local_files_only=True)
    model.eval()
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in feeds.items()})
    return out.logits.numpy(), model.config


def _pair_feeds() -> dict[str, np.ndarray]:
    from finetune.pipeline import sorted_batches

    served = make_tokenizer(tiny_vocab(), True, 32)
    a = ["where is my order", "café 我的订单 🙂", "refund " * 40]
    b = ["track the package", "ok", "the card " * 40]
    ids, types = pair_token_ids(served, a, b)
    [(_order, feeds)] = sorted_batches(ids, 8, 32, 0, types)
    assert feeds["token_type_ids"].sum() > 0
    return feeds


def test_cross_encoder_config_is_a_one_logit_pair_model(cross_encoder: FinetuneResult) -> None:
    config = json.loads((cross_encoder.out / "config.json").read_text())

    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "relevant"} and config["text_pair"] is True
    assert "problem_type" not in config  # transformers' pipeline then scores with a sigmoid


def test_cross_encoder_logits_match_transformers(cross_encoder: FinetuneResult) -> None:
    feeds = _pair_feeds()

    theirs, config = _theirs(cross_encoder.out, feeds, "BertForSequenceClassification")

    assert config.num_labels == 1
    np.testing.assert_allclose(theirs, _ours(cross_encoder.out, feeds), atol=1e-4)


def test_cross_encoder_metrics_have_accuracy_and_ranking(cross_encoder: FinetuneResult) -> None:
    metrics = json.loads((cross_encoder.out / "metrics.json").read_text())

    assert metrics["task"] == "pair-classify"
    for split in ("dev", "test"):
        figures = metrics[split]
        assert figures["examples"] == 16 and 0 <= figures["accuracy"] <= 1
        assert figures["confusion_matrix"]["labels"] == ["irrelevant", "relevant"]
        assert figures["rerank"]["queries"] == 4 and 0 < figures["rerank"]["mrr@10"] <= 1
        assert 0 < figures["rerank"]["ndcg@10"] <= 1
    assert "MRR@10" in cross_encoder.summary()


def test_multi_label_config_has_problem_type_and_tuned_thresholds(
    multi_label: FinetuneResult,
) -> None:
    config = json.loads((multi_label.out / "config.json").read_text())

    assert config["problem_type"] == "multi_label_classification"
    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert set(config["thresholds"]) == {"neg", "pos"}
    assert all(0 < t < 1 for t in config["thresholds"].values())


def test_multi_label_logits_match_transformers(multi_label: FinetuneResult) -> None:
    from backend.bucketing import pad_batch

    rows = token_ids(make_tokenizer(tiny_vocab(), True, 32),
                     ["good bad", "café 我的订单 🙂", "love " * 40])  # fmt: skip
    feeds = pad_batch(rows, 32)

    theirs, config = _theirs(multi_label.out, feeds, "BertForSequenceClassification")

    assert config.problem_type == "multi_label_classification"
    np.testing.assert_allclose(theirs, _ours(multi_label.out, feeds), atol=1e-4)


def test_multi_label_metrics_have_micro_and_macro_f1(multi_label: FinetuneResult) -> None:
    metrics = json.loads((multi_label.out / "metrics.json").read_text())

    for split in ("dev", "test"):
        figures = metrics[split]
        assert figures["examples"] == 24 and figures["thresholds"] == "tuned on dev"
        assert 0 <= figures["micro_f1"] <= 1 and 0 <= figures["macro_f1"] <= 1
        assert set(figures["per_label"]) == {"neg", "pos"}
        assert set(figures["at_0.5"]) == {"micro_f1", "macro_f1"}
    assert "dev_micro_f1" in metrics["epochs"][0]  # the figure that picked the best epoch


PRODUCTS = ["card", "app", "package", "account"]
DATES = ["today", "yesterday", "tomorrow"]


def entity_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Return texts with a PRODUCT and sometimes a DATE entity, spans computed as written."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        parts: list[tuple[str, str | None]] = [(rng.choice(["my", "the"]), None),
                                               (rng.choice(PRODUCTS), "PRODUCT")]  # fmt: skip
        parts += [(rng.choice([*FILLER, "is", "was", "broken", "late"]), None)
                  for _ in range(rng.choice([1, 3, 25]))]  # fmt: skip
        if i % 2:
            parts += [(rng.choice(DATES), "DATE")]
        if i % 5 == 0:
            parts += [("café 我的 🙂", None)]
        text, entities = "", []
        for word, label in parts:
            start = len(text) + (1 if text else 0)
            text = f"{text} {word}" if text else word
            if label:
                entities.append({"start": start, "end": start + len(word), "label": label})
        rows.append({"text": text, "entities": entities})
    return rows


def write_entities(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


@pytest.fixture(scope="module")
def tagger(tmp_path_factory: pytest.TempPathFactory, tiny_bert: Path) -> FinetuneResult:
    root = tmp_path_factory.mktemp("tag")
    train = write_entities(root / "train.jsonl", entity_rows(48, 1))
    dev = write_entities(root / "dev.jsonl", entity_rows(20, 2))
    return _run(tiny_bert, root, train, dev, TaskOptions("tag"))


def test_tagger_config_is_a_token_classifier_with_bio_labels(tagger: FinetuneResult) -> None:
    from safetensors.numpy import load_file

    config = json.loads((tagger.out / "config.json").read_text())

    assert config["architectures"] == ["BertForTokenClassification"]
    assert config["id2label"] == {"0": "O", "1": "B-DATE", "2": "I-DATE", "3": "B-PRODUCT",
                                  "4": "I-PRODUCT"}  # fmt: skip
    assert config["label_scheme"] == "BIO" and "problem_type" not in config
    tensors = load_file(str(tagger.out / "model.safetensors"))
    assert tensors["classifier.weight"].shape == (5, 32)
    assert not any(name.startswith("bert.pooler") for name in tensors)


def test_tagger_logits_match_transformers(tagger: FinetuneResult) -> None:
    from backend.bucketing import pad_batch

    rows = token_ids(make_tokenizer(tiny_vocab(), True, 32),
                     ["my card was late today", "café 我的订单 🙂", "the app " * 40])  # fmt: skip
    feeds = pad_batch(rows, 32)

    theirs, config = _theirs(tagger.out, feeds, "BertForTokenClassification")

    assert config.num_labels == 5
    ours = _ours(tagger.out, feeds, task="tag")
    assert ours.shape == theirs.shape == (3, 32, 5)
    np.testing.assert_allclose(theirs, ours, atol=1e-4)


def test_tagger_metrics_have_entity_f1_micro_and_per_type(tagger: FinetuneResult) -> None:
    metrics = json.loads((tagger.out / "metrics.json").read_text())

    assert metrics["task"] == "tag"
    for split in ("dev", "test"):
        figures = metrics[split]
        assert figures["texts"] == 20 and figures["micro"]["support"] == 30
        assert set(figures["per_type"]) <= {"DATE", "PRODUCT"}
        assert figures["per_type"]["PRODUCT"]["support"] == 20
        assert 0 <= figures["micro_f1"] <= 1
        assert 0 < figures["truncated_texts"] < 20  # the 25-filler-word texts pass 32 tokens
    assert "dev_micro_f1" in metrics["epochs"][0]
    assert "entity F1" in tagger.summary()


@pytest.mark.parametrize(
    ("fixture", "task", "expected"),
    [
        ("cross_encoder", "classify", {"task": "classify", "text_pair": True,
                                       "score_activation": "sigmoid"}),
        ("multi_label", "classify", {"problem_type": "multi_label_classification",
                                     "score_activation": "sigmoid"}),
        ("tagger", "tag", {"task": "tag", "label_scheme": "BIO"}),
    ],
)  # fmt: skip
def test_export_builds_each_output_with_its_head_from_config_json(
    request: pytest.FixtureRequest, tmp_path: Path, fixture: str, task: str,
    expected: dict[str, Any],
) -> None:  # fmt: skip
    from export.build import build
    from modelformat.layout import read_model_info

    result: FinetuneResult = request.getfixturevalue(fixture)
    config = json.loads((result.out / "config.json").read_text())

    built = build(result.out, "m", tmp_path, task=task, max_seq_len=32, warmup=False)

    info = read_model_info(built.path) or {}
    assert {k: info.get(k) for k in expected} == expected
    assert info["labels"] == [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    if "thresholds" in config:
        assert info["thresholds"] == config["thresholds"]
