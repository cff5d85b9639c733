"""Missing, corrupt or inconsistent checkpoints stop with an ExportError naming the culprit.

Every case also checks that nothing was written under the base path.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from export.build import build
from export.errors import ExportError


def _edit_tensors(ckpt: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(str(ckpt / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(ckpt / "model.safetensors"))


def _edit_config(ckpt: Path, **changes: object) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    config.update(changes)
    (ckpt / "config.json").write_text(json.dumps(config))


def _drop_vocab_line(ckpt: Path) -> None:
    lines = (ckpt / "vocab.txt").read_text().splitlines()
    (ckpt / "vocab.txt").write_text("\n".join(lines[:-1]) + "\n")


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "no vocab": (lambda c: (c / "vocab.txt").unlink(), "vocab.txt"),
    "vocab size differs from embedding rows": (_drop_vocab_line, "vocab.txt"),
    "no weights file": (lambda c: (c / "model.safetensors").unlink(), "model.safetensors"),
    "corrupt weights file": (
        lambda c: (c / "model.safetensors").write_bytes(b"\x08\x00\x00\x00garbage!"),
        "model.safetensors",
    ),
    "corrupt config": (lambda c: (c / "config.json").write_text("{not json"), "config.json"),
    "missing config key": (lambda c: _edit_config(c, hidden_size=None), "config.json"),
    "unknown architecture": (lambda c: _edit_config(c, model_type="gpt2"), "model_type='gpt2'"),
    "tensor with wrong shape": (
        lambda c: _edit_tensors(
            c,
            lambda t: t.update(
                {"bert.encoder.layer.1.intermediate.dense.weight": np.zeros((36, 32), np.float32)}
            ),
        ),
        "bert.encoder.layer.1.intermediate.dense.weight",
    ),
    "missing tensor": (
        lambda c: _edit_tensors(c, lambda t: t.pop("bert.encoder.layer.0.attention.self.key.bias")),
        "bert.encoder.layer.0.attention.self.key.bias",
    ),
    "classifier bias without weight": (
        lambda c: _edit_tensors(c, lambda t: t.pop("classifier.weight")),
        "classifier.weight",
    ),
    "labels count differs from head width": (
        lambda c: _edit_config(c, id2label={"0": "a", "1": "b"}),
        "2 labels",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_names_the_file_or_tensor(
    case: str, hf_classify: Path, tmp_path: Path
) -> None:
    ckpt = Path(shutil.copytree(hf_classify, tmp_path / "ckpt"))
    damage, expected = CASES[case]
    damage(ckpt)
    with pytest.raises(ExportError, match=expected.replace(".", r"\.")):
        build(ckpt, "bad", tmp_path / "models", max_seq_len=16, warmup=False)
    assert not (tmp_path / "models").exists()


def test_classify_without_head_suggests_embed_or_prompts(hf_embed: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no classifier head"):
        build(hf_embed, "x", tmp_path, task="classify")


def test_labels_override_must_match_head_width(hf_classify: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="3 outputs"):
        build(hf_classify, "x", tmp_path, labels=["a", "b"])


def test_google_head_width_checked_against_labels(google_classify: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=r"output_weights|3 outputs"):
        build(google_classify, "x", tmp_path, labels=["a", "b", "c", "d"])


def test_missing_checkpoint_path(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="checkpoint not found"):
        build(tmp_path / "nope", "x", tmp_path / "models")


def test_directory_that_is_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="not a checkpoint"):
        build(tmp_path / "empty", "x", tmp_path / "models")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": "regress"}, "task must be"),
        ({"precision": "int8"}, "precision must be"),
        ({"pooling": "max"}, "pooling must be"),
        ({"max_seq_len": 1}, "max_seq_len"),
        ({"max_seq_len": 4096}, "max_position_embeddings"),
    ],
)
def test_bad_settings_are_refused(
    kwargs: dict, message: str, hf_classify: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExportError, match=message):
        build(hf_classify, "x", tmp_path, **kwargs)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("labels", [["a", "a", "b"], ["a", "", "b"], ["a", "b\nc", "d"]])
def test_labels_must_be_unique_single_lines(
    labels: list[str], hf_classify: Path, tmp_path: Path
) -> None:
    with pytest.raises(ExportError, match="labels must be"):
        build(hf_classify, "x", tmp_path, labels=labels)


def test_cased_tokenizer_config_is_recorded(tmp_path: Path) -> None:
    from export.tiny import write_hf_checkpoint

    ckpt = write_hf_checkpoint(tmp_path / "cased", task="embed", do_lower_case=False)
    result = build(ckpt, "cased", tmp_path / "models", task="embed", max_seq_len=16, warmup=False)
    assert result.model_info["do_lower_case"] is False
