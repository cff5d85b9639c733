"""Length bucketing, chunking and reassembly in the caller's order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.bucketing import Chunk, pad_batch, plan_chunks, reassemble
from modelformat.buckets import bucket_for, buckets


def test_buckets_double_from_16_up_to_max_seq_len() -> None:
    assert buckets(128) == [16, 32, 64, 128]
    assert buckets(100) == [16, 32, 64, 100]
    assert buckets(8) == [8]


@pytest.mark.parametrize(("length", "bucket"), [(1, 16), (16, 16), (17, 32), (65, 128), (128, 128)])
def test_bucket_for_picks_the_smallest_that_fits(length: int, bucket: int) -> None:
    assert bucket_for(length, 128) == bucket


def test_chunks_are_sorted_by_length_and_padded_to_their_bucket() -> None:
    lengths = [100, 5, 40, 6, 7, 120]

    chunks = plan_chunks(lengths, max_batch=2, max_seq_len=128)

    assert [c.indices for c in chunks] == [(1, 3), (4, 2), (0, 5)]
    assert [c.seq_len for c in chunks] == [16, 64, 128]


def test_without_bucketing_chunks_keep_order_and_pad_to_their_longest() -> None:
    chunks = plan_chunks([100, 5, 40, 300], max_batch=2, max_seq_len=128, bucketing=False)

    assert [c.indices for c in chunks] == [(0, 1), (2, 3)]
    assert [c.seq_len for c in chunks] == [100, 128]


def test_pad_batch_builds_the_three_int32_inputs() -> None:
    batch = pad_batch([np.array([2, 9, 3], np.int32), np.array([2, 3], np.int32)], 4, pad_id=0)

    np.testing.assert_array_equal(batch["input_ids"], [[2, 9, 3, 0], [2, 3, 0, 0]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 0], [1, 1, 0, 0]])
    assert batch["token_type_ids"].dtype == np.int32 and not batch["token_type_ids"].any()


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=2, max_value=300), min_size=1, max_size=80),
    max_batch=st.integers(min_value=1, max_value=17),
    bucketing=st.booleans(),
)
def test_every_text_is_sent_once_and_comes_back_in_caller_order(
    lengths: list[int], max_batch: int, bucketing: bool
) -> None:
    chunks = plan_chunks(lengths, max_batch, 128, bucketing=bucketing)
    # A fake model that returns each row's own index, so reassembly order is visible.
    outputs = [{"row": np.asarray(c.indices, dtype=np.int64)[:, None]} for c in chunks]

    merged = reassemble(chunks, outputs, len(lengths))

    assert sorted(i for c in chunks for i in c.indices) == list(range(len(lengths)))
    assert all(len(c.indices) <= max_batch for c in chunks)
    assert all(min(lengths[i], 128) <= c.seq_len <= 128 for c in chunks for i in c.indices)
    np.testing.assert_array_equal(merged["row"][:, 0], np.arange(len(lengths)))


@pytest.mark.parametrize(
    ("length", "bucket"), [(1, 16), (16, 16), (17, 32), (33, 100), (100, 100), (110, 128)]
)
def test_a_models_own_bucket_lengths_replace_the_doubling_rule(length: int, bucket: int) -> None:
    assert bucket_for(length, 128, lengths=[32, 16, 100]) == bucket


def test_chunks_pad_to_the_models_bucket_lengths_when_it_has_them() -> None:
    chunks = plan_chunks([3, 40, 20], max_batch=1, max_seq_len=100, bucket_lens=[16, 32, 64, 100])
    assert [c.seq_len for c in chunks] == [16, 32, 64]
    chunks = plan_chunks([3, 40], max_batch=1, max_seq_len=100, bucket_lens=[16, 48, 100])
    assert [c.seq_len for c in chunks] == [16, 48]


@settings(max_examples=300, deadline=None)
@given(
    max_seq_len=st.integers(2, 512),
    model_buckets=st.one_of(st.none(), st.lists(st.integers(1, 512), min_size=1, max_size=6)),
    data=st.data(),
)
def test_a_bucket_never_cuts_a_text(
    max_seq_len: int, model_buckets: list[int] | None, data: st.DataObject
) -> None:
    # Texts arrive truncated to max_seq_len; a model's buckets may stop short of it.
    length = data.draw(st.integers(1, max_seq_len))
    assert bucket_for(length, max_seq_len, lengths=model_buckets) >= length


@pytest.mark.parametrize(
    ("second", "match"),
    [
        pytest.param({"logits": np.ones((2, 3), np.float32)}, "signatures disagree", id="missing"),
        pytest.param(
            {"logits": np.ones((2, 3)), "probabilities": np.ones((1, 3))}, "shape", id="one-row"
        ),
    ],
)
def test_chunks_whose_outputs_disagree_are_a_502_not_garbage_rows(
    second: dict[str, np.ndarray], match: str
) -> None:
    from backend.errors import UpstreamError

    chunks = [Chunk(indices=(0,), seq_len=16), Chunk(indices=(1, 2), seq_len=32)]
    first = {"logits": np.zeros((1, 3), np.float32), "probabilities": np.zeros((1, 3), np.float32)}

    with pytest.raises(UpstreamError, match=match):
        reassemble(chunks, [first, second], 3)


def test_one_chunk_in_caller_order_is_returned_as_is_but_still_checked() -> None:
    from backend.errors import UpstreamError

    chunk = Chunk(indices=(0, 1), seq_len=16)
    outputs = {"probabilities": np.arange(6, dtype=np.float32).reshape(2, 3)}
    merged = reassemble([chunk], [outputs], 2)
    assert merged["probabilities"] is outputs["probabilities"]
    with pytest.raises(UpstreamError, match="shape"):
        reassemble([chunk], [{"probabilities": np.ones((1, 3), np.float32)}], 2)


def test_retrieval_token_outputs_are_padded_across_buckets_and_the_pooled_one_not() -> None:
    chunks = [Chunk(indices=(1,), seq_len=16), Chunk(indices=(0,), seq_len=32)]
    outputs = [
        {"embedding": np.ones((1, 8), np.float32), "token_weights": np.ones((1, 16), np.float32),
         "token_vectors": np.ones((1, 16, 4), np.float32)},
        {"embedding": np.ones((1, 8), np.float32), "token_weights": np.ones((1, 32), np.float32),
         "token_vectors": np.ones((1, 32, 4), np.float32)},
    ]  # fmt: skip

    merged = reassemble(chunks, outputs, 2, token_outputs=("token_weights", "token_vectors"))

    assert merged["embedding"].shape == (2, 8)
    assert merged["token_weights"].shape == (2, 32) and merged["token_vectors"].shape == (2, 32, 4)
    assert merged["token_weights"][1, 16:].sum() == 0 and merged["token_weights"][0].sum() == 32
