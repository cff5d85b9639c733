"""The REST surface on ``--rest_api_port``: TF Serving's /v1 routes over keep-alive HTTP/1.1."""

from __future__ import annotations

import errno
import gzip
import logging
import re
import socket
import threading
import time
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from tensorflow_serving.apis import get_model_metadata_pb2

from modelserver import inference, rest_encode
from modelserver.core import Core
from modelserver.errors import ServingError, invalid
from modelserver.rest_json import debug_string, decode_predict, parse_body

log = logging.getLogger(__name__)

V1_PATH = re.compile(r"(?i)/v1/.*")
PREDICT_PATH = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)"
)
STATUS_PATH = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:\/(metadata))?"
)
NOT_FOUND_HTML = (
    b"<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>\n</HEAD><BODY>\n<H1>Not Found</H1>\n"
    b"</BODY></HTML>\n"
)
_REASONS = {s.value: s.phrase for s in HTTPStatus}
MAX_UNCOMPRESSED_BYTES = 100 << 20  # TF Serving's gzip limit (kMaxUncompressedBytes)
# Bodies are read whole before decoding: past this size a request is refused unread (413), so a
# client can't make the server buffer an unbounded Content-Length or chunked stream.
MAX_BODY_BYTES = MAX_UNCOMPRESSED_BYTES
# Open connections each hold a thread while they wait for their next request; past this many the
# server answers 503 and closes, rather than growing without bound. Work is bounded separately by
# --rest_api_num_threads (requests handled at once).
MAX_CONNECTIONS = 1024
CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
MAX_TRAILER_LINES = 64


def _version(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text)
    if value >= 2**63:
        raise invalid(f"Failed to convert version: {text} to numeric.")
    return value


class RestApi:
    """Routes one request to Core and returns (HTTP status, content type, body)."""

    def __init__(
        self,
        core: Core,
        timeout_s: float,
        monitoring_path: str | None,
        cors: bool = False,
        num_threads: int = 4,
    ) -> None:
        self.core = core
        self.cors = cors
        self.in_flight = 0  # requests being handled (read at shutdown to drain them)
        self._count_lock = threading.Lock()
        # --rest_api_num_threads: how many requests are worked on at once (TF Serving's executor)
        self._workers = threading.BoundedSemaphore(max(1, num_threads))
        self.timeout_s = timeout_s
        self.monitoring_path = monitoring_path

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        """Return the response for ``method path`` with ``body``."""
        if not self._workers.acquire(timeout=self.timeout_s):
            return _error(503, "All REST worker threads are busy; try again")
        with self._count_lock:
            self.in_flight += 1
        try:
            return self._handle(method, path, body)
        finally:
            with self._count_lock:
                self.in_flight -= 1
            self._workers.release()

    def _handle(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        if self.monitoring_path and method == "GET" and path == self.monitoring_path:
            return 200, "text/plain; charset=utf-8", self.core.metrics.render().encode()
        if not V1_PATH.fullmatch(path):
            return 404, "text/html", NOT_FOUND_HTML
        try:
            text = self._dispatch(method, path, body)
            return 200, "application/json", text.encode()
        except ServingError as error:
            return (
                error.http_status,
                "application/json",
                rest_encode.error_body(error.message).encode(),
            )
        except Exception:  # a bug must not leak a stack trace to the client
            log.exception("unhandled error for %s %s", method, path)
            return 500, "application/json", rest_encode.error_body("Internal error").encode()

    def _dispatch(self, method: str, path: str, body: bytes) -> str:
        if method == "POST":
            match = PREDICT_PATH.fullmatch(path)
            if match and match.group(4) == "predict":
                return self._predict(match, body)
            if match and match.group(4) in ("classify", "regress"):
                return self._classify_regress(match, body)
        elif method == "GET":
            match = STATUS_PATH.fullmatch(path)
            if match:
                return self._get(match)
        raise invalid(f"Malformed request: {method} {path}")

    def _get(self, match: re.Match[str]) -> str:
        if match.group(1) is None:
            raise invalid("Missing model name in request.")
        name = unquote(match.group(1))
        version = _version(match.group(2))
        label = unquote(match.group(3)) if match.group(3) is not None else None
        if match.group(4):
            response = self.core.metadata(name, version, label, ["signature_def"])
            sig_map = get_model_metadata_pb2.SignatureDefMap()
            response.metadata["signature_def"].Unpack(sig_map)
            return rest_encode.metadata_body(response, sig_map)
        # The label is ignored here: TF Serving's GetModelStatusImpl only reads the version.
        return rest_encode.status_body(self.core.status(name, version))

    def _predict(self, match: re.Match[str], body: bytes) -> str:
        started = time.perf_counter()
        name = unquote(match.group(1))
        error: ServingError | None = None
        try:
            version = _version(match.group(2))
            label = unquote(match.group(3)) if match.group(3) is not None else None
            doc = parse_body(body)  # JSON is validated before the model lookup
            if not isinstance(doc, dict):
                raise invalid(f"JSON Value: {debug_string(doc)} Is not object")
            signature = doc.get("signature_name", "")
            if not isinstance(signature, str):
                raise invalid(
                    f"JSON Value: {debug_string(doc)} not formatted correctly. "
                    "'signature_name' key must be a string value."
                )
            servable, resolved, sig = self.core.signature_for_json(name, version, label, signature)
            inputs, row_format = decode_predict(doc, sig, signature or "DEFAULT")
            result = self.core.run_on(servable, resolved, inputs, (), self.timeout_s)
            return rest_encode.predict_body(result.outputs, row_format)
        except ServingError as exc:
            error = exc
            raise
        finally:
            self.core.record(name, "Predict", "REST", started, error)

    def _classify_regress(self, match: re.Match[str], body: bytes) -> str:
        started = time.perf_counter()
        name, method = unquote(match.group(1)), match.group(4)
        api = "Classify" if method == "classify" else "Regress"
        error: ServingError | None = None
        try:
            version = _version(match.group(2))
            label = unquote(match.group(3)) if match.group(3) is not None else None
            doc = parse_body(body)  # JSON is validated before the model lookup
            request_input = inference.input_from_json(doc)
            signature = doc.get("signature_name", "")
            if not isinstance(signature, str):
                raise invalid(
                    f"JSON Value: {debug_string(doc)} not formatted correctly. "
                    "'signature_name' key must be a string value."
                )
            servable = self.core.manager.servable(name, version, label)
            if method == "classify":
                _, result = inference.classify(servable, signature, request_input)
                return rest_encode.classify_body(result)
            _, result = inference.regress(servable, signature, request_input)
            return rest_encode.regress_body(result)
        except ServingError as exc:
            error = exc
            raise
        finally:
            self.core.record(name, api, "REST", started, error)


def _error(status: int, message: str) -> tuple[int, str, bytes]:
    return status, "application/json", rest_encode.error_body(message).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse one connection
    server_version = "modelserver"
    api: RestApi
    server: RestServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _body(self) -> bytes | None:
        """Return the (un-gzipped) request body, or None when the exchange is over."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = self._read_chunked()
        else:
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                self._send(*_error(400, "Invalid Content-Length"))
                return None
            if length > MAX_BODY_BYTES:
                self._refuse_body(f"Content-Length {length}")
                return None
            body = self.rfile.read(length) if length > 0 else b""
            if len(body) < length:
                body = None
        if body is None:
            self.close_connection = True
            return None  # the client went away mid-request
        if self.headers.get("Content-Encoding", "").lower() == "gzip" and body:
            try:
                body = _gunzip(body)
            except ServingError as error:
                self._send(
                    error.http_status,
                    "application/json",
                    rest_encode.error_body(error.message).encode(),
                )
                return None
        return body

    def _refuse_body(self, what: str) -> None:
        """Answer 413 without reading the body, and close: the rest of it can't be skipped."""
        self.close_connection = True
        self._send(*_error(413, f"{what} exceeds the request body limit of {MAX_BODY_BYTES} bytes"))

    def _read_chunked(self) -> bytes | None:
        parts: list[bytes] = []
        total = 0
        while True:
            # Hex digits only: int(..., 16) would also take "-1" (then read(-1) buffers the
            # connection to its end), "0x10" and "1_0".
            token = self.rfile.readline(1024).split(b";")[0].strip()
            if not CHUNK_SIZE.fullmatch(token):
                self._malformed_chunk()
                return None
            size = int(token, 16)
            total += size
            if total > MAX_BODY_BYTES:
                self._refuse_body("A chunked body")
                return None
            if size == 0:
                for _ in range(MAX_TRAILER_LINES):
                    if self.rfile.readline(1024) in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
                self._malformed_chunk()
                return None
            chunk = self.rfile.read(size)
            if len(chunk) < size:
                return None
            parts.append(chunk)
            self.rfile.readline(1024)

    def _malformed_chunk(self) -> None:
        self.close_connection = True
        self._send(*_error(400, "Malformed chunked request body"))

    def _serve(self) -> None:
        body = self._body()  # always drain it, or it would be read as the next request
        if body is None:
            return
        if self.command == "OPTIONS":
            origin = self.headers.get("Origin", "")
            status = 200 if re.match(r"https?://", origin) else 400
            self._send(status, "application/json", b"")
            return
        status, ctype, payload = self.api.handle(self.command, self.path, body)
        self._send(status, ctype, payload)

    def setup(self) -> None:
        super().setup()
        # Small responses must not wait for the client's delayed ACK (Nagle): ~40 ms otherwise.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        if not self.server.admit():
            self.close_connection = True
            self.raw_requestline = b""
            self.command, self.request_version = "GET", "HTTP/1.1"
            self._send(*_error(503, "Too many open connections"))
            return
        try:
            super().handle()
        except TimeoutError:
            pass  # the client went quiet: the connection closes
        finally:
            self.server.leave()

    def _send(self, status: int, ctype: str, payload: bytes) -> None:
        """Write status line, headers and body in one send."""
        reason = _REASONS.get(status, "")
        head = (
            f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(payload)}\r\n"
        )
        if self.close_connection:
            head += "Connection: close\r\n"
        if self.api.cors:
            head += (
                "Access-Control-Allow-Origin: *\r\nAccess-Control-Allow-Methods: POST, GET\r\n"
                "Access-Control-Allow-Headers: Content-Type\r\n"
            )
        data = head.encode("latin-1") + b"\r\n" + (b"" if self.command == "HEAD" else payload)
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client disconnected; nothing to answer

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _serve

    def do_HEAD(self) -> None:
        self._serve()


def _gunzip(body: bytes) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(body, MAX_UNCOMPRESSED_BYTES + 1)
    except (zlib.error, gzip.BadGzipFile) as exc:
        raise invalid(f"Failed to decompress gzip request body: {exc}") from None
    if len(out) > MAX_UNCOMPRESSED_BYTES:
        raise invalid(
            f"Uncompressed request body exceeds the limit of {MAX_UNCOMPRESSED_BYTES} bytes"
        )
    return out


class RestServer(ThreadingHTTPServer):
    """A threaded HTTP server whose handler threads are daemons, at most MAX_CONNECTIONS open."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open = 0
        self._open_lock = threading.Lock()

    def admit(self) -> bool:
        """Count a new connection in; False when the server already holds its maximum."""
        with self._open_lock:
            if self._open >= self.max_connections:
                return False
            self._open += 1
            return True

    def leave(self) -> None:
        """Count a connection out."""
        with self._open_lock:
            self._open -= 1


class DualStackRestServer(RestServer):
    """The same server on ``::`` taking IPv6 and IPv4 connections alike."""

    address_family = socket.AF_INET6

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def build_rest_server(api: RestApi, port: int) -> RestServer:
    """Return an HTTP server on every interface, IPv6 and IPv4, dispatching to ``api``.

    As the binary's REST listener (evhttp_server.cc binds ``::``, falling back to IPv4 where
    IPv6 is missing; its gRPC one is ``0.0.0.0:<port>``): a container's published port needs it,
    and TF Serving has no flag for the REST address.
    """
    # A silent or trickling client (or an idle keep-alive one) lets its thread go after the REST
    # timeout instead of holding it forever: StreamRequestHandler applies ``timeout`` to reads.
    handler = type("Handler", (_Handler,), {"api": api, "timeout": api.timeout_s})
    if socket.has_dualstack_ipv6():
        try:
            return DualStackRestServer(("::", port), handler)
        except OSError as exc:
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise  # e.g. the port is taken: the same answer IPv4 would give
    return RestServer(("0.0.0.0", port), handler)
