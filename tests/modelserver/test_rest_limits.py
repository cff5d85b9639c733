"""The REST listener's resource bounds: body size, silent clients, worker threads.

These are modelserver's own guards, tested here rather than in the contract suite: TF Serving's
REST server (libevent, evhttp_server.cc) bounds bodies, idle clients and its threads in its own
way (other limits, other answers), so the contract with the binary does not include them.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.contract.conftest import Server, start_server, write_config

LIMIT = 100 << 20  # modelserver.rest_server.MAX_BODY_BYTES
TIMEOUT_S = 3.0  # the narrow server's --rest_api_timeout_in_ms


@pytest.fixture(scope="module")
def narrow_server(contract_root: Path, hp2_base: Path) -> Iterator[Server]:
    """half_plus_two behind one REST worker thread and a 3 s REST timeout."""
    config = write_config(
        contract_root / "narrow.config", [{"name": "half_plus_two", "base_path": str(hp2_base)}]
    )
    flags = [f"--model_config_file={config}", "--rest_api_num_threads=1"]
    server = start_server(
        contract_root, [*flags, f"--rest_api_timeout_in_ms={int(TIMEOUT_S * 1000)}"]
    )
    yield server
    server.stop()


def _exchange(port: int, head: bytes, wait_s: float = 10.0) -> bytes:
    """Send ``head`` on a fresh connection and return everything the server sends back."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(head)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_declared_body_over_the_limit_is_refused_unread(narrow_server: Server) -> None:
    head = (
        "POST /v1/models/half_plus_two:predict HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {LIMIT + 1}\r\n\r\n"
    ).encode()
    answer = _exchange(narrow_server.rest_port, head)  # returns: the server closed the socket
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"Connection: close" in answer and b"request body limit" in answer


def test_a_chunked_body_over_the_limit_is_refused_unread(narrow_server: Server) -> None:
    head = (
        "POST /v1/models/half_plus_two:predict HTTP/1.1\r\nHost: x\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n{LIMIT + 1:x}\r\n"
    ).encode()
    answer = _exchange(narrow_server.rest_port, head)
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_a_silent_connection_is_closed_after_the_rest_timeout(narrow_server: Server) -> None:
    started = time.monotonic()
    answer = _exchange(narrow_server.rest_port, b"", wait_s=30)
    assert answer == b""  # closed by the server, not by our 30 s socket timeout
    assert time.monotonic() - started < 25


def test_a_negative_chunk_size_is_refused_not_read_to_the_end(narrow_server: Server) -> None:
    # int("-1", 16) is -1, and read(-1) would buffer everything the client sends until it closes.
    head = (
        b"POST /v1/models/half_plus_two:predict HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n-1\r\n"
    )
    answer = _exchange(narrow_server.rest_port, head + b"x" * 4096)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"Malformed chunked request body" in answer


def test_rest_api_num_threads_bounds_requests_worked_on_at_once(narrow_server: Server) -> None:
    # Four calls of half the REST timeout at once on one worker thread: the first runs, the next
    # waits for it, and the last two can start only after two whole calls, i.e. at least the full
    # timeout after they came: at least one is told the workers are busy. Only lower bounds on
    # the model's time decide that (it spins on the clock), so a slow CPU can't change it.
    slow_body = {"signature_name": "slow", "inputs": {"x": [[1.0]], "seconds": [TIMEOUT_S / 2]}}
    url = f"{narrow_server.url}/v1/models/half_plus_two:predict"
    replies: list[requests.Response] = []

    def call() -> None:
        replies.append(requests.post(url, json=slow_body, timeout=60))

    calls = [threading.Thread(target=call) for _ in range(4)]
    for call in calls:
        call.start()
    for call in calls:
        call.join(60)
    statuses = sorted(r.status_code for r in replies)
    assert statuses[0] == 200 and 503 in statuses, statuses
    refused = next(r for r in replies if r.status_code == 503)
    assert "busy" in json.loads(refused.text)["error"]


@pytest.mark.parametrize(
    ("depth", "message"),
    [
        (500, "Error: INVALID_ARGUMENT: Too many dimensions in tensor: 499, over 64"),  # a row
        (100_000, "JSON Parse error: the document nests deeper than this server reads"),
    ],
)
def test_deep_nesting_is_a_400_and_the_server_serves_on(
    narrow_server: Server, depth: int, message: str
) -> None:
    """TF Serving parses iteratively (kParseIterativeFlag): nesting is no crash there; here
    Python's parser and numpy stop short of it, and either is a 400 (they were 500s: a
    RecursionError, numpy's 64 dimensions), not an internal error."""
    url = f"{narrow_server.url}/v1/models/half_plus_two:predict"
    body = b'{"instances": ' + b"[" * depth + b"1.0" + b"]" * depth + b"}"
    response = requests.post(url, data=body, timeout=30)
    assert response.status_code == 400, response.text[:300]
    assert message in json.loads(response.text)["error"], response.text[:300]
    served = requests.post(url, json={"instances": [1.0]}, timeout=30)
    assert served.status_code == 200, served.text[:300]
