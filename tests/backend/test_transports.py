"""grpc, rest and local answer alike; an unreachable or silent model server is 503 / 504."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from flask.testing import FlaskClient

from backend.app import create_app
from backend.clients.rest_client import RestClient
from tests.backend.conftest import EMBED, EXITS, INTENT
from tests.backend.stack import Gateway, ModelServer, hung_port, model_config

TEXTS = ["my card was charged twice", "我的订单还没到", "hello", " ".join(["refund"] * 80)]
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    (f"/v1/models/{INTENT}:classify", {"texts": TEXTS, "top_k": 3, "return_logits": True}),
    (f"/v1/models/{EMBED}:embed", {"texts": TEXTS}),
    (f"/v1/models/{EMBED}:embed", {"texts": TEXTS, "normalize": False}),
    # early exits (v2, the newest: the one local serves): a float32 speed per text each way
    (
        f"/v1/models/{EXITS}:classify",
        {"texts": TEXTS, "speed": [1, 0, 0.4, 1], "return_logits": True},
    ),
]


@pytest.fixture(scope="module")
def local_client(model_base: Path, config_file: Path) -> Iterator[FlaskClient]:
    """Return a test client of a gateway running the models in-process (GATEWAY_UPSTREAM=local)."""
    app = create_app(
        {
            "upstream": "local",
            "model_base_path": str(model_base),
            "model_config_file": str(config_file),
            "max_batch_size": 4,
        }
    )
    yield app.test_client()
    from backend.worker import stop_worker

    stop_worker(app)


def _numbers(body: dict[str, Any]) -> np.ndarray:
    if "embeddings" in body:
        return np.asarray(body["embeddings"])
    return np.asarray([[t["score"] for t in p["top_k"]] + p["logits"] for p in body["predictions"]])


@pytest.mark.parametrize(
    ("path", "body"), REQUESTS, ids=["classify", "embed", "embed-raw", "classify-early-exit"]
)
def test_grpc_rest_and_local_give_identical_answers(
    grpc_gateway: Gateway,
    rest_gateway: Gateway,
    local_client: FlaskClient,
    path: str,
    body: dict[str, Any],
) -> None:
    answers = {
        "grpc": requests.post(f"{grpc_gateway.url}{path}", json=body, timeout=60).json(),
        "rest": requests.post(f"{rest_gateway.url}{path}", json=body, timeout=60).json(),
        "local": local_client.post(path, json=body).get_json(),
    }

    assert {name: a["model"]["version"] for name, a in answers.items()} == dict.fromkeys(
        answers, answers["grpc"]["model"]["version"]
    )
    if "predictions" in answers["grpc"]:
        labels = {
            name: [p["top_k"][0]["label"] for p in a["predictions"]] for name, a in answers.items()
        }
        assert labels["grpc"] == labels["rest"] == labels["local"]
        exits = {
            name: [p.get("exit_layer") for p in a["predictions"]] for name, a in answers.items()
        }
        assert exits["grpc"] == exits["rest"] == exits["local"]
    np.testing.assert_allclose(
        _numbers(answers["rest"]), _numbers(answers["grpc"]), rtol=1e-6, atol=1e-7
    )
    np.testing.assert_allclose(
        _numbers(answers["local"]), _numbers(answers["grpc"]), rtol=1e-5, atol=1e-6
    )


@pytest.fixture(scope="module")
def black_hole() -> Iterator[int]:
    """Return a port that accepts TCP connections and never answers (a hung model server)."""
    with hung_port() as port:
        yield port


def _app(model_base: Path, upstream: str, port: int, timeout_s: float = 10.0) -> FlaskClient:
    return create_app(
        {
            "upstream": upstream,
            "tfs_grpc_target": f"127.0.0.1:{port}",
            "tfs_rest_url": f"http://127.0.0.1:{port}",
            "model_base_path": str(model_base),
            "default_model": INTENT,
            "request_timeout_s": timeout_s,
            "grpc_retries": 1,
        }
    ).test_client()


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
@pytest.mark.parametrize("body", [{"texts": ["hi"]}, {"texts": ["hi"], "version": 1}])
def test_unreachable_model_server_is_503_with_retry_after(
    model_base: Path, upstream: str, body: dict[str, Any]
) -> None:
    client = _app(model_base, upstream, _closed_port())

    response = client.post(f"/v1/models/{INTENT}:classify", json=body)

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"
    assert response.get_json()["error"]["code"] == "upstream_unavailable"
    assert client.get("/readyz").status_code == 503


@pytest.mark.parametrize("upstream", ["grpc", "rest"])
def test_silent_model_server_is_504_at_the_timeout(
    model_base: Path, black_hole: int, upstream: str
) -> None:
    timeout_s = 2.0
    client = _app(model_base, upstream, black_hole, timeout_s=timeout_s)
    path, body = f"/v1/models/{INTENT}:classify", {"texts": ["hi"], "version": 1}
    client.post(path, json=body)  # loads the assets and opens the connection: not timed

    started = time.monotonic()
    response = client.post(path, json=body)
    elapsed = time.monotonic() - started

    assert response.status_code == 504, response.get_json()
    assert response.get_json()["error"]["code"] == "upstream_timeout"
    # One deadline for the whole request, not one per attempt (a retry would double it); the
    # slack is the whole timeout again, for a slow or loaded machine.
    assert elapsed < 2 * timeout_s


@pytest.fixture()
def broken_chunks() -> Iterator[int]:
    """A real HTTP server whose every reply breaks off mid-body (bad chunked encoding)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"out\r\nzz\r\n'
                )

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(timeout=2)
    server.close()


def test_a_reply_broken_off_mid_body_is_a_502_not_a_500(
    model_base: Path, broken_chunks: int
) -> None:
    client = _app(model_base, "rest", broken_chunks)

    response = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hi"], "version": 1})

    assert response.status_code == 502, response.get_json()
    error = response.get_json()["error"]
    assert error["code"] == "upstream_error" and "IncompleteRead" in error["message"]


@pytest.fixture()
def closing_server() -> Iterator[tuple[int, list[int]]]:
    """A real HTTP/1.1 server that keeps a connection open between requests but closes it after
    1 s idle, as TF Serving's and any server's keep-alive timeout does, without saying so in
    the answer. Yields its port and the requests each connection carried."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    carried: list[int] = []
    body = b'{"model_version_status": [{"version": "3", "state": "AVAILABLE"}]}'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                carried.append(0)
                with conn:
                    conn.settimeout(1.0)  # far above the gap between back-to-back calls
                    while _read_request(conn):
                        carried[-1] += 1
                        conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1]), carried
    server.close()


def _read_request(conn: socket.socket) -> bool:
    """Read one GET request's head; False once the peer closed or was idle past the timeout."""
    head = b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return False
            head += chunk
        return True
    return False


def test_rest_calls_share_one_connection_and_survive_its_idle_close(
    closing_server: tuple[int, list[int]],
) -> None:
    port, carried = closing_server
    client = RestClient(f"http://127.0.0.1:{port}")

    for _ in range(3):
        assert client.model_status("m", timeout_s=2)[0].version == 3
    time.sleep(1.5)  # the server closes the idle connection meanwhile
    assert client.model_status("m", timeout_s=2)[0].version == 3
    client.close()

    # three calls on one kept-alive connection; the call after the server closed it opened a new
    # one (not a 503 from a dead socket)
    assert carried == [3, 1]


def test_readyz_without_a_default_model_checks_the_server_answers(
    modelserver: ModelServer, model_base: Path
) -> None:
    up = create_app(
        {"upstream": "grpc", "tfs_grpc_target": modelserver.grpc_target,
         "model_base_path": str(model_base)}
    ).test_client()  # fmt: skip
    down = _app(model_base, "grpc", _closed_port())

    assert up.get("/readyz").get_json() == {
        "status": "ready", "model": None, "version": None, "models": {}
    }  # fmt: skip
    assert down.get("/readyz").status_code == 503


def _config_app(modelserver: ModelServer, model_base: Path, config: Path) -> FlaskClient:
    return create_app(
        {"upstream": "grpc", "tfs_grpc_target": modelserver.grpc_target,
         "model_base_path": str(model_base), "model_config_file": str(config),
         "labels_cache_s": 0.0}
    ).test_client()  # fmt: skip


def test_readyz_waits_for_every_model_of_the_serving_config(
    modelserver: ModelServer, model_base: Path, tmp_path: Path
) -> None:
    config = tmp_path / "models.config"
    config.write_text(model_config(model_base, {}, [INTENT, EMBED, "not-served"]))
    client = _config_app(modelserver, model_base, config)

    waiting = client.get("/readyz")
    config.write_text(model_config(model_base, {}, [INTENT, EMBED]))
    ready = client.get("/readyz")

    assert waiting.status_code == 503 and "'not-served'" in waiting.get_json()["error"]["message"]
    assert ready.status_code == 200
    assert ready.get_json()["models"] == {INTENT: 2, EMBED: 1}
    assert ready.get_json()["model"] is None  # no GATEWAY_DEFAULT_MODEL: none is special


def test_a_model_added_once_ready_does_not_take_the_gateway_out_while_it_loads(
    modelserver: ModelServer, model_base: Path, tmp_path: Path
) -> None:
    config = tmp_path / "models.config"
    config.write_text(model_config(model_base, {}, [INTENT]))
    client = _config_app(modelserver, model_base, config)
    assert client.get("/readyz").status_code == 200

    config.write_text(model_config(model_base, {}, [INTENT, "still-loading"]))
    response = client.get("/readyz")

    assert response.status_code == 200
    assert response.get_json()["models"] == {INTENT: 2, "still-loading": None}


def test_readyz_is_503_when_the_default_model_is_not_served(modelserver: ModelServer) -> None:
    client = create_app(
        {"upstream": "rest", "tfs_rest_url": modelserver.rest_url, "default_model": "absent"}
    ).test_client()

    response = client.get("/readyz")

    assert response.status_code == 503 and response.get_json()["error"]["code"] == "not_ready"


def test_a_version_missing_from_the_gateways_model_tree_is_a_502(
    modelserver: ModelServer, tmp_path: Path
) -> None:
    # The model server serves tiny-intent, but this gateway points at an empty model tree.
    (tmp_path / INTENT).mkdir()
    client = create_app(
        {"upstream": "grpc", "tfs_grpc_target": modelserver.grpc_target,
         "model_base_path": str(tmp_path)}
    ).test_client()  # fmt: skip

    response = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hi"]})

    assert response.status_code == 502
    assert response.get_json()["error"]["code"] == "model_assets_error"
    assert "GATEWAY_MODEL_BASE_PATH" in response.get_json()["error"]["message"]


def test_a_saved_model_without_model_json_is_a_502_that_says_how_to_serve_it(
    modelserver: ModelServer, model_base: Path, tmp_path: Path
) -> None:
    """A SavedModel the exporter did not write (no assets/model.json) is served by the model
    server but not through the gateway: the answer says what is missing and what to do."""
    import shutil

    shutil.copytree(model_base / INTENT, tmp_path / INTENT)
    for model_json in (tmp_path / INTENT).glob("*/assets/model.json"):
        model_json.unlink()
    client = create_app(
        {"upstream": "grpc", "tfs_grpc_target": modelserver.grpc_target,
         "model_base_path": str(tmp_path)}
    ).test_client()  # fmt: skip

    response = client.post(f"/v1/models/{INTENT}:classify", json={"texts": ["hi"]})

    assert response.status_code == 502
    error = response.get_json()["error"]
    assert error["code"] == "model_assets_error"
    assert "has no assets/model.json" in error["message"]
    assert "python -m export build" in error["message"]


def test_local_upstream_under_gunicorn_loads_models_when_the_worker_starts(
    grpc_gateway: Gateway, model_base: Path, config_file: Path, log_dir: Path
) -> None:
    from tests.backend.stack import gateway_env

    env = gateway_env(None, "local", model_base, config_file)
    local = Gateway(env, log_dir, workers=1)
    try:
        body = {"texts": TEXTS[:2], "top_k": 3}
        got = requests.post(f"{local.url}/v1/models/{INTENT}:classify", json=body, timeout=60)
        want = requests.post(
            f"{grpc_gateway.url}/v1/models/{INTENT}:classify", json=body, timeout=60
        )

        assert got.status_code == 200, got.text
        assert got.json()["model"] == want.json()["model"]
        np.testing.assert_allclose(
            [[t["score"] for t in p["top_k"]] for p in got.json()["predictions"]],
            [[t["score"] for t in p["top_k"]] for p in want.json()["predictions"]],
            rtol=1e-5,
        )
        assert requests.get(f"{local.url}/readyz", timeout=10).status_code == 200
    finally:
        local.stop()


class _SlowModelServer(ThreadingHTTPServer):
    """A TF Serving REST stand-in on a real socket whose predict and metadata each take
    ``delay_s`` (a model server under load)."""

    daemon_threads = True

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(handler, body: dict[str, Any]) -> None:
                time.sleep(delay_s)
                data = json.dumps(body).encode()
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                handler.wfile.write(data)

            def do_POST(handler) -> None:
                handler.rfile.read(int(handler.headers["Content-Length"]))
                handler._answer({"outputs": {"logits": [[0.0, 1.0]]}})

            def do_GET(handler) -> None:
                outputs = {"logits": {"dtype": "DT_FLOAT"}}
                sig = {"serving_default": {"outputs": outputs}}
                handler._answer({"metadata": {"signature_def": {"signature_def": sig}}})

        super().__init__(("127.0.0.1", 0), Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # the client gave up at its deadline: the late answer has nowhere to go


def test_a_rest_calls_first_signature_look_up_stays_within_its_deadline() -> None:
    """The first call of a version asks its signature after the predict: it used to get a full
    timeout of its own, so the request waited up to twice GATEWAY_TIMEOUT_S."""
    from backend.clients.rest_client import RestClient
    from backend.errors import UpstreamTimeout

    server = _SlowModelServer(delay_s=0.6)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RestClient(f"http://127.0.0.1:{server.server_address[1]}")
    inputs = {"input_ids": np.array([[2, 3]], dtype=np.int32)}
    try:
        started = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            client.predict(INTENT, inputs, version=1, timeout_s=1.0)
        # the UpstreamTimeout is the behaviour (the look-up with a deadline of its own answered
        # in 1.2 s); the time only has to be the deadline's order, not twice it: 2x its 1 s floor
        assert time.monotonic() - started < 2.0
    finally:
        client.close()
        server.shutdown()
        server.server_close()


# -- the REST upstream's edges: real sockets, servers that misbehave at the right moment --------

STATUS_BODY = b'{"model_version_status": [{"version": "3", "state": "AVAILABLE"}]}'
METADATA_BODY = json.dumps({"metadata": {"signature_def": {"signature_def": {
    "serving_default": {"outputs": {"logits": {"dtype": "DT_FLOAT"}}}}}}}).encode()  # fmt: skip
PREDICT_BODY = b'{"outputs": {"logits": [[0.0, 1.0]]}}'


def _answer(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip


def _request_line(conn: socket.socket) -> bytes | None:
    """Read one request (head and Content-Length body); return its request line, None once the
    peer closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)  # fmt: skip
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        rest += chunk
    return head.split(b"\r\n")[0]


def _tf_answer(line: bytes) -> bytes:
    """Return TF Serving's answer to a predict, a metadata or a status request line."""
    if line.startswith(b"POST"):
        return _answer(PREDICT_BODY)
    return _answer(METADATA_BODY if b"/metadata" in line else STATUS_BODY)


@contextlib.contextmanager
def _raw_server(serve: Any) -> Iterator[tuple[int, list[int]]]:
    """Run ``serve(conn, answered)`` on each connection of a real TCP server, in a thread of its
    own; yield the port and, per connection, how many requests it answered (``serve`` counts)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    answered: list[int] = []

    def one(conn: socket.socket, index: int) -> None:
        with conn, contextlib.suppress(OSError):
            serve(conn, answered, index)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                answered.append(0)
                threading.Thread(target=one, args=(conn, len(answered) - 1), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield int(server.getsockname()[1]), answered
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()


def _one_answer_per_connection(closing: str) -> Any:
    """A server that keeps connections alive but closes each one as its second request arrives,
    unanswered: what a client sees when the server's idle timeout closed the connection between
    the client's idle check and its send (``eof``: a FIN; ``reset``: an RST)."""

    def serve(conn: socket.socket, answered: list[int], index: int) -> None:
        line = _request_line(conn)
        if line is None:
            return
        answered[index] += 1  # before the answer: the client may return (and the test read it)
        conn.sendall(_tf_answer(line))  # before this thread runs again
        if _request_line(conn) is not None and closing == "reset":
            conn.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )

    return _raw_server(serve)


@pytest.mark.parametrize("closing", ["eof", "reset"])
def test_a_kept_alive_connection_the_server_closed_as_the_call_went_is_retried_afresh(
    closing: str,
) -> None:
    with _one_answer_per_connection(closing) as (port, answered):
        client = RestClient(f"http://127.0.0.1:{port}")
        try:
            first = client.model_status("m", timeout_s=2)
            second = client.model_status("m", timeout_s=2)  # its kept-alive connection is gone
        finally:
            client.close()

    assert first[0].version == second[0].version == 3
    assert answered == [1, 1]  # the second call went again on a new connection, once


def test_a_replica_whose_kept_alive_connection_closed_is_not_marked_down() -> None:
    with (
        _one_answer_per_connection("eof") as (one, _),
        _one_answer_per_connection("eof") as (two, _),
    ):
        client = RestClient(f"http://127.0.0.1:{one},http://127.0.0.1:{two}")
        inputs = {"input_ids": np.array([[2, 3]], dtype=np.int32)}
        try:
            answers = [client.predict("m", inputs, version=1, timeout_s=2) for _ in range(6)]
            assert client.replicas is not None
            down = [r.address for r in client.replicas.members() if r.down_until > 0]
        finally:
            client.close()

    assert [a[0]["logits"].tolist() for a in answers] == [[[0.0, 1.0]]] * 6
    assert down == []  # each call's reused connection was closed, not the replica gone


@pytest.mark.parametrize("timeout_s", [0.0, -0.5])
def test_a_spent_deadline_is_a_504_and_leaves_the_pooled_connection_usable(
    closing_server: tuple[int, list[int]], timeout_s: float
) -> None:
    from backend.errors import UpstreamTimeout

    port, carried = closing_server
    client = RestClient(f"http://127.0.0.1:{port}")
    try:
        client.model_status("m", timeout_s=2)
        with pytest.raises(UpstreamTimeout):
            client.model_status("m", timeout_s=timeout_s)
        client.model_status("m", timeout_s=2)
    finally:
        client.close()

    assert carried == [2]  # the spent call took no connection: none leaked, none dropped


def _trickling(conn: socket.socket, answered: list[int], index: int) -> None:
    """Answer a status request one byte every 50 ms (about 6 s for the whole answer)."""
    if _request_line(conn) is None:
        return
    padded = STATUS_BODY[:-1] + b', "padding": "' + b"." * 60 + b'"}'
    for byte in _answer(padded):
        conn.sendall(bytes([byte]))
        time.sleep(0.05)
    answered[index] += 1


def test_a_server_that_trickles_its_answer_is_cut_off_at_the_deadline() -> None:
    """Each recv gets a byte well within the timeout: only a deadline over the whole exchange
    stops the call (it used to wait for the last byte, 6 s)."""
    from backend.errors import UpstreamTimeout

    with _raw_server(_trickling) as (port, answered):
        client = RestClient(f"http://127.0.0.1:{port}")
        started = time.monotonic()
        try:
            with pytest.raises(UpstreamTimeout):
                client.model_status("m", timeout_s=0.5)
        finally:
            elapsed = time.monotonic() - started
            client.close()

    assert answered == [0]
    assert elapsed < 1.5  # the deadline's order (0.5 s and a loaded machine's slack), not 6 s


def test_the_rest_pool_keeps_a_connection_for_each_thread_of_the_worker(tmp_path: Path) -> None:
    """24 worker threads each waiting on the model server at once, twice: the second time every
    call finds a kept-alive connection (the pool held 16, whatever the threads)."""
    from backend.worker import start_worker, stop_worker

    calls = 24
    meet = threading.Barrier(calls)

    def serve(conn: socket.socket, answered: list[int], index: int) -> None:
        while _request_line(conn) is not None:
            meet.wait(timeout=10)  # every call is in flight at once
            answered[index] += 1  # before the answer: the client may return (and the test read it)
            conn.sendall(_answer(STATUS_BODY))

    with _raw_server(serve) as (port, answered):
        settings = {"upstream": "rest", "tfs_rest_url": f"http://127.0.0.1:{port}",
                    "model_base_path": str(tmp_path), "max_concurrent_chunks": 1}  # fmt: skip
        app = create_app(settings)
        client = start_worker(app, threads=calls).client
        try:
            with ThreadPoolExecutor(calls) as pool:
                for _ in range(2):
                    states = list(pool.map(lambda _: client.model_status("m", timeout_s=10),
                                           range(calls)))  # fmt: skip
                    assert all(s[0].version == 3 for s in states)
        finally:
            stop_worker(app)

    assert answered == [2] * calls
