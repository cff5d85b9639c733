"""The exported TF model computes what transformers' PyTorch BERT computes on the same weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.build import build
from export.predictor import PersistentPredictor
from export.warmup import token_batch

VOCAB = 303  # len(tiny_vocab())


def _inputs() -> dict[str, np.ndarray]:
    feeds = token_batch(5, 24, VOCAB, cls_id=2, sep_id=3, seed=7)
    feeds["token_type_ids"][:, 12:] = feeds["attention_mask"][:, 12:]  # exercise segment B
    return feeds


def _torch_outputs(model_cls: type, ckpt: Path, feeds: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    model = model_cls.from_pretrained(str(ckpt), local_files_only=True).eval()
    with torch.no_grad():
        return model(**{k: torch.tensor(v, dtype=torch.long) for k, v in feeds.items()})


def test_hf_classifier_matches_torch_within_1e4(classify_v1) -> None:  # type: ignore[no-untyped-def]
    feeds = _inputs()
    expected = _torch_outputs(
        transformers.BertForSequenceClassification,
        Path(classify_v1.model_info["source"]["path"]),
        feeds,
    ).logits.numpy()
    got = PersistentPredictor(classify_v1.path).predict(feeds)
    np.testing.assert_allclose(got["logits"], expected, atol=1e-4)
    softmax = np.exp(expected) / np.exp(expected).sum(-1, keepdims=True)
    np.testing.assert_allclose(got["probabilities"], softmax, atol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_hf_embedding_matches_torch_pooling(hf_embed: Path, tmp_path: Path, pooling: str) -> None:
    feeds = _inputs()
    hidden = _torch_outputs(transformers.BertModel, hf_embed, feeds).last_hidden_state.numpy()
    if pooling == "cls":
        expected = hidden[:, 0]
    else:
        mask = feeds["attention_mask"][..., None].astype(np.float32)
        expected = (hidden * mask).sum(1) / mask.sum(1)
    result = build(
        hf_embed, "e", tmp_path, task="embed", pooling=pooling, max_seq_len=32, warmup=False
    )
    got = PersistentPredictor(result.path).predict(feeds)["embedding"]
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_google_checkpoint_matches_torch_on_same_weights(
    google_classify: Path, hf_classify: Path, tmp_path: Path
) -> None:
    feeds = _inputs()
    expected = _torch_outputs(
        transformers.BertForSequenceClassification, hf_classify, feeds
    ).logits.numpy()
    result = build(
        google_classify, "g", tmp_path, labels=["neg", "neu", "pos"], max_seq_len=32, warmup=False
    )
    got = PersistentPredictor(result.path).predict(feeds)["logits"]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert result.model_info["source"]["format"] == "google"
    assert result.model_info["labels"] == ["neg", "neu", "pos"]


def test_bf16_safetensors_checkpoint_is_read_exactly(hf_classify: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    from export.checkpoint import read_checkpoint

    ckpt = Path(shutil.copytree(hf_classify, tmp_path / "bf16"))
    tensors = load_file(str(ckpt / "model.safetensors"))
    save_file(
        {k: v.to(torch.bfloat16) for k, v in tensors.items()}, str(ckpt / "model.safetensors")
    )
    weights = read_checkpoint(ckpt).weights
    expected = tensors["bert.encoder.layer.1.attention.self.query.weight"].to(torch.bfloat16)
    np.testing.assert_array_equal(weights["layer_1/query/kernel"], expected.float().numpy().T)
    assert weights["classifier/kernel"].dtype == np.float32


def test_google_prefix_and_directory_read_the_same_weights(google_classify: Path) -> None:
    from export.checkpoint import read_checkpoint

    by_dir = read_checkpoint(google_classify)
    by_prefix = read_checkpoint(google_classify / "bert_model.ckpt")
    assert by_dir.weights.keys() == by_prefix.weights.keys()
    np.testing.assert_array_equal(
        by_dir.weights["embeddings/word"], by_prefix.weights["embeddings/word"]
    )
    assert by_dir.labels == ["LABEL_0", "LABEL_1", "LABEL_2"] and by_dir.do_lower_case
