"""``python -m finetune distill-exits``: students learn the teacher; the output loads everywhere."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.tiny import tiny_vocab, write_hf_checkpoint
from finetune.cli import main
from finetune.errors import FinetuneError
from finetune.exits import DistillConfig, distill_exits
from tests.finetune.conftest import separable_rows, write_tsv

LAYERS = 3
TEXTS = ["good great thanks", "terrible awful order", "the package", "love " * 20]


def _feeds(texts: list[str]) -> dict[str, np.ndarray]:
    from backend.bucketing import pad_batch
    from finetune.pipeline import make_tokenizer, token_ids

    rows = token_ids(make_tokenizer(tiny_vocab(), True, 64), texts)
    return pad_batch(rows, max(len(r) for r in rows))


def _our_logits(path: Path, texts: list[str]) -> np.ndarray:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run

    ckpt = read_checkpoint(path)
    module = EncoderModule(ckpt.config, ckpt.weights, task="classify")
    return run(module.serve, _feeds(texts))["logits"]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Distillation texts (labelled TSV: labels ignored) and a labelled dev split."""
    root = tmp_path_factory.mktemp("distill-data")
    return {
        "texts": write_tsv(root / "texts.tsv", separable_rows(160, seed=1)),
        "dev": write_tsv(root / "dev.tsv", separable_rows(64, seed=2)),
    }


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, data: dict[str, Path]) -> Path:
    """A 3-layer classify checkpoint whose (random) head splits the texts about evenly.

    A random head mostly answers one label; its bias is shifted by the median logit margin so
    that agreeing with it means more than always answering the majority label.
    """
    from safetensors.numpy import load_file, save_file

    from finetune.data import read_texts

    path = write_hf_checkpoint(tmp_path_factory.mktemp("teacher") / "ckpt", labels=("neg", "pos"),
                               layers=LAYERS, seed=3)  # fmt: skip
    texts = read_texts(data["texts"]).texts + read_texts(data["dev"]).texts
    logits = np.concatenate([_our_logits(path, texts[i : i + 64])
                             for i in range(0, len(texts), 64)])  # fmt: skip
    tensors = load_file(str(path / "model.safetensors"))
    tensors["classifier.bias"][1] -= np.median(logits[:, 1] - logits[:, 0])
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture(scope="module")
def distilled(tmp_path_factory: pytest.TempPathFactory, teacher: Path, data: dict[str, Path]
              ) -> dict[str, Any]:  # fmt: skip
    """One ``distill-exits`` run through the command line: its exit status, output and path."""
    out = tmp_path_factory.mktemp("distilled") / "exits"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["distill-exits", "--checkpoint", str(teacher), "--texts", str(data["texts"]),
                     "--dev", str(data["dev"]), "--out", str(out), "--epochs", "25",
                     "--seed", "5"])  # fmt: skip
    return {"code": code, "stdout": printed.getvalue(), "out": out}


def test_students_agree_with_the_teacher_more_than_untrained_ones_and_the_majority(
    distilled: dict[str, Any], teacher: Path, data: dict[str, Path]
) -> None:
    from export.checkpoint import read_checkpoint
    from finetune.data import read_texts
    from finetune.exits import agreement, build_students, encode, initial_students, student_logits

    dev = encode(read_checkpoint(teacher), read_texts(data["dev"]).texts, 64)
    untrained = build_students(initial_students(LAYERS - 1, 32, 128, 2, seed=5), "mean")
    before = agreement(student_logits(untrained, dev.pooled["mean"]), dev.teacher)
    majority = np.bincount(dev.teacher.argmax(-1)).max() / len(dev.teacher)
    report = json.loads((distilled["out"] / "exits.json").read_text())

    after = [row["agreement"] for row in report["per_layer"] if not row.get("teacher")]
    assert len(after) == LAYERS - 1
    for trained, untrained_agreement in zip(after, before, strict=True):
        assert trained > untrained_agreement and trained >= majority + 0.15
    assert report["history"][-1]["kl"] < report["history"][0]["kl"]


def test_the_command_prints_progress_and_a_table_per_exit_layer(distilled: dict[str, Any]
                                                                ) -> None:  # fmt: skip
    stdout = distilled["stdout"]

    assert distilled["code"] == 0
    assert "mean epoch 25/25: KL" in stdout and "dev agreement by layer" in stdout
    assert "| exit layer | agreement | accuracy | mean entropy |" in stdout
    assert "| 1 |" in stdout and "| 2 |" in stdout and "| 3 (teacher) | 1.000 |" in stdout
    assert stdout.strip().splitlines()[-1].startswith(f"wrote {distilled['out']} (2 students")


def test_output_is_the_input_checkpoint_plus_students_config_and_report(
    distilled: dict[str, Any], teacher: Path
) -> None:
    out = distilled["out"]
    config = json.loads((out / "config.json").read_text())
    report = json.loads((out / "exits.json").read_text())
    entry = config.pop("early_exits")

    assert config == json.loads((teacher / "config.json").read_text())
    assert (out / "vocab.txt").read_bytes() == (teacher / "vocab.txt").read_bytes()
    assert entry["pooling"] == report["pooling"] == "mean"
    assert entry["width"] == 128 and entry["layers"] == [1, 2] and entry["texts"] == 160
    assert entry["epochs"] == 25 and set(entry["agreement"]) == {"1", "2"}
    rows = report["per_layer"]
    assert [row["layer"] for row in rows] == [1, 2, 3] and rows[-1]["teacher"]
    assert all(0 <= row["accuracy"] <= 1 and 0 <= row["mean_entropy"] <= 1 for row in rows)
    assert report["dev"] == {"path": report["dev"]["path"], "texts": 64, "labelled": True}
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".tmp-")]


def test_students_are_in_safetensors_under_the_contract_names(distilled: dict[str, Any]) -> None:
    from safetensors.numpy import load_file

    tensors = load_file(str(distilled["out"] / "model.safetensors"))

    for k in range(LAYERS - 1):
        assert tensors[f"exits.{k}.dense.weight"].shape == (128, 32)  # torch [out, in]
        assert tensors[f"exits.{k}.dense.bias"].shape == (128,)
        assert tensors[f"exits.{k}.classifier.weight"].shape == (2, 128)
        assert tensors[f"exits.{k}.classifier.bias"].shape == (2,)
    assert f"exits.{LAYERS - 1}.dense.weight" not in tensors


def test_read_checkpoint_returns_the_students_and_the_early_exits_entry(
    distilled: dict[str, Any],
) -> None:
    from safetensors.numpy import load_file

    from export.checkpoint import read_checkpoint

    ckpt = read_checkpoint(distilled["out"])
    tensors = load_file(str(distilled["out"] / "model.safetensors"))
    config = json.loads((distilled["out"] / "config.json").read_text())

    assert ckpt.exits == config["early_exits"]
    np.testing.assert_array_equal(ckpt.weights["exit_1/dense/kernel"],
                                  tensors["exits.1.dense.weight"].T)  # fmt: skip


def test_transformers_loads_the_output_to_the_teachers_logits(
    distilled: dict[str, Any], teacher: Path
) -> None:
    import torch
    from transformers import BertForSequenceClassification

    feeds = {k: torch.from_numpy(v.astype(np.int64)) for k, v in _feeds(TEXTS).items()}
    logits = {}
    for name, path in (("teacher", teacher), ("out", distilled["out"])):
        model = BertForSequenceClassification.from_pretrained(str(path), local_files_only=True)
        with torch.no_grad():
            logits[name] = model.eval()(**feeds).logits.numpy()

    np.testing.assert_allclose(logits["out"], logits["teacher"], atol=1e-5)
    np.testing.assert_allclose(logits["out"], _our_logits(distilled["out"], TEXTS), atol=1e-4)


def _refusal_case(case: str, root: Path, teacher: Path, data: dict[str, Path]
                  ) -> tuple[Path, Path, str]:  # fmt: skip
    """Return (checkpoint, texts, expected message part) for one refusal."""
    texts = data["texts"]
    if case == "out exists":
        (root / "out").mkdir()
        return teacher, texts, "exists"
    if case == "no trained head":
        return write_hf_checkpoint(root / "embed", task="embed", layers=2), texts, "no trained"
    if case == "one label":
        return write_hf_checkpoint(root / "one", labels=("only",), layers=2), texts, "at least 2"
    if case == "one layer":
        return write_hf_checkpoint(root / "l1", layers=1), texts, "1-layer"
    empty = root / "empty.tsv"
    empty.write_text("text\tlabel\n\n", encoding="utf-8")
    return teacher, empty, "no texts"


@pytest.mark.parametrize("case", ["out exists", "no trained head", "one label", "one layer",
                                  "empty texts"])  # fmt: skip
def test_refusals_exit_2_with_one_error_line_and_write_nothing(
    case: str, tmp_path: Path, teacher: Path, data: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    checkpoint, texts, expected = _refusal_case(case, tmp_path, teacher, data)
    before = sorted(p.name for p in tmp_path.iterdir())

    code = main(["distill-exits", "--checkpoint", str(checkpoint), "--texts", str(texts),
                 "--dev", str(data["dev"]), "--out", str(tmp_path / "out")])  # fmt: skip

    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and expected in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_dev_labels_the_head_lacks_are_refused(tmp_path: Path, teacher: Path,
                                               data: dict[str, Path]) -> None:  # fmt: skip
    dev = write_tsv(tmp_path / "dev.tsv", [("good", "pos"), ("bad", "meh")])

    with pytest.raises(FinetuneError, match=r"labels \['meh'\]"):
        distill_exits(teacher, data["texts"], dev, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_texts_without_labels_are_read_one_per_line(tmp_path: Path) -> None:
    from finetune.data import read_texts

    path = tmp_path / "texts.txt"
    path.write_text("good thanks\n\nthe package\twith a tab\tpos\n", encoding="utf-8")

    texts = read_texts(path)

    assert texts.texts == ["good thanks", "the package\twith a tab"] and texts.labels is None


@pytest.mark.parametrize("argv", [[], ["train"]])
def test_the_bare_form_and_train_still_fine_tune(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*argv, "--checkpoint", str(tmp_path / "missing"), "--train", "t.tsv",
                 "--dev", "d.tsv", "--out", str(tmp_path / "out")])  # fmt: skip

    assert code == 2 and "checkpoint not found" in capsys.readouterr().err
    assert DistillConfig().pooling == "mean"


def test_only_the_chosen_poolings_vectors_are_cached(teacher: Path) -> None:
    """[L-1, n, H] float32 per pooling: BERT-base on 100k texts is 3.4 GB each; a run with one
    pooling must not hold both."""
    from export.checkpoint import read_checkpoint
    from finetune.exits import encode

    ckpt = read_checkpoint(teacher)
    texts = ["a short text", "another one here"]
    one = encode(ckpt, texts, 16, ("cls",))
    both = encode(ckpt, texts, 16)
    assert set(one.pooled) == {"cls"} and set(both.pooled) == {"cls", "mean"}
    np.testing.assert_array_equal(one.pooled["cls"], both.pooled["cls"])


def test_distilling_writes_a_monotone_speed_calibration(distilled: dict[str, Any]) -> None:
    from export.calibration import knot_speeds

    out = distilled["out"]
    table = json.loads((out / "config.json").read_text())["early_exits"]["calibration"]
    report = json.loads((out / "exits.json").read_text())["calibration"]

    assert table["meaning"] == "layers_skipped" and table["dev_texts"] == 64
    assert table["speeds"] == knot_speeds() and len(report) == 21
    t, layers = table["thresholds"], table["mean_exit_layer"]
    assert t[0] == 0.0 and t[-1] == 1.0 and all(a <= b for a, b in itertools.pairwise(t))
    assert layers[0] == LAYERS and all(a >= b for a, b in itertools.pairwise(layers))
    assert table["agreement"][0] == 1.0 and len(table["accuracy"]) == 21
    for row, speed in zip(report, knot_speeds(), strict=True):
        # each knot lands near its aim: within one dev row's worth of skipped layers
        assert abs(row["layers_skipped"] - speed) <= 1 / 64 + 1e-9 or speed == 1.0
        assert row["mean_exit_layer"] == pytest.approx(
            LAYERS - row["layers_skipped"] * (LAYERS - 1)
        )
    assert "| speed | threshold | mean exit layer | layers skipped |" in distilled["stdout"]
    assert "| 0.80 |" in distilled["stdout"]


@pytest.fixture(scope="module")
def calibrated_version(distilled: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
                       ) -> Any:  # fmt: skip
    """The distilled checkpoint exported with its exits (and so its speed calibration)."""
    from export.build import build

    return build(distilled["out"], "calibrated", tmp_path_factory.mktemp("calibrated-models"),
                 max_seq_len=64, early_exit=True, warmup=False)  # fmt: skip


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.0])
def test_the_exported_graph_exits_where_the_distill_time_simulation_said(
    distilled: dict[str, Any], data: dict[str, Path], calibrated_version: Any, speed: float
) -> None:
    import tensorflow as tf

    from export.checkpoint import read_checkpoint
    from export.model import normalized_entropy, run
    from finetune.calibration import exit_layers
    from finetune.data import read_texts
    from finetune.exits import build_students, encode, student_logits

    out, k = distilled["out"], round(speed * 20)
    table = json.loads((out / "config.json").read_text())["early_exits"]["calibration"]
    texts = read_texts(data["dev"]).texts
    ckpt = read_checkpoint(out)
    dev = encode(ckpt, texts, 64, ("mean",))
    students = build_students([_prefixed(ckpt.weights, f"exit_{i}/") for i in range(LAYERS - 1)],
                              "mean")  # fmt: skip
    entropies = normalized_entropy(tf.constant(student_logits(students, dev.pooled["mean"])))

    serve = tf.saved_model.load(str(calibrated_version.path)).signatures["serving_default"]
    got = run(serve, {**_feeds(texts), "speed": np.full(len(texts), speed, np.float32)})

    simulated = exit_layers(entropies.numpy(), table["thresholds"][k])
    np.testing.assert_array_equal(got["exit_layer"], simulated)
    assert got["exit_layer"].mean() == pytest.approx(table["mean_exit_layer"][k])
    assert calibrated_version.model_info["early_exit"]["speed_calibration"] == table


def _prefixed(weights: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    return {k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}
