"""REST transport: TF Serving's HTTP API with one keep-alive session per worker.

``base_url`` may list several replicas, comma-separated: requests take turns over them, one that
cannot be reached (or answers 503) is skipped for ``DOWN_S`` and the request goes to the next,
and version states are merged over the replicas that answer (AVAILABLE only where all say so).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson
import requests
from requests.adapters import HTTPAdapter

import backend.clients.endpoints as endpoints
from backend.clients.base import Outputs, error_for_status
from backend.errors import UpstreamError, UpstreamTimeout, UpstreamUnavailable
from modelformat.status import VersionStatus, from_rest

# TF Serving's HTTP status → TF code name (the inverse of http_server.cc ToHTTPStatusCode).
_HTTP_TO_CODE = {
    400: "INVALID_ARGUMENT",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_TF_DTYPES = {"DT_FLOAT": np.float32, "DT_DOUBLE": np.float64, "DT_INT32": np.int32}
CONNECT_TIMEOUT_S = 1.0
SIGNATURE = "serving_default"
# A replica that could not be reached gets no new request for this long (then it is tried again).
DOWN_S = 1.0


class RestClient:
    """PredictClient over TF Serving's REST API (columnar ``inputs`` JSON, encoded by orjson)."""

    transport = "rest"
    enforces_deadline = True

    def __init__(self, base_url: str, *, pool_size: int = 16, retry_after_s: int = 1) -> None:
        self.base_urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        self.base_url = self.base_urls[0] if self.base_urls else base_url.rstrip("/")
        self._turn = itertools.count()
        self._down_until: dict[str, float] = {}
        self.retry_after_s = retry_after_s
        self._session = requests.Session()
        # One connection pool per replica (a pool per host; fewer would evict them in turn).
        adapter = HTTPAdapter(
            pool_connections=max(1, len(self.base_urls)), pool_maxsize=pool_size, max_retries=0
        )
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        # (model, version, signature) → output name → numpy dtype, from the signature metadata.
        self._outputs: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()

    def predict(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        version: int | None = None,
        label: str | None = None,
        timeout_s: float,
        signature_name: str | None = None,
    ) -> tuple[Outputs, int]:
        """Return the outputs and the version served (the version asked for; REST echoes none)."""
        path = self._model_path(model, version, label)
        signature = signature_name or SIGNATURE
        body = orjson.dumps(
            {"signature_name": signature, "inputs": dict(inputs)},
            option=orjson.OPT_SERIALIZE_NUMPY,
        )
        reply = self._request("POST", f"{path}:predict", model, timeout_s, body)
        outputs = reply.get("outputs") if isinstance(reply, dict) else None
        if outputs is None:
            raise UpstreamError("the model server's predict reply has no 'outputs'")
        specs = self._output_specs(model, path, version, label, signature, timeout_s)
        if not isinstance(outputs, dict):
            # One output: TF Serving drops its name, so take it from the signature.
            if len(specs) != 1:
                raise UpstreamError("cannot name the model server's single unnamed output")
            outputs = {next(iter(specs)): outputs}
        decoded = {
            name: np.asarray(value, dtype=specs.get(name, np.float32))
            for name, value in outputs.items()
        }
        return decoded, int(version) if version is not None else -1

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return every version's state from GET /v1/models/{model}, newest first (merged over
        the replicas when there are several)."""
        path = f"/v1/models/{quote(model, safe='')}"
        if len(self.base_urls) <= 1:
            return from_rest(self._request("GET", path, model, timeout_s))
        fetchers = [
            lambda url=url: from_rest(self._request_at(url, "GET", path, model, timeout_s))
            for url in self.base_urls
        ]
        return endpoints.merged_status(fetchers)

    def close(self) -> None:
        """Close the session's connections."""
        self._session.close()

    @staticmethod
    def _model_path(model: str, version: int | None, label: str | None) -> str:
        path = f"/v1/models/{quote(model, safe='')}"
        if version is not None:
            return f"{path}/versions/{int(version)}"
        if label is not None:
            return f"{path}/labels/{quote(label, safe='')}"
        return path

    def _output_specs(
        self,
        model: str,
        path: str,
        version: int | None,
        label: str | None,
        signature: str,
        timeout_s: float,
    ) -> dict[str, Any]:
        """Return a signature's output names → numpy dtypes, cached per model version."""
        key = (model, str(version) if version is not None else f"label:{label}", signature)
        with self._lock:
            cached = self._outputs.get(key)
        if cached is not None:
            return cached
        reply = self._request("GET", f"{path}/metadata", model, timeout_s)
        try:
            sig = reply["metadata"]["signature_def"]["signature_def"][signature]
            specs = {
                name: _TF_DTYPES.get(info.get("dtype", "DT_FLOAT"), np.float32)
                for name, info in sig["outputs"].items()
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise UpstreamError(f"the model server's metadata has no {signature}") from exc
        if version is not None:  # a label may move; a version's signature never changes
            with self._lock:
                self._outputs[key] = specs
        return specs

    def _request(
        self, method: str, path: str, model: str, timeout_s: float, body: bytes | None = None
    ) -> Any:
        """Send one request to the next replica; on UNAVAILABLE, to the others in turn."""
        if len(self.base_urls) <= 1:
            return self._request_at(self.base_url, method, path, model, timeout_s, body)
        deadline = time.monotonic() + timeout_s
        last: UpstreamUnavailable | None = None
        for url in self._order():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                return self._request_at(url, method, path, model, remaining, body)
            except UpstreamUnavailable as exc:
                self._down_until[url] = time.monotonic() + DOWN_S
                last = exc
        if last is not None:
            raise last
        raise UpstreamTimeout(f"the model server did not answer within {timeout_s:.3g}s")

    def _order(self) -> list[str]:
        """Return the replicas starting at the next one's turn, those marked down last."""
        start = next(self._turn) % len(self.base_urls)
        turn = self.base_urls[start:] + self.base_urls[:start]
        now = time.monotonic()
        up = [u for u in turn if self._down_until.get(u, 0.0) <= now]
        return up + [u for u in turn if u not in up]

    def _request_at(
        self,
        base_url: str,
        method: str,
        path: str,
        model: str,
        timeout_s: float,
        body: bytes | None = None,
    ) -> Any:
        """Send one request to ``base_url`` and return its parsed JSON; map every failure to a
        gateway error."""
        try:
            response = self._session.request(
                method,
                base_url + path,
                data=body,
                headers={"Content-Type": "application/json"} if body is not None else None,
                timeout=(min(CONNECT_TIMEOUT_S, timeout_s), timeout_s),
            )
        except requests.ConnectTimeout as exc:
            raise UpstreamUnavailable(
                f"cannot connect to the model server at {base_url}",
                retry_after_s=self.retry_after_s,
            ) from exc
        except requests.Timeout as exc:
            raise UpstreamTimeout(
                f"the model server did not answer within {timeout_s:.3g}s"
            ) from exc
        except requests.ConnectionError as exc:
            raise UpstreamUnavailable(
                f"cannot reach the model server at {base_url}",
                retry_after_s=self.retry_after_s,
            ) from exc
        except requests.RequestException as exc:
            # A reply that broke off mid-body (ChunkedEncodingError), could not be decoded, or
            # any other HTTP-level failure: the model server answered, but not usably.
            raise UpstreamError(
                f"the model server's reply to {method} {path} was unusable: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        try:
            payload = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            payload = None
        if response.status_code != 200:
            message = payload.get("error", "") if isinstance(payload, dict) else ""
            code = _HTTP_TO_CODE.get(response.status_code, "UNKNOWN")
            raise error_for_status(
                code, str(message), model=model, retry_after_s=self.retry_after_s
            )
        if payload is None:
            raise UpstreamError("the model server's reply is not JSON")
        return payload
