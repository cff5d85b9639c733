"""The OpenAPI document tells the truth (issue 21 item 7): schemathesis (pinned) generates
requests from /openapi.json and sends them to a live gunicorn gateway over a real model server,
every route and every check on: no 5xx, every answer matches its schema and a documented status,
schema-valid requests accepted, schema-violating ones refused, Allow headers true. Each route that
names a model gets one of its kind (tests/schemathesis.toml), :tag a real token classifier."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ops.procs import REPO, child_env
from tests.backend.conftest import EMBED, INTENT, TAGGER
from tests.backend.stack import Gateway

CONFIG = REPO / "tests" / "schemathesis.toml"


def test_schemathesis_finds_no_difference_between_the_schema_and_the_gateway(
    grpc_gateway: Gateway, tmp_path: Path
) -> None:
    env = child_env(ST_CLASSIFY_MODEL=INTENT, ST_EMBED_MODEL=EMBED, ST_TAG_MODEL=TAGGER)
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(tmp_path / "hypothesis")
    cmd = [
        str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(CONFIG), "run",
        f"{grpc_gateway.url}/openapi.json", "--checks", "all", "--max-examples", "12",
        "--seed", "7", "--request-timeout", "20", "--workers", "1",
    ]  # fmt: skip
    # One worker: with two, hypothesis describes schemathesis's filter lambdas by parsing its
    # source in both threads at once, which CPython 3.11.7's parser can fail ("AST constructor
    # recursion depth mismatch", a Runtime Error) once path parameters have patterns.
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert "Tested: 25" in output, output[-3000:]  # every route (/tfs and /embed_sparse too)
    tagged = [
        line
        for line in grpc_gateway.process.log_path.read_text().splitlines()
        if f'"/v1/models/{TAGGER}:tag","status":200' in line and "schemathesis" in line
    ]
    assert tagged, "schemathesis got no :tag answer from the tag model"


def test_the_schema_says_what_the_gateway_refuses(grpc_gateway: Gateway) -> None:
    """The example the issue found: "texts": [""] was schema-valid but a 422."""
    import requests

    doc = requests.get(f"{grpc_gateway.url}/openapi.json", timeout=10).json()
    texts = doc["components"]["schemas"]["ClassifyRequest"]["properties"]["texts"]
    assert texts["minItems"] == 1 and texts["maxItems"] == 64  # the test gateway's limits
    assert texts["items"]["minLength"] == 1 and texts["items"]["maxLength"] == 2000
    assert "pattern" in texts["items"]  # not only whitespace
    options = requests.options(f"{grpc_gateway.url}/v1/models/{INTENT}:classify", timeout=10)
    assert "GET" not in options.headers["Allow"]  # it is no model-status route
