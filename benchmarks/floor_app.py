"""The gateway's floor: the least a request can cost under the parts it is built from.

Two WSGI apps benchmarks/e2e runs under gunicorn's gthread worker (the gateway's worker class and
threads) to measure CPU per sequential request: ``raw`` answers without any framework, ``app``
is Flask with one JSON route that reads its body as the gateway does (orjson). With a bare gRPC
Predict call measured in the client (bytes in, bytes out: no tensors built), their sum is the
floor the gateway's own CPU per request stands on (results/e2e_breakdown.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson
from flask import Flask, Response, request

ANSWER = b'{"predictions":[{"label":"billing","score":0.9}]}'


def raw(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Read the body and answer a fixed JSON document: gunicorn's own cost per request."""
    stream = environ["wsgi.input"]
    stream.read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response(
        "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(ANSWER)))]
    )
    return [ANSWER]


app = Flask("floor")


@app.post("/v1/models/<model>:classify")
def classify(model: str) -> Response:
    """Parse the JSON body and answer a fixed document: gunicorn + Flask's cost per request."""
    orjson.loads(request.get_data())
    return Response(ANSWER, mimetype="application/json")
