"""Fine-tuning starts from a checkpoint of any architecture and writes one transformers reads.

A tiny random base model of each architecture saved by transformers, with a tokenizer.json of
its own kind (byte-level BPE for RoBERTa and ModernBERT, WordPiece for DistilBERT) and no
vocab.txt, is fine-tuned for one epoch with the same module export serves and the checkpoint's
own tokenizer; transformers loads the result (every tensor known, none missing) and computes the
same logits as export's module on the written checkpoint, whose tokenizer files are the
source's (and, exported, the version's).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch  # the test-time numerical reference (requirements-dev.txt)
import transformers

from export.tiny_tokenizers import build_tokenizer, write_tokenizer
from tests.finetune.conftest import TRAIN_KWARGS

SIZE = {"hidden_size": 32, "num_attention_heads": 4, "intermediate_size": 48,
        "num_hidden_layers": 2, "max_position_embeddings": 64}  # fmt: skip
# one architecture per kind of classification head: dense tanh → out_proj (RoBERTa), a ReLU
# pre_classifier (DistilBERT), dense GELU → norm without biases over the mean (ModernBERT)
BASES: dict[str, dict[str, Any]] = {
    "roberta": {"pad_token_id": 1, "type_vocab_size": 1},
    "distilbert": {"dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 48},
    "modernbert": {"pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "cls_token_id": 0,
                   "sep_token_id": 2, "local_attention": 8, "classifier_pooling": "mean"},
}  # fmt: skip
KINDS = {"roberta": "bpe", "distilbert": "wordpiece", "modernbert": "bpe"}
_TRAINED: dict[str, Any] = {}


def _tokenizer(model_type: str) -> Any:
    kind = KINDS[model_type]
    if kind not in _TRAINED:
        _TRAINED[kind] = build_tokenizer(kind)
    return _TRAINED[kind]


def _batch(model_type: str, rows: int, seed: int) -> dict[str, np.ndarray]:
    from export.warmup import token_batch

    tok = _tokenizer(model_type)
    names = ("[CLS]", "[SEP]") if KINDS[model_type] == "wordpiece" else ("<s>", "</s>")
    cls, sep = (tok.token_to_id(name) for name in names)
    return token_batch(rows, 12, tok.get_vocab_size(with_added_tokens=True), cls_id=cls,
                       sep_id=sep, seed=seed)  # fmt: skip


def _base(model_type: str, where: Path) -> Path:
    rows = _tokenizer(model_type).get_vocab_size(with_added_tokens=True)
    config = transformers.AutoConfig.for_model(
        model_type, **{**SIZE, "vocab_size": rows, **BASES[model_type]}
    )
    torch.manual_seed(5)
    path = where / model_type
    transformers.AutoModel.from_config(config).save_pretrained(path)
    write_tokenizer(path, KINDS[model_type], trained=_tokenizer(model_type))
    return path


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Path]) -> Callable[[str], Path]:
    """Return a function fine-tuning (once per module) a base model of an architecture."""
    from finetune.run import finetune
    from finetune.training import TrainConfig

    done: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in done:
            where = tmp_path_factory.mktemp(f"tuned-{model_type}")
            done[model_type] = where / "tuned"
            finetune(_base(model_type, where), data["train"], data["dev"], done[model_type],
                     config=TrainConfig(**{**TRAIN_KWARGS, "epochs": 1}), precision="fp32",
                     max_seq_len=32)  # fmt: skip
        return done[model_type]

    return get


@pytest.mark.parametrize("model_type", list(BASES))
def test_a_fine_tuned_checkpoint_of_another_architecture_loads_in_transformers_alike(
    model_type: str, tuned: Callable[[str], Path]
) -> None:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run

    out = tuned(model_type)

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == model_type
    load = transformers.AutoModelForSequenceClassification.from_pretrained  # a local directory
    model, info = load(str(out), local_files_only=True, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(model).__name__ == config["architectures"][0]
    feeds = _batch(model_type, 3, seed=4)
    names = ("input_ids", "attention_mask")  # none of these has token types
    with torch.no_grad():
        expected = model.eval()(**{k: torch.tensor(feeds[k], dtype=torch.long) for k in names})
    ckpt = read_checkpoint(out)
    got = run(EncoderModule(ckpt.config, ckpt.weights, task="classify").serve, feeds)["logits"]
    np.testing.assert_allclose(got, expected.logits.numpy(), atol=1e-4)
    assert ckpt.labels == ["neg", "pos"]


@pytest.mark.parametrize("model_type", list(BASES))
def test_distilled_exits_of_another_architecture_export_and_serve(
    model_type: str, tmp_path: Path, data: dict[str, Path], tuned: Callable[[str], Path]
) -> None:
    """distill-exits reads the same module's layers; the export serves them (speed 0 = full)."""
    from export.build import build
    from export.predictor import PersistentPredictor
    from finetune.exits import DistillConfig, distill_exits

    distilled = tmp_path / "distilled"
    distill_exits(tuned(model_type), data["train"], data["dev"], distilled,
                  config=DistillConfig(epochs=2, width=16, max_seq_len=32))  # fmt: skip
    result = build(distilled, "m", tmp_path / "models", early_exit=True, max_seq_len=32,
                   warmup=False)  # fmt: skip
    feeds = _batch(model_type, 4, seed=6)
    predictor = PersistentPredictor(result.path)
    full = predictor.predict({**feeds, "speed": np.zeros(4, np.float32)})
    assert list(full["exit_layer"]) == [2] * 4
    fast = predictor.predict({**feeds, "speed": np.ones(4, np.float32)})
    assert set(fast["exit_layer"]) <= {1, 2}


def test_a_fine_tuned_roberta_keeps_its_bpe_tokenizer_through_export(
    tmp_path: Path, tuned: Callable[[str], Path]
) -> None:
    """Fine-tuning writes the source's tokenizer files (no BERT vocab.txt); export copies that
    tokenizer.json into the version's assets byte for byte, and transformers reads it back."""
    from export.build import build

    out = tuned("roberta")
    source = out.parent / "roberta"
    assert not (out / "vocab.txt").exists()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    result = build(out, "m", tmp_path / "models", max_seq_len=32, warmup=False)
    assert (result.path / "assets" / "tokenizer.json").read_bytes() == (
        source / "tokenizer.json"
    ).read_bytes()
    assert result.model_info["tokenizer"]["model"] == "BPE"
    text = "my card was charged twice, refund please"
    theirs = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    ours = _tokenizer("roberta")
    assert theirs(text)["input_ids"] == ours.encode(text).ids
