"""``python -m export build|inspect|verify`` as a user runs it (real subprocesses)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from export.cli import main
from ops.procs import child_env, python_cmd


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        python_cmd("-m", "export", *args),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=180,
    )


def test_build_prints_progress_and_one_line_summary(google_classify: Path, tmp_path: Path) -> None:
    labels = tmp_path / "labels.txt"
    labels.write_text("bad\nmeh\ngood\n")
    done = _run(
        "build",
        "--checkpoint",
        str(google_classify),
        "--name",
        "g",
        "--base-path",
        str(tmp_path),
        "--labels",
        str(labels),
        "--precision",
        "bf16",
        "--max-seq-len",
        "32",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    for stage in ("reading weights", "building", "converting", "verifying", "warmup", "publishing"):
        assert any(stage in line for line in lines), (stage, lines)
    assert lines[-1].startswith(f"published {tmp_path / 'g' / '1'} (")
    assert "bf16" in lines[-1] and "max_abs_prob_diff=" in lines[-1]
    info = json.loads((tmp_path / "g" / "1" / "assets" / "model.json").read_text())
    assert info["labels"] == ["bad", "meh", "good"]


@pytest.mark.parametrize("case", ["missing checkpoint", "base path is a file"])
def test_build_failure_exits_nonzero_with_one_clear_line(
    case: str, hf_classify: Path, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("not a directory")
    checkpoint, base, expected = {
        "missing checkpoint": (tmp_path / "missing", tmp_path / "models", "checkpoint not found"),
        "base path is a file": (hf_classify, tmp_path / "file", "is a file"),
    }[case]
    done = _run("build", "--checkpoint", str(checkpoint), "--name", "x", "--base-path", str(base))
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and expected in last
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "models").exists()


def test_inspect_and_verify_against_previous(classify_v1, hf_classify: Path, models: Path) -> None:  # type: ignore[no-untyped-def]
    from export.build import build

    second = build(hf_classify, "cls", models, precision="fp16", max_seq_len=64, warmup=False)
    shown = _run("inspect", str(second.path))
    assert shown.returncode == 0, shown.stderr
    assert "fp16" in shown.stdout and "input_ids: int32[?, ?]" in shown.stdout
    checked = _run("verify", str(second.path), "--against", str(classify_v1.path))
    assert checked.returncode == 0, checked.stderr
    figures = json.loads(checked.stdout)
    assert figures["within_tolerance"] is True and figures["max_abs_prob_diff"] < 1e-2
    # same entry point in-process (saves a TensorFlow start): beyond tolerance exits 1
    strict = ["verify", str(second.path), "--against", str(classify_v1.path)]
    assert main([*strict, "--max-prob-diff", "1e-12"]) == 1


def test_inspect_of_a_non_version_fails_cleanly(tmp_path: Path) -> None:
    done = _run("inspect", str(tmp_path))
    assert done.returncode == 1 and "not a model version" in done.stderr


def test_the_exporter_and_model_server_import_tensorflow_without_keras(tmp_path: Path) -> None:
    # TensorFlow's __init__ loads Keras' optimizers eagerly (~1.5 s of CPU at each start of a
    # model server or an export); export/lean_tf.py skips it, and `import keras` still works after
    code = (
        "import sys; from export.lean_tf import import_tensorflow; tf = import_tensorflow(); "
        "assert 'keras' not in sys.modules, 'keras loaded'; "
        "tf.saved_model.save(tf.Module(), sys.argv[1]); tf.saved_model.load(sys.argv[1]); "
        "assert 'keras' not in sys.modules, 'keras loaded by save or load'; "
        "import keras; keras.optimizers.Adam(); print('ok')"
    )
    done = subprocess.run(
        python_cmd("-c", code, str(tmp_path / "module")), capture_output=True, text=True,
        env=child_env(), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
