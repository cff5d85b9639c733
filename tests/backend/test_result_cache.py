"""The result cache (backend/cache.py): byte-identical answers, never stale, scoped per key,
bounded, single flight; gateways of their own (one worker, so a repeat hits) on the session's
modelserver. Every input option crossed with the cache on and off on these dense-only models
(``test_every_option_answers_as_uncached_in_any_order``); the hybrid models' output kinds and
query side in tests/backend/test_retrieval_e2e.py, whose gateways run with the cache on."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests

from backend import auth
from backend.auth import ApiKey, key_hash
from backend.cache import Claim, ResultCache, SharedTier, entry_of
from backend.plan import Plan
from backend.service import Gateway as ServiceGateway
from backend.settings import load_settings
from backend.tokenization import Encoded
from tests.backend.alike import assert_alike
from tests.backend.conftest import EMBED, EXITS, INTENT, SENTENCE
from tests.backend.corpus import LONG_ENGLISH
from tests.backend.stack import Gateway, ModelServer, gateway_env, model_config

NO_STORE = {"Cache-Control": "no-store"}
CACHED_MODELS = [INTENT, EMBED, SENTENCE, EXITS]
# (model, route, body): the cacheable routes, with options that only post-process
ROUTES = [
    (EMBED, "embed", {"normalize": True, "embedding_types": ["float", "int8"]}),
    (EMBED, "embed", {"outputs": ["dense"], "truncation_direction": "left"}),
    (SENTENCE, "embed", {"prompt_name": "query"}),
    (INTENT, "classify", {"top_k": 2, "return_logits": True}),
]


def _cached_gateway(
    server: ModelServer, upstream: str, base: Path, config: Path, log_dir: Path, **extra: str
) -> Gateway:
    env = gateway_env(server, upstream, base, config)
    env.update(GATEWAY_CACHE_BYTES="1000000", GATEWAY_LABELS_CACHE_S="0.1", **extra)
    return Gateway(env, log_dir, workers=1, threads=8)


@pytest.fixture(scope="module")
def own_config(model_base: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a serving config of the cached gateways' own (the label test moves its labels)."""
    path = tmp_path_factory.mktemp("cache-config") / "models.config"
    path.write_text(model_config(model_base, {INTENT: {"stable": 1}}, CACHED_MODELS))
    return path


@pytest.fixture(scope="module", params=["grpc", "rest"])
def cached(
    request: pytest.FixtureRequest,
    modelserver: ModelServer,
    model_base: Path,
    own_config: Path,
    log_dir: Path,
) -> Iterator[Gateway]:
    """Return a one-worker gateway with the result cache on, over grpc, then over rest."""
    gateway = _cached_gateway(modelserver, request.param, model_base, own_config, log_dir)
    try:
        yield gateway
    finally:
        gateway.stop()


def _write(path: Path, text: str) -> None:
    """Replace ``path`` at once (a reader never sees half of it), as ops' tools do."""
    part = path.with_suffix(".part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def _post(gateway: Gateway, model: str, route: str, body: dict[str, Any], **kw: Any) -> Any:
    response = requests.post(f"{gateway.url}/v1/models/{model}:{route}", json=body, timeout=10,
                             **kw)  # fmt: skip
    assert response.status_code == 200, response.text
    return response


@pytest.mark.parametrize(("model", "route", "options"), ROUTES)
def test_answers_are_byte_identical_hit_miss_or_partial(
    cached: Gateway, model: str, route: str, options: dict[str, Any]
) -> None:
    tag = f"{route}-{len(options)}-{next(iter(options))}-{cached.port}"
    texts = [f"the first {tag} text", f"a second {tag} one", f"and a third {tag}"]
    body = {"texts": texts, **options}
    fresh = _post(cached, model, route, body, headers=NO_STORE)
    assert fresh.headers["x-cache"] == "bypass"
    first = _post(cached, model, route, body)
    assert first.headers["x-cache"] == "miss"
    again = _post(cached, model, route, body)
    assert again.headers["x-cache"] == "hit"
    assert fresh.content == first.content == again.content
    # a hit skips tokenize: no tokens computed, the cache stage in Server-Timing
    assert again.headers["x-compute-tokens"] == "0"
    assert "cache;dur=" in again.headers["Server-Timing"]
    # the caller's order, one text new: partial, and each text's answer as when alone
    mixed = {"texts": [texts[2], f"a new {tag} text", texts[0]], **options}
    partial = _post(cached, model, route, mixed)
    assert partial.headers["x-cache"] == "partial"
    # its new text computed alone: up to the last bits of a three-text batch's (AVX2 machines)
    assert_alike(partial.content, _post(cached, model, route, mixed, headers=NO_STORE).content,
                  options)  # fmt: skip


# Each route's options that decide the tokens or the rows (the key must hold them) beside ones that
# only post-process (the key must not need them); every text once more with a long one, cut
# differently from either side. A field left out of the key serves one option's entry to another.
CROSSED = [
    (EMBED, "embed", [{}, {"truncation_direction": "left"},
                      {"outputs": ["dense"], "embedding_types": ["binary"]},
                      {"normalize": False},
                      {"truncation_direction": "left", "normalize": False}]),
    (SENTENCE, "embed", [{}, {"prompt_name": "query"}, {"input_type": "search_document"},
                         {"prompt_name": "passage", "truncation_direction": "left"},
                         {"input_type": "search_query", "truncation_direction": "left"}]),
    (INTENT, "classify", [{}, {"truncation_direction": "left"},
                          {"top_k": 2, "return_logits": True}]),
    (EXITS, "classify", [{"version": 2}, {"version": 2, "speed": 0.9},
                         {"version": 2, "speed": 0.9, "truncation_direction": "left"},
                         {"version": 1}]),
]  # fmt: skip


@pytest.mark.parametrize(("model", "route", "variants"), CROSSED,
                         ids=[f"{m}-{r}" for m, r, _ in CROSSED])  # fmt: skip
def test_every_option_answers_as_uncached_in_any_order(
    cached: Gateway, model: str, route: str, variants: list[dict[str, Any]]
) -> None:
    """The same texts with each option in turn, then in the other order (every text a hit, or
    one option's entry served to another), every third request with one text new (partly
    cached): each answer is the answer the same request gets uncached (``no-store`` crosses the
    stages the cache off does), byte for byte when its texts were computed together (a miss);
    else up to the last bits of its floats (a text computed in a batch of another size:
    backend/cache.py), far closer than another option's answer."""
    tag = f"{model}-{cached.port}"
    long = LONG_ENGLISH[:800]  # over every model's max_seq_len
    texts = [f"crossed {tag}", f"{long} {tag}", f"{tag} {long}"[::-1]]
    uncached = [_post(cached, model, route, {"texts": texts, **v}, headers=NO_STORE).content
                for v in variants]  # fmt: skip
    assert len(set(uncached)) == len(variants), "two options answer alike: nothing to tell apart"
    order = [*range(len(variants)), *reversed(range(len(variants)))]
    for step, index in enumerate(order):
        some = texts if step % 3 else [f"new {step} {tag}", *texts[1:]]  # partly cached
        body = {"texts": some, **variants[index]}
        answer = _post(cached, model, route, body)
        want = uncached[index] if some is texts else _post(cached, model, route, body,
                                                           headers=NO_STORE).content  # fmt: skip
        assert_alike(answer.content, want, (variants[index], answer.headers["x-cache"]))
        if answer.headers["x-cache"] == "miss":
            assert answer.content == want, variants[index]


def test_no_store_keeps_nothing_and_truncate_false_still_refuses_a_cut_hit(
    cached: Gateway,
) -> None:
    body = {"texts": [f"kept out {cached.port}"]}
    _post(cached, EMBED, "embed", body, headers={"Cache-Control": "private, no-store"})
    assert _post(cached, EMBED, "embed", body).headers["x-cache"] == "miss"
    long = " ".join(["word"] * 300) + str(cached.port)
    _post(cached, EMBED, "embed", {"texts": [long]})
    # the long text cut under truncate=true is a hit; the error names its index in the request
    for texts in ([f"new {cached.port}", long], [body["texts"][0], long + " and new"]):
        refused = requests.post(f"{cached.url}/v1/models/{EMBED}:embed", timeout=10,
                                json={"texts": texts, "truncate": False})  # fmt: skip
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["message"].startswith("texts[1] needs")


def _computed(gateway: Gateway) -> float:
    """Return how many inferences the gateway computed (its ``_plan`` stage observes each)."""
    exposed = requests.get(f"{gateway.url}/metrics", timeout=5).text
    line = next(x for x in exposed.splitlines() if x.startswith("gateway_texts_per_request_count"))
    return float(line.rsplit(" ", 1)[1])


def test_concurrent_requests_of_one_new_text_compute_it_once(cached: Gateway) -> None:
    body = {"texts": [f"sixteen at once {cached.port}"]}
    before = _computed(cached)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: _post(cached, EMBED, "embed", body), range(16)))
    assert len({a.content for a in answers}) == 1
    assert sorted(a.headers["x-cache"] for a in answers).count("miss") >= 1
    assert _computed(cached) - before == 1


def test_a_label_move_never_serves_the_old_versions_answer(
    cached: Gateway, model_base: Path, own_config: Path
) -> None:
    texts = ["what is my balance", "card lost", "what is my balance"]
    want = {}
    for version in (1, 2):
        body = {"texts": texts, "version": version}
        want[version] = _post(cached, INTENT, "classify", body, headers=NO_STORE).json()[
            "predictions"
        ]
    assert want[1] != want[2]
    stop = threading.Event()

    def move() -> None:
        version = 1
        while not stop.is_set():
            version = 3 - version
            labels = {INTENT: {"stable": version}}
            _write(own_config, model_config(model_base, labels, CACHED_MODELS))
            time.sleep(0.15)

    def ask(_: int) -> tuple[int, Any]:
        answer = _post(cached, INTENT, "classify", {"texts": texts, "label": "stable"}).json()
        return answer["model"]["version"], answer["predictions"]

    mover = threading.Thread(target=move)
    mover.start()
    answers: list[tuple[int, Any]] = []
    try:
        # hits answer in a millisecond: ask until both versions answered (or 20 s), not a count
        deadline = time.monotonic() + 20
        with ThreadPoolExecutor(4) as pool:
            while time.monotonic() < deadline:
                answers.extend(pool.map(ask, range(40)))
                if len(answers) >= 120 and {v for v, _ in answers} == {1, 2}:
                    break
                time.sleep(0.05)
    finally:
        stop.set()
        mover.join()
        _write(own_config, model_config(model_base, {INTENT: {"stable": 1}}, CACHED_MODELS))
    served = {version for version, _ in answers}
    assert served == {1, 2}, "the label never moved during the requests"
    for version, predictions in answers:  # the batches differ: up to the floats' last bits
        assert_alike(orjson.dumps(predictions), orjson.dumps(want[version]), version)


def test_entries_are_per_api_key_and_counted_in_metrics(
    modelserver: ModelServer,
    model_base: Path,
    own_config: Path,
    log_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    keys_file = tmp_path_factory.mktemp("cache-keys") / "keys.json"
    keys_file.write_bytes(orjson.dumps({"keys": [
        {"name": name, "sha256": key_hash(f"bg-{name}")} for name in ("a", "b")
    ]}))  # fmt: skip
    gateway = _cached_gateway(
        modelserver, "grpc", model_base, own_config, log_dir,
        GATEWAY_API_KEYS_FILE=str(keys_file), GATEWAY_CACHE_ENTRIES="2",
    )  # fmt: skip
    try:
        seen = [
            _post(gateway, EMBED, "embed", {"texts": [text]},
                  headers={"Authorization": f"Bearer bg-{name}"}).headers["x-cache"]
            for name, text in (("a", "only a sent this"), ("b", "only a sent this"),
                               ("a", "only a sent this"), ("a", "another"))
        ]  # fmt: skip
        exposed = requests.get(f"{gateway.url}/metrics", timeout=5).text
    finally:
        gateway.stop()
    assert seen == ["miss", "miss", "hit", "miss"]  # b's lookup never finds a's entry
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposed.splitlines()
        if line.startswith("gateway_cache_")
    }
    assert samples['gateway_cache_lookups_total{result="hit",tier="local"}'] == 1
    assert samples['gateway_cache_lookups_total{result="miss",tier="local"}'] == 3
    assert samples['gateway_cache_evictions_total{tier="local"}'] == 1  # three entries, room for 2
    assert samples['gateway_cache_entries{tier="local"}'] == 2
    assert samples['gateway_cache_bytes{tier="local"}'] > 0


@pytest.mark.parametrize("shared", [False, True])
def test_keys_share_entries_only_when_set(shared: bool, model_base: Path) -> None:
    settings = load_settings({
        "model_base_path": str(model_base), "cache_bytes": 1_000_000,
        "cache_shared_keys": shared, "tfs_grpc_target": "127.0.0.1:1",
    })  # fmt: skip
    gateway = ServiceGateway(settings)
    try:
        plan = Plan(EMBED, ["same text"], reuse=("embed",))
        plan.served, plan.assets = 1, gateway.assets.get(EMBED, 1)
        keys = []
        for name in ("a", "b"):
            token = auth.current_key.set(ApiKey(name=name, sha256="0" * 64))
            try:
                keys.append(gateway._cache_keys(plan))
            finally:
                auth.current_key.reset(token)
    finally:
        gateway.close()
    assert (keys[0] == keys[1]) is shared


# -- the cache itself, in process ---------------------------------------------------------------


def _entry(key: tuple[Any, ...], floats: int) -> Any:
    encoded = Encoded(np.arange(4, dtype=np.int32), False, 4)
    return entry_of(key, encoded, {"embedding": np.zeros(floats, dtype=np.float32)})


def test_the_cache_keeps_its_byte_bound_and_refuses_a_huge_entry() -> None:
    cache = ResultCache(max_bytes=20_000, max_entry_bytes=5_000, max_entries=1_000)
    for index in range(100):
        cache.put(("k", index), _entry(("k", index), 256))
    assert cache.bytes <= 20_000 and 0 < len(cache) < 100
    assert cache.get(("k", 99)) is not None and cache.get(("k", 0)) is None
    cache.put(("huge",), _entry(("huge",), 10_000))
    assert cache.get(("huge",)) is None


def test_concurrent_misses_of_one_key_are_computed_once() -> None:
    cache = ResultCache(max_bytes=1_000_000, max_entry_bytes=100_000, max_entries=100)
    key = ("model", 1, ("embed",), "same text")
    first, second = Claim(), Claim()
    _, mine, theirs = cache.lookup([key], first)
    assert mine == [0] and not theirs
    _, mine2, theirs2 = cache.lookup([key], second)
    assert not mine2 and len(theirs2) == 1
    waiter = theirs2[0][1]
    assert not waiter.is_set()
    cache.put(key, _entry(key, 8))
    cache.release(first)
    assert waiter.wait(1) and cache.get(key) is not None


def test_a_release_ends_only_the_flights_its_request_claimed() -> None:
    """A second release (the ``finally`` after the fill's) never ends another request's claim
    of the same text made in between."""
    cache = ResultCache(max_bytes=1_000_000, max_entry_bytes=100_000, max_entries=100)
    key = ("model", 1, ("embed",), "claimed twice")
    first, second = Claim(), Claim()
    cache.lookup([key], first)
    cache.release(first, [key])
    _, mine, _ = cache.lookup([key], second)
    cache.release(first)
    _, _, theirs = cache.lookup([key], Claim())
    assert mine == [0] and len(theirs) == 1 and not theirs[0][1].is_set()
    cache.release(second)
    assert theirs[0][1].is_set()


class _FailingTier(SharedTier):
    """A shared tier whose read fails with what no Redis error is (a fault a real Redis can't
    be made to cause once values that don't decode are misses: the test of the ``finally``)."""

    def fetch(self, keys: Any) -> Any:
        raise RuntimeError("the shared tier broke")


def test_a_failure_after_the_claim_leaves_no_flight_behind(model_base: Path) -> None:
    """Issue 60 item 3: whatever raises between the lookup's claim and the computation, the
    claims end (a claim left behind made every later request for its texts wait its whole
    deadline)."""
    import time as clock

    settings = load_settings({
        "model_base_path": str(model_base), "cache_bytes": 1_000_000,
        "tfs_grpc_target": "127.0.0.1:1",
    })  # fmt: skip
    gateway = ServiceGateway(settings)
    try:
        cache = gateway.cache
        assert cache is not None
        cache.shared = _FailingTier("redis://127.0.0.1:1/0", "p:", 60, 0.05, 5, 10_000)
        plan = Plan(EMBED, ["claimed then failed", "and another"], reuse=("embed",))
        plan.served, plan.assets = 1, gateway.assets.get(EMBED, 1)
        plan.deadline = clock.monotonic() + 5
        with pytest.raises(RuntimeError, match="broke"):
            gateway._cached_stages(plan, cache)
        _, mine, theirs = cache.lookup(gateway._cache_keys(plan), Claim())
        cache.shared.close()
    finally:
        gateway.close()
    assert mine == [0, 1] and not theirs  # no flight left: a new request computes them
