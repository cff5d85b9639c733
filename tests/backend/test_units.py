"""Pure parts without servers: settings, version labels and caches, OpenAPI, access log."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from backend.access_log import access_record
from backend.app import create_app
from backend.clients.base import VersionStatus
from backend.errors import LabelNotFound, ModelNotFound, UpstreamUnavailable, VersionNotFound
from backend.schemas import ErrorResponse, Health
from backend.settings import Settings, SettingsError, load_settings
from backend.versions import (
    AssetCache,
    LabelTable,
    StatusCache,
    check_model_name,
    parse_version_labels,
)

CONFIG = """
model_config_list {
  config {
    name: "intent"
    base_path: "/models/intent"
    model_platform: "tensorflow"
    model_version_policy { latest { num_versions: 2 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 2 }
  }
  config { name: "embed" base_path: "/models/embed" model_platform: "tensorflow" }
}
"""


def test_settings_come_from_gateway_env_vars_with_units() -> None:
    settings = load_settings(
        environ={"GATEWAY_UPSTREAM": "rest", "GATEWAY_TIMEOUT_S": "2.5", "GATEWAY_BUCKETING": "off"}
    )

    assert settings.upstream == "rest" and settings.request_timeout_s == 2.5
    assert settings.bucketing is False


def test_overrides_win_over_the_environment() -> None:
    settings = load_settings({"GATEWAY_MAX_BATCH": "8", "upstream": "local"}, environ={})

    assert settings.max_batch_size == 8 and settings.upstream == "local"


@pytest.mark.parametrize(
    "bad", [{"GATEWAY_UPSTREAM": "carrier-pigeon"}, {"GATEWAY_MAX_BATCH": "0"}, {"nope": 1}]
)
def test_bad_settings_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(SettingsError):
        load_settings(bad, environ={})


def test_settings_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Settings().upstream = "rest"  # type: ignore[misc]


def test_version_labels_are_read_from_the_text_format_config() -> None:
    assert parse_version_labels(CONFIG) == {"intent": {"stable": 1, "canary": 2}, "embed": {}}


def test_label_table_rereads_the_file_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    table = LabelTable(str(path), recheck_s=0.0)
    assert table.version_for("intent", "canary") == 2

    path.write_text(CONFIG.replace("value: 2", "value: 3"))
    os.utime(path, (time.time() + 5, time.time() + 5))

    assert table.version_for("intent", "canary") == 3
    with pytest.raises(LabelNotFound):
        table.version_for("intent", "beta")


def test_label_table_keeps_the_last_good_config_when_the_file_breaks(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text(CONFIG)
    table = LabelTable(str(path), recheck_s=0.0)
    table.version_for("intent", "stable")

    path.write_text("model_config_list { config { name: ")
    os.utime(path, (time.time() + 5, time.time() + 5))

    assert table.version_for("intent", "stable") == 1


def test_without_a_config_file_labels_are_404() -> None:
    with pytest.raises(LabelNotFound):
        LabelTable("").version_for("intent", "stable")


def test_status_cache_returns_newest_available_and_caches() -> None:
    calls = []

    def fetch(model: str) -> list[VersionStatus]:
        calls.append(model)
        return [
            VersionStatus(3, "LOADING"),
            VersionStatus(2, "AVAILABLE"),
            VersionStatus(1, "AVAILABLE"),
        ]

    cache = StatusCache(fetch, ttl_s=60)

    assert cache.newest_available("m") == 2 and cache.newest_available("m") == 2
    assert calls == ["m"]
    cache.invalidate("m")
    cache.get("m")
    assert calls == ["m", "m"]


def test_no_available_version_is_503() -> None:
    cache = StatusCache(lambda m: [VersionStatus(1, "LOADING")], ttl_s=0)

    with pytest.raises(UpstreamUnavailable):
        cache.newest_available("m")


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", ".hidden", "", "x" * 200])
def test_unsafe_model_names_are_404(name: str) -> None:
    with pytest.raises(ModelNotFound):
        check_model_name(name)


def test_assets_are_loaded_per_version_and_missing_versions_are_404(
    tmp_path: Path, tiny_vocab_file: Path
) -> None:
    assets = tmp_path / "intent" / "4" / "assets"
    assets.mkdir(parents=True)
    (assets / "vocab.txt").write_bytes(tiny_vocab_file.read_bytes())
    (assets / "model.json").write_text(
        json.dumps({"task": "classify", "max_seq_len": 32, "labels": ["a", "b"]})
    )
    cache = AssetCache(tmp_path)

    loaded = cache.get("intent", 4)

    assert loaded.labels == ("a", "b") and loaded.max_seq_len == 32
    assert cache.get("intent", 4) is loaded
    with pytest.raises(VersionNotFound):
        cache.get("intent", 5)
    with pytest.raises(ModelNotFound):
        cache.get("other", 1)


def test_access_log_record_is_json_ready() -> None:
    record = access_record("POST", "/v1/models/m:embed", "", "200 OK", 120, 0.0123, remote="::1")

    assert record["status"] == 200 and record["duration_ms"] == 12.3
    assert json.loads(json.dumps(record))["remote"] == "::1"


# -- the OpenAPI document describes the routes that exist -----------------------------------


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> FlaskClient:
    """A gateway whose model server is unreachable; its model tree has one (empty) model, m."""
    base = tmp_path_factory.mktemp("units-models")
    (base / "m").mkdir()
    return create_app(
        {"upstream": "rest", "tfs_rest_url": "http://127.0.0.1:1", "model_base_path": str(base)}
    ).test_client()


def test_openapi_is_3_1_and_lists_every_public_route(client: FlaskClient) -> None:
    doc = client.get("/openapi.json").get_json()
    rules = {
        re.sub(r"<(?:[^<>]*:)?(\w+)>", r"{\1}", r.rule)  # <name:model>, <any(...):verb>
        for r in client.application.url_map.iter_rules()
        if not r.rule.startswith("/debug")
    }

    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]) == rules


def test_openapi_schemas_resolve_and_declare_the_errors(client: FlaskClient) -> None:
    doc = client.get("/openapi.json").get_json()
    schemas = doc["components"]["schemas"]

    refs = _refs(doc["paths"]) | _refs(schemas)
    assert all(ref.rsplit("/", 1)[1] in schemas for ref in refs)
    classify = doc["paths"]["/v1/models/{model}:classify"]["post"]
    assert set(classify["responses"]) >= {"200", "400", "404", "413", "422", "503", "504"}
    request_schema = schemas["ClassifyRequest"]
    assert request_schema["additionalProperties"] is False
    assert request_schema["properties"]["texts"]["minItems"] == 1
    assert request_schema["properties"]["texts"]["maxItems"] == Settings().max_texts_per_request
    assert request_schema["properties"]["texts"]["items"]["type"] == "string"


def test_documented_shapes_match_real_responses(client: FlaskClient) -> None:
    Health.model_validate(client.get("/healthz").get_json())
    for response in (
        client.post("/v1/models/m:classify", data=b"{"),
        client.get("/nope"),
        client.post("/v1/models/m:embed", json={"texts": ["hi"]}),
    ):
        ErrorResponse.model_validate(response.get_json())


def _refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        for value in node.values():
            found |= _refs(value)
        return found
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node)) if node else set()
    return set()


def test_an_unexpected_error_is_a_generic_500_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = create_app({"upstream": "rest"})

    @app.get("/boom")
    def boom() -> str:
        raise RuntimeError("secret internals")

    with caplog.at_level("ERROR"):
        response = app.test_client().get("/boom")

    assert response.status_code == 500
    assert response.get_json() == {
        "error": {"code": "internal", "message": "internal error; see the gateway log"}
    }
    assert "secret" not in response.get_data(as_text=True)
    logged = [r for r in caplog.records if r.exc_info]
    assert len(logged) == 1 and "secret internals" in str(logged[0].exc_info[1])  # type: ignore[index]


def test_upstream_failures_are_counted_by_code(client: FlaskClient) -> None:
    response = client.post("/v1/models/m:embed", json={"texts": ["hi"]})

    assert response.status_code == 503
    text = client.get("/metrics").get_data(as_text=True)

    assert 'gateway_upstream_errors_total{code="upstream_unavailable",transport="rest"}' in text


def test_gunicorn_config_follows_gateway_timeout_and_cpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import runpy

    monkeypatch.setenv("GATEWAY_TIMEOUT_S", "20")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.delenv("GATEWAY_WORKERS", raising=False)
    monkeypatch.delenv("GATEWAY_WORKER_CLASS", raising=False)

    conf = runpy.run_path(str(Path(__file__).parents[2] / "docker" / "gunicorn.conf.py"))

    from gunicorn.util import load_class
    from gunicorn.workers.gthread import ThreadWorker

    # gthread's threads, with keep-alive connections served on (backend/httpworker.py)
    assert issubclass(load_class(conf["worker_class"]), ThreadWorker)
    assert conf["worker_class"] == "backend.httpworker.LingeringThreadWorker"
    assert conf["preload_app"] is True
    assert conf["workers"] == len(os.sched_getaffinity(0))
    assert conf["timeout"] > 20 and conf["graceful_timeout"] > 20
    assert conf["logger_class"] == "backend.access_log.JsonAccessLogger"
    assert callable(conf["post_fork"]) and callable(conf["child_exit"])
