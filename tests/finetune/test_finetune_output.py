"""The output: a HF checkpoint transformers loads to the same logits and export builds as is."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest

from export.tiny import tiny_vocab
from finetune.errors import FinetuneError
from finetune.pipeline import make_tokenizer, token_ids

TEXTS = ["good great thanks", "terrible awful order", "the package", "love " * 20]


def test_metrics_json_records_scores_precision_pipeline_and_time(trained) -> None:  # type: ignore[no-untyped-def]
    metrics = json.loads((trained.out / "metrics.json").read_text())

    for split in ("dev", "test"):
        assert set(metrics[split]) >= {"accuracy", "macro_f1", "confusion_matrix"}
        matrix = np.array(metrics[split]["confusion_matrix"]["rows_true_columns_predicted"])
        assert matrix.shape == (2, 2) and matrix.sum() == metrics[split]["examples"] == 32
    assert metrics["precision"] == {
        "requested": "fp32", "used": "fp32", "policy": "float32", "reason": "requested",
        "loss_scaling": False,
    }  # fmt: skip
    assert metrics["pipeline"] == "optimised"
    assert metrics["wall_s"] > 0 and len(metrics["epochs"]) == 3


def test_config_names_the_labels(trained) -> None:  # type: ignore[no-untyped-def]
    config = json.loads((trained.out / "config.json").read_text())

    assert config["id2label"] == {"0": "neg", "1": "pos"}
    assert config["label2id"] == {"neg": 0, "pos": 1}
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert (trained.out / "vocab.txt").read_text().splitlines() == tiny_vocab()


def _feeds(max_seq_len: int = 64) -> dict[str, np.ndarray]:
    from backend.bucketing import pad_batch

    rows = token_ids(make_tokenizer(tiny_vocab(), True, max_seq_len), TEXTS)
    return pad_batch(rows, max(len(r) for r in rows))


def _our_logits(path: Path) -> np.ndarray:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run

    ckpt = read_checkpoint(path)
    return run(EncoderModule(ckpt.config, ckpt.weights, task="classify").serve, _feeds())["logits"]


def test_transformers_loads_the_same_logits(trained) -> None:  # type: ignore[no-untyped-def]
    import torch
    from transformers import BertForSequenceClassification

    feeds = _feeds()
    ours = _our_logits(trained.out)
    local_dir = str(trained.out)  # a directory on disk: never a hub lookup
    model = BertForSequenceClassification.from_pretrained(local_dir, local_files_only=True)
    model.eval()
    with torch.no_grad():
        theirs = model(**{k: torch.from_numpy(v.astype(np.int64)) for k, v in feeds.items()})

    assert model.config.id2label == {0: "neg", 1: "pos"}
    np.testing.assert_allclose(theirs.logits.numpy(), ours, atol=1e-4)


def test_export_builds_the_output_with_no_extra_flag(trained, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from export.cli import main as export_main
    from export.predictor import PersistentPredictor
    from modelformat.layout import read_model_info

    code = export_main(["build", "--checkpoint", str(trained.out), "--name", "tickets",
                        "--base-path", str(tmp_path), "--task", "classify", "--no-warmup",
                        "--max-seq-len", "32"])  # fmt: skip

    assert code == 0
    info = read_model_info(tmp_path / "tickets" / "1")
    assert info is not None and info["labels"] == ["neg", "pos"] and not info["zero_shot"]
    served = PersistentPredictor(tmp_path / "tickets" / "1").predict(_feeds())
    trained_logits = _our_logits(trained.out)
    np.testing.assert_allclose(served["logits"], trained_logits, atol=1e-4)


def test_a_failing_write_leaves_no_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from export.config import BertConfig
    from finetune import output

    def disk_full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr("safetensors.numpy.save_file", disk_full)
    config = BertConfig(vocab_size=5, hidden_size=4, num_layers=0, num_heads=1,
                        intermediate_size=4, max_position=8)  # fmt: skip
    out = tmp_path / "out"

    with pytest.raises(FinetuneError, match="No space left"), output.publishing(out) as temp:
        output.write_checkpoint(temp, config, {}, ["a", "b"], ["[PAD]"], True, 8, {})

    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temp directory left either
