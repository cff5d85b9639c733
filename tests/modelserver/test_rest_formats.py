"""TF Serving's JSON float formatting, request decoding and response encoding."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tensorflow.core.protobuf import meta_graph_pb2

from modelserver.errors import ServingError
from modelserver.rest_encode import error_body, format_float, predict_body
from modelserver.rest_json import decode_predict, parse_body


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (9000000, "9e+06"),
        (999999, "999999.0"),
        (0.5, "0.5"),
        (0.00003, "3e-05"),
        (555557.5, "555557.5"),
        (3, "3.0"),
        (0.1, "0.1"),
        (1 / 3, "0.333333343"),
        (-0.0, "-0.0"),
        (float("nan"), "NaN"),
        (float("inf"), "Infinity"),
        (float("-inf"), "-Infinity"),
    ],
)
def test_float32_formatting_matches_json_tensor_test_vectors(value: float, text: str) -> None:
    assert format_float(float(np.float32(value))) == text


def test_double_formatting_uses_17_digits_when_needed() -> None:
    assert format_float(0.1 + 0.2, double=True) == "0.30000000000000004"


def test_parse_ignores_trailing_garbage_and_accepts_nan() -> None:
    assert parse_body(b'{"a": NaN} junk')["a"] != parse_body(b'{"a": NaN}')["a"]  # NaN != NaN


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "JSON Parse error: The document is empty"),
        (b"   ", "JSON Parse error: The document is empty"),
        (b"[1, 2", "JSON Parse error: Missing a comma or ']' after an array element. at offset: 5"),
        (
            b'{"a": 1 "b"',
            "JSON Parse error: Missing a comma or '}' after an object member. at offset: 8",
        ),
    ],
)
def test_parse_errors_use_rapidjson_wording(body: bytes, message: str) -> None:
    with pytest.raises(ServingError) as info:
        parse_body(body)

    assert info.value.message == message


def signature(**inputs: int) -> meta_graph_pb2.SignatureDef:
    sig = meta_graph_pb2.SignatureDef()
    for name, dtype in inputs.items():
        sig.inputs[name].dtype = dtype
    return sig


def test_row_format_stacks_instances_with_signature_dtypes() -> None:
    sig = signature(ids=3, mask=3)  # DT_INT32

    inputs, rows = decode_predict(
        {"instances": [{"ids": [1, 2], "mask": [1, 1]}, {"ids": [3, 4], "mask": [1, 0]}]}, sig, "x"
    )

    assert rows
    assert inputs["ids"].dtype == np.int32 and inputs["ids"].tolist() == [[1, 2], [3, 4]]


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"instances": [1.5]}, "Type: Number is not of expected type: int32"),
        ({"instances": [True]}, "Type: True is not of expected type: int32"),
        ({"instances": [2**40]}, "is not of expected type: int32"),
        ({"instances": [[1, [2]]]}, "found at incorrect level"),
        ({"inputs": [[1, 2], [3]]}, "Encountered list at unexpected size: 1 at level: 1"),
        ({"inputs": [1, True]}, "Type: True is not of expected type: int32"),  # not promoted
        ({"inputs": [[1, 2], [3, "4"]]}, 'JSON Value: "4" Type: String is not of'),
    ],
)
def test_int_inputs_reject_floats_bools_overflow_and_ragged_lists(doc: dict, fragment: str) -> None:
    with pytest.raises(ServingError) as info:
        decode_predict(doc, signature(ids=3), "x")

    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("value", "dtype", "message"),
    [
        ([0.5, False], 1, "JSON Value: false Type: False is not of expected type: float"),
        ([[True, 1.0]], 2, "JSON Value: true Type: True is not of expected type: double"),
        ([1, "x", [2]], 3, 'JSON Value: "x" Type: String is not of expected type: int32'),
        ([[1, "x"], 2], 3, 'JSON Value: "x" Type: String is not of expected type: int32'),
        (
            [[1], 2, "x"],
            3,
            "JSON Value: 2 found at incorrect level: 1 in the JSON DOM. Expected at level: 2",
        ),
    ],
)
def test_the_first_bad_leaf_in_order_is_the_error_and_bools_are_no_numbers(
    value: list, dtype: int, message: str
) -> None:
    """As json_tensor.cc fills a tensor: leaf by leaf in order, the first leaf whose type the
    signature's dtype does not take (or the first at a wrong level) is the error; numpy used to
    promote a bool among numbers to 0 or 1."""
    with pytest.raises(ServingError) as info:
        decode_predict({"inputs": value}, signature(x=dtype), "x")

    assert info.value.message == message


def test_a_float_input_takes_integers_past_a_double_as_infinity() -> None:
    """rapidjson reads a 400-digit integer as a double (inf); it was an OverflowError (a 500)."""
    inputs, _ = decode_predict({"inputs": [10**400, -(10**400), 1]}, signature(x=1), "x")

    assert inputs["x"].dtype == np.float32
    assert inputs["x"].tolist() == [float("inf"), float("-inf"), 1.0]


def test_debug_strings_are_written_only_up_to_their_256_bytes() -> None:
    """The error's dump of a value is cut at 256 bytes, and a value nested past Python's
    recursion limit is dumped too (json.dumps raised RecursionError: a 500)."""
    from modelserver.rest_json import debug_string

    value = {"a": [1, 2.5, None, True, 'x"y'], "b": {"c": ["z" * 300]}}
    assert debug_string(value) == json.dumps(value, separators=(",", ":"))[:256]
    deep: list = []
    for _ in range(5_000):
        deep = [deep]
    assert debug_string(deep) == "[" * 256


def test_half_inputs_are_unimplemented() -> None:
    with pytest.raises(ServingError) as info:
        decode_predict({"inputs": [1.0]}, signature(h=19), "x")

    assert info.value.http_status == 501
    assert info.value.message == "Conversion of JSON Value: 1.0 to type: half"


def test_row_output_needs_rank_and_consistent_batch() -> None:
    with pytest.raises(ServingError, match="has no shape information "):
        predict_body({"s": np.float32(1.0)}, row_format=True)
    with pytest.raises(ServingError, match="has inconsistent batch size: 3 expecting: 2"):
        predict_body({"a": np.zeros(2, np.float32), "b": np.zeros(3, np.float32)}, True)


def test_outputs_by_dtype() -> None:
    body = predict_body(
        {
            "i": np.array([1, 2], np.int64),
            "b": np.array([True, False]),
            "s": np.array([b"x", b"y"], object),
        },
        row_format=False,
    )

    assert json.loads(body) == {"outputs": {"i": [1, 2], "b": [True, False], "s": ["x", "y"]}}


def test_error_body_is_pretty_printed() -> None:
    assert error_body('bad "x"') == '{\n    "error": "bad \\"x\\""\n}'


def test_vectorized_float_writer_equals_the_scalar_one() -> None:
    from modelserver.rest_encode import format_floats

    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            (rng.standard_normal(20000) * 10.0 ** rng.integers(-30, 30, 20000)).astype(np.float32),
            (rng.integers(-(10**6), 10**6, 20000) / 10.0 ** rng.integers(0, 8, 20000)).astype(
                np.float32
            ),
            np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 9e6, 1e-45, 3.4e38], np.float32),
        ]
    )

    fast = format_floats(values)
    slow = [format_float(float(v)) for v in values]
    same = sum(a == b for a, b in zip(fast, slow, strict=True))
    assert same >= len(values) - 5  # decimal ties may pick 9 digits where 6 suffice
    parsed = np.array([float(t.replace("Infinity", "inf")) for t in fast], np.float32)
    assert np.array_equal(parsed, values, equal_nan=True)  # lossless either way
    doubles = rng.standard_normal(2000)
    assert format_floats(doubles) == [format_float(float(v), double=True) for v in doubles]
