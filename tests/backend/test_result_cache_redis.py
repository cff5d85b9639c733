"""The result cache's shared tier in Redis (backend/cache.py, SharedTier): two one-worker gateways
("pods", processes of their own) on the session's modelserver and one real redis-server (the
Debian package, started here on a free port, with the Kubernetes base's own arguments: the pods
as its user "gateway-cache", MGET and PSETEX on the cache's keys only) share their hits byte for
byte, and a pod's entry serves the other pod only the request it answers (the gateways' own
keys, every option crossed: none built by hand); entries over the entry bound and no-store
answers are not written, every entry written expires; with Redis killed under load nothing
fails, the tier is skipped and says so, and once Redis is back it is used again."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from backend import cache as cache_module
from backend.cache import SharedTier, decode, encode, entry_of
from backend.settings import SettingsError, load_settings
from backend.tokenization import Encoded
from ops.procs import free_port
from tests.backend.conftest import EMBED, INTENT, SENTENCE
from tests.backend.corpus import LONG_ENGLISH
from tests.backend.stack import Gateway, ModelServer, gateway_env, hung_port
from tests.backend.test_ratelimit_redis import RedisServer, acl_server, redis_server_binary

PREFIX = "bert-gateway:cache:"
ENTRY_BYTES = 3_000  # a short text's entry fits; a 3,150-character text's key alone does not
RETRY_S = 0.5


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    redis_server_binary()
    server = acl_server(tmp_path_factory.mktemp("cache-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pods(
    redis_server: RedisServer, modelserver: ModelServer, model_base: Path, config_file: Path,
    log_dir: Path,
) -> Iterator[list[Gateway]]:  # fmt: skip
    """Return two one-worker gateways whose result caches share ``redis_server``."""
    env = gateway_env(modelserver, "grpc", model_base, config_file)
    env.update(
        GATEWAY_CACHE_BYTES="1000000", GATEWAY_CACHE_ENTRY_BYTES=str(ENTRY_BYTES),
        GATEWAY_CACHE_REDIS="1", GATEWAY_CACHE_REDIS_URL=redis_server.url_as("gateway-cache"),
        GATEWAY_CACHE_REDIS_RETRY_S=str(RETRY_S), GATEWAY_MAX_TEXT_CHARS="4000",
    )  # fmt: skip
    gateways = [Gateway(env, log_dir, workers=1, threads=8) for _ in range(2)]
    try:
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()


def _post(gateway: Gateway, model: str, route: str, body: dict[str, Any], **kw: Any) -> Any:
    response = requests.post(f"{gateway.url}/v1/models/{model}:{route}", json=body, timeout=10,
                             **kw)  # fmt: skip
    assert response.status_code == 200, response.text
    return response


def _stored(server: RedisServer) -> int:
    return len(server.client().keys(PREFIX + "*"))


def _samples(gateway: Gateway) -> dict[str, float]:
    exposed = requests.get(f"{gateway.url}/metrics", timeout=5).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposed.splitlines()
        if line.startswith("gateway_cache_")
    }


@pytest.mark.parametrize(("model", "route"), [(EMBED, "embed"), (INTENT, "classify")])
def test_a_text_one_pod_computed_is_a_hit_in_the_other_byte_for_byte(
    pods: list[Gateway], model: str, route: str
) -> None:
    body = {"texts": [f"computed once {route}", f"and shared {route}"]}
    first = _post(pods[0], model, route, body)
    assert (first.headers["x-cache"], first.headers["x-cache-shared"]) == ("miss", "miss")
    other = _post(pods[1], model, route, body)
    assert (other.headers["x-cache"], other.headers["x-cache-shared"]) == ("hit", "hit")
    assert other.headers["x-compute-tokens"] == "0"
    assert other.content == first.content
    # now in the second pod's own tier: Redis is not asked
    again = _post(pods[1], model, route, body)
    assert again.headers["x-cache"] == "hit" and "x-cache-shared" not in again.headers
    samples = _samples(pods[1])
    assert samples['gateway_cache_lookups_total{result="hit",tier="redis"}'] >= 2
    assert samples['gateway_cache_transfer_bytes_total{direction="read",tier="redis"}'] > 0


def test_entries_over_the_bound_and_no_store_answers_are_not_written(
    pods: list[Gateway], redis_server: RedisServer
) -> None:
    before = _stored(redis_server)
    huge = {"texts": ["far too long to keep " * 150]}
    assert _post(pods[0], EMBED, "embed", huge).headers["x-cache"] == "miss"
    kept_out = {"texts": ["a caller asked not to keep this"]}
    bypass = _post(pods[0], EMBED, "embed", kept_out, headers={"Cache-Control": "no-store"})
    assert bypass.headers["x-cache"] == "bypass" and "x-cache-shared" not in bypass.headers
    assert _stored(redis_server) == before
    assert _post(pods[1], EMBED, "embed", huge).headers["x-cache-shared"] == "miss"
    assert _post(pods[1], EMBED, "embed", kept_out).headers["x-cache-shared"] == "miss"
    assert _samples(pods[0])['gateway_cache_not_stored_total{reason="too_big",tier="redis"}'] >= 1


def test_redis_killed_under_load_fails_nothing_and_its_tier_comes_back(
    pods: list[Gateway], redis_server: RedisServer
) -> None:
    """8 client threads over both pods for 3 s, Redis SIGKILLed 1 s in: 0 failed requests."""
    statuses: list[int] = []
    lock = threading.Lock()
    counter = itertools.count()
    stop = time.monotonic() + 3.0

    def client(index: int) -> None:
        with requests.Session() as session:
            while time.monotonic() < stop:
                n = next(counter)
                texts = [f"load {n % 40}", f"new under load {n}"]  # repeats and new texts
                reply = session.post(f"{pods[index % 2].url}/v1/models/{EMBED}:embed",
                                     json={"texts": texts}, timeout=10)  # fmt: skip
                with lock:
                    statuses.append(reply.status_code)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    redis_server.process.kill()
    for thread in threads:
        thread.join()
    degraded = [_samples(pod) for pod in pods]

    assert len(statuses) > 50 and set(statuses) == {200}, len(statuses)
    for samples in degraded:
        assert samples['gateway_cache_errors_total{tier="redis"}'] >= 1
        assert samples['gateway_cache_degraded{tier="redis"}'] == 1
    skipped = _post(pods[0], EMBED, "embed", {"texts": ["while Redis is down"]})
    assert skipped.headers["x-cache-shared"] == "degraded"

    redis_server.process.restart()
    redis_server.process.wait_until(redis_server._ready, 30)
    time.sleep(RETRY_S + 0.1)
    body = {"texts": ["after Redis came back"]}
    assert _post(pods[0], EMBED, "embed", body).headers["x-cache-shared"] == "miss"
    assert _post(pods[1], EMBED, "embed", body).headers["x-cache-shared"] == "hit"
    assert _samples(pods[0])['gateway_cache_degraded{tier="redis"}'] == 0


# -- the tier itself, in process ----------------------------------------------------------------


@pytest.mark.parametrize("extras", [False, True])
def test_an_entry_reads_back_as_it_was_written(extras: bool) -> None:
    ids = np.array([101, 7, 8, 102], dtype=np.int32)
    encoded = Encoded(ids, True, 9, ids * 0 if extras else None, ids * 0 + 1 if extras else None)
    rows = {"embedding": np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
            "exit_layer": np.array(3, dtype=np.int64)}  # fmt: skip
    key = ("scope", EMBED, 1, ("embed", None), "text")
    back = decode(key, encode(entry_of(key, encoded, rows)))
    assert (back.encoded.truncated, back.encoded.full_length) == (True, 9)
    assert back.encoded.ids.tobytes() == ids.tobytes()
    assert (back.encoded.type_ids is None) is not extras
    for name, row in rows.items():
        assert back.rows[name].dtype == row.dtype and back.rows[name].tobytes() == row.tobytes()
    with pytest.raises(ValueError):
        decode(key, b"not an entry")


def test_a_redis_that_hangs_costs_one_timeout_then_nothing() -> None:
    with hung_port() as port:
        tier = SharedTier(f"redis://127.0.0.1:{port}/0", PREFIX, 60.0, 0.05, 30.0, 10_000)
        started = time.monotonic()
        assert tier.fetch([("k",)]) is None
        first = time.monotonic() - started
        started = time.monotonic()
        assert tier.fetch([("k",)]) is None and tier.degraded
        again = time.monotonic() - started
        tier.close()
    assert 0.04 <= first < 0.5, first  # the stated 50 ms, no retries
    assert again < 0.005, again


def test_a_redis_that_is_not_there_is_skipped_at_once() -> None:
    tier = SharedTier(f"redis://127.0.0.1:{free_port()}/0", PREFIX, 60.0, 0.05, 30.0, 10_000)
    started = time.monotonic()
    assert tier.fetch([("k",)]) is None and tier.degraded
    assert time.monotonic() - started < 0.5
    tier.close()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"cache_redis": True, "rate_limit_redis_url": "redis://r:6379/0"}, "GATEWAY_CACHE_BYTES"),
        ({"cache_redis": True, "cache_bytes": 1000}, "needs a Redis"),
        ({"cache_redis": True, "cache_bytes": 1000, "cache_redis_url": "http://r"}, "redis://"),
        ({"cache_redis": True, "cache_bytes": 1000, "cache_redis_url": "redis://r",
          "cache_redis_timeout_s": 0}, "positive"),
    ],
)  # fmt: skip
def test_the_shared_tier_needs_the_workers_tier_and_a_redis(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(settings)


def test_the_shared_tier_uses_the_rate_limits_redis_only_once_turned_on() -> None:
    shared = {"cache_bytes": 1000, "rate_limit_redis_url": "redis://r:6379/0"}
    assert not load_settings(shared).cache_redis
    assert load_settings({**shared, "cache_redis": True}).cache_redis_target == "redis://r:6379/0"
    own = load_settings({**shared, "cache_redis": True, "cache_redis_url": "redis://c:6379/1"})
    assert own.cache_redis_target == "redis://c:6379/1"


def test_a_keys_name_in_redis_holds_this_gateways_semantics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rolling upgrade that changes answers bumps SEMANTICS: its pods never read the old
    pods' entries (nor the old theirs), whatever the key."""
    tier = SharedTier("redis://127.0.0.1:1/0", PREFIX, 60.0, 0.05, 5.0, 10_000)
    key = ("", EMBED, 1, ("embed", None, None, None, False), "every output", "text")
    before = tier.name(key)
    monkeypatch.setattr(cache_module, "_SEMANTICS", (cache_module.SEMANTICS + 1,
                                                     *cache_module._SEMANTICS[1:]))  # fmt: skip
    after = tier.name(key)
    tier.close()
    assert before != after and before.startswith(PREFIX) and after.startswith(PREFIX)


def test_an_entry_from_redis_holds_the_bytes_it_counts() -> None:
    """Issue 60 item 3: an entry read back holds its arrays alone, not views of the whole value
    beside copies (twice the bytes counted against GATEWAY_CACHE_BYTES)."""
    import gc
    import tracemalloc

    key = ("", EMBED, 1, ("embed",), "every output", "a text")
    rows = {"token_weights": np.ones(8_000, dtype=np.float32)}
    made = entry_of(key, Encoded(np.arange(64, dtype=np.int32), False, 64), rows)
    tracemalloc.start()
    try:
        value = encode(made)
        back = decode(key, value)
        del value
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert back.rows["token_weights"].tobytes() == rows["token_weights"].tobytes()
    assert held <= back.size * 1.1, (held, back.size)


# Pod 0 and pod 1 take turns: each option's request is computed (and written) by one pod, then
# asked of the other, which reads it from Redis when its key is the same. An option the key left
# out would serve one option's entry to another across pods. (Options that only post-process
# share entries: tests/backend/test_result_cache.py.)
SHARED_CROSS = [
    (EMBED, "embed", [{}, {"truncation_direction": "left"}]),
    (SENTENCE, "embed", [{}, {"prompt_name": "query"}, {"input_type": "search_document"},
                         {"prompt_name": "query", "truncation_direction": "left"}]),
    (INTENT, "classify", [{}, {"truncation_direction": "left"}]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "route", "variants"), SHARED_CROSS,
                         ids=[m for m, _, _ in SHARED_CROSS])  # fmt: skip
def test_a_pods_entry_serves_another_pod_only_the_request_it_answers(
    pods: list[Gateway], redis_server: RedisServer, model: str, route: str,
    variants: list[dict[str, Any]],
) -> None:  # fmt: skip
    texts = [f"shared across pods {model}", f"{LONG_ENGLISH[:600]} {model}"]
    uncached = [_post(pods[0], model, route, {"texts": texts, **v},
                      headers={"Cache-Control": "no-store"}).content
                for v in variants]  # fmt: skip
    assert len(set(uncached)) == len(variants), "two options answer alike: nothing to tell apart"
    for index, variant in enumerate(variants):
        writer, reader = pods[index % 2], pods[(index + 1) % 2]
        body = {"texts": texts, **variant}
        written = _post(writer, model, route, body)
        assert written.headers["x-cache-shared"] == "miss", variant  # no other option's entry
        read = _post(reader, model, route, body)
        assert read.headers["x-cache-shared"] == "hit", variant  # the writer's, through Redis
        assert written.content == read.content == uncached[index], variant
    client = redis_server.client()
    names = client.keys(PREFIX + "*")
    assert names and all(client.pttl(name) > 0 for name in names)  # every entry expires


MISTYPED = [
    "redis//gateway:s3cret-pw@r:6379/0",  # no scheme
    "http://gateway:s3cret-pw@r:6379/0",  # another scheme
    "redis://gateway:s3cr/et-pw@r:6379/0",  # a '/' not percent-encoded: a host inside it
    "redis://gateway:s3cr#et-pw@r:6379/0",
    "redis://gateway:s3cret-pw@r:63x9/0",  # the port
]


@pytest.mark.parametrize("url", MISTYPED)
@pytest.mark.parametrize("setting", ["rate_limit_redis_url", "cache_redis_url"])
def test_a_mistyped_redis_url_is_refused_without_its_password(url: str, setting: str) -> None:
    """Issue 60 item 7: the message names the setting and shows the URL, its password
    redacted (the gateway logs it at start)."""
    with pytest.raises(SettingsError) as refused:
        load_settings({setting: url, "cache_bytes": 1000, "cache_redis": True})
    assert "s3cr" not in str(refused.value) and "gateway:***@" in str(refused.value)
    assert f"GATEWAY_{setting.upper()}" in str(refused.value)


def test_a_redis_url_redis_py_cannot_read_is_refused_without_its_password() -> None:
    from backend.redisconn import RedisConn, redacted

    with pytest.raises(ValueError) as refused:
        RedisConn("redis://gateway:s3cret-pw@r:63x9/0", 0.05, 1.0)
    assert "s3cret" not in str(refused.value) and refused.value.__suppress_context__
    assert redacted("unix:///run/redis.sock?db=0&password=s3cret-pw") == (
        "unix:///run/redis.sock?db=0&password=***"
    )
    assert redacted("redis://s3cret-pw@r:6379/0") == "redis://***@r:6379/0"
