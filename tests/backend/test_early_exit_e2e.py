"""Early-exit classifiers through a real gunicorn gateway and model server, over gRPC and REST.

tiny-exits v2 is a 3-layer classifier exported with early exits; v1 is the same checkpoint
without them (conftest).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import requests

from tests.backend.conftest import EXIT_LAYERS, EXITS, INTENT
from tests.backend.stack import Gateway

CLASSIFY = f"/v1/models/{EXITS}:classify"
# Different lengths (two buckets) and more texts than GATEWAY_MAX_BATCH (4): several chunks,
# each holding texts from all over the request.
TEXTS = [
    "my card was charged twice",
    "hello",
    " ".join(["refund"] * 30),
    "where is my parcel?",
    "the app keeps crashing when I open it",
    "hi",
    " ".join(["password"] * 20),
]


def _classify(gateway: Gateway, body: dict[str, Any], path: str = CLASSIFY) -> dict[str, Any]:
    response = requests.post(f"{gateway.url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _logits(answer: dict[str, Any]) -> np.ndarray:
    return np.asarray([p["logits"] for p in answer["predictions"]])


def test_speed_0_is_the_full_model(gateway: Gateway) -> None:
    body = {"texts": TEXTS, "version": 2, "top_k": 3, "return_logits": True}

    at_zero = _classify(gateway, {**body, "speed": 0})
    omitted = _classify(gateway, body)  # no GATEWAY_DEFAULT_SPEED, model default 0
    full = _classify(gateway, {**body, "version": 1})  # the same weights without exits

    assert at_zero == omitted
    assert [p["exit_layer"] for p in at_zero["predictions"]] == [EXIT_LAYERS] * len(TEXTS)
    assert [p["label"] for p in at_zero["predictions"]] == [p["label"] for p in full["predictions"]]
    np.testing.assert_allclose(_logits(at_zero), _logits(full), rtol=1e-5, atol=1e-5)
    assert all("exit_layer" not in p for p in full["predictions"])
    assert "notes" not in at_zero and "notes" not in full


def test_speed_1_exits_every_text_after_the_first_layer(gateway: Gateway) -> None:
    answer = _classify(gateway, {"texts": TEXTS, "version": 2, "speed": 1})

    assert [p["exit_layer"] for p in answer["predictions"]] == [1] * len(TEXTS)
    assert answer["model"] == {"name": EXITS, "version": 2}


def test_a_speed_per_text_applies_to_that_text_only(gateway: Gateway) -> None:
    speeds = [1, 0, 0, 1, 0, 1, 1]
    body = {"texts": TEXTS, "version": 2, "top_k": 3, "return_logits": True}

    mixed = _classify(gateway, {**body, "speed": speeds})
    fast = _classify(gateway, {**body, "speed": 1})
    full = _classify(gateway, {**body, "speed": 0})

    for index, speed in enumerate(speeds):
        alone = (fast if speed == 1 else full)["predictions"][index]
        got = mixed["predictions"][index]
        assert got["exit_layer"] == (1 if speed == 1 else EXIT_LAYERS), index
        assert got["label"] == alone["label"], index
        np.testing.assert_allclose(got["logits"], alone["logits"], rtol=1e-5, atol=1e-5)


def test_exit_layers_are_counted_in_metrics(gateway: Gateway) -> None:
    for _ in range(4):  # gunicorn spreads these over both workers
        _classify(gateway, {"texts": TEXTS, "version": 2, "speed": 1})

    text = requests.get(f"{gateway.url}/metrics", timeout=10).text

    assert "# HELP gateway_exit_layer Layers each text ran" in text
    samples = {
        line.split("{", 1)[0] + "|" + _label(line, "le"): float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("gateway_exit_layer")
        and f'model="{EXITS}"' in line
        and 'version="2"' in line
    }
    assert samples["gateway_exit_layer_bucket|1.0"] >= 4 * len(TEXTS)
    assert samples["gateway_exit_layer_count|"] >= samples["gateway_exit_layer_bucket|1.0"]
    assert f'model="{INTENT}"' not in "".join(
        line for line in text.splitlines() if line.startswith("gateway_exit_layer")
    )


def _label(line: str, name: str) -> str:
    marker = f'{name}="'
    if marker not in line:
        return ""
    return line.split(marker, 1)[1].split('"', 1)[0]


@pytest.mark.parametrize(
    ("speed", "says"),
    [
        (-0.5, "field 'speed'"),
        (1.5, "field 'speed'"),
        ("NaN", "field 'speed'"),
        ("Infinity", "field 'speed'"),
        ("fast", "field 'speed'"),
        (True, "field 'speed'"),
        ([0.5, 0.5], "2 values for 3 texts"),
        ([0.5, "0.5", 0.5], "speed[1]"),
        ([0.5, 0.5, None], "speed[2]"),
    ],
)
def test_bad_speeds_are_422(gateway: Gateway, speed: Any, says: str) -> None:
    body = {"texts": TEXTS[:3], "version": 2, "speed": speed}

    response = requests.post(f"{gateway.url}{CLASSIFY}", json=body, timeout=30)

    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "unprocessable"
    assert says in response.json()["error"]["message"]


def test_a_bare_nan_speed_is_invalid_json_400(gateway: Gateway) -> None:
    data = b'{"texts": ["hi"], "version": 2, "speed": NaN}'

    response = requests.post(f"{gateway.url}{CLASSIFY}", data=data, timeout=30)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize(("model", "version"), [(EXITS, 1), (INTENT, 1)])
def test_a_model_without_exits_ignores_speed_and_says_so(
    gateway: Gateway, model: str, version: int
) -> None:
    path = f"/v1/models/{model}:classify"
    body = {"texts": TEXTS, "version": version, "return_logits": True}

    with_speed = _classify(gateway, {**body, "speed": [0.5] * len(TEXTS)}, path)
    without = _classify(gateway, body, path)

    assert with_speed["notes"] == [
        f"speed ignored: model '{model}' version {version} has no early exits"
    ]
    assert with_speed["predictions"] == without["predictions"]
    assert all("exit_layer" not in p for p in with_speed["predictions"])
    assert "notes" not in without
