"""sentence-transformers checkpoints export as they encode: pooling -> dense -> normalize.

The reference is sentence-transformers' modules written out in torch over transformers'
BertModel (sentence-transformers itself needs transformers < 5 and scikit-learn: not installed):
Pooling's cls / mean / max / lasttoken (and their concatenation), Dense's linear layer and
activation, Normalize's F.normalize.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.build import build
from export.errors import ExportError
from export.predictor import PersistentPredictor
from export.tiny_sentence import write_sentence_checkpoint
from export.zeroshot import tokenize

TEXTS = ["my card was charged twice", "hello", "where is my order? it is late again today"]


def _reference(ckpt: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Return what SentenceTransformer.encode computes for ``feeds``, in torch."""
    model = transformers.BertModel.from_pretrained(str(ckpt), local_files_only=True).eval()
    modules = json.loads((ckpt / "modules.json").read_text())
    ids = torch.tensor(feeds["input_ids"], dtype=torch.long)
    mask = torch.tensor(feeds["attention_mask"], dtype=torch.long)
    with torch.no_grad():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        x = hidden
        for module in modules[1:]:
            kind = module["type"].rsplit(".", 1)[-1]
            where = ckpt / module["path"]
            if kind == "Pooling":
                config = json.loads((where / "config.json").read_text())
                m = mask.unsqueeze(-1).float()
                parts = []
                if config["pooling_mode_cls_token"]:
                    parts.append(hidden[:, 0])
                if config["pooling_mode_max_tokens"]:
                    parts.append(torch.max(hidden.masked_fill(m == 0, -1e9), 1)[0])
                if config["pooling_mode_mean_tokens"]:
                    parts.append((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9))
                if config["pooling_mode_lasttoken"]:
                    last = mask.sum(1) - 1
                    parts.append(hidden[torch.arange(hidden.shape[0]), last])
                x = torch.cat(parts, 1)
            elif kind == "Dense":
                from safetensors.torch import load_file

                weights = load_file(str(where / "model.safetensors"))
                x = torch.nn.functional.linear(x, weights["linear.weight"], weights["linear.bias"])
                activation = json.loads((where / "config.json").read_text())["activation_function"]
                x = torch.tanh(x) if activation.endswith("Tanh") else x
            elif kind == "Normalize":
                x = torch.nn.functional.normalize(x, p=2, dim=1)
    return x.numpy()


def _feeds(ckpt: Path) -> dict[str, np.ndarray]:
    vocab = (ckpt / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return tokenize(TEXTS, vocab, True, 32)


@pytest.mark.parametrize(
    ("pooling", "dense", "normalize"),
    [
        (("mean",), (), True),
        (("cls",), ((16, "tanh"),), True),
        (("max",), (), False),
        (("lasttoken",), ((24, "identity"),), True),
        (("cls", "mean"), ((8, "tanh"),), False),
    ],
)
def test_export_answers_like_sentence_transformers_encode(
    tmp_path: Path, pooling: tuple[str, ...], dense: tuple[tuple[int, str], ...], normalize: bool
) -> None:
    ckpt = write_sentence_checkpoint(tmp_path / "ckpt", pooling=pooling, dense=dense,
                                     normalize=normalize, seed=3)  # fmt: skip
    feeds = _feeds(ckpt)

    result = build(ckpt, "st", tmp_path / "models", task="embed", max_seq_len=32, warmup=False)
    got = PersistentPredictor(result.path).predict(feeds)["embedding"]

    want = _reference(ckpt, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() >= 0.99999
    entry = result.model_info["sentence_transformers"]
    assert entry["pooling"] == list(pooling) and entry["normalize"] is normalize
    assert result.model_info["embedding_dim"] == want.shape[1]


def test_prompts_go_into_model_json(tmp_path: Path) -> None:
    prompts = {"query": "query: ", "document": "passage: "}
    ckpt = write_sentence_checkpoint(tmp_path / "ckpt", prompts=prompts,
                                     default_prompt_name="query")  # fmt: skip

    result = build(ckpt, "st", tmp_path / "models", task="embed", max_seq_len=32, warmup=False)

    entry = result.model_info["sentence_transformers"]
    assert entry["prompts"] == prompts and entry["default_prompt_name"] == "query"


def test_a_pooling_flag_that_contradicts_the_checkpoint_is_refused(tmp_path: Path) -> None:
    ckpt = write_sentence_checkpoint(tmp_path / "ckpt", pooling=("mean",))

    with pytest.raises(ExportError, match=r"pools with mean.*not cls: drop --pooling"):
        build(ckpt, "st", tmp_path / "models", task="embed", pooling="cls", warmup=False)


def test_an_unserved_module_is_refused_with_what_is_served(tmp_path: Path) -> None:
    ckpt = write_sentence_checkpoint(tmp_path / "ckpt")
    modules = json.loads((ckpt / "modules.json").read_text())
    modules.append({"idx": 9, "name": "9", "path": "9_LayerNorm",
                    "type": "sentence_transformers.models.LayerNorm"})  # fmt: skip
    (ckpt / "modules.json").write_text(json.dumps(modules))

    with pytest.raises(ExportError, match=r"LayerNorm.*not served.*Pooling, Dense, Normalize"):
        build(ckpt, "st", tmp_path / "models", task="embed", warmup=False)
