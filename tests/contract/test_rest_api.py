"""REST contract: TF Serving's /v1 routes, JSON formats, error strings and HTTP codes."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest

from ops.drills.costly import PeakRss
from tests.contract.conftest import Server, cpu_seconds

PREDICT = "/v1/models/half_plus_two:predict"


def post(server: Server, path: str, body: bytes | str | dict[str, Any]) -> Any:
    """POST a body (dicts as JSON) and return the response."""
    data = json.dumps(body) if isinstance(body, dict) else body
    return server.http.post(server.url + path, data=data, timeout=30)


def test_status_json_matches_tf_serving_byte_for_byte(main_server: Server) -> None:
    response = main_server.http.get(main_server.url + "/v1/models/half_plus_two/versions/1")

    assert response.status_code == 200
    assert response.headers["Content-Type"] == "application/json"
    assert response.text == (
        '{\n "model_version_status": [\n  {\n   "version": "1",\n   "state": "AVAILABLE",\n'
        '   "status": {\n    "error_code": "OK",\n    "error_message": ""\n   }\n  }\n ]\n}\n'
    )


def test_status_lists_versions_newest_first_and_ignores_labels(main_server: Server) -> None:
    for path in ("/v1/models/half_plus_two", "/v1/models/half_plus_two/labels/whatever"):
        body = main_server.http.get(main_server.url + path).json()
        assert [v["version"] for v in body["model_version_status"]] == ["2", "1"]


def test_row_format_predict(main_server: Server) -> None:
    response = post(main_server, PREDICT, {"instances": [1.0, 2.0, 5.0]})

    assert response.status_code == 200
    assert response.json() == {"predictions": [3.5, 4.0, 5.5]}
    assert response.text == '{\n    "predictions": [3.5, 4.0, 5.5\n    ]\n}'


def test_columnar_predict_with_version_and_label_paths(main_server: Server) -> None:
    body = {"inputs": {"x": [[1.0], [3.0]]}}
    by_version = post(main_server, "/v1/models/half_plus_two/versions/1:predict", body).json()
    by_label = post(main_server, "/v1/models/half_plus_two/labels/canary:predict", body).json()

    assert by_version == {"outputs": [[2.5], [3.5]]}
    assert by_label == {"outputs": [[3.5], [4.5]]}


def test_multi_output_rows_are_objects_and_columns_are_named(main_server: Server) -> None:
    rows = post(
        main_server,
        PREDICT,
        {"signature_name": "multi", "instances": [{"a": 1.0, "b": 2.0}, {"a": 3, "b": 4}]},
    )
    cols = post(
        main_server,
        PREDICT,
        {"signature_name": "multi", "inputs": {"a": [1.0], "b": [2.0], "ignored": 1}},
    )

    assert rows.json() == {"predictions": [{"sum": 3.0, "diff": -1.0}, {"sum": 7.0, "diff": -1.0}]}
    assert cols.json() == {"outputs": {"sum": [3.0], "diff": [-1.0]}}


def test_b64_strings_in_and_bytes_outputs_as_b64(main_server: Server) -> None:
    response = post(
        main_server, PREDICT, {"signature_name": "strings", "instances": [{"b64": "aGk="}, "abc"]}
    )

    assert response.json() == {
        "predictions": [
            {"length": 2, "echo_bytes": {"b64": "aGk="}},
            {"length": 3, "echo_bytes": {"b64": "YWJj"}},
        ]
    }


def test_nan_and_infinity_round_trip_as_bare_tokens(main_server: Server) -> None:
    response = post(main_server, PREDICT, '{"instances": [NaN, Infinity, -Infinity]}')

    assert response.status_code == 200
    assert "NaN" in response.text and "-Infinity" in response.text
    values = json.loads(response.text)["predictions"]
    assert values[0] != values[0] and values[1] == float("inf") and values[2] == float("-inf")


def test_floats_use_tf_serving_formatting(main_server: Server) -> None:
    # y = 0.5x + 3 (v2): 17999994 -> 9e+06, 1/3 of float32 precision needs 9 digits.
    response = post(main_server, PREDICT, {"instances": [17999994.0, -5.6666665]})

    assert response.text == '{\n    "predictions": [9e+06, 0.166666746\n    ]\n}'


def test_trailing_garbage_after_the_json_document_is_ignored(main_server: Server) -> None:
    response = post(main_server, PREDICT, '{"instances": [1.0]} trailing')

    assert response.json() == {"predictions": [3.5]}


ERRORS = [
    ("empty body", PREDICT, "", 400, "JSON Parse error: The document is empty"),
    (
        "bad json",
        PREDICT,
        "{x",
        400,
        "JSON Parse error: Missing a name for object member. at offset: 1",
    ),
    (
        "bad json unknown model",
        "/v1/models/nope:predict",
        "[",
        400,
        "JSON Parse error: Invalid value. at offset: 1",
    ),
    ("not an object", PREDICT, "[1]", 400, "JSON Value: [1] Is not object"),
    (
        "signature not a string",
        PREDICT,
        '{"signature_name": 1, "instances": [1]}',
        400,
        'JSON Value: {"signature_name":1,"instances":[1]} not formatted correctly. '
        "'signature_name' key must be a string value.",
    ),
    (
        "unknown model",
        "/v1/models/nope:predict",
        '{"instances": [1.0]}',
        404,
        "Servable not found for request: Latest(nope)",
    ),
    (
        "unknown version",
        "/v1/models/half_plus_two/versions/9:predict",
        '{"instances": [1.0]}',
        404,
        "Servable not found for request: Specific(half_plus_two, 9)",
    ),
    (
        "unknown label",
        "/v1/models/half_plus_two/labels/gold:predict",
        '{"instances": [1.0]}',
        400,
        "Unrecognized servable version label: gold",
    ),
    (
        "unknown signature",
        PREDICT,
        '{"signature_name": "zz", "instances": [1.0]}',
        400,
        'Serving signature name: "zz" not found in signature def',
    ),
    (
        "both keys",
        PREDICT,
        '{"instances": [1], "inputs": [1]}',
        400,
        'JSON Value: {"instances":[1],"inputs":[1]} Not formatted correctly expecting only one '
        "of 'inputs' or 'instances' keys to exist ",
    ),
    ("no keys", PREDICT, "{}", 400, "Missing 'inputs' or 'instances' key"),
    (
        "instances not a list",
        PREDICT,
        '{"instances": 1}',
        400,
        "Expecting 'instances' to be an list/array",
    ),
    ("empty instances", PREDICT, '{"instances": []}', 400, "No values in 'instances' array"),
    (
        "wrong dtype",
        PREDICT,
        '{"instances": ["x"]}',
        400,
        "Failed to process element: 0 of 'instances' list. Error: INVALID_ARGUMENT: JSON Value: "
        '"x" Type: String is not of expected type: float',
    ),
    (
        "wrong input name",
        PREDICT,
        '{"instances": [{"z": 1.0}]}',
        400,
        "Failed to process element: 0 key: z of 'instances' list. Error: INVALID_ARGUMENT: JSON "
        "object: does not have named input: z",
    ),
    (
        "missing columnar input",
        PREDICT,
        '{"signature_name": "multi", "inputs": {"a": [1.0]}}',
        400,
        "Missing named input: b in 'inputs' object.",
    ),
    (
        "ragged rows",
        PREDICT,
        '{"instances": [[1.0, 2.0], [1.0]]}',
        400,
        "Failed to process element: 1 of 'instances' list. Error: INVALID_ARGUMENT: Expecting "
        "tensor size: 2 but got: 1",
    ),
    (
        "plain list for multi input",
        PREDICT,
        '{"signature_name": "multi", "instances": [1.0]}',
        400,
        "instances is a plain list, but expecting list of objects as multiple input tensors "
        "required as per tensorinfo_map",
    ),
    (
        "bad base64",
        PREDICT,
        '{"signature_name": "strings", "instances": [{"b64": "@@"}]}',
        400,
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "path", "body", "status", "message"), ERRORS, ids=[e[0] for e in ERRORS]
)
def test_predict_errors_match_tf_serving(
    main_server: Server, case: str, path: str, body: str, status: int, message: str | None
) -> None:
    response = post(main_server, path, body)

    assert response.status_code == status
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.json()) == {"error"}
    if message is not None:
        assert response.json()["error"] == message


# Numbers then one long string, where one tensor's value is a list: TF Serving checks each leaf's
# type as it fills the tensor of the signature's dtype. numpy once inferred the dtype from them:
# 2,000 numbers and a 50,000-character string were a 2,001 x 200,000-byte unicode array (400 MB).
LONG = '"' + "x" * 50_000 + '"'
NUMBERS = "7, " * 2_000
TINY = "/v1/models/tiny:predict"
WRAPPED = "Failed to process element: 0{} of 'instances' list. Error: INVALID_ARGUMENT: "
LONG_STRING_BODIES = {
    "a float column": (PREDICT, f'{{"inputs": [{NUMBERS}{LONG}]}}', "", "float"),
    "a float row": (PREDICT, f'{{"instances": [[{NUMBERS}{LONG}]]}}', WRAPPED.format(""),
                    "float"),
    "an int32 row's input": (
        TINY, f'{{"instances": [{{"attention_mask": [1], "token_type_ids": [0], "input_ids": '
        f'[{NUMBERS}{LONG}]}}]}}', WRAPPED.format(" key: input_ids"), "int32"),
    "an int32 column": (
        TINY, f'{{"inputs": {{"attention_mask": [[1]], "token_type_ids": [[0]], "input_ids": '
        f'[[{NUMBERS}{LONG}]]}}}}', "", "int32"),
}  # fmt: skip
RSS_BOUND_MIB = 20.0  # the gateway's bound for a generated body (tests/backend)


@pytest.mark.parametrize("case", list(LONG_STRING_BODIES))
def test_numbers_then_a_long_string_are_a_400_without_the_server_growing(
    main_server: Server, case: str
) -> None:
    """A 56 KB body: TF Serving's type error for the string, and the server's peak memory
    within 20 MiB of its RSS before (it grew ~400 MiB when numpy inferred a unicode dtype)."""
    path, body, prefix, dtype = LONG_STRING_BODIES[case]
    main_server.http.get(f"{main_server.url}/v1/models/half_plus_two", timeout=30)
    with PeakRss(main_server.proc.pid) as peak:
        cpu = cpu_seconds(main_server)
        response = post(main_server, path, body)
        cpu = cpu_seconds(main_server) - cpu
    print(f"{case}: {len(body)} bytes, {response.status_code}, CPU {cpu * 1000:.0f} ms, "
          f"RSS +{peak.grown_mib:.1f} MiB")  # fmt: skip
    assert response.status_code == 400, response.text[:300]
    message = response.json()["error"]
    assert message.startswith(f'{prefix}JSON Value: "xxxx'), message[:300]
    assert message.endswith(f"Type: String is not of expected type: {dtype}"), message[-300:]
    assert peak.grown_mib <= RSS_BOUND_MIB, f"{case}: the server grew {peak.grown_mib:.0f} MiB"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models/half_plus_two:predict"),
        ("POST", "/v1/models/half_plus_two"),
        ("DELETE", "/v1/models/half_plus_two"),
        ("POST", "/v1/models/half_plus_two:PREDICT"),
        ("POST", "/v1/models/half_plus_two:predict?x=1"),
        ("GET", "/v1/models/half_plus_two/"),
    ],
)
def test_malformed_requests_name_method_and_path(
    main_server: Server, method: str, path: str
) -> None:
    response = main_server.http.request(method, main_server.url + path, data="{}")

    assert response.status_code == 400
    assert response.json() == {"error": f"Malformed request: {method} {path}"}


def test_model_list_without_name_is_rejected(main_server: Server) -> None:
    response = main_server.http.get(main_server.url + "/v1/models")

    assert (response.status_code, response.json()) == (
        400,
        {"error": "Missing model name in request."},
    )


@pytest.mark.parametrize("path", ["/", "/healthz", "/v2/models/x", "/models/half_plus_two"])
def test_paths_outside_v1_get_the_html_404(main_server: Server, path: str) -> None:
    response = main_server.http.get(main_server.url + path)

    assert response.status_code == 404
    assert response.text.startswith("<HTML><HEAD>\n<TITLE>404 Not Found</TITLE>")


def test_status_of_unknown_model_is_404(main_server: Server) -> None:
    response = main_server.http.get(main_server.url + "/v1/models/nope")

    assert (response.status_code, response.json()) == (
        404,
        {"error": "Could not find any versions of model nope"},
    )


def test_metadata_lists_signature_defs_with_string_sizes(main_server: Server) -> None:
    body = main_server.http.get(main_server.url + "/v1/models/half_plus_two/versions/1/metadata")

    doc = body.json()
    assert doc["model_spec"] == {"name": "half_plus_two", "signature_name": "", "version": "1"}
    x = doc["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]["x"]
    assert x["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in x["tensor_shape"]["dim"]] == ["-1", "1"]


def test_slow_prediction_past_rest_timeout_returns_504(main_server: Server) -> None:
    model_s = 4.0  # spins on the clock: at least this long whatever the CPU
    started = time.monotonic()
    response = post(
        main_server,
        PREDICT,
        {"signature_name": "slow", "inputs": {"x": [[1.0]], "seconds": [model_s]}},
    )

    assert response.status_code == 504
    assert "error" in response.json()
    assert time.monotonic() - started < model_s  # answered at the 1.5 s REST timeout


@pytest.mark.skipif(not socket.has_dualstack_ipv6(), reason="needs IPv6 (a dual-stack socket)")
def test_rest_port_takes_ipv6_connections_as_well(main_server: Server) -> None:
    # TF Serving's REST listener binds "::" (evhttp_server.cc), so ::1 reaches it like 127.0.0.1.
    response = main_server.http.get(f"http://[::1]:{main_server.rest_port}/v1/models/tiny")

    assert response.status_code == 200


def test_client_disconnecting_mid_request_leaves_the_server_serving(main_server: Server) -> None:
    body = json.dumps({"instances": [1.0]}).encode()
    with socket.create_connection(("127.0.0.1", main_server.rest_port), timeout=5) as sock:
        # Promise a long body, send half of it, hang up.
        sock.sendall(
            b"POST " + PREDICT.encode() + b" HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: 100000\r\n\r\n" + body
        )
    with socket.create_connection(("127.0.0.1", main_server.rest_port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/models/half_plus_two:predict HTTP/1.1\r\nHost: x\r\n"
            b'Content-Length: 2000\r\n\r\n{"instances": [1.0]'
        )
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1024)

    response = post(main_server, PREDICT, {"instances": [1.0]})
    assert response.json() == {"predictions": [3.5]}


def test_keep_alive_connection_serves_many_requests(main_server: Server) -> None:
    for value in range(5):
        response = post(main_server, PREDICT, {"instances": [float(value)]})
        assert response.json() == {"predictions": [0.5 * value + 3]}
    assert response.headers.get("Connection", "keep-alive").lower() != "close"


def test_chunked_and_gzip_bodies_are_accepted(main_server: Server) -> None:
    import gzip

    def chunks() -> Any:
        yield b'{"instances"'
        yield b": [1.0]}"

    chunked = main_server.http.post(main_server.url + PREDICT, data=chunks(), timeout=10)
    zipped = main_server.http.post(
        main_server.url + PREDICT,
        timeout=10,
        data=gzip.compress(b'{"instances": [3.0]}'),
        headers={"Content-Encoding": "gzip"},
    )

    assert chunked.json() == {"predictions": [3.5]}
    assert zipped.json() == {"predictions": [4.5]}


def test_regress_rest_returns_results(main_server: Server) -> None:
    body = {"signature_name": "regress_x_to_y", "examples": [{"x": 1.0}, {"x": [4.0]}]}

    response = post(main_server, "/v1/models/half_plus_two:regress", body)

    assert response.status_code == 200
    assert response.text == '{\n    "results": [3.5, 5.0\n    ]\n}'


def test_classify_rest_returns_label_score_pairs_and_context(main_server: Server) -> None:
    body = {
        "signature_name": "classify_x_to_y",
        "context": {"x": 10.0},
        "examples": [{"x": 2.0}, {}],
    }

    response = post(main_server, "/v1/models/half_plus_two/versions/1:classify", body)

    assert response.json() == {"results": [[["", 3.0]], [["", 7.0]]]}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (
            '{"signature_name": "regress_x_to_y"}',
            400,
            'JSON Value: {"signature_name":"regress_x_to_y"} When method is classify, key '
            "'examples' is expected and was not found",
        ),
        (
            '{"examples": []}',
            400,
            "JSON Value: {\"examples\":[]} 'examples' value is an empty array",
        ),
        ('{"examples": [1]}', 400, "Example must be JSON object but got JSON Number"),
        (
            '{"examples": [{"x": [1, 2.5]}]}',
            400,
            "Unexpected element type in feature: x expecting type: int64",
        ),
        (
            '{"examples": [{"x": null}]}',
            400,
            "Feature: x has element with unexpected JSON type: Null",
        ),
        (
            '{"signature_name": "zz", "examples": [{"x": 1.0}]}',
            400,
            "No signature was found with the name: zz",
        ),
    ],
)
def test_regress_rest_errors(main_server: Server, body: str, status: int, message: str) -> None:
    response = post(main_server, "/v1/models/half_plus_two:regress", body)

    assert (response.status_code, response.json()) == (status, {"error": message})
