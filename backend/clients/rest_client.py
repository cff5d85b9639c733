"""REST transport: TF Serving's HTTP API over the worker's own keep-alive connections.

The connections are the standard library's ``http.client`` ones, kept in a small pool per
replica: a call costs one send and one read of the socket. A ``requests`` session cost the worker
about 0.8 ms more CPU per one-text request (docs/performance/gateway-cost.md). A call's timeout
bounds its whole exchange, not each read; a kept-alive connection the server closed as the call
went on it is replaced, once, by a new one (``RestClient._exchange``).

``base_url`` may list several replicas, comma-separated: ``backend.clients.replicas.ReplicaSet``
sends each call to one replica that reported the version, round robin; one that cannot be reached
is skipped for a second and the call goes to another; a saturated answer (HTTP 429, or 503 "batch
queue full") is not failed over; version states are asked of every replica at once under one
deadline and merged (AVAILABLE only where all that answer say so).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import quote, urlsplit

import numpy as np
import orjson

from backend import tracing
from backend.clients.base import Outputs, error_for_status
from backend.clients.replicas import ReplicaSet
from backend.errors import PayloadTooLarge, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from modelformat.outputs import narrowest_signature
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
POOL_SIZE = 16  # idle connections kept per replica when the calls at once are not known
SIGNATURE = "serving_default"


class RestClient:
    """PredictClient over TF Serving's REST API (columnar ``inputs`` JSON, encoded by orjson)."""

    transport = "rest"
    enforces_deadline = True

    def __init__(
        self,
        base_url: str,
        *,
        pool_size: int = POOL_SIZE,
        retry_after_s: int = 1,
        status_deadline_s: float = 1.0,
        max_reply_bytes: int | None = None,
    ) -> None:
        # the most bytes of a passthrough reply read in (``forward``; None: no bound): past it
        # a 413 naming GATEWAY_MAX_ANSWER_BYTES, the rest of the reply left unread
        self.max_reply_bytes = max_reply_bytes
        self.base_urls = [u.strip().rstrip("/") for u in base_url.split(",") if u.strip()]
        self.base_url = self.base_urls[0] if self.base_urls else base_url.rstrip("/")
        self.retry_after_s = retry_after_s
        self.replicas: ReplicaSet[str] | None = None
        if len(self.base_urls) > 1:
            self.replicas = ReplicaSet(
                base_url,
                resolve=lambda: list(self.base_urls),
                connect=str,
                disconnect=lambda url: None,
                status=self._status_at,
                transport=self.transport,
                status_deadline_s=status_deadline_s,
                retry_after_s=retry_after_s,
            )
        # One pool of idle connections per replica.
        self._pools = {url: Connections(url, pool_size) for url in {*self.base_urls, self.base_url}}
        # (model, version) → signature → output name → numpy dtype, from the version's metadata.
        self._outputs: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
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
        output_filter: Sequence[str] = (),
    ) -> tuple[Outputs, int]:
        """Return the outputs and the version served (the version asked for; REST echoes none).

        REST has no output filter: with ``output_filter``, a version call asks the narrowest
        signature that has those outputs (an output-subset signature, modelformat/outputs.py
        ``narrowest_signature``, as the version's metadata lists them), else every output of the
        signature comes back."""
        path = self._model_path(model, version, label)
        asked = signature_name or SIGNATURE
        plain = {"inputs": dict(inputs)}
        bodies: dict[str, bytes] = {}

        def at(url: str, left: float) -> tuple[Any, dict[str, Any]]:
            tracing.annotate("tfserving.replica", url)
            deadline = time.monotonic() + left
            signature = asked
            if output_filter and version is not None:  # the signatures, asked once per version
                signatures = self._signatures(url, model, path, version, label, deadline)
                outputs = {name: list(specs) for name, specs in signatures.items()}
                signature = narrowest_signature(asked, outputs, output_filter)
            if signature not in bodies:
                bodies[signature] = orjson.dumps(
                    {"signature_name": signature, **plain}, option=orjson.OPT_SERIALIZE_NUMPY
                )
            reply = self._request_at(url, "POST", f"{path}:predict", model,
                                     _left_of(deadline), bodies[signature])  # fmt: skip
            # The first call of a version also asks its signatures: within what the predict left
            # of the deadline, never a second full timeout.
            specs = self._output_specs(url, model, path, version, label, signature, deadline)
            return reply, specs

        if self.replicas is None:
            reply, specs = at(self.base_url, timeout_s)
        else:
            self.replicas.refresh_in_background(model, 1.0)
            reply, specs = self.replicas.call(
                model,
                version,
                lambda replica, left: at(replica.handle, left),
                time.monotonic() + timeout_s,
            )
        outputs = reply.get("outputs") if isinstance(reply, dict) else None
        if outputs is None:
            raise UpstreamError("the model server's predict reply has no 'outputs'")
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

    def forward(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        model: str,
        version: int | None,
        timeout_s: float,
    ) -> tuple[int, bytes]:
        """Return (status, body) of one request to TF Serving's REST API, as it answered it (the
        /tfs passthrough); only a model server that can't be reached or answer in time is a
        gateway error."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        tracing.inject(headers)

        def at(url: str, left: float) -> tuple[int, bytes]:
            tracing.annotate("tfserving.replica", url)
            return self._exchange(url, method, path, body, headers, left, self.max_reply_bytes)

        if self.replicas is None:
            return at(self.base_url, timeout_s)
        return self.replicas.call(
            model, version, lambda r, left: at(r.handle, left), time.monotonic() + timeout_s
        )

    def model_status(self, model: str, *, timeout_s: float) -> list[VersionStatus]:
        """Return every version's state from GET /v1/models/{model}, newest first (merged over
        the replicas when there are several)."""
        if self.replicas is not None:
            return self.replicas.status(model)
        return self._status_at(self.base_url, model, timeout_s)

    def _status_at(self, url: str, model: str, timeout_s: float) -> list[VersionStatus]:
        path = f"/v1/models/{quote(model, safe='')}"
        return from_rest(self._request_at(url, "GET", path, model, timeout_s))

    def close(self) -> None:
        """Close the idle connections (a later call opens new ones)."""
        if self.replicas is not None:
            self.replicas.close()
        for pool in self._pools.values():
            pool.close()

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
        url: str,
        model: str,
        path: str,
        version: int | None,
        label: str | None,
        signature: str,
        deadline: float,
    ) -> dict[str, Any]:
        """Return a signature's output names → numpy dtypes (the version's metadata, asked for
        once per model version, before ``deadline``)."""
        signatures = self._signatures(url, model, path, version, label, deadline)
        specs = signatures.get(signature)
        if specs is None:
            raise UpstreamError(f"the model server's metadata has no {signature}")
        return specs

    def _signatures(
        self,
        url: str,
        model: str,
        path: str,
        version: int | None,
        label: str | None,
        deadline: float,
    ) -> dict[str, dict[str, Any]]:
        """Return every signature's output names → numpy dtypes, cached per model version (asked
        for once, before ``deadline``)."""
        key = (model, str(version) if version is not None else f"label:{label}")
        with self._lock:
            cached = self._outputs.get(key)
        if cached is not None:
            return cached
        left = deadline - time.monotonic()
        if left <= 0:
            raise UpstreamTimeout("the model server did not answer in time (signature metadata)")
        reply = self._request_at(url, "GET", f"{path}/metadata", model, left)
        try:
            sigs = reply["metadata"]["signature_def"]["signature_def"]
            found = {
                name: {
                    output: _TF_DTYPES.get(info.get("dtype", "DT_FLOAT"), np.float32)
                    for output, info in sig["outputs"].items()
                }
                for name, sig in sigs.items()
                if isinstance(sig, dict) and isinstance(sig.get("outputs"), dict)
            }
        except (KeyError, TypeError, AttributeError) as exc:
            raise UpstreamError("the model server's metadata has no signature_def") from exc
        if version is not None:  # a label may move; a version's signatures never change
            with self._lock:
                self._outputs[key] = found
        return found

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
        headers = {}
        if body is not None:
            headers["Content-Type"] = "application/json"
            tracing.inject(headers)  # the trace context goes on to TF Serving, when tracing
        status, content = self._exchange(base_url, method, path, body, headers, timeout_s)
        try:
            payload = orjson.loads(content)
        except orjson.JSONDecodeError:
            payload = None
        if status != 200:
            message = payload.get("error", "") if isinstance(payload, dict) else ""
            code = _HTTP_TO_CODE.get(status, "UNKNOWN")
            raise error_for_status(
                code, str(message), model=model, retry_after_s=self.retry_after_s
            )
        if payload is None:
            raise UpstreamError("the model server's reply is not JSON")
        return payload

    def _exchange(
        self,
        base_url: str,
        method: str,
        path: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
        max_bytes: int | None = None,
    ) -> tuple[int, bytes]:
        """Send one request on a pooled connection; return (status, body). Every failure is a
        gateway error: no connection → unavailable, no answer in time → timeout, an answer that
        broke off → unusable, an answer over ``max_bytes`` (when given) → 413, read no further.

        ``timeout_s`` bounds the whole exchange (connecting, sending, every read of the
        answer), not each read: a server that trickles its answer is cut off at the deadline.
        A kept-alive connection the server closed just as the request went (its idle timeout
        fired between the idle check and the send) fails before any byte of the answer: the
        request goes again, once, on a new connection (Predict, metadata and status are
        idempotent), so neither a 503 nor a replica marked down comes of it.
        """
        deadline = time.monotonic() + timeout_s
        if timeout_s <= 0:
            raise UpstreamTimeout("the request's deadline passed before the model server was asked")
        pool = self._pools[base_url]
        fresh = False
        while True:
            conn = self._connection(pool, base_url, deadline, fresh)
            sock = cast(_DeadlineSocket, conn.sock)  # (or its TLS twin): connected
            reused, answered = conn.exchanges > 0, False
            sock.deadline, sock.received = deadline, 0
            try:
                sock.settimeout(_left(deadline))  # sendall's timeout is its whole send
                conn.request(method, pool.prefix + path, body=body, headers=headers)
                response = conn.getresponse()
                answered = True
                content = _read(response, max_bytes)
            except TimeoutError as exc:
                conn.close()
                raise UpstreamTimeout(
                    f"the model server did not answer within {timeout_s:.3g}s"
                ) from exc
            except ConnectionError as exc:
                conn.close()
                if reused and not fresh and sock.received == 0:
                    fresh = True  # closed by the server while idle: once more, on a new one
                    continue
                if not answered:  # refused, reset or closed before a status line: not reached
                    raise UpstreamUnavailable(
                        f"cannot reach the model server at {base_url}",
                        retry_after_s=self.retry_after_s,
                    ) from exc
                raise _unusable(method, path, exc) from exc
            except (http.client.HTTPException, OSError) as exc:
                # A reply that broke off mid-body or could not be parsed: answered, not usably.
                conn.close()
                raise _unusable(method, path, exc) from exc
            except BaseException:
                conn.close()  # whatever it was, the socket is not left open
                raise
            conn.exchanges += 1
            pool.give(conn, reusable=not response.will_close)
            return response.status, content

    def _connection(
        self, pool: Connections, base_url: str, deadline: float, fresh: bool
    ) -> _Connection:
        """Return an idle connection of ``pool`` (a new one when ``fresh``), connected before
        ``deadline``; a gateway error when there is none."""
        try:
            return pool.take(min(CONNECT_TIMEOUT_S, _left(deadline)), fresh=fresh)
        except TimeoutError as exc:
            if deadline <= time.monotonic():
                raise UpstreamTimeout("the model server did not answer in time") from exc
            raise UpstreamUnavailable(
                f"cannot connect to the model server at {base_url}",
                retry_after_s=self.retry_after_s,
            ) from exc
        except OSError as exc:
            raise UpstreamUnavailable(
                f"cannot reach the model server at {base_url}", retry_after_s=self.retry_after_s
            ) from exc


def _left_of(deadline: float) -> float:
    """Return the seconds left before ``deadline`` (0 or less once it has passed)."""
    return deadline - time.monotonic()


def _left(deadline: float) -> float:
    """Return the seconds left before ``deadline``; ``TimeoutError`` once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed")
    return left


def _read(response: http.client.HTTPResponse, max_bytes: int | None) -> bytes:
    """Return the reply's body; past ``max_bytes`` a 413 (its Content-Length says so before any
    byte is read, else one byte past the limit does; the caller closes the connection)."""
    if max_bytes is None:
        return response.read()
    length = response.getheader("Content-Length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise _too_large(int(length), max_bytes)
    content = response.read(max_bytes + 1)
    if len(content) > max_bytes:
        raise _too_large(None, max_bytes)
    return content


def _too_large(size: int | None, limit: int) -> PayloadTooLarge:
    what = f"{size} bytes" if size is not None else f"over {limit} bytes"
    return PayloadTooLarge(
        f"the model server's reply is {what}, over the limit of {limit} bytes per answer "
        "(GATEWAY_MAX_ANSWER_BYTES)"
    )


def _unusable(method: str, path: str, exc: BaseException) -> UpstreamError:
    return UpstreamError(
        f"the model server's reply to {method} {path} was unusable: {type(exc).__name__}: {exc}"
    )


class _DeadlineReads:
    """A socket whose every read waits no later than the exchange's ``deadline`` (a socket
    timeout bounds one ``recv``; this bounds them all together) and counts the bytes it
    ``received``: ``http.client`` reads an answer through ``recv_into`` alone."""

    deadline = float("inf")
    received = 0

    def recv_into(self, buffer: Any, *args: Any, **kwargs: Any) -> int:
        self.settimeout(_left(self.deadline))  # type: ignore[attr-defined]
        count: int = super().recv_into(buffer, *args, **kwargs)  # type: ignore[misc]
        self.received += count
        return count


class _DeadlineSocket(_DeadlineReads, socket.socket):
    """A TCP socket with deadline-bound reads."""


class _DeadlineSSLSocket(_DeadlineReads, ssl.SSLSocket):
    """A TLS socket with deadline-bound reads (what an https base URL's connections wrap)."""


def _connect(
    address: tuple[str, int], timeout: float, source_address: Any = None
) -> _DeadlineSocket:
    """Return a connected ``_DeadlineSocket`` (``socket.create_connection``'s socket, adopted)."""
    plain = socket.create_connection(address, timeout, source_address)
    sock = _DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
    sock.settimeout(timeout)
    return sock


class _Connection(http.client.HTTPConnection):
    """A pooled connection over a ``_DeadlineSocket``, counting the exchanges it completed (0:
    new)."""

    exchanges = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _connect


class _TlsConnection(_Connection, http.client.HTTPSConnection):
    """A pooled HTTPS connection (the same, over TLS)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._context.sslsocket_class = _DeadlineSSLSocket  # type: ignore[attr-defined]


class Connections:
    """Idle keep-alive connections to one base URL, the most recently used first. A call takes
    one (or opens one), makes one exchange on it, and gives it back unless it is spent.

    ``size`` idle connections are kept at most: the calls a worker can have in flight at once
    (its threads and its chunk threads, ``backend.clients.make_client``), so that a worker busy
    on every thread still reuses its connections rather than opening and closing the ones over.
    """

    def __init__(self, base_url: str, size: int) -> None:
        parts = urlsplit(base_url)
        https = parts.scheme == "https"
        self._cls = _TlsConnection if https else _Connection
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if https else 80)
        self.prefix = parts.path.rstrip("/")
        self.size = max(1, size)
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

    def take(self, connect_timeout_s: float, fresh: bool = False) -> _Connection:
        """Return an idle connection the server hasn't closed (unless ``fresh``), else a new
        connected one (``OSError``/``TimeoutError`` when it can't connect within
        ``connect_timeout_s``)."""
        while not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if not _closed_by_peer(conn):
                return conn
            conn.close()
        conn = self._cls(self._host, self._port, timeout=connect_timeout_s)
        try:
            conn.connect()
        except BaseException:
            conn.close()
            raise
        return conn

    def give(self, conn: _Connection, *, reusable: bool) -> None:
        """Keep ``conn`` for the next call, or close it (spent, or the pool is full)."""
        if reusable:
            with self._lock:
                if len(self._idle) < self.size:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """True when an idle connection's socket is gone or readable: the server closed it (end of
    file) or sent what no request asked for; either way it can't carry the next exchange."""
    sock = conn.sock
    if sock is None:
        return True
    poller = select.poll()  # not select(): a worker may hold descriptors past 1024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
