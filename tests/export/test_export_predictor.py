"""PersistentPredictor loads once and serves threads; LatestVersionPredictor swaps without drops."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from export.predictor import LatestVersionPredictor, PersistentPredictor, PredictorError
from export.tiny import export_tiny_model
from export.warmup import token_batch

FEEDS = token_batch(4, 16, 303, cls_id=2, sep_id=3, seed=3)


@pytest.fixture(scope="module")
def predictor(classify_v1) -> PersistentPredictor:  # type: ignore[no-untyped-def]
    return PersistentPredictor(classify_v1.path)


def test_loads_once_and_reports_load_time(predictor: PersistentPredictor) -> None:
    loaded = predictor._loaded
    for _ in range(3):
        predictor.predict(FEEDS)
    assert predictor._loaded is loaded
    assert 0 < predictor.load_time_s < 60
    assert predictor.version == 1
    assert predictor.model_info is not None and predictor.model_info["task"] == "classify"


def test_concurrent_threads_get_the_same_answers(predictor: PersistentPredictor) -> None:
    expected = predictor.predict(FEEDS)["probabilities"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda _: predictor.predict(FEEDS)["probabilities"], range(48)))
    for got in results:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_unknown_input_is_a_predictor_error(predictor: PersistentPredictor) -> None:
    with pytest.raises(PredictorError, match="missing"):
        predictor.predict({"input_ids": FEEDS["input_ids"]})


def test_latest_version_swaps_without_dropping_a_call(tmp_path: Path) -> None:
    first = export_tiny_model(tmp_path, "live", seed=1, max_seq_len=16, warmup=False)
    expected = {1: PersistentPredictor(first).predict(FEEDS)["probabilities"]}
    latest = LatestVersionPredictor(tmp_path / "live", poll_interval_s=0.05)
    served: list[int | None] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    outputs: dict[int, np.ndarray] = {}

    def caller() -> None:
        while not stop.is_set():
            try:
                out, version = latest.predict_versioned(FEEDS)
            except BaseException as exc:  # any dropped call fails the test
                errors.append(exc)
                return
            served.append(version)
            outputs.setdefault(version or 0, out["probabilities"])

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        second = export_tiny_model(tmp_path, "live", seed=2, max_seq_len=16, warmup=False)
        deadline = time.monotonic() + 30
        while latest.version != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        latest.close()
    expected[2] = PersistentPredictor(second).predict(FEEDS)["probabilities"]
    assert errors == []
    assert served[0] == 1 and served[-1] == 2
    for version in (1, 2):
        np.testing.assert_allclose(outputs[version], expected[version], atol=1e-6)
    assert not np.allclose(expected[1], expected[2])  # seeds differ, so the swap is observable


def test_broken_new_version_is_skipped_and_old_keeps_serving(tmp_path: Path) -> None:
    export_tiny_model(tmp_path, "m", seed=1, max_seq_len=16, warmup=False)
    latest = LatestVersionPredictor(tmp_path / "m", poll_interval_s=0)
    broken = tmp_path / "m" / "2"
    broken.mkdir()
    (broken / "saved_model.pb").write_bytes(b"not a saved model")
    assert latest.refresh() is False
    assert latest.version == 1
    assert latest.predict(FEEDS)["probabilities"].shape == (4, 3)
