"""sentence-transformers checkpoints export as they encode: pooling -> dense -> normalize.

Directories in 5.x's and 6.x's layouts (export/tiny_sentence.py), against sentence-transformers'
modules written out in torch over transformers' BertModel: Pooling's cls / mean / max / lasttoken
(and their concatenation: in 5.x's fixed order, in 6.x's listed order), Dense's linear layer and
activation, Normalize's F.normalize. And a model built and saved by sentence-transformers itself,
5.x (requirements-refs.txt) and 6.x (requirements-st6.txt), against its own ``encode``
(tests/export/st6.py: each in a child process).
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
                m = mask.unsqueeze(-1).float()
                pooled = {
                    "cls": hidden[:, 0],
                    "max": torch.max(hidden.masked_fill(m == 0, -1e9), 1)[0],
                    "mean": (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9),
                    "lasttoken": hidden[torch.arange(hidden.shape[0]), mask.sum(1) - 1],
                }
                x = torch.cat([pooled[mode] for mode in _modes(where)], 1)
            elif kind == "Dense":
                from safetensors.torch import load_file

                weights = load_file(str(where / "model.safetensors"))
                x = torch.nn.functional.linear(x, weights["linear.weight"], weights["linear.bias"])
                activation = json.loads((where / "config.json").read_text())["activation_function"]
                x = torch.tanh(x) if activation.endswith("Tanh") else x
            elif kind == "Normalize":
                x = torch.nn.functional.normalize(x, p=2, dim=1)
    return x.numpy()


def _modes(where: Path) -> list[str]:
    """Return a Pooling's modes in the order it concatenates them: 6.x's ``pooling_mode`` as
    listed, 5.x's ``pooling_mode_*`` flags in its fixed order (cls, max, mean, lasttoken)."""
    config = json.loads((where / "config.json").read_text())
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return [mode] if isinstance(mode, str) else list(mode)
    flags = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
             "mean": "pooling_mode_mean_tokens", "lasttoken": "pooling_mode_lasttoken"}  # fmt: skip
    return [mode for mode, key in flags.items() if config.get(key)]


def _feeds(ckpt: Path) -> dict[str, np.ndarray]:
    vocab = (ckpt / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return tokenize(TEXTS, vocab, True, 32)


@pytest.mark.parametrize(
    ("layout", "pooling", "dense", "normalize"),
    [
        ("5", ("mean",), (), True),
        ("5", ("cls",), ((16, "tanh"),), True),
        ("5", ("max",), (), False),
        ("5", ("lasttoken",), ((24, "identity"),), True),
        ("5", ("cls", "mean"), ((8, "tanh"),), False),
        ("6", ("mean",), (), True),
        ("6", ("cls",), ((16, "tanh"),), True),
        ("6", ("mean", "cls"), ((8, "tanh"),), False),  # 6.x: concatenated in the listed order
    ],
)
def test_export_answers_like_sentence_transformers_encode(
    tmp_path: Path, layout: str, pooling: tuple[str, ...], dense: tuple[tuple[int, str], ...],
    normalize: bool,
) -> None:  # fmt: skip
    ckpt = write_sentence_checkpoint(tmp_path / "ckpt", pooling=pooling, dense=dense,
                                     normalize=normalize, seed=3, layout=layout)  # fmt: skip
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


@pytest.mark.parametrize("st6", [False, True], ids=["st5", "st6"])
@pytest.mark.parametrize(
    ("pooling", "activation"), [(("mean",), "tanh"), (("mean", "cls"), "identity")]
)
def test_export_answers_like_sentence_transformers_itself(
    tmp_path: Path, pooling: tuple[str, ...], activation: str, st6: bool
) -> None:
    from export.tiny import write_hf_checkpoint
    from tests.export.st6 import answers

    base = write_hf_checkpoint(tmp_path / "base", task="embed", seed=5, hidden=32)
    theirs = answers("dense", st6=st6, base=str(base), dest=str(tmp_path / "st"),
                     pooling=list(pooling), activation=activation, texts=TEXTS)  # fmt: skip
    feeds = {k[len("feed_") :]: v.astype(np.int32) for k, v in theirs.items()
             if k.startswith("feed_")}  # fmt: skip

    result = build(tmp_path / "st", "st", tmp_path / "models", task="embed", max_seq_len=32,
                   warmup=False)  # fmt: skip
    got = PersistentPredictor(result.path).predict(feeds)["embedding"]

    print(f"sentence-transformers {theirs['version']}: {np.abs(got - theirs['want']).max():.2e}")
    assert str(theirs["version"]).startswith("6." if st6 else "5.")
    np.testing.assert_allclose(got, theirs["want"], atol=1e-5)
    assert result.model_info["sentence_transformers"]["normalize"] is True


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
