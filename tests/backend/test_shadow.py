"""Shadow comparisons (pure), shadow targets of their own, and shadows that hang: the client
never waits for them."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from backend import metrics
from backend.app import create_app
from backend.clients import make_client
from backend.service import Gateway
from backend.settings import load_settings
from backend.shadow import compare_classifications, compare_embeddings
from ops.procs import REPO
from tests.backend.conftest import INTENT
from tests.backend.stack import ModelServer, hung_port, model_config

MONITORING = REPO / "serving_config" / "monitoring.config"


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


class CountingVersions:
    """The real upstream client, counting the predict calls each version gets."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: Counter[int | None] = Counter()

    def predict(self, model: str, inputs: Any, **kwargs: Any) -> Any:
        self.calls[kwargs.get("version")] += 1
        return self._client.predict(model, inputs, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def _shadowing_app(
    modelserver: ModelServer,
    model_base: Path,
    config_file: Path,
    tmp_path: Path,
    queue: int,
    delay_s: float = 0.0,
    **settings: Any,
) -> tuple[Any, Gateway]:
    """Return (app, gateway): v1 serves, v2 shadows every default request and hangs ``delay_s``
    (on the clients' model server; ``settings`` may name a shadow target of its own)."""
    routing_file = tmp_path / "routing.yaml"
    routing_file.write_text(f"{INTENT}:\n  weights: {{1: 1}}\n  shadow: {{version: 2}}\n")
    config = {
        "tfs_grpc_target": modelserver.grpc_target, "model_base_path": str(model_base),
        "model_config_file": str(config_file), "routing_file": str(routing_file),
        "shadow_queue_size": queue, "shadow_timeout_s": 30, **settings,
    }  # fmt: skip
    app = create_app(config)
    gateway_settings = app.extensions["gateway_settings"]
    client = make_client(gateway_settings)
    if delay_s:
        client = HangingVersion(client, 2, delay_s=delay_s)
    gateway = Gateway(gateway_settings, client=CountingVersions(client))
    app.extensions["gateway"] = gateway
    return app, gateway


def _timed_default_requests(client: Any, n: int) -> list[float]:
    """Send ``n`` default :classify requests; return each one's seconds (every answer from v1)."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        reply = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hello"]})
        times.append(time.perf_counter() - started)
        assert reply.status_code == 200
        assert reply.get_json()["model"]["version"] == 1
    return times


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
        times = _timed_default_requests(client, 8)

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


def _request_count(server: ModelServer, model: str) -> float:
    """Return the model server's TF Serving request_count of ``model`` (status OK)."""
    text = requests.get(f"{server.rest_url}/monitoring/prometheus/metrics", timeout=5).text
    line = f':tensorflow:serving:request_count{{model_name="{model}",status="OK"}} '
    return sum(float(row[len(line) :]) for row in text.splitlines() if row.startswith(line))


def test_shadow_calls_go_to_the_shadow_target_and_never_to_the_clients_model_servers(
    modelserver: ModelServer, model_base: Path, config_file: Path, tmp_path: Path, log_dir: Path
) -> None:
    shadow_config = tmp_path / "shadow.config"
    shadow_config.write_text(model_config(model_base, {}, [INTENT]), encoding="utf-8")
    target = ModelServer(shadow_config, log_dir, [f"--monitoring_config_file={MONITORING}"])
    try:
        target.wait_available(INTENT, 2)
        app, gateway = _shadowing_app(
            modelserver, model_base, config_file, tmp_path, 8,
            shadow_tfs_grpc_target=target.grpc_target,
        )  # fmt: skip
        compared = metrics.child(metrics.SHADOW_REQUESTS, INTENT, "1", "2", "compared")
        before, target_before = compared._value.get(), _request_count(target, INTENT)
        client = app.test_client()
        try:
            for text in ("hello", "where is my order", "reset my password"):
                reply = client.post(f"/v1/models/{INTENT}:classify", json={"texts": [text]})
                assert reply.status_code == 200
                assert reply.get_json()["model"]["version"] == 1
            assert gateway.shadows.join(timeout_s=30)
        finally:
            gateway.close()
        assert compared._value.get() - before == 3
        assert _request_count(target, INTENT) - target_before == 3  # the three shadows
        assert dict(gateway.client.calls) == {1: 3}  # the clients' server: only their calls
    finally:
        target.stop()


def test_a_shadow_target_that_hangs_costs_the_client_nothing_and_counts_errors(
    modelserver: ModelServer, model_base: Path, config_file: Path, tmp_path: Path
) -> None:
    with hung_port() as port:
        app, gateway = _shadowing_app(
            modelserver, model_base, config_file, tmp_path, 0,
            shadow_tfs_grpc_target=f"127.0.0.1:{port}", shadow_timeout_s=2, status_deadline_s=0.5,
        )  # fmt: skip
        outcome = {o: metrics.child(metrics.SHADOW_REQUESTS, INTENT, "1", "2", o)
                   for o in ("error", "dropped", "compared")}  # fmt: skip
        before = {o: c._value.get() for o, c in outcome.items()}
        client = app.test_client()
        try:
            times = _timed_default_requests(client, 4)
            assert gateway.shadows.join(timeout_s=30)
        finally:
            gateway.close()
    delta = {o: c._value.get() - before[o] for o, c in outcome.items()}
    # the shadow's 2 s deadline on the hung target is not the client's: the typical request
    # answers in a tenth of it, none waits half of it (a loaded machine delays, never by 2 s)
    assert statistics.median(times) < 0.2 and max(times) < 1.0, times
    assert delta["compared"] == 0
    assert delta["error"] >= 1 and delta["error"] + delta["dropped"] == 4


@pytest.mark.parametrize(
    ("environ", "target"),
    [
        ({"GATEWAY_SHADOW_TFS_GRPC": "dns:///shadow:8500"}, ("grpc", "dns:///shadow:8500")),
        ({"GATEWAY_UPSTREAM": "rest", "GATEWAY_SHADOW_TFS_REST": "http://shadow:8501"},
         ("rest", "http://shadow:8501")),
        ({"GATEWAY_UPSTREAM": "rest", "GATEWAY_SHADOW_TFS_GRPC": "shadow:8500"}, None),
        ({}, None),
    ],
)  # fmt: skip
def test_shadow_settings_name_the_shadow_target_of_the_upstream_in_use(
    environ: dict[str, str], target: tuple[str, str] | None
) -> None:
    settings = load_settings(environ=environ)
    shadow = settings.shadow_settings()

    if target is None:
        assert shadow is None  # shadows go where the clients' calls go
        return
    assert shadow is not None
    upstream, where = target
    assert shadow.upstream == upstream
    assert (shadow.tfs_grpc_target if upstream == "grpc" else shadow.tfs_rest_url) == where
    assert shadow.shadow_settings() is None  # a shadow target has no shadow of its own
