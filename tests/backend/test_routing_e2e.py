"""Weighted split and shadow traffic through real gunicorn gateways and a real modelserver.

tiny-route v1 and v3 are the same checkpoint; v2 is that checkpoint with two labels swapped in
its id2label (numerically identical, wrong on every text whose top label is one of the two).
stable = v1, canary = v3: v2 and v3 are unvetted (newer than stable). A second gateway has API
keys: who reaches which version (issue 34 item 5).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from modelformat import routing
from ops import apikeys
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config

ROUTED = "tiny-route"
LABELS = ("negative", "neutral", "positive")
SWAPPED = ("neutral", "negative", "positive")
TEXTS = ["the cat sat on the mat", "a dog ran", "good morning to you", "the end", "hello world"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Return a modelserver serving tiny-route v1-v3 and a 2-worker gateway with a routing file."""
    from export.build import build
    from export.tiny import write_hf_checkpoint

    base = tmp_path_factory.mktemp("routed")
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_hf_checkpoint(Path(tmp) / "ckpt", labels=LABELS, seed=3)
        for version, labels in ((1, LABELS), (2, SWAPPED), (3, LABELS)):
            build(ckpt, ROUTED, base, version=version, labels=labels, max_seq_len=32, warmup=False)
    config = base / "models.config"
    labels = {ROUTED: {"stable": 1, "canary": 3}}
    config.write_text(model_config(base, labels, [ROUTED]), encoding="utf-8")
    keys_file = base / "keys.json"
    keys = {
        "plain": apikeys.add(keys_file, "plain", None, None, None),
        "tester": apikeys.add(keys_file, "tester", None, None, None, ["public", "canary"]),
        "ops": apikeys.add(keys_file, "ops", None, None, None, ["*"]),
    }
    routing_file = base / "routing.yaml"
    routing_file.write_text("{}\n", encoding="utf-8")
    logs = tmp_path_factory.mktemp("routed-logs")
    server = ModelServer(config, logs)
    gateways: list[Gateway] = []
    try:
        for version in (1, 2, 3):
            server.wait_available(ROUTED, version)
        env = gateway_env(server, "grpc", base, config)
        # shadows queue here (the default, 0, drops those that arrive while one runs): the
        # comparison tests count every request's shadow
        env.update(GATEWAY_LABELS_CACHE_S="0.2", GATEWAY_DEFAULT_MODEL=ROUTED,
                   GATEWAY_SHADOW_QUEUE="64")  # fmt: skip
        gateways.append(Gateway(env, logs, workers=2))
        keyed_env = dict(env, GATEWAY_API_KEYS_FILE=str(keys_file))
        gateways.append(Gateway(keyed_env, logs, workers=1))
        yield {"gateway": gateways[0], "routing": routing_file, "env": env, "logs": logs,
               "keyed": gateways[1], "keys": keys}  # fmt: skip
    finally:
        for gateway in gateways:
            gateway.stop()
        server.stop()


def set_routing(path: Path, text: str) -> None:
    """Write the routing file and wait past the gateways' re-read bound (0.2 s)."""
    path.write_text(text, encoding="utf-8")
    time.sleep(0.6)


def classify(url: str, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    headers = {"X-Route-Key": key} if key is not None else {}
    # A fresh connection each time: gunicorn hands it to either worker.
    reply = requests.post(f"{url}/v1/models/{ROUTED}:classify", json=body, headers=headers,
                          timeout=10)  # fmt: skip
    assert reply.status_code == 200, reply.text
    return reply.json()


def served(url: str, key: str | None = None, **body: Any) -> int:
    return int(classify(url, {"texts": ["hello world"], **body}, key)["model"]["version"])


def metric_sum(url: str, name: str, **labels: str) -> float:
    """Return the sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def wait_metric(url: str, name: str, at_least: float, **labels: str) -> float:
    deadline = time.monotonic() + 20
    while (value := metric_sum(url, name, **labels)) < at_least and time.monotonic() < deadline:
        time.sleep(0.1)
    return value


def test_default_traffic_follows_the_weights_within_the_stated_error(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: 80, 3: 20}}\n")

    versions = Counter(served(url) for _ in range(300))

    assert set(versions) <= {1, 3}
    # 300 draws at p = 0.2: sd 0.023; 4 sd = 0.093
    assert abs(versions[3] / 300 - 0.20) < 0.093, versions


def test_a_route_key_lands_on_its_version_in_every_worker_and_after_a_restart(
    stack: dict,
) -> None:
    url = stack["gateway"].url
    text = f"{ROUTED}:\n  weights: {{1: 50, 3: 50}}\n"
    set_routing(stack["routing"], text)
    route = routing.parse(text).route(ROUTED)
    assert route is not None
    keys = [f"customer-{i}" for i in range(24)]
    expected = {key: route.choose(key, ROUTED) for key in keys}

    first = {key: {served(url, key) for _ in range(3)} for key in keys}
    restarted = Gateway(stack["env"], stack["logs"], workers=2)
    try:
        after = {key: served(restarted.url, key) for key in keys}
    finally:
        restarted.stop()

    assert first == {key: {expected[key]} for key in keys}
    assert after == expected
    assert set(expected.values()) == {1, 3}  # both versions are really in play


def test_requests_naming_a_version_or_a_label_are_not_split(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{3: 100}}\n")

    assert {served(url) for _ in range(5)} == {3}
    assert {served(url, version=1) for _ in range(5)} == {1}
    assert {served(url, label="stable") for _ in range(5)} == {1}


def test_weights_naming_a_version_that_is_not_served_fall_back_to_stable(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{9: 100}}\n")

    # stable, never the newest AVAILABLE (v3: in a pinned rollout, the unvetted version)
    assert {served(url) for _ in range(3)} == {1}


def test_tokenize_resolves_the_version_an_inference_request_would_get(stack: dict) -> None:
    url = stack["gateway"].url

    def tokenized(**body: Any) -> int:
        reply = requests.post(f"{url}/v1/models/{ROUTED}:tokenize",
                              json={"texts": ["hi"], **body}, timeout=10)  # fmt: skip
        assert reply.status_code == 200, reply.text
        return int(reply.json()["model"]["version"])

    # the weights, not the newest version (v3)
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: 100}}\n")
    assert {tokenized() for _ in range(6)} == {1}
    # a version the weights name that is not served: stable, as for :classify
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{9: 100}}\n")
    assert {tokenized() for _ in range(3)} == {1} == {served(url) for _ in range(3)}
    # a version or label named: not split
    assert (tokenized(version=2), tokenized(label="canary")) == (2, 3)


def test_a_broken_routing_file_keeps_the_last_good_split(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: 100}}\n")
    # Each worker keeps its own last good routing: let both read the good file first.
    assert {served(url) for _ in range(30)} == {1}

    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: -5}}\n")

    assert {served(url) for _ in range(5)} == {1}
    assert metric_sum(url, "gateway_routing_stale") >= 1
    assert metric_sum(url, "gateway_routing_errors_total") >= 1


@pytest.mark.parametrize(("shadow", "agrees"), [(3, True), (2, False)])
def test_the_shadow_answer_is_compared_by_label_name(
    stack: dict, shadow: int, agrees: bool
) -> None:
    url = stack["gateway"].url
    set_routing(
        stack["routing"],
        f"{ROUTED}:\n  weights: {{1: 100}}\n  shadow: {{version: {shadow}, share: 1.0}}\n",
    )
    pair = {"model": ROUTED, "served_version": "1", "shadow_version": str(shadow)}
    before = metric_sum(url, "gateway_shadow_agreement_count", measure="top1", **pair)
    agreed_before = metric_sum(url, "gateway_shadow_agreement_sum", measure="top1", **pair)

    answers = [classify(url, {"texts": TEXTS}) for _ in range(6)]
    total = wait_metric(
        url, "gateway_shadow_agreement_count", before + 6 * len(TEXTS), measure="top1", **pair
    )
    agreed = metric_sum(url, "gateway_shadow_agreement_sum", measure="top1", **pair)

    assert {a["model"]["version"] for a in answers} == {1}  # the shadow never answers
    assert total == before + 6 * len(TEXTS)
    top1 = [p["label"] for p in answers[0]["predictions"]]
    swapped_rows = sum(label in ("negative", "neutral") for label in top1) * 6
    expected = 6 * len(TEXTS) if agrees else 6 * len(TEXTS) - swapped_rows
    assert agreed - agreed_before == expected
    assert swapped_rows > 0  # the texts do reach the swapped labels


def test_a_shadow_that_fails_never_fails_the_client(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: 100}}\n  shadow: {{version: 9}}\n")
    labels = {"model": ROUTED, "served_version": "1", "shadow_version": "9", "outcome": "error"}
    before = metric_sum(url, "gateway_shadow_requests_total", **labels)

    assert {served(url) for _ in range(4)} == {1}
    assert wait_metric(url, "gateway_shadow_requests_total", before + 4, **labels) == before + 4


def test_a_request_that_fails_after_resolution_counts_against_its_version(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], "{}\n")
    body = {"texts": ["word " * 100], "truncate": False}
    before = metric_sum(url, "gateway_requests_total", model=ROUTED, version="3", status="422")
    reply = requests.post(f"{url}/v1/models/{ROUTED}:classify", json=body, timeout=10)

    assert reply.status_code == 422
    after = metric_sum(url, "gateway_requests_total", model=ROUTED, version="3", status="422")
    assert after == before + 1


def keyed_reply(stack: dict, key: str, body: dict[str, Any], **headers: str) -> requests.Response:
    headers["Authorization"] = f"Bearer {stack['keys'][key]}"
    return requests.post(
        f"{stack['keyed'].url}/v1/models/{ROUTED}:classify",
        json={"texts": ["hello world"], **body}, headers=headers, timeout=10,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("key", "body", "status", "version"),
    [
        ("plain", {}, 200, None),
        ("plain", {"label": "stable"}, 200, 1),
        ("plain", {"version": 1}, 200, 1),
        ("plain", {"version": 2}, 403, None),  # unvetted: newer than stable
        ("plain", {"version": 3}, 403, None),
        ("plain", {"label": "canary"}, 403, None),
        ("tester", {"label": "canary"}, 200, 3),
        ("tester", {"version": 3}, 403, None),  # its scope names the label, not the number
        ("tester", {"version": 1}, 200, 1),
        ("ops", {"version": 2}, 200, 2),
        ("ops", {"label": "canary"}, 200, 3),
    ],
)
def test_an_api_key_reaches_only_the_versions_and_labels_its_scope_names(
    stack: dict, key: str, body: dict[str, Any], status: int, version: int | None
) -> None:
    set_routing(stack["routing"], "{}\n")

    reply = keyed_reply(stack, key, body)

    assert reply.status_code == status, reply.text
    if status == 403:
        assert reply.json()["error"]["code"] == "forbidden"
    elif version is not None:
        assert reply.json()["model"]["version"] == version


def test_tokenize_and_the_openai_model_form_keep_to_the_scope_too(stack: dict) -> None:
    url, plain = stack["keyed"].url, {"Authorization": f"Bearer {stack['keys']['plain']}"}

    tokenize = requests.post(
        f"{url}/v1/models/{ROUTED}:tokenize", json={"texts": ["hi"], "version": 3}, headers=plain,
        timeout=10,
    )  # fmt: skip
    embeddings = requests.post(f"{url}/v1/embeddings",
                               json={"input": "hi", "model": f"{ROUTED}:canary"}, headers=plain,
                               timeout=10)  # fmt: skip

    # refused for the scope (not for a bad body or an unknown key), naming what was asked
    assert [(r.status_code, r.json()["error"]["code"]) for r in (tokenize, embeddings)] == [
        (403, "forbidden")
    ] * 2
    assert "may not name version 3 of model 'tiny-route'" in tokenize.json()["error"]["message"]
    assert "may not name label 'canary'" in embeddings.json()["error"]["message"]


def test_x_route_key_does_not_override_the_api_keys_sticky_split(stack: dict) -> None:
    text = f"{ROUTED}:\n  weights: {{1: 50, 3: 50}}\n"
    set_routing(stack["routing"], text)
    route = routing.parse(text).route(ROUTED)
    assert route is not None
    own = route.choose("plain", ROUTED)
    other = next(f"k{i}" for i in range(100) if route.choose(f"k{i}", ROUTED) != own)

    versions = {keyed_reply(stack, "plain", {}, **{"X-Route-Key": other}).json()["model"]["version"]
                for _ in range(4)}  # fmt: skip

    assert versions == {own}


def test_rollout_series_count_only_default_traffic_not_pinned_requests(stack: dict) -> None:
    url = stack["gateway"].url
    set_routing(stack["routing"], f"{ROUTED}:\n  weights: {{1: 100}}\n")
    series = ("gateway_version_requests_total", "gateway_version_request_seconds_count")
    before = {(n, v): metric_sum(url, n, model=ROUTED, version=v) for n in series for v in "13"}

    for _ in range(3):
        served(url, version=3)
        served(url, label="canary")
        served(url, label="stable")
    assert {served(url) for _ in range(4)} == {1}

    after = {(n, v): metric_sum(url, n, model=ROUTED, version=v) for n in series for v in "13"}
    assert all(after[(n, "3")] == before[(n, "3")] for n in series)  # pinned: not the rollout's
    assert all(after[(n, "1")] == before[(n, "1")] + 4 for n in series)  # label stable: pinned too
