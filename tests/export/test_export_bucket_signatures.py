"""One fixed-length ``seq_<L>`` signature per length bucket, equal to ``serving_default``.

TF Serving batches per signature, so the gateway sends each bucket-padded chunk to its own
fixed-length signature and every batch queue holds one shape (no padding inside the server).
"""

from __future__ import annotations

import numpy as np
import pytest

from export.predictor import PersistentPredictor
from export.warmup import BATCH_SIZES, MAX_RECORDS, read_warmup_records, token_batch, warmup_plan
from modelformat.buckets import buckets as bucket_lengths
from modelformat.layout import read_model_info
from tests.export.conftest import tf_serving_bundle

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@pytest.mark.parametrize(
    ("max_seq_len", "lens"),
    [(128, [16, 32, 64, 128]), (100, [16, 32, 64, 100]), (16, [16]), (8, [8]),
     (512, [16, 32, 64, 128, 256, 512])],
)  # fmt: skip
def test_bucket_lengths_double_from_16_and_always_include_max_seq_len(
    max_seq_len: int, lens: list[int]
) -> None:
    assert bucket_lengths(max_seq_len) == lens


@pytest.mark.parametrize("fixture", ["classify_v1", "embed_v1"])
def test_model_json_names_one_signature_per_bucket(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    result = request.getfixturevalue(fixture)
    info = read_model_info(result.path)
    assert info is not None
    assert info["bucket_signatures"] == {"16": "seq_16", "32": "seq_32", "64": "seq_64"}
    predictor = PersistentPredictor(result.path)
    assert predictor.signature_names == ["seq_16", "seq_32", "seq_64", "serving_default"]


@pytest.mark.parametrize("fixture", ["classify_v1", "embed_v1"])
def test_bucket_signatures_have_fixed_length_inputs_and_serving_defaults_outputs(
    fixture: str, request: pytest.FixtureRequest
) -> None:
    predictor = PersistentPredictor(request.getfixturevalue(fixture).path)
    default_out = predictor.output_specs()
    for seq_len in (16, 32, 64):
        specs = predictor.input_specs(f"seq_{seq_len}")
        assert sorted(specs) == sorted(INPUTS)
        assert {s.shape for s in specs.values()} == {(None, seq_len)}
        assert {s.dtype for s in specs.values()} == {np.dtype(np.int32)}
        outputs = predictor.output_specs(f"seq_{seq_len}")
        assert {k: v.dtype for k, v in outputs.items()} == {
            k: v.dtype for k, v in default_out.items()
        }


@pytest.mark.parametrize("fixture", ["classify_v1", "embed_v1"])
@pytest.mark.parametrize("seq_len", [16, 32, 64])
def test_every_bucket_signature_gives_serving_defaults_outputs(
    fixture: str, seq_len: int, request: pytest.FixtureRequest
) -> None:
    predictor = PersistentPredictor(request.getfixturevalue(fixture).path)
    feeds = token_batch(5, seq_len, 303, cls_id=2, sep_id=3, seed=seq_len)
    expected = predictor.predict(feeds)
    got = predictor.predict(feeds, f"seq_{seq_len}")
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, atol=1e-5, rtol=0)


def test_bucket_signatures_run_through_the_tf1_session_loader_tf_serving_uses(  # type: ignore[no-untyped-def]
    classify_v1,
) -> None:
    """TF Serving loads a SavedModelBundle and feeds each signature's own tensors."""
    predictor = PersistentPredictor(classify_v1.path)
    batches = {n: token_batch(4, n, 303, cls_id=2, sep_id=3, seed=7 + n) for n in (16, 32, 64)}
    expected = {n: predictor.predict(feeds) for n, feeds in batches.items()}
    with tf_serving_bundle(classify_v1.path) as bundle:
        feed_names = set()
        for seq_len, feeds in batches.items():
            name = f"seq_{seq_len}"
            feed_names.add(bundle.meta.signature_def[name].inputs["input_ids"].name)
            got = bundle.run(name, feeds)
            for output in ("logits", "probabilities"):
                np.testing.assert_allclose(
                    got[output], expected[seq_len][output], atol=1e-5, rtol=0
                )
        # distinct feed tensors per signature: TF Serving gives each its own batch queue
        feed_names.add(bundle.meta.signature_def["serving_default"].inputs["input_ids"].name)
        assert len(feed_names) == 4


def test_warmup_covers_each_bucket_signature_at_batch_1_8_32(classify_v1) -> None:  # type: ignore[no-untyped-def]
    records = read_warmup_records(classify_v1.path)
    bucketed = [(sig, x["input_ids"].shape) for sig, x in records if sig != "serving_default"]
    assert bucketed == [(f"seq_{n}", (b, n)) for n in (16, 32, 64) for b in BATCH_SIZES]
    predictor = PersistentPredictor(classify_v1.path)
    for signature, feeds in records:
        out = predictor.predict(feeds, signature)
        assert np.isfinite(out["logits"]).all()


def test_warmup_plan_stays_within_tf_servings_record_limit() -> None:
    assert len(warmup_plan(512)) <= MAX_RECORDS
    assert {sig for sig, _, _ in warmup_plan(512)} >= {"serving_default", "seq_512"}
