"""Export serves a model at most as long as its tokenizer reads (issue 41 item 6): without
--max-seq-len, a tokenizer_config.json model_max_length below the default 128 is the model's
max_seq_len, and model.json says where the number came from. The length chosen, the flag's or the
tokenizer's, is held to the same rules: at least 2, at most the position embeddings (issue 48
item 5), and a refusal says where the number came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from export.build import DEFAULT_MAX_SEQ_LEN, build, choose_max_seq_len
from export.checkpoint import read_checkpoint
from export.errors import ExportError
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


# --- the chosen length is held to the rules, wherever it came from (issue 48 item 5) ----------


@pytest.mark.parametrize("asked", [0, -3, 1])
def test_a_flag_below_two_is_refused_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], asked: int
) -> None:
    """`--max-seq-len 0` once became the default 128 (`0 or 128`); it names the flag now."""
    from export.cli import main

    base = tmp_path / "models"
    argv = ["build", "--checkpoint", str(tmp_path / "absent"), "--name", "x",
            "--base-path", str(base), "--max-seq-len", str(asked)]  # fmt: skip
    assert main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    # refused on the flag, before the (absent) checkpoint is looked at
    assert last == f"error: max_seq_len must be at least 2, got {asked} (--max-seq-len)"
    assert not base.exists()


def test_a_tokenizers_length_below_two_is_refused_and_names_the_tokenizer(tmp_path: Path) -> None:
    base = tmp_path / "models"
    with pytest.raises(ExportError, match=r"at least 2, got 1 \(the tokenizer's model_max_length"):
        build(_checkpoint(tmp_path, 1), "short", base, version=1, warmup=False)
    assert not base.exists()


@pytest.mark.parametrize(("stated", "asked"), [(None, 200), (100, None)])
def test_a_length_past_the_position_embeddings_is_refused_and_names_its_source(
    tmp_path: Path, stated: int | None, asked: int | None
) -> None:
    """The tiny checkpoint has 64 positions: the flag's 200, or a tokenizer's 100 (below the
    default, so chosen), is past them; the error says where the number came from."""
    path = write_hf_checkpoint(tmp_path / "ckpt", seed=1, max_position=64)
    if stated is not None:
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text(encoding="utf-8"))
        config_file.write_text(json.dumps({**config, "model_max_length": stated}), "utf-8")
    source = "--max-seq-len" if asked else "the tokenizer's model_max_length"
    base = tmp_path / "models"
    with pytest.raises(ExportError, match="max_position_embeddings 64") as caught:
        build(path, "long", base, version=1, max_seq_len=asked, warmup=False)
    assert source in str(caught.value)
    assert not base.exists()
