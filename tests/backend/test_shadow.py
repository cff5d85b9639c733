"""Shadow comparisons (pure) and a shadow that hangs: the client never waits for it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend import metrics
from backend.app import create_app
from backend.clients import make_client
from backend.service import Gateway
from backend.shadow import compare_classifications, compare_embeddings
from tests.backend.conftest import INTENT
from tests.backend.stack import ModelServer


def test_classifications_agree_by_label_name_not_by_index() -> None:
    served = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=np.float32)
    # The same numbers under an id2label that swaps the first two labels.
    same = compare_classifications(["a", "b", "c"], served, ["a", "b", "c"], served)
    swapped = compare_classifications(["a", "b", "c"], served, ["b", "a", "c"], served)

    assert same == {"top1": [1.0, 1.0], "topk_overlap": [1.0, 1.0], "score_delta": [0.0, 0.0]}
    assert swapped["top1"] == [0.0, 1.0]
    assert swapped["score_delta"] == pytest.approx([0.5, 0.0])  # 'a' scored 0.2 in the shadow


def test_top_k_overlap_counts_shared_labels_of_the_first_three() -> None:
    served = np.array([[0.5, 0.3, 0.1, 0.06, 0.04]], dtype=np.float32)
    shadow = np.array([[0.5, 0.04, 0.1, 0.3, 0.06]], dtype=np.float32)

    out = compare_classifications(list("abcde"), served, list("abcde"), shadow)

    assert out["top1"] == [1.0]
    assert out["topk_overlap"] == pytest.approx([2 / 3])  # {a, b, c} vs {a, d, c}


def test_embeddings_compare_by_cosine_and_another_dimension_agrees_with_nothing() -> None:
    served = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    shadow = np.array([[1.0, 1.0], [0.0, 1.0]], dtype=np.float32)

    assert compare_embeddings(served, shadow)["cosine"] == pytest.approx([2**-0.5, 1.0])
    assert compare_embeddings(served, np.ones((2, 3), np.float32))["cosine"] == [0.0, 0.0]


class HangingVersion:
    """The real upstream client, except that calls to ``version`` take ``delay_s`` first."""

    def __init__(self, client: Any, version: int, delay_s: float) -> None:
        self._client, self.version, self.delay_s = client, version, delay_s

    def predict(self, model: str, inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("version") == self.version:
            time.sleep(self.delay_s)
        return self._client.predict(model, inputs, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _shadowing_app(
    modelserver: ModelServer,
    model_base: Path,
    config_file: Path,
    tmp_path: Path,
    queue: int,
    delay_s: float,
) -> tuple[Any, Gateway]:
    """Return (app, gateway): v1 serves, v2 shadows every default request and hangs ``delay_s``."""
    routing_file = tmp_path / "routing.yaml"
    routing_file.write_text(f"{INTENT}:\n  weights: {{1: 1}}\n  shadow: {{version: 2}}\n")
    config = {
        "tfs_grpc_target": modelserver.grpc_target, "model_base_path": str(model_base),
        "model_config_file": str(config_file), "routing_file": str(routing_file),
        "shadow_queue_size": queue, "shadow_timeout_s": 30,
    }  # fmt: skip
    app = create_app(config)
    settings = app.extensions["gateway_settings"]
    gateway = Gateway(settings, client=HangingVersion(make_client(settings), 2, delay_s=delay_s))
    app.extensions["gateway"] = gateway
    return app, gateway


def test_a_shadow_that_hangs_never_delays_the_client_and_a_full_queue_drops_shadows(
    modelserver: ModelServer, model_base: Path, config_file: Path, tmp_path: Path
) -> None:
    app, gateway = _shadowing_app(modelserver, model_base, config_file, tmp_path, 2, 2.0)
    labels = (INTENT, "1", "2", "dropped")
    dropped = metrics.child(metrics.SHADOW_REQUESTS, *labels)
    depth = metrics.child(metrics.SHADOW_QUEUE, INTENT)
    before = dropped._value.get()
    client = app.test_client()
    client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["warm up"]})  # shadow 1 hangs
    try:
        times = []
        for _ in range(8):
            started = time.perf_counter()
            reply = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hello"]})
            times.append(time.perf_counter() - started)
            assert reply.status_code == 200
            assert reply.get_json()["model"]["version"] == 1

        # One shadow is hanging, two wait in the queue: every later one is dropped at once.
        assert dropped._value.get() - before >= 8 - 2
        assert max(times) < 1.0  # each far below the shadow's 2 s
        assert depth._value.get() == 3  # the running one and the two waiting: what rollouts read
    finally:
        gateway.shadows.join(timeout_s=30)
        gateway.close()
    assert depth._value.get() == 0


def test_a_queue_of_0_keeps_one_shadow_in_flight_and_drops_the_rest(
    modelserver: ModelServer, model_base: Path, config_file: Path, tmp_path: Path
) -> None:
    app, gateway = _shadowing_app(modelserver, model_base, config_file, tmp_path, 0, 1.0)
    outcome = {o: metrics.child(metrics.SHADOW_REQUESTS, INTENT, "1", "2", o)
               for o in ("dropped", "compared")}  # fmt: skip
    before = {o: c._value.get() for o, c in outcome.items()}
    client = app.test_client()
    try:
        for _ in range(5):
            reply = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hello"]})
            assert reply.status_code == 200
    finally:
        assert gateway.shadows.join(timeout_s=30)
        gateway.close()
    # the first shadow runs (hanging 1 s); the four that arrive meanwhile have nowhere to wait
    assert outcome["compared"]._value.get() - before["compared"] == 1
    assert outcome["dropped"]._value.get() - before["dropped"] == 4
