"""Clients that send slowly, never close, or hold connections open cannot freeze a worker
(backend/httpworker.py), and a stop, reload or max_requests restart answers every request
already sent. Real gunicorn with the gateway's config, raw sockets."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backend.stack import Gateway, gateway_env

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"
THREADS = 4
HOSTILE = 16  # more stalled connections than the worker has threads
LIMIT_S = 1.0  # the header and body timeouts the fixture sets


def _env(base: Path, **extra: str) -> dict[str, str]:
    env = gateway_env(None, "grpc", base, base / "missing.config")
    env.pop("GATEWAY_MODEL_CONFIG_FILE")
    return {**env, **extra}


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One worker of THREADS threads; 1 s to send a head, 1 s a body, 1 s of keep-alive."""
    base = tmp_path_factory.mktemp("no-models")
    env = _env(base, GATEWAY_HEADER_TIMEOUT_S=str(LIMIT_S), GATEWAY_BODY_TIMEOUT_S=str(LIMIT_S),
               GATEWAY_KEEPALIVE_S="1")  # fmt: skip
    gateway = Gateway(env, tmp_path_factory.mktemp("logs"), workers=1, threads=THREADS)
    yield gateway
    gateway.stop()


def _read_response(sock: socket.socket) -> bytes:
    """Return one whole response (head, then Content-Length bytes); b"" if closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            assert not data, f"closed mid-response: {data!r}"
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-body: {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def _probe_waits(port: int, seconds: float) -> list[float]:
    """Send a well-behaved request on a new connection every 20 ms for ``seconds``; their waits."""
    waits = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
        waits.append(time.monotonic() - started)
        time.sleep(0.02)
    return waits


def _never_held(waits: list[float]) -> None:
    """Assert that the probes were not held behind the hostile connections: the typical probe
    (the median) answers in a tenth of the 1 s the bugs cost each (a thread held to the timeout,
    a 2 s wait for a FIN), however a loaded machine delays a few; no probe waits past 3 s."""
    slowest = sorted(waits)[-5:]
    assert statistics.median(waits) < 0.1 * LIMIT_S, (statistics.median(waits), slowest)
    assert max(waits) < 3 * LIMIT_S, slowest


@contextlib.contextmanager
def _connections(port: int, count: int, first: bytes) -> Iterator[list[socket.socket]]:
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(count)]
    try:
        for sock in socks:
            if first:
                sock.sendall(first)
        yield socks
    finally:
        for sock in socks:
            sock.close()


# -- the rules without a server --------------------------------------------------------------

HEAD = b"POST /x HTTP/1.1\r\nHost: t\r\n"


@pytest.mark.parametrize(("data", "whole"), [
    (b"GET / HTTP/1.1\r\nHost: t\r\n", False),
    (b"GET / HTTP/1.1\r\nHost: t\r\n\r\n", True),
    (b"\r\n\r\nGET / HTTP/1.1\r\n", False),  # empty lines before a request are no head's end
    (HEAD + b"Content-Length: 4\r\n\r\nabc", False),
    (HEAD + b"Content-Length: 4\r\n\r\nabcd", True),
    (HEAD + b"Content-Length: 4000000\r\n\r\nab", True),  # over the limit: the app says 413
    (HEAD + b"Content-Length: x\r\n\r\n", True),  # malformed: gunicorn says 400
    (HEAD + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\n", True),  # waits for a 100
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", False),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n", False),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", True),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\n", True),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", True),  # malformed: gunicorn's 400
])  # fmt: skip
def test_a_thread_gets_a_connection_only_with_a_whole_request(data: bytes, whole: bool) -> None:
    from backend.httpworker import request_complete

    assert request_complete(data, max_head=8192, max_body=1_048_576) is whole


def test_the_read_timeouts_are_positive_seconds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import runpy

    conf_file = str(Path(__file__).parents[2] / "docker" / "gunicorn.conf.py")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("GATEWAY_HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("GATEWAY_MAX_REQUESTS", "1000")
    conf = runpy.run_path(conf_file)
    assert conf["HEADER_TIMEOUT_S"] == 2.5 and conf["BODY_TIMEOUT_S"] == 10.0
    assert (conf["max_requests"], conf["max_requests_jitter"], conf["keepalive"]) == (1000, 100, 5)
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv("GATEWAY_BODY_TIMEOUT_S", bad)
        with pytest.raises(SystemExit, match="GATEWAY_BODY_TIMEOUT_S"):
            runpy.run_path(conf_file)


# -- (a) closing a connection never stalls the worker's loop ---------------------------------


def test_quiet_pooled_connections_never_stall_new_requests(strict: Gateway) -> None:
    # Pooled clients (requests, httpx) keep a connection after its answer and never send FIN.
    # Lingering threads close theirs after keepalive (1 s here); gunicorn's close_graceful
    # waited up to 2 s for the FIN each, one after another, on the loop that accepts.
    with _connections(strict.port, THREADS + 2, HEALTH) as idle:
        for sock in idle:
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
        _never_held(_probe_waits(strict.port, 3.0))
        for sock in idle:  # closed by the server after its keep-alive, at once, no 408
            assert sock.recv(65536) == b""


def test_answers_that_close_never_stall_new_requests(strict: Gateway) -> None:
    # "Connection: close" answered, and the client keeps its end open and sends no FIN.
    request = b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    with _connections(strict.port, 6, request) as stubborn:
        for sock in stubborn:
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
        _never_held(_probe_waits(strict.port, 1.5))
        for sock in stubborn:
            assert sock.recv(65536) == b""


# -- (c) half requests hold no thread, and end in 408 ----------------------------------------

HALVES = [
    pytest.param(b"GET /heal", id="half-request-line"),
    pytest.param(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-A: ", id="half-headers"),
    pytest.param(b"POST /v1/models/nope:classify HTTP/1.1\r\nHost: t\r\nContent-Type: "
                 b"application/json\r\nContent-Length: 100\r\n\r\n{\"texts\": [", id="half-body"),
    pytest.param(b"POST /v1/models/nope:classify HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: "
                 b"chunked\r\n\r\n5\r\n{\"tex\r\n", id="half-chunked-body"),
]  # fmt: skip


@pytest.mark.parametrize("half", HALVES)
def test_half_requests_hold_no_thread_and_are_answered_408(strict: Gateway, half: bytes) -> None:
    started = time.monotonic()
    with _connections(strict.port, HOSTILE, half) as stalled:
        _never_held(_probe_waits(strict.port, 0.5))
        for sock in stalled:
            answer = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 408"), answer
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b"connection: close" in head.lower()
            assert json.loads(body)["error"]["code"] == "request_timeout"
            assert sock.recv(65536) == b""  # then closed
        # within the timeout and the loop's one-second tick
        assert time.monotonic() - started < LIMIT_S + 2.5


def test_connections_that_send_nothing_hold_no_thread_and_are_closed_silently(
    strict: Gateway,
) -> None:
    with _connections(strict.port, HOSTILE, b"") as silent:
        _never_held(_probe_waits(strict.port, 0.5))
        for sock in silent:
            assert sock.recv(65536) == b""  # after keepalive, no answer to a request never made


def test_a_request_dribbled_a_byte_at_a_time_is_cut_off_at_the_header_timeout(
    strict: Gateway,
) -> None:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", strict.port), timeout=10) as sock:
        with contextlib.suppress(OSError):
            for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 200:
                sock.sendall(bytes([byte]))  # each byte resets no clock: the head's is total
                time.sleep(0.05)
        assert _read_response(sock).startswith(b"HTTP/1.1 408")
    assert time.monotonic() - started < LIMIT_S + 2.5


def test_a_request_sent_in_pieces_within_the_timeouts_is_served(strict: Gateway) -> None:
    body = b'{"texts": ["hello"]}'
    request = (b"POST /v1/models/nope:classify HTTP/1.1\r\nHost: t\r\nContent-Type: "
               b"application/json\r\nContent-Length: %d\r\n\r\n%s") % (len(body), body)  # fmt: skip
    with socket.create_connection(("127.0.0.1", strict.port), timeout=10) as sock:
        for start in range(0, len(request), 16):
            sock.sendall(request[start : start + 16])
            time.sleep(0.02)
        answer = _read_response(sock)
        # the app got the whole body and answered it (no such model), not a timeout
        assert answer.startswith(b"HTTP/1.1 404"), answer
        sock.sendall(HEALTH)  # and the connection serves the next request
        assert _read_response(sock).startswith(b"HTTP/1.1 200")


# -- (b) a stop, reload or max_requests restart answers what was sent ------------------------


def _keep_alive_client(port: int, until: float, failures: list[str], answered: list[int]) -> None:
    """Send requests back to back on one connection, reconnecting only after an answer that
    said ``Connection: close``; a request left without an answer is a failure."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    try:
        while time.monotonic() < until:
            try:
                sock.sendall(HEALTH)
                answer = _read_response(sock)
            except (OSError, AssertionError) as e:
                failures.append(f"{type(e).__name__}: {e}")
                answer = b""
            if not answer.startswith(b"HTTP/1.1 200"):
                failures.append(f"no answer: {answer[:60]!r}")
                return
            answered.append(1)
            if b"connection: close" in answer.lower():
                sock.close()
                sock = socket.create_connection(("127.0.0.1", port), timeout=15)
    finally:
        sock.close()


def _worker_pids(master: int) -> list[int]:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    return [int(pid) for pid in children]


RESTARTS = ["sigterm-worker", "sighup-reload", "max-requests"]


@pytest.mark.parametrize("restart", RESTARTS)
def test_requests_sent_on_kept_alive_connections_are_answered_across_a_restart(
    tmp_path: Path, restart: str
) -> None:
    extra = {"GATEWAY_MAX_REQUESTS": "40"} if restart == "max-requests" else {}
    gateway = Gateway(_env(tmp_path, **extra), tmp_path, workers=1, threads=THREADS)
    try:
        failures: list[str] = []
        answered: list[int] = []
        until = time.monotonic() + 4.0
        clients = [threading.Thread(target=_keep_alive_client,
                                    args=(gateway.port, until, failures, answered))
                   for _ in range(THREADS)]  # fmt: skip
        for client in clients:
            client.start()
        time.sleep(0.5)
        before = _worker_pids(gateway.process.pid)
        if restart == "sigterm-worker":  # what the master sends a worker on a stop or a reload
            os.kill(before[0], signal.SIGTERM)
        elif restart == "sighup-reload":
            os.kill(gateway.process.pid, signal.SIGHUP)
        for client in clients:
            client.join(timeout=30)
        assert not failures, failures[:5]
        assert _worker_pids(gateway.process.pid) != before  # it did restart
        assert len(answered) > 100
    finally:
        gateway.stop()


def test_a_request_on_an_idle_kept_alive_connection_early_in_a_stop_is_answered_with_close(
    tmp_path: Path,
) -> None:
    gateway = Gateway(_env(tmp_path), tmp_path, workers=1, threads=THREADS)
    try:
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            sock.sendall(HEALTH)
            assert _read_response(sock).startswith(b"HTTP/1.1 200")
            os.kill(_worker_pids(gateway.process.pid)[0], signal.SIGTERM)
            time.sleep(0.5)  # the client sends its next request as the worker stops
            sock.sendall(HEALTH)
            answer = _read_response(sock)
            assert answer.startswith(b"HTTP/1.1 200"), answer
            assert b"connection: close" in answer.lower()
    finally:
        gateway.stop()
