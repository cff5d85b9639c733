"""A hostile client can't hurt the gateway (issue 34), on a real gunicorn gateway over a real model
server: what a client invents (model names, versions, token-id lists) costs nothing that lasts,
neither worker memory nor metric series, and the metrics of a refused request name no version.

The gateway here has one worker with one thread, so that consecutive requests run on the same
thread (what one request leaves in the thread is what the next one would inherit) and the
worker's RSS is one number.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from ops import apikeys
from tests.backend.conftest import EMBED, INTENT
from tests.backend.stack import Gateway, ModelServer, gateway_env

# 5,000 requests of invented names, versions and id lists may add at most this much to the
# worker's resident memory once it is warm (a worker that kept anything per request, even a
# few hundred bytes, would grow past it; one that kept each 404's request body, 30 MB).
SOAK_REQUESTS = 5000
SOAK_RSS_BOUND_MIB = 8.0
# 30 KB of texts within the test gateway's limits: what a retained request body costs per request
BIG_TEXTS = ["word " * 398] * 15


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("hostile-keys") / "keys.json"
    return {
        "path": str(path),
        "all": apikeys.add(path, "all", None, None, None, versions=["*"]),
        "embed-only": apikeys.add(path, "embed-only", [EMBED], None, None),
        "once": apikeys.add(path, "once", None, 0.001, 1),
    }


@pytest.fixture(scope="module")
def one_thread(
    keys: dict[str, str],
    modelserver: ModelServer,
    model_base: Path,
    config_file: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Gateway]:
    env = gateway_env(modelserver, "grpc", model_base, config_file)
    env["GATEWAY_API_KEYS_FILE"] = keys["path"]
    env["GATEWAY_STATUS_CACHE_S"] = "60"  # one fetch per model for the whole module
    gateway = Gateway(env, tmp_path_factory.mktemp("hostile-logs"), workers=1, threads=1)
    yield gateway
    gateway.stop()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def series(url: str) -> dict[str, float]:
    """Return every sample of /metrics by its name and labels."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def worker_rss_mib(gateway: Gateway) -> float:
    """Return the resident memory of the gateway's one worker, in MiB."""
    master = gateway.process.pid
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    status = Path(f"/proc/{children[0]}/status").read_text()
    kib = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    assert kib is not None
    return int(kib.group(1)) / 1024


def test_a_refused_request_names_no_version_the_thread_served_before(
    one_thread: Gateway, keys: dict[str, str]
) -> None:
    url = f"{one_thread.url}/v1/models/{INTENT}:classify"
    refused = {
        "401": {},
        "403": _auth(keys["embed-only"]),
        "429": _auth(keys["once"]),
    }
    assert requests.post(url, json={"texts": ["hi"]}, headers=_auth(keys["once"]), timeout=10).ok
    for status, headers in refused.items():
        served = requests.post(url, json={"texts": ["hi"], "version": 2},
                               headers=_auth(keys["all"]), timeout=10)  # fmt: skip
        assert served.status_code == 200 and served.json()["model"]["version"] == 2
        reply = requests.post(url, json={"texts": ["hi"]}, headers=headers, timeout=10)
        assert str(reply.status_code) == status, reply.text

    counted = series(one_thread.url)
    for status in refused:
        named = [
            name
            for name in counted
            if name.startswith("gateway_requests_total{") and f'status="{status}"' in name
        ]
        assert named, f"no {status} counted"
        assert all('version=""' in name for name in named), named


def test_a_version_the_client_invents_never_becomes_a_label(
    one_thread: Gateway, keys: dict[str, str]
) -> None:
    headers = _auth(keys["all"])
    for version in (7001, 7002):
        reply = requests.post(
            f"{one_thread.url}/v1/models/{INTENT}:classify",
            json={"texts": ["hi"], "version": version}, headers=headers, timeout=10,
        )  # fmt: skip
        assert reply.status_code == 404
    reply = requests.post(
        f"{one_thread.url}/v1/embeddings", json={"model": f"{EMBED}@7003", "input": "hi"},
        headers=headers, timeout=10,
    )  # fmt: skip
    assert reply.status_code == 404

    invented = [n for n in series(one_thread.url) if re.search(r'"700[123]"', n)]
    assert not invented


def test_model_status_keeps_the_cached_states_default_requests_use(
    one_thread: Gateway, keys: dict[str, str]
) -> None:
    """GET /v1/models/<name> asks the model server, and the requests after it use that answer
    (it used to throw the model's cached states away: a flood of it made every default request
    a fan-out to every replica)."""
    headers = _auth(keys["all"])
    fresh = 'gateway_status_refreshes_total{outcome="fresh"}'
    for _ in range(3):
        status = requests.get(f"{one_thread.url}/v1/models/{INTENT}", headers=headers, timeout=10)
        assert status.status_code == 200
        before = series(one_thread.url).get(fresh, 0.0)
        for _ in range(3):
            reply = requests.post(f"{one_thread.url}/v1/models/{INTENT}:classify",
                                  json={"texts": ["hi"]}, headers=headers, timeout=10)  # fmt: skip
            assert reply.status_code == 200
        assert series(one_thread.url).get(fresh, 0.0) == before


def _soak_requests(session: requests.Session, url: str, key: str, numbers: range) -> dict[int, int]:
    """Send a request per number that invents something from it (a name, a version, an id
    list); return how many got each status."""
    rng = random.Random(34)
    headers = _auth(key)
    statuses: dict[int, int] = {}

    def post(path: str, body: dict[str, Any], extra: dict[str, str] | None = None) -> int:
        reply = session.post(f"{url}{path}", json=body, headers=extra or headers, timeout=30)
        return reply.status_code

    for i in numbers:
        kind = i % 8
        ids = [rng.randrange(5, 30) for _ in range(rng.randrange(1, 40))]
        if kind == 0:  # a new model name with a large body
            status = post(f"/v1/models/ghost-{i}:classify", {"texts": BIG_TEXTS})
        elif kind == 1:  # a new version of a served model
            status = post(f"/v1/models/{INTENT}:classify", {"texts": ["hi"], "version": 10**6 + i})
        elif kind == 2:  # a new token-id list, served
            status = post("/v1/embeddings", {"model": f"{EMBED}@1", "input": [ids]})
        elif kind == 3:  # a new version in the body's model
            status = post("/v1/embeddings", {"model": f"{EMBED}@{10**6 + i}", "input": [ids]})
        elif kind == 4:  # a new name's status
            status = session.get(f"{url}/v1/models/ghost-{i}", headers=headers, timeout=30)
            status = status.status_code
        elif kind == 5:  # new ids to turn back into text
            status = post(f"/v1/models/{INTENT}:detokenize", {"ids": [ids], "version": 1})
        elif kind == 6:  # a new version to detokenize with
            status = post(f"/v1/models/{INTENT}:detokenize", {"ids": [ids], "version": 10**6 + i})
        else:  # a new name in the body, and without a key
            status = post("/v1/embeddings", {"model": f"ghost-{i}", "input": "hi"}, {"X": "y"})
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


@pytest.mark.timeout(600)  # the requests take 20-60 s on 2 shared cores; the stack's start more
def test_5000_invented_names_versions_and_id_lists_leave_memory_and_series_flat(
    one_thread: Gateway, keys: dict[str, str]
) -> None:
    session = requests.Session()
    warm = _soak_requests(session, one_thread.url, keys["all"], range(400))
    series(one_thread.url)  # /metrics itself is a route with series
    rss_before = worker_rss_mib(one_thread)
    series_before = set(series(one_thread.url))
    started = time.monotonic()

    statuses = _soak_requests(session, one_thread.url, keys["all"], range(400, 400 + SOAK_REQUESTS))

    elapsed = time.monotonic() - started
    rss_after = worker_rss_mib(one_thread)
    series_after = set(series(one_thread.url))
    assert set(statuses) == set(warm) == {200, 401, 404}, statuses
    assert rss_after - rss_before <= SOAK_RSS_BOUND_MIB, (
        f"worker RSS {rss_before:.1f} -> {rss_after:.1f} MiB over {SOAK_REQUESTS} requests "
        f"({elapsed:.1f} s)"
    )
    assert series_after == series_before, sorted(series_after ^ series_before)[:20]
    print(f"worker RSS {rss_before:.1f} -> {rss_after:.1f} MiB, {len(series_after)} series, "
          f"{SOAK_REQUESTS} requests in {elapsed:.1f} s")  # fmt: skip


# -- unbounded work: every list a client sends has a limit (the shared test gateway's) ----------

MAX_TEXTS = 64  # tests/backend/stack.py's GATEWAY_MAX_TEXTS
MAX_TOKEN_IDS = 20_000  # the default GATEWAY_MAX_TOKEN_IDS


@pytest.mark.parametrize(
    "path, body",
    [
        (f"/v1/models/{INTENT}:detokenize", {"ids": [[7]] * (MAX_TEXTS + 1)}),
        ("/v1/embeddings", {"model": EMBED, "input": [[7]] * (MAX_TEXTS + 1)}),
    ],
)
def test_more_id_lists_than_max_texts_are_413(
    grpc_gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    reply = requests.post(f"{grpc_gateway.url}{path}", json=body, timeout=30)

    assert reply.status_code == 413, reply.text
    assert "GATEWAY_MAX_TEXTS" in reply.text


@pytest.mark.parametrize(
    "path, body",
    [
        (f"/v1/models/{INTENT}:detokenize", {"ids": [[7] * (MAX_TOKEN_IDS + 1)]}),
        ("/v1/embeddings", {"model": EMBED, "input": [[7] * (MAX_TOKEN_IDS + 1)]}),
        ("/v1/embeddings", {"model": EMBED, "input": [7] * (MAX_TOKEN_IDS + 1)}),
    ],
)
def test_a_token_id_list_over_max_token_ids_is_422(
    grpc_gateway: Gateway, path: str, body: dict[str, Any]
) -> None:
    reply = requests.post(f"{grpc_gateway.url}{path}", json=body, timeout=30)

    assert reply.status_code == 422, reply.text
    assert "GATEWAY_MAX_TOKEN_IDS" in reply.text


@pytest.mark.parametrize("spec", [":", "@x", f"{EMBED}@", f"{EMBED}:", f"{EMBED}:1x", "a b"])
def test_a_body_model_outside_the_schemas_forms_is_400(grpc_gateway: Gateway, spec: str) -> None:
    reply = requests.post(
        f"{grpc_gateway.url}/v1/embeddings", json={"model": spec, "input": "hi"}, timeout=30
    )

    assert reply.status_code == 400, reply.text
    pattern = requests.get(f"{grpc_gateway.url}/openapi.json", timeout=10).json()
    pattern = pattern["components"]["schemas"]["EmbeddingsRequest"]["properties"]["model"]
    assert not re.fullmatch(pattern["pattern"], spec)


def _unbounded(node: Any, where: str, found: list[str]) -> None:
    """Collect every place in a request schema where a value has no stated size limit."""
    if isinstance(node, dict):
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node and "const" \
                not in node:  # fmt: skip
            found.append(where)
        if kind == "array" and "maxItems" not in node:
            found.append(where)
        if kind in ("integer", "number") and "maximum" not in node:
            found.append(where)
        for key, value in node.items():
            if key != "not":  # what a body may not be (version and label both) is no input
                _unbounded(value, f"{where}.{key}", found)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            _unbounded(value, f"{where}[{index}]", found)


def test_every_input_has_a_stated_limit_in_the_openapi_document(grpc_gateway: Gateway) -> None:
    doc = requests.get(f"{grpc_gateway.url}/openapi.json", timeout=10).json()
    schemas = doc["components"]["schemas"]
    requests_ = [name for name in schemas if name.endswith("Request") or name == "Document"]
    found: list[str] = []
    for name in requests_:
        _unbounded(schemas[name], name, found)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                _unbounded(parameter["schema"], f"{method} {path} {parameter['name']}", found)

    assert found == []
    speed = schemas["ClassifyRequest"]["properties"]["speed"]["description"]
    assert "must equal that of 'texts'" in speed  # the cross-field rule no schema keyword says
