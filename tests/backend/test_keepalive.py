"""An answer given before the body was read must not cost the client's next request.

Through one pooled keep-alive session (what requests, urllib3 and most HTTP clients hold), a 413
for an oversize body or a 404 for a large body to an unknown route used to be answered
"keep-alive" and the connection then closed by gunicorn: the next, valid request failed with
"Remote end closed connection without response".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.backend.conftest import INTENT
from tests.backend.stack import Gateway, ModelServer, gateway_env

LIMIT = 1_048_576  # the default GATEWAY_MAX_BODY_BYTES


@pytest.fixture(scope="module")
def roomy_gateway(
    modelserver: ModelServer, model_base: Path, config_file: Path, log_dir: Path
) -> Iterator[Gateway]:
    env = {**gateway_env(modelserver, "grpc", model_base, config_file)}
    env["GATEWAY_MAX_BODY_BYTES"] = str(LIMIT)
    gateway = Gateway(env, log_dir, workers=1)
    yield gateway
    gateway.stop()


EARLY_ANSWERS = [
    pytest.param(f"/v1/models/{INTENT}:classify", b"x" * (2 * LIMIT), 413, id="oversize-413"),
    pytest.param("/v1/no/such/route", b"x" * 300_000, 404, id="unknown-route-404"),
    pytest.param("/v1/models/nope:classify", b'{"texts": ["' + b"a" * 300_000 + b'"]}', 422,
                 id="text-over-the-limit-422"),
    pytest.param(f"/v1/models/{INTENT}:classify", b"\xff" * 500_000, 400, id="bad-utf8-400"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status"), EARLY_ANSWERS)
def test_a_rejected_large_body_does_not_cost_the_next_request(
    roomy_gateway: Gateway, path: str, body: bytes, status: int
) -> None:
    session = requests.Session()
    valid = {"texts": ["hello world"]}
    for _ in range(5):
        rejected = session.post(f"{roomy_gateway.url}{path}", data=body, timeout=30)
        assert rejected.status_code == status
        assert set(rejected.json()["error"]) == {"code", "message"}
        answer = session.post(
            f"{roomy_gateway.url}/v1/models/{INTENT}:classify", json=valid, timeout=30
        )
        assert answer.status_code == 200


def test_an_oversize_body_is_answered_with_connection_close(roomy_gateway: Gateway) -> None:
    response = requests.post(
        f"{roomy_gateway.url}/v1/models/{INTENT}:classify", data=b"x" * (LIMIT + 1), timeout=30
    )
    assert response.status_code == 413
    assert response.headers["Connection"] == "close"
