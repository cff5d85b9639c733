"""``export build --early-exit``: the served graph with students, per-row speed and compaction.

A tiny 4-layer checkpoint with random students (export.tiny): random students are confident on
some rows and not on others, which is all the exit logic needs to be exercised.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

import export.build
from export.build import build
from export.checkpoint import read_checkpoint
from export.errors import ExportError
from export.gates import Tolerance, exit_violations
from export.model import EncoderModule, normalized_entropy, pool, run
from export.tiny import write_hf_checkpoint
from export.warmup import read_warmup_records, token_batch
from tests.export.conftest import Bundle

LAYERS = 4
ROWS = 24


@pytest.fixture(scope="module")
def exits_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("ee-ckpt"), exits=True, layers=LAYERS)


@pytest.fixture(scope="module")
def exits_version(exits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("ee-models")
    return build(exits_ckpt, "ee", base, version=1, max_seq_len=64, early_exit=True,
                 default_speed=0.25)  # fmt: skip


@pytest.fixture(scope="module")
def exits_loaded(exits_version: Any) -> Any:
    """``exits_version`` loaded once (``tf.saved_model.load``) for every test that only runs it:
    each load costs seconds of CPU, and running a signature changes nothing in it."""
    return tf.saved_model.load(str(exits_version.path))


@pytest.fixture(scope="module")
def exits_bundle(exits_version: Any) -> Iterator[Bundle]:
    """``exits_version`` loaded once through the TF1 session loader TF Serving uses (as
    ``tf_serving_bundle`` does, in a graph and session of its own, held for the module)."""
    graph = tf.Graph()
    with graph.as_default():
        session = tf.compat.v1.Session(graph=graph)
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(exits_version.path))
    try:
        yield Bundle(session, meta)
    finally:
        session.close()


@pytest.fixture(scope="module")
def plain_version(exits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The same checkpoint exported without --early-exit: the full model (up to seq_32, all the
    comparison runs; no warmup records, which nothing reads)."""
    return build(exits_ckpt, "plain", tmp_path_factory.mktemp("plain"), version=1, max_seq_len=32,
                 warmup=False)  # fmt: skip


def _batch(seq: int = 32, seed: int = 5) -> dict[str, np.ndarray]:
    return token_batch(ROWS, seq, 80, 2, 3, seed=seed)


def _speeds(value: float | np.ndarray) -> np.ndarray:
    return np.broadcast_to(np.asarray(value, np.float32), (ROWS,)).copy()


def _expected(exits_ckpt: Path, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """FastBERT's rule row by row, from every layer's hidden states (no compaction involved)."""
    ckpt = read_checkpoint(exits_ckpt)
    module = EncoderModule(ckpt.config, ckpt.weights, task="classify", pooling="cls",
                        early_exit=ckpt.exits)  # fmt: skip
    ints = {k: tf.constant(v) for k, v in feeds.items() if k != "speed"}
    states = module.layer_outputs(**ints)
    student_logits = [
        module.students[i](pool(h, ints["attention_mask"], "mean")).numpy()
        for i, h in enumerate(states[:-1])
    ]
    teacher = module.head(states[-1]).numpy()
    logits = np.empty_like(teacher)
    layers = np.empty(ROWS, np.int32)
    for row in range(ROWS):
        for i, out in enumerate(student_logits):
            uncertainty = float(normalized_entropy(out[row : row + 1]).numpy()[0])
            if uncertainty < feeds["speed"][row]:
                logits[row], layers[row] = out[row], i + 1
                break
        else:
            logits[row], layers[row] = teacher[row], LAYERS
    return logits, layers


def test_speed_zero_is_exactly_the_full_model(exits_loaded: Any, plain_version: Any) -> None:
    ee = exits_loaded
    plain = tf.saved_model.load(str(plain_version.path))
    for signature in ("serving_default", "seq_32"):
        feeds = _batch()
        want = run(plain.signatures[signature], feeds)
        got = run(ee.signatures[signature], {**feeds, "speed": _speeds(0.0)})
        np.testing.assert_array_equal(got["logits"], want["logits"])
        np.testing.assert_array_equal(got["probabilities"], want["probabilities"])
        assert (got["exit_layer"] == LAYERS).all()
        assert got["exit_layer"].dtype == np.int32


def test_rows_exit_where_fastberts_rule_says(exits_ckpt: Path, exits_loaded: Any) -> None:
    ee = exits_loaded
    speeds = np.linspace(0.0, 1.0, ROWS, dtype=np.float32)  # one speed per row
    feeds = {**_batch(), "speed": speeds}
    got = run(ee.signatures["seq_32"], feeds)
    want_logits, want_layers = _expected(exits_ckpt, feeds)

    np.testing.assert_array_equal(got["exit_layer"], want_layers)
    np.testing.assert_allclose(got["logits"], want_logits, rtol=0, atol=1e-5)
    assert len(set(want_layers.tolist())) >= 3  # the rows really exit at different layers
    np.testing.assert_allclose(got["probabilities"].sum(-1), 1.0, atol=1e-6)


def test_speed_one_leaves_after_the_first_layer(exits_loaded: Any) -> None:
    ee = exits_loaded
    got = run(ee.signatures["serving_default"], {**_batch(), "speed": _speeds(1.0)})
    assert (got["exit_layer"] == 1).all()


def test_compaction_and_the_masked_baseline_give_the_same_answers(exits_ckpt: Path) -> None:
    ckpt = read_checkpoint(exits_ckpt)

    def module(compaction: bool) -> EncoderModule:
        return EncoderModule(ckpt.config, ckpt.weights, task="classify", pooling="cls",
                          early_exit=ckpt.exits, compaction=compaction)  # fmt: skip

    compact, masked = module(True), module(False)
    # 1.0: every row leaves after layer 1, so each later layer is skipped (its tf.cond)
    for speed in (0.0, 0.5, 1.0, np.linspace(0.0, 1.0, ROWS)):
        feeds = {**_batch(seed=9), "speed": _speeds(speed)}
        a, b = run(compact.serve, feeds), run(masked.serve, feeds)
        np.testing.assert_array_equal(a["exit_layer"], b["exit_layer"])
        np.testing.assert_allclose(a["logits"], b["logits"], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("bad", "read_as"), [(np.nan, 0.0), (-0.1, 0.0), (1.5, 1.0), (-np.inf, 0.0)]
)
def test_one_bad_speed_is_clamped_in_its_row_and_the_others_answer_as_alone(
    exits_loaded: Any, bad: float, read_as: float
) -> None:
    """A merged batch (TF Serving's batching) must not fail every caller for one row."""
    serve = exits_loaded.signatures["serving_default"]
    feeds = _batch(seed=4)
    speeds = np.linspace(0.0, 1.0, ROWS).astype(np.float32)
    speeds[1] = bad
    got = run(serve, {**feeds, "speed": speeds})
    want = run(serve, {**feeds, "speed": np.where(np.arange(ROWS) == 1, read_as, speeds)})
    np.testing.assert_array_equal(got["exit_layer"], want["exit_layer"])
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-6)


def test_a_speed_of_the_wrong_length_is_the_graphs_invalid_argument(exits_loaded: Any) -> None:
    ee = exits_loaded
    with pytest.raises(tf.errors.InvalidArgumentError, match="speed must have one value per row"):
        run(ee.signatures["serving_default"], {**_batch(), "speed": np.zeros(3, np.float32)})


def test_model_json_signatures_and_warmup_describe_the_exits(
    exits_version: Any, exits_loaded: Any
) -> None:
    info = exits_version.model_info
    assert info["inputs"] == ["input_ids", "attention_mask", "token_type_ids", "speed"]
    assert info["outputs"] == ["logits", "probabilities", "exit_layer"]
    assert info["early_exit"] == {
        "default_speed": 0.25, "num_layers": LAYERS, "layers": [1, 2, 3], "pooling": "mean",
        "width": 8, "agreement": {"1": 0.0, "2": 0.0, "3": 0.0},
        "speed_calibration": {"meaning": "raw_entropy_threshold"},  # distilled before calibration
    }  # fmt: skip
    loaded = exits_loaded
    for name in ("serving_default", "seq_16", "seq_64"):
        fn = loaded.signatures[name]
        _, inputs = fn.structured_input_signature
        assert inputs["speed"].dtype == tf.float32 and inputs["speed"].shape.as_list() == [None]
        assert fn.structured_outputs["exit_layer"].dtype == tf.int32
    records = read_warmup_records(exits_version.path)
    assert records and all(inputs["speed"].shape == inputs["input_ids"].shape[:1]
                           for _, inputs in records)  # fmt: skip


def test_early_exit_refusals_publish_nothing(
    tmp_path: Path, hf_classify: Path, hf_embed: Path, exits_ckpt: Path
) -> None:
    base = tmp_path / "models"
    with pytest.raises(ExportError, match="no trained early-exit students"):
        build(hf_classify, "m", base, early_exit=True, max_seq_len=32)
    with pytest.raises(ExportError, match="not an embedding or zero-shot export"):
        build(hf_embed, "m", base, task="embed", early_exit=True, max_seq_len=32)
    with pytest.raises(ExportError, match="default speed must be in"):
        build(exits_ckpt, "m", base, early_exit=True, default_speed=float("nan"), max_seq_len=32)
    assert not (base / "m").exists() or not any((base / "m").iterdir())


def test_students_are_all_there_or_the_checkpoint_is_refused(tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    ckpt = write_hf_checkpoint(tmp_path / "ck", exits=True, layers=3)
    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["exits.1.classifier.bias"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ExportError, match=r"exits\.1\.classifier\.bias"):
        read_checkpoint(ckpt)


def test_a_checkpoint_without_exits_reads_as_before(hf_classify: Path) -> None:
    assert read_checkpoint(hf_classify).exits is None


@pytest.mark.parametrize("speed", ["mixed", "all leave at layer 1"])
def test_runs_through_the_tf1_session_loader_tf_serving_uses(
    exits_bundle: Bundle, exits_loaded: Any, speed: str
) -> None:
    """TF Serving loads a SavedModelBundle (graph + session): the exits must run that way too.

    With every row gone after layer 1 the later layers' conditionals take their empty branch.
    """
    speeds = np.linspace(0.0, 1.0, ROWS) if speed == "mixed" else np.ones(ROWS)
    feeds = {**_batch(seq=16), "speed": speeds.astype(np.float32)}
    got = exits_bundle.run("seq_16", feeds)
    want = run(exits_loaded.signatures["seq_16"], feeds)
    np.testing.assert_array_equal(got["exit_layer"], want["exit_layer"])
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=1e-5)


# Emulated bf16 (AVX2) on this random 4-layer model drifts 0.017 from fp32 at speed 0 already,
# beyond the default 0.01 (fp16: 0.0004): the bf16 case is about the exit figures, not that bound.
CONVERSIONS = [("fp16", Tolerance()), ("bf16", Tolerance(max_prob_diff=0.05))]
# The converted exports below are gated on the probe batch, which is 16 tokens long at
# max_seq_len 16 (its bucket signature gated beside serving_default, as at any length): one
# bucket to trace, save and load instead of three.
GATED_LEN = 16


@pytest.mark.parametrize(("precision", "tolerance"), CONVERSIONS)
def test_a_converted_early_exit_export_is_also_gated_where_rows_exit(
    exits_ckpt: Path, exits_version: Any, tmp_path: Path, precision: str, tolerance: Tolerance
) -> None:
    result = build(exits_ckpt, "ee", tmp_path, max_seq_len=GATED_LEN, early_exit=True,
                   warmup=False, precision=precision, tolerance=tolerance)  # fmt: skip
    at_speeds = result.model_info["conversion"]["early_exit"]
    assert [at["speed"] for at in at_speeds] == [0.8, 1.0]  # default 0: gated at 0.8, and 1
    for at in at_speeds:
        assert sum(at["exit_rows"]) == 8 and len(at["exit_rows"]) == LAYERS
        assert at["early_rows"] > 0  # the probe's rows really leave early: students compared
        assert at["decisive_exit_agreement"] == 1.0 and exit_violations(at, tolerance) == []
    assert at_speeds[1]["exit_rows"][0] > 0  # speed 1: the first student answers
    assert "; at speed 0.8: exit_rows=" in result.summary()
    assert "early_exit" not in exits_version.conversion  # fp32 is the reference itself


def test_a_converted_student_that_exits_elsewhere_is_refused(
    exits_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first student made overconfident in the converted graph only: speed 0 never asks it."""
    original = export.build._build_modules

    def broken_modules(ckpt: Any, *args: Any, **kwargs: Any) -> Any:
        reference, _, labels, scale = original(ckpt, *args, **kwargs)
        weights = dict(ckpt.weights)
        weights["exit_0/classifier/kernel"] = weights["exit_0/classifier/kernel"] * 50.0
        target = EncoderModule(ckpt.config, weights, task="classify", precision="fp16",
                            pooling="cls", early_exit=ckpt.exits)  # fmt: skip
        return reference, target, labels, scale

    monkeypatch.setattr(export.build, "_build_modules", broken_modules)
    with pytest.raises(ExportError, match=r"early-exit conversion beyond tolerance at speed "
                                          r"0\.8 \(decisive_exit_agreement"):  # fmt: skip
        build(exits_ckpt, "broken", tmp_path, max_seq_len=GATED_LEN, early_exit=True,
              warmup=False, precision="fp16")  # fmt: skip
    assert not (tmp_path / "broken").exists() or not any((tmp_path / "broken").iterdir())


# a calibration as distill-exits writes it (finetune/calibration.py): speed k/20 → threshold
CALIBRATED = [(k / 20) ** 0.5 for k in range(21)]


@pytest.fixture(scope="module")
def calibrated_ckpt(exits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same checkpoint with a speed calibration in config.json's ``early_exits``."""
    import json
    import shutil

    from export.calibration import knot_speeds

    path = tmp_path_factory.mktemp("ee-calibrated") / "ckpt"
    shutil.copytree(exits_ckpt, path)
    config = json.loads((path / "config.json").read_text())
    config["early_exits"]["calibration"] = {
        "meaning": "layers_skipped", "speeds": knot_speeds(), "thresholds": CALIBRATED,
        "mean_exit_layer": [4.0 - 3.0 * s for s in knot_speeds()], "agreement": [1.0] * 21,
        "accuracy": None, "dev_texts": 24,
    }  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_a_calibrated_graph_exits_where_the_rule_says_at_the_mapped_threshold(
    calibrated_ckpt: Path,
) -> None:
    from export.calibration import threshold_at

    ckpt = read_checkpoint(calibrated_ckpt)
    module = EncoderModule(ckpt.config, ckpt.weights, task="classify", pooling="cls",
                        early_exit=ckpt.exits)  # fmt: skip
    speeds = np.linspace(0.0, 1.0, ROWS, dtype=np.float32)
    feeds = {**_batch(), "speed": speeds}

    got = run(module.serve, feeds)
    want_logits, want_layers = _expected(calibrated_ckpt, {**feeds, "speed": threshold_at(
        speeds, CALIBRATED)})  # fmt: skip

    np.testing.assert_array_equal(got["exit_layer"], want_layers)
    np.testing.assert_allclose(got["logits"], want_logits, rtol=0, atol=1e-5)
    assert ckpt.exits is not None and ckpt.exits["calibration"]["thresholds"] == CALIBRATED


def test_a_calibrated_fp16_export_carries_the_table_and_passes_the_exit_gate(
    calibrated_ckpt: Path, tmp_path: Path
) -> None:
    result = build(calibrated_ckpt, "ee", tmp_path, max_seq_len=GATED_LEN, early_exit=True,
                   warmup=False, precision="fp16", default_speed=0.5)  # fmt: skip

    table = result.model_info["early_exit"]["speed_calibration"]
    assert table["meaning"] == "layers_skipped" and table["thresholds"] == CALIBRATED
    at_speeds = result.model_info["conversion"]["early_exit"]
    assert [at["speed"] for at in at_speeds] == [0.5, 1.0]
    assert all(exit_violations(at, Tolerance()) == [] for at in at_speeds)
    assert at_speeds[1]["exit_rows"][0] > 0
