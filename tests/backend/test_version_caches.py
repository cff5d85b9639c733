"""The gateway's version caches: single-flight status, labels from an unreadable config,
assets of a version number that was deleted and published again."""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from backend import versions
from backend.app import create_app
from backend.clients.base import VersionStatus
from backend.clients.replicas import RECENT_MODELS, ReplicaSet
from backend.errors import ModelNotFound, UpstreamUnavailable, VersionNotFound
from backend.versions import AssetCache, LabelTable, StatusCache
from export.tiny import tiny_vocab
from tests.backend.conftest import other_vocab


def _status(version: int) -> list[VersionStatus]:
    return [VersionStatus(version=version, state="AVAILABLE")]


class GatedFetch:
    """A GetModelStatus stand-in that blocks each call until released, and counts calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.release = threading.Event()
        self.answer: list[VersionStatus] | Exception = _status(1)

    def __call__(self, model: str) -> list[VersionStatus]:
        self.calls += 1
        answer = self.answer
        self.started.set()
        assert self.release.wait(10), "test never released the fetch"
        if isinstance(answer, Exception):
            raise answer
        return answer


def _in_thread(fn: object, results: list[object]) -> threading.Thread:
    def run() -> None:
        try:
            results.append(fn())  # type: ignore[operator]
        except Exception as exc:
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_fetch_started_before_invalidate_does_not_store_its_stale_answer() -> None:
    fetch = GatedFetch()
    cache = StatusCache(fetch, ttl_s=60)
    results: list[object] = []
    thread = _in_thread(lambda: cache.get("m"), results)
    assert fetch.started.wait(10)
    cache.invalidate("m")  # e.g. a version vanished upstream while this fetch was in flight
    fetch.answer = _status(2)
    fetch.release.set()
    thread.join(10)
    assert results == [_status(1)]  # its own caller still gets what it fetched
    assert cache.get("m") == _status(2)  # but the next caller fetches again
    assert fetch.calls == 2


def test_concurrent_misses_share_one_fetch() -> None:
    fetch = GatedFetch()
    cache = StatusCache(fetch, ttl_s=60)
    results: list[object] = []
    first = _in_thread(lambda: cache.get("m"), results)
    assert fetch.started.wait(10)
    others = [_in_thread(lambda: cache.get("m"), results) for _ in range(7)]
    fetch.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert fetch.calls == 1
    assert results == [_status(1)] * 8


def test_waiters_get_the_leaders_error_without_calling_again() -> None:
    fetch = GatedFetch()
    fetch.answer = UpstreamUnavailable("model server unreachable")
    cache = StatusCache(fetch, ttl_s=60)
    results: list[object] = []
    first = _in_thread(lambda: cache.get("m"), results)
    assert fetch.started.wait(10)
    others = [_in_thread(lambda: cache.get("m"), results) for _ in range(3)]
    fetch.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert fetch.calls == 1
    assert len(results) == 4 and all(isinstance(r, UpstreamUnavailable) for r in results)


CONFIG = """model_config_list {
  config {
    name: "m"
    base_path: "/models/m"
    model_platform: "tensorflow"
    version_labels { key: "stable" value: %d }
  }
}
"""


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_unreadable_config_keeps_the_last_labels_logs_once_and_shows_in_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "models.config"
    config.write_text(CONFIG % 1)
    table = LabelTable(str(config), recheck_s=0)
    assert table.version_for("m", "stable") == 1
    errors_before = _sample("gateway_model_config_errors_total")

    config.write_text("model_config_list { config { name: ")  # a broken rewrite
    os.utime(config, ns=(1, 1))  # a new mtime whatever the file system's resolution
    with caplog.at_level(logging.WARNING, logger="backend.versions"):
        assert table.version_for("m", "stable") == 1
        assert table.version_for("m", "stable") == 1
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "unreadable" in caplog.records[0].message
    assert _sample("gateway_model_config_errors_total") == errors_before + 2
    assert _sample("gateway_model_config_stale") == 1
    exposed = create_app({}).test_client().get("/metrics").get_data(as_text=True)
    assert "\ngateway_model_config_stale 1.0\n" in exposed
    assert f"\ngateway_model_config_errors_total {errors_before + 2}\n" in exposed

    config.write_text(CONFIG % 2)
    assert table.version_for("m", "stable") == 2
    assert _sample("gateway_model_config_stale") == 0


def _in_worker(multiproc_dir: Path, code: str) -> str:
    """Run ``code`` in a fresh process sharing ``multiproc_dir``, as a gunicorn worker would."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir)}
    done = subprocess.run(
        [sys.executable, "-c", f"from backend import metrics\n{code}"],
        env=env, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return done.stdout


def test_a_dead_workers_stale_config_flag_leaves_metrics(tmp_path: Path) -> None:
    # A worker that dies while its config is unreadable: gunicorn's child_exit marks it dead,
    # and /metrics must stop saying "stale" for a process that no longer serves anything.
    pid = _in_worker(tmp_path, "import os\nmetrics.MODEL_CONFIG_STALE.set(1)\nprint(os.getpid())")
    show = "print(metrics.render()[0].decode())"
    assert "\ngateway_model_config_stale 1.0\n" in _in_worker(tmp_path, show)

    _in_worker(tmp_path, f"metrics.mark_worker_dead({int(pid)})")

    assert "\ngateway_model_config_stale 1.0\n" not in _in_worker(tmp_path, show)


def _publish(base: Path, version: int, vocab: list[str]) -> None:
    """Publish a minimal version directory the way export does (write aside, rename)."""
    temp = base / "m" / f".tmp-{version}"
    (temp / "assets").mkdir(parents=True)
    (temp / "assets" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    info = {"task": "embed", "max_seq_len": 16, "do_lower_case": True}
    (temp / "assets" / "model.json").write_text(json.dumps(info))
    temp.rename(base / "m" / str(version))


def test_a_version_deleted_and_published_again_gets_its_new_vocabulary(tmp_path: Path) -> None:
    _publish(tmp_path, 3, tiny_vocab())
    cache = AssetCache(tmp_path, recheck_s=0.0)
    first = cache.get("m", 3)
    assert cache.get("m", 3) is first  # cached while the directory stays
    shutil.rmtree(tmp_path / "m" / "3")
    _publish(tmp_path, 3, other_vocab())
    second = cache.get("m", 3)
    assert second is not first
    word = tiny_vocab()[7]
    assert list(second.tokenizer.encode([word])[0].ids) != list(
        first.tokenizer.encode([word])[0].ids
    )


def test_asset_cache_hits_skip_the_directory_check_within_the_recheck_window(
    tmp_path: Path,
) -> None:
    _publish(tmp_path, 3, tiny_vocab())
    cache = AssetCache(tmp_path, recheck_s=3600.0)
    first = cache.get("m", 3)
    shutil.rmtree(tmp_path / "m" / "3")
    _publish(tmp_path, 3, other_vocab())
    assert cache.get("m", 3) is first  # within the window: no stat, the cached assets
    cache.recheck_s = 0.0
    assert cache.get("m", 3) is not first  # past it: the republished directory is seen


def test_an_answer_kept_through_a_quiet_spell_is_refetched_before_it_is_served() -> None:
    # A worker whose default requests all went to versions a routing file named asked for no
    # states meanwhile; when the entry goes (a rollout's promotion), its first answer must come
    # from the model server now, not from before the new version loaded.
    answers = [_status(1), [VersionStatus(2, "AVAILABLE"), VersionStatus(1, "AVAILABLE")]]
    fetch = GatedFetch()
    fetch.release.set()
    fetch.answer = answers[0]
    cache = StatusCache(fetch, ttl_s=0.05)
    assert cache.newest_available("m") == 1
    fetch.answer = answers[1]  # v2 loads during the quiet spell
    time.sleep(0.15)  # > 2 x ttl

    assert cache.newest_available("m") == 2
    assert fetch.calls == 2


def test_a_recently_expired_answer_is_served_while_one_background_fetch_refreshes_it() -> None:
    fetch = GatedFetch()
    fetch.release.set()
    cache = StatusCache(fetch, ttl_s=0.2)
    assert cache.get("m") == _status(1)
    fetch.release.clear()  # the refresh hangs (a slow replica)
    fetch.answer = _status(2)
    time.sleep(0.25)  # expired, but less than 2 x ttl old

    started = time.monotonic()
    assert cache.get("m") == _status(1)  # the last answer, at once
    time.sleep(0.3)  # now over 2 x ttl old, its refresh still running: still served
    assert cache.get("m") == _status(1)
    assert time.monotonic() - started < 1.0
    fetch.release.set()


# -- issue 34: unknown model names cost nothing that lasts ------------------------------------


def _unknown(model: str) -> list[VersionStatus]:
    raise ModelNotFound(f"model {model!r} is not served")


class Body:
    """A request's parsed body (weakly referenceable)."""

    def __init__(self) -> None:
        self.texts = ["word " * 200_000]


def test_an_unknown_models_404_keeps_nothing_of_the_request_that_asked() -> None:
    """The cached 404 is a fact, not the exception: a re-raised exception's traceback keeps the
    frames of every request that raised it, and with them their parsed bodies."""
    cache = StatusCache(_unknown, ttl_s=60)

    def request() -> weakref.ref[Body]:
        body = Body()  # the request's parsed body, alive in its frames
        with pytest.raises(ModelNotFound):
            cache.get("ghost")
        return weakref.ref(body)

    first, second = request(), request()  # the fetch's 404, then the cached one
    gc.collect()

    assert first() is None and second() is None


def test_a_client_inventing_model_names_grows_the_status_cache_by_nothing() -> None:
    cache = StatusCache(_unknown, ttl_s=60)  # remembers the last 1,024 names

    def ask(names: range) -> tracemalloc.Snapshot:
        for i in names:
            with pytest.raises(ModelNotFound):
                cache.get(f"ghost-{i}")
        gc.collect()  # what is only garbage (in cycles) is not kept
        return tracemalloc.take_snapshot()

    tracemalloc.start()
    try:
        warm = ask(range(1500))  # the cache is full
        grown = sum(s.size_diff for s in ask(range(1500, 6500)).compare_to(warm, "filename"))
    finally:
        tracemalloc.stop()

    assert grown < 64 * 1024, f"{grown} bytes kept for 5,000 unknown names"
    calls = []
    cache._fetch = lambda model: calls.append(model) or _unknown(model)  # type: ignore[method-assign]
    with pytest.raises(ModelNotFound):
        cache.get("ghost-6499")  # the newest names are remembered: no fetch
    with pytest.raises(ModelNotFound):
        cache.get("ghost-0")  # the oldest were forgotten: fetched again
    assert calls == ["ghost-0"]


def test_a_remembered_404_expires_with_the_cache_ttl() -> None:
    calls = []

    def fetch(model: str) -> list[VersionStatus]:
        calls.append(model)
        return _unknown(model)

    cache = StatusCache(fetch, ttl_s=0.05)
    for _ in range(2):
        with pytest.raises(ModelNotFound):
            cache.get("ghost")
    time.sleep(0.1)
    with pytest.raises(ModelNotFound):
        cache.get("ghost")

    assert calls == ["ghost", "ghost"]


def test_a_fresh_look_up_is_kept_for_the_requests_after_it() -> None:
    """GET /v1/models/<name> asks now and stores the answer (it used to discard the cache)."""
    fetch = GatedFetch()
    fetch.release.set()
    cache = StatusCache(fetch, ttl_s=60)
    assert cache.get("m") == _status(1)
    fetch.answer = _status(2)

    assert cache.get("m", fresh=True) == _status(2)
    assert cache.get("m") == _status(2)
    assert fetch.calls == 2


def test_status_fan_outs_for_invented_names_are_forgotten_past_a_bound() -> None:
    replicas: ReplicaSet[str] = ReplicaSet(
        "a,b", resolve=lambda: ["a", "b"], connect=str, disconnect=lambda h: None,
        status=lambda handle, model, deadline: _unknown(model), transport="rest",
    )  # fmt: skip
    try:
        for i in range(RECENT_MODELS * 4):
            with pytest.raises(ModelNotFound):
                replicas.status(f"ghost-{i}")
            replicas.refresh_in_background(f"other-{i}", 1.0)

        assert len(replicas._refreshed) <= RECENT_MODELS
        assert len(replicas._answered) <= RECENT_MODELS
    finally:
        replicas.close()


def test_requests_missing_one_version_together_load_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _publish(tmp_path, 1, tiny_vocab())
    cache = AssetCache(tmp_path)
    loads = []
    real_load = versions.load_assets

    def slow_load(base: Path, model: str, version: int) -> Any:
        loads.append((model, version))
        time.sleep(0.3)  # a large vocabulary on a slow volume
        return real_load(base, model, version)

    monkeypatch.setattr(versions, "load_assets", slow_load)
    results: list[object] = []
    threads = [_in_thread(lambda: cache.get("m", 1), results) for _ in range(8)]
    for thread in threads:
        thread.join(10)

    assert loads == [("m", 1)]
    assert len(results) == 8 and all(r is results[0] for r in results)


def test_requests_missing_an_absent_version_together_each_get_the_404(tmp_path: Path) -> None:
    _publish(tmp_path, 1, tiny_vocab())
    cache = AssetCache(tmp_path)
    results: list[object] = []
    threads = [_in_thread(lambda: cache.get("m", 9), results) for _ in range(8)]
    for thread in threads:
        thread.join(10)

    assert len(results) == 8 and all(isinstance(r, VersionNotFound) for r in results)
