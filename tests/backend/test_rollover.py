"""A new version with a new vocabulary goes live under load: no answer ever mixes the two."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from backend.app import create_app
from backend.tokenization import BertTokenizer
from backend.worker import stop_worker
from ops.procs import ServerProcess, free_port, python_cmd
from tests.backend.conftest import other_vocab

MODEL = "tiny-roll"
TEXTS = ["my card was charged twice", "hello world", "我的订单还没到"]


@pytest.fixture(scope="module")
def roll_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, int]]:
    """Return (base path, grpc port, rest port) of a modelserver following tiny-roll's newest."""
    from export.tiny import export_tiny_model

    base = tmp_path_factory.mktemp("roll")
    export_tiny_model(base, MODEL, task="classify", version=1, seed=3, warmup=False)
    grpc_port, rest_port = free_port(), free_port()
    server = ServerProcess(
        python_cmd(
            "-m",
            "modelserver",
            f"--port={grpc_port}",
            f"--rest_api_port={rest_port}",
            f"--model_name={MODEL}",
            f"--model_base_path={base / MODEL}",
            "--file_system_poll_wait_seconds=1",
        ),
        tmp_path_factory.mktemp("roll-logs") / "modelserver.log",
    )
    try:
        server.wait_until(lambda: _available(rest_port) == [1], 120)
        yield base, grpc_port, rest_port
    finally:
        server.stop()


def _available(rest_port: int) -> list[int]:
    try:
        reply = requests.get(f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}", timeout=1).json()
    except (requests.RequestException, ValueError):
        return []
    return sorted(
        int(s["version"])
        for s in reply.get("model_version_status", [])
        if s["state"] == "AVAILABLE"
    )


def _reference(base: Path, rest_port: int, version: int) -> np.ndarray:
    """Return the model's probabilities on TEXTS tokenized with ``version``'s own vocabulary."""
    vocab = base / MODEL / str(version) / "assets" / "vocab.txt"
    rows = []
    for encoded in BertTokenizer.from_files(vocab, max_seq_len=64).encode(TEXTS):
        ids = encoded.ids.tolist()
        body = {
            "inputs": {
                "input_ids": [ids],
                "attention_mask": [[1] * len(ids)],
                "token_type_ids": [[0] * len(ids)],
            }
        }
        url = f"http://127.0.0.1:{rest_port}/v1/models/{MODEL}/versions/{version}:predict"
        rows.append(requests.post(url, json=body, timeout=30).json()["outputs"]["probabilities"][0])
    return np.asarray(rows)


def test_rollover_to_a_new_vocabulary_never_mixes_versions(
    roll_server: tuple[Path, int, int],
) -> None:
    from export.tiny import export_tiny_model

    base, grpc_port, rest_port = roll_server
    app = create_app(
        {
            "upstream": "grpc",
            "tfs_grpc_target": f"127.0.0.1:{grpc_port}",
            "model_base_path": str(base),
            "status_cache_s": 0.2,
        }
    )
    client = app.test_client()
    expected = {1: _reference(base, rest_port, 1)}
    answers: list[tuple[int, np.ndarray]] = []
    errors: list[object] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            response = client.post(
                f"/v1/models/{MODEL}:classify", json={"texts": TEXTS, "top_k": 3}
            )
            body = response.get_json()
            if response.status_code != 200:
                errors.append(body)
                continue
            scores = [
                [
                    {t["label"]: t["score"] for t in p["top_k"]}[k]
                    for k in ("negative", "neutral", "positive")
                ]
                for p in body["predictions"]
            ]
            answers.append((body["model"]["version"], np.asarray(scores)))

    worker = threading.Thread(target=load)
    worker.start()
    try:
        started = time.monotonic()  # let v1 answer first, however long that takes here
        while time.monotonic() - started < 60 and not answers and not errors:
            time.sleep(0.05)
        export_tiny_model(
            base, MODEL, task="classify", version=2, seed=4, vocab=other_vocab(), warmup=False
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(v == 2 for v, _ in answers[-3:]):
            time.sleep(0.2)
    finally:
        stop.set()
        worker.join(timeout=30)
        stop_worker(app)
    expected[2] = _reference(base, rest_port, 2)

    versions = [v for v, _ in answers]
    assert 1 in versions and versions[-1] == 2, versions
    for version, scores in answers:
        np.testing.assert_allclose(scores, expected[version], rtol=1e-5)
    # A request that resolved v1 just before it was unloaded is retried once on the new newest.
    assert not errors, errors
