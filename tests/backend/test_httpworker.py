"""backend/httpworker.py: gunicorn's gthread worker whose pool threads serve a keep-alive
connection's next request themselves, through a real gunicorn running the gateway."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.backend.stack import Gateway, ModelServer, gateway_env

HEALTH = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


@pytest.fixture(scope="module")
def two_threads(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> Iterator[Gateway]:
    """A gateway of one worker with two pool threads (the fewest that leave one free)."""
    gateway = Gateway(gateway_env(modelserver, "grpc", model_base, config_file), log_dir,
                      workers=1, threads=2)  # fmt: skip
    yield gateway
    gateway.stop()


def _get(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/healthz")
    reply = conn.getresponse()
    reply.read()
    return reply.status


def _read_response(sock: socket.socket) -> bytes:
    """Return one whole response (headers, then Content-Length bytes: they may come apart)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))  # fmt: skip
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-body: {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def test_a_keep_alive_connection_serves_many_requests_on_one_socket(two_threads: Gateway) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", two_threads.port, timeout=10)
    try:
        assert _get(conn) == 200
        first = conn.sock
        statuses = [_get(conn) for _ in range(200)]
        assert statuses == [200] * 200
        assert conn.sock is first  # never closed and reopened
    finally:
        conn.close()


def test_pipelined_requests_are_all_answered_in_order(two_threads: Gateway) -> None:
    with socket.create_connection(("127.0.0.1", two_threads.port), timeout=10) as sock:
        sock.sendall(HEALTH * 3)
        received = b""
        while received.count(b"HTTP/1.1 200") < 3:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {received.count(b'HTTP/1.1 200')} answers"
            received += chunk


def test_connections_that_linger_never_keep_a_new_one_waiting(two_threads: Gateway) -> None:
    idle = [http.client.HTTPConnection("127.0.0.1", two_threads.port, timeout=10)
            for _ in range(3)]  # fmt: skip
    waits = []
    try:
        for conn in [*idle, fresh := http.client.HTTPConnection("127.0.0.1", two_threads.port)]:
            # each answered, then quiet: a pool thread may linger on it
            started = time.monotonic()
            assert _get(conn) == 200
            waits.append(time.monotonic() - started)
        # A pool thread always stays free: no request waits for a lingering one's keep-alive
        # (5 s), though there are more quiet connections than threads.
        assert max(waits) < 1.0, waits
        fresh.close()
        assert [_get(conn) for conn in idle] == [200, 200, 200]  # the quiet ones still work
    finally:
        for conn in idle:
            conn.close()


def test_a_worker_with_a_lingering_connection_stops_as_fast_as_gthread(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> None:
    gateway = Gateway(gateway_env(modelserver, "grpc", model_base, config_file), log_dir,
                      workers=1, threads=2)  # fmt: skip
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
    try:
        assert _get(conn) == 200  # its thread now lingers on it
        started = time.monotonic()
        gateway.stop()
        # gthread closes kept-alive connections 2 s into a stop; a thread that went on
        # lingering would hold the worker for the whole keep-alive (5 s) first.
        assert time.monotonic() - started < 4.5
    finally:
        conn.close()
        gateway.stop()


def test_a_connection_quiet_for_the_keep_alive_is_closed_as_gthread_closes_it(
    two_threads: Gateway,
) -> None:
    with socket.create_connection(("127.0.0.1", two_threads.port), timeout=10) as sock:
        sock.sendall(HEALTH)
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        assert sock.recv(65536) == b""  # the server closes it: docker/gunicorn.conf.py keepalive
        assert 4.5 < time.monotonic() - started < 9.0  # 5 s, not a linger and a keep-alive more


def _wakeups(pid: int) -> int:
    """Return how often the threads of process ``pid`` have gone to sleep and been woken."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        total += int(status.split("voluntary_ctxt_switches:")[1].split()[0])
    return total


def test_a_thread_lingering_on_an_idle_connection_sleeps_until_something_comes(
    two_threads: Gateway,
) -> None:
    """A lingering thread used to look up every 10 ms (100 wake-ups a second each, each taking
    the GIL from the requests being served): idle, it now sleeps until its socket or the
    worker's wake pipe stirs (and looks up once a second)."""
    master = two_threads.process.pid
    worker = int(Path(f"/proc/{master}/task/{master}/children").read_text().split()[0])
    conn = http.client.HTTPConnection("127.0.0.1", two_threads.port, timeout=10)
    try:
        assert _get(conn) == 200  # answered, then quiet: its thread lingers on it
        time.sleep(0.2)
        before = _wakeups(worker)
        time.sleep(2.0)
        woken = _wakeups(worker) - before
        assert _get(conn) == 200  # the lingering thread serves the next request at once
    finally:
        conn.close()
    # the worker's main loop wakes once a second, a lingering thread as often: well under 100
    assert woken < 40, f"{woken} wake-ups of the worker's threads in 2 s"
