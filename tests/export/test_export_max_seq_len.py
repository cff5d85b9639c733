"""Export serves a model at most as long as its tokenizer reads (issue 41 item 6): without
--max-seq-len, a tokenizer_config.json model_max_length below the default 128 is the model's
max_seq_len, and model.json says where the number came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.build import DEFAULT_MAX_SEQ_LEN, build, choose_max_seq_len
from export.checkpoint import read_checkpoint
from export.tiny import write_hf_checkpoint


def _checkpoint(root: Path, model_max_length: float) -> Path:
    path = write_hf_checkpoint(root / "ckpt", seed=1)
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["model_max_length"] = model_max_length
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("stated", "asked", "expected", "source"),
    [
        (64, None, 64, "model_max_length"),  # below the default: the tokenizer's
        (512, None, DEFAULT_MAX_SEQ_LEN, "default"),  # above it: the default
        (1e30, None, DEFAULT_MAX_SEQ_LEN, "default"),  # transformers' "no limit"
        (64, 96, 96, "--max-seq-len"),  # the flag wins
    ],
)
def test_the_tokenizers_model_max_length_caps_the_default(
    tmp_path: Path, stated: float, asked: int | None, expected: int, source: str
) -> None:
    ckpt = read_checkpoint(_checkpoint(tmp_path, stated))
    length, said = choose_max_seq_len(asked, ckpt)
    assert length == expected and source in said


def test_an_export_without_the_flag_serves_the_tokenizers_length(tmp_path: Path) -> None:
    result = build(_checkpoint(tmp_path, 48), "short", tmp_path / "models", version=1,
                   warmup=False)  # fmt: skip
    info = json.loads((Path(result.path) / "assets" / "model.json").read_text(encoding="utf-8"))
    assert info["max_seq_len"] == 48
    assert "model_max_length" in info["max_seq_len_source"]
