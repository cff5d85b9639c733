"""``python -m finetune`` refusals: one ``error:`` line, exit status 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from finetune.cli import main
from ops.procs import REPO
from tests.finetune.conftest import write_tsv


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


def _args(ckpt: Path, train: Path, dev: Path, out: Path, *extra: str) -> list[str]:
    return ["--checkpoint", str(ckpt), "--train", str(train), "--dev", str(dev),
            "--out", str(out), "--quiet", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("train_rows", "dev_rows", "message"),
    [
        ([], [("x", "pos")], "the training set has no examples"),
        ([("a", "pos"), ("b", "pos")], [("x", "pos")], "the training set has one label only"),
        ([("a", "pos"), ("b", "neg")], [("x", "meh")], "line 2: unknown label 'meh'"),
    ],
)
def test_unusable_data_exits_2_with_one_error_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    tiny_bert: Path,
    train_rows: list[tuple[str, str]],
    dev_rows: list[tuple[str, str]],
    message: str,
) -> None:
    train = write_tsv(tmp_path / "train.tsv", train_rows)
    dev = write_tsv(tmp_path / "dev.tsv", dev_rows)

    code, err = _run(capsys, *_args(tiny_bert, train, dev, tmp_path / "out"))

    assert code == 2
    assert err.startswith("error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_that_is_not_bert_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, data: dict[str, Path]
) -> None:
    gpt = tmp_path / "gpt2"
    gpt.mkdir()
    (gpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2}))

    code, err = _run(capsys, *_args(gpt, data["train"], data["dev"], tmp_path / "out"))

    assert code == 2
    assert "unknown architecture model_type='gpt2'" in err and err.count("\n") == 1


def test_a_missing_data_file_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_bert: Path, data: dict[str, Path]
) -> None:
    code, err = _run(capsys, *_args(tiny_bert, tmp_path / "nope.tsv", data["dev"], tmp_path / "o"))

    assert code == 2
    assert f"data file not found: {tmp_path / 'nope.tsv'}" in err


def test_an_existing_out_is_refused_without_resume(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_bert: Path, data: dict[str, Path]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")

    code, err = _run(capsys, *_args(tiny_bert, data["train"], data["dev"], out))

    assert code == 2
    assert f"{out} exists" in err and "--resume" in err
    assert (out / "keep.txt").read_text() == "mine"


def test_module_entry_point_prints_no_traceback(tmp_path: Path, data: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "finetune", *_args(tmp_path / "none", data["train"], data["dev"],
                                                   tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip

    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'none'}"


def test_leftover_state_needs_resume_and_resume_needs_the_same_settings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_bert: Path, data: dict[str, Path]
) -> None:
    from finetune.output import state_dir

    out = tmp_path / "out"
    state = state_dir(out)
    state.mkdir()
    (state / "run.json").write_text(json.dumps({"epochs": 99}))
    args = _args(tiny_bert, data["train"], data["dev"], out)

    code, err = _run(capsys, *args)
    assert code == 2 and "pass --resume to continue it" in err

    code, err = _run(capsys, *args, "--resume")
    assert code == 2 and "other settings than the killed run" in err and "epochs" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--patience", "0", "patience must be at least 1"), ("--epochs", "0", "epochs"),
     ("--batch-size", "-1", "batch size"), ("--lr", "0", "learning rate")],
)  # fmt: skip
def test_a_bad_number_is_refused_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_bert: Path, data: dict[str, Path],
    flag: str, value: str, says: str,
) -> None:  # fmt: skip
    from finetune.output import state_dir

    out = tmp_path / "out"
    code, err = _run(capsys, *_args(tiny_bert, data["train"], data["dev"], out, flag, value))
    assert code == 2 and says in err
    assert not out.exists() and not state_dir(out).exists()  # nothing blocks the next run


def test_resume_refuses_data_files_that_changed_since_the_killed_run(
    tmp_path: Path, tiny_bert: Path, data: dict[str, Path]
) -> None:
    import shutil

    from finetune.errors import FinetuneError
    from finetune.run import finetune
    from finetune.training import TrainConfig

    train = tmp_path / "train.tsv"
    shutil.copy(data["train"], train)
    out = tmp_path / "out"
    config = TrainConfig(epochs=1, batch_size=8, save_every_steps=1, verbose=False)

    class Killed(Exception):
        pass

    def kill(step: int) -> None:
        if step == 2:
            raise Killed

    with pytest.raises(Killed):
        finetune(tiny_bert, train, data["dev"], out, config=config, precision="fp32",
                 max_seq_len=32, on_step=kill)  # fmt: skip
    train.write_text(train.read_text() + "one more ticket\tpos\n")
    with pytest.raises(FinetuneError, match="other data than the killed run: the train file"):
        finetune(tiny_bert, train, data["dev"], out, config=config, precision="fp32",
                 max_seq_len=32, resume=True)  # fmt: skip


# -- the other heads' files (issue 22) -----------------------------------------------------------
GOOD_SPANS = '{"text": "order 123 arrived", "entities": [{"start": 6, "end": 9, "label": "ORDER"}]}'


@pytest.mark.parametrize(
    ("task", "train", "dev", "says"),
    [
        (["--task", "tag"], GOOD_SPANS + "\n",
         GOOD_SPANS + '\n{"text": "order 123", "entities": [{"start": 6, "end": 12, '
         '"label": "ORDER"}]}\n', "dev.txt: 1 bad rows: line 2: entity [6, 12) 'ORDER' is out of "
         "range"),
        (["--task", "tag"], '{"text": "order ORD123 arrived", "entities": [{"start": 9, '
         '"end": 12, "label": "ORDER"}]}\n', GOOD_SPANS + "\n",
         "train.txt: 1 bad rows: line 1: entity [9, 12) 'ORDER' does not start at a word boundary"),
        (["--task", "pair-classify"], "text_a\ttext_b\tlabel\nq\td\t1\nq\te\t0\n",
         "text_a\ttext_b\tlabel\nq\tonly two\n", "dev.txt: 1 bad rows: line 2: 2 tab-separated "
         "fields, expected 3"),
        (["--task", "multi-label"], "text\tlabels\na\tx|y\nb\ty\n", "text\tlabels\nc\tx|z\n",
         "dev.txt: 1 bad rows: line 2: unknown label 'z' (the training set has x, y)"),
        (["--task", "pair-classify", "--num-labels", "1"], "q\td\tyes\nq\te\tno\n",
         "q\td\tyes\n", "labels must be 0/1 or irrelevant/relevant, got no, yes"),
        (["--task", "multi-label", "--num-labels", "2"], "a\tx\n", "a\tx\n",
         "--num-labels is for --task pair-classify"),
    ],
)  # fmt: skip
def test_bad_files_of_the_other_heads_exit_2_with_one_error_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_bert: Path,
    task: list[str], train: str, dev: str, says: str,
) -> None:  # fmt: skip
    (tmp_path / "train.txt").write_text(train, encoding="utf-8")
    (tmp_path / "dev.txt").write_text(dev, encoding="utf-8")

    code, err = _run(capsys, *_args(tiny_bert, tmp_path / "train.txt", tmp_path / "dev.txt",
                                    tmp_path / "out", *task))  # fmt: skip

    assert code == 2
    assert err.startswith("error: ") and says in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()
