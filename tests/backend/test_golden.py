"""Golden answers of every inference route on the shared stack (tests/backend/golden.py: the
rules; issue 43): classify (versions, labels, scores, logits, early exits), tag, embed with
each output type, prompts and chunking, tokenize, detokenize, rerank (an embedding model),
OpenAI's /v1/embeddings and Cohere's /v2/embed. The sentence-pair, cross-encoder and
multi-label heads are held to theirs in test_heads_e2e.py, on its stack.

Each answer comes through the gRPC gateway and through the REST one; both are held to the same
file. Re-record: ``GATEWAY_GOLDEN_RECORD=1`` (golden.py's docstring).
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import orjson
import pytest

from tests.backend.conftest import EMBED, EXITS, INTENT, SENTENCE, TAGGER
from tests.backend.golden import (
    BYTES,
    TOLERANCE,
    Case,
    assert_same_answer,
    check,
    float_kind,
    golden_file,
    mode,
    recording,
)

TEXTS = ["my card was charged twice", "Thé pâckage never arrived 😀", "我的订单还没到 please help"]
LONG = " ".join(["refund the money for my cancelled subscription"] * 12)  # over max_seq_len
ALL_TYPES = ["float", "int8", "uint8", "binary", "ubinary"]
DOCS = ["your package ships in two days", "the card was charged twice", "hello world"]

CASES = [
    Case("classify", f"/v1/models/{INTENT}:classify", {"texts": [*TEXTS, LONG], "top_k": 2}),
    Case("classify-scores-logits-v1", f"/v1/models/{INTENT}:classify",
         {"texts": TEXTS, "version": 1, "return_scores": True, "return_logits": True}),
    Case("classify-label", f"/v1/models/{INTENT}:classify",
         {"texts": ["hello"], "label": "canary", "top_k": 3}),
    Case("classify-early-exit", f"/v1/models/{EXITS}:classify",
         {"texts": TEXTS, "speed": [0.0, 0.8, 1.0], "return_scores": True}),
    Case("tag", f"/v1/models/{TAGGER}:tag", {"texts": [*TEXTS, LONG]}),
    Case("tag-none-truncate", f"/v1/models/{TAGGER}:tag",
         {"texts": [TEXTS[0], LONG], "aggregation": "none", "long_text": "truncate"}),
    Case("tag-average", f"/v1/models/{TAGGER}:tag", {"texts": TEXTS, "aggregation": "average"}),
    Case("embed", f"/v1/models/{EMBED}:embed", {"texts": TEXTS}),
    Case("embed-raw", f"/v1/models/{EMBED}:embed", {"texts": TEXTS[:2], "normalize": False}),
    Case("embed-types", f"/v1/models/{EMBED}:embed",
         {"texts": TEXTS, "embedding_types": ALL_TYPES}, quantized=True),
    Case("embed-chunk", f"/v1/models/{EMBED}:embed",
         {"texts": [LONG, TEXTS[0]], "long_text": "chunk"}),
    Case("embed-left", f"/v1/models/{EMBED}:embed",
         {"texts": [LONG], "truncation_direction": "left"}),
    Case("embed-sentence-prompt", f"/v1/models/{SENTENCE}:embed",
         {"texts": TEXTS, "prompt_name": "passage", "embedding_types": ["float", "ubinary"]}),
    Case("embed-sentence-input-type", f"/v1/models/{SENTENCE}:embed",
         {"texts": TEXTS[:2], "input_type": "search_query"}),
    Case("tokenize", f"/v1/models/{INTENT}:tokenize", {"texts": [*TEXTS, LONG]}),
    Case("tokenize-unigram", f"/v1/models/{SENTENCE}:tokenize", {"texts": TEXTS}),
    Case("detokenize", f"/v1/models/{INTENT}:detokenize", {"ids": [[5, 6, 7, 8], [9, 10]]}),
    Case("rerank-model", f"/v1/models/{SENTENCE}:rerank",
         {"query": "where is my order", "documents": DOCS, "return_documents": True}),
    Case("rerank-v1", "/v1/rerank",
         {"model": SENTENCE, "query": "charged twice", "documents": DOCS, "top_n": 2}),
    Case("rerank-v2", "/v2/rerank",
         {"model": f"{SENTENCE}@1", "query": "hello", "return_documents": True,
          "documents": [{"text": d} for d in DOCS]}),
    Case("openai", "/v1/embeddings", {"model": EMBED, "input": TEXTS[0]}),
    Case("openai-list-dimensions", "/v1/embeddings",
         {"model": SENTENCE, "input": TEXTS, "dimensions": 8, "input_type": "search_document"}),
    Case("openai-base64", "/v1/embeddings",
         {"model": EMBED, "input": TEXTS[:2], "encoding_format": "base64"}, base64_floats=True),
    Case("openai-token-ids-int8", "/v1/embeddings",
         {"model": EMBED, "input": [[5, 6, 7], [8, 9]], "embedding_type": "int8"}, quantized=True),
    Case("openai-binary-base64", "/v1/embeddings",
         {"model": EMBED, "input": TEXTS[:2], "embedding_type": "binary",
          "encoding_format": "base64"}),
    Case("cohere", "/v2/embed", {"model": EMBED, "texts": TEXTS}),
    Case("cohere-types", "/v2/embed",
         {"model": SENTENCE, "texts": [*TEXTS, LONG],
          "input_type": "search_document", "truncate": "START",
          "embedding_types": ["float", "int8", "ubinary"]}, quantized=True),
]  # fmt: skip
CASES_BY_NAME = {case.name: case for case in CASES}


@pytest.mark.parametrize(
    ("case", "transport"),
    [(case, transport) for case in CASES for transport in ("grpc", "rest")],
    ids=[f"{case.name}-{transport}" for case in CASES for transport in ("grpc", "rest")],
)
def test_answers_match_the_golden_files(
    request: pytest.FixtureRequest, case: Case, transport: str
) -> None:
    gateway = request.getfixturevalue(f"{transport}_gateway")

    check(gateway.url, case, record=recording() and transport == "grpc")


# -- the comparison off the recording machine (golden.py's shape and numbers) ------------------


def _nudged(body: bytes) -> bytes:
    """Return ``body`` with every float32 literal one float32 step up: another CPU's last bits."""
    text = re.sub(
        rb"-?\d+\.\d+(?:e[+-]?\d+)?",
        lambda m: orjson.dumps(
            np.nextafter(np.float32(float(m.group(0))), np.float32(np.inf)),
            option=orjson.OPT_SERIALIZE_NUMPY,
        ),
        body,
    )
    return text


def test_last_bit_differences_pass_off_the_recording_machine() -> None:
    case = CASES_BY_NAME["embed"]
    want = golden_file(case).read_bytes()

    assert _nudged(want) != want
    assert_same_answer(_nudged(want), want, case)


def _as_float64_digits(body: bytes) -> bytes:
    return re.sub(rb"-?\d+\.\d+", lambda m: repr(float(np.float32(float(m.group(0))))).encode(),
                  body)  # fmt: skip


def _json_dumps(body: bytes) -> bytes:
    return json.dumps(json.loads(body), ensure_ascii=False).encode()


def _keys_reordered(body: bytes) -> bytes:
    return orjson.dumps(dict(reversed(list(orjson.loads(body).items()))))


def _one_float_off(body: bytes) -> bytes:
    return re.sub(rb"0\.(\d)", lambda m: b"0." + str((int(m.group(1)) + 1) % 10).encode(), body,
                  count=1)  # fmt: skip


def _first_base64_float_off(body: bytes) -> bytes:
    answer = orjson.loads(body)
    vector = np.frombuffer(base64.b64decode(answer["data"][0]["embedding"]), "<f4").copy()
    vector[0] += 0.01
    answer["data"][0]["embedding"] = base64.b64encode(vector.tobytes()).decode()
    return orjson.dumps(answer)


# Serialization changes that each machine must catch, not only the recording one.
DEFECTS = {
    "float32 written as float64 digits": ("embed", _as_float64_digits),
    "json.dumps instead of orjson (spaces, ensure_ascii off)": ("embed", _json_dumps),
    "keys in another order": ("classify", _keys_reordered),
    "a label changed": ("classify", lambda b: b.replace(b'"neutral"', b'"neutrall"', 1)),
    "a float off by 0.1": ("classify", _one_float_off),
    "an integer off by one": ("tokenize", lambda b: b.replace(b"[2,239,", b"[2,240,", 1)),
    "a base64 vector changed": ("openai-base64", _first_base64_float_off),
}  # fmt: skip


@pytest.mark.parametrize("defect", DEFECTS)
def test_serialization_changes_fail_off_the_recording_machine(defect: str) -> None:
    name, change = DEFECTS[defect]
    case = CASES_BY_NAME[name]
    want = golden_file(case).read_bytes()
    got = change(want)

    assert got != want
    with pytest.raises(AssertionError):
        assert_same_answer(got, want, case)


@pytest.mark.parametrize(
    ("literal", "kind"),
    [(b"0.1", "f32"), (b"0.10000000149011612", "f64"), (b"0.00001", "f32"), (b"1e-05", "py"),
     (b"0.100", "other")],
)  # fmt: skip
def test_a_floats_kind_is_the_writer_that_wrote_it(literal: bytes, kind: str) -> None:
    assert float_kind(literal) == kind


RECORDED = "AMD EPYC (AVX-512 + bf16: avx2 fma f16c avx512f avx512_bf16 avx512_vnni), 2 cores"


@pytest.mark.parametrize(
    ("here", "held", "named"),
    [
        (RECORDED, BYTES, "AVX-512 + bf16, 2 cores"),
        # another vendor's CPU with the same kernels and cores: still every byte
        ("Intel Xeon (AVX-512 + bf16: avx2 fma f16c avx512f avx512_bf16 avx512_vnni), 2 cores",
         BYTES, "AVX-512 + bf16, 2 cores"),
        ("AMD EPYC (AVX2: avx2 fma f16c), 2 cores", TOLERANCE, "CPU class 'AVX-512 + bf16' there"),
        ("AMD EPYC (AVX-512 + bf16: avx2 fma f16c avx512f avx512_bf16 avx512_vnni), 8 cores",
         TOLERANCE, "cores '2' there, '8' here"),
        ("AMD EPYC (AVX-512 + bf16: avx2 fma avx512f avx512_bf16 avx512_vnni), 2 cores",
         TOLERANCE, "kernel flags"),
    ],
)  # fmt: skip
def test_answers_are_held_within_tolerance_only_where_the_arithmetic_differs(
    here: str, held: str, named: str
) -> None:
    got, why = mode(RECORDED + "\n", here)

    assert (got, named in why) == (held, True), why
