"""The output kinds' pure post-processing (backend/outputs/): sparse, multi-vector, dense, and
ColBERT's query/document tokenization against PyLate's own."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from backend.outputs import (
    KINDS,
    Options,
    agreement,
    dense,
    multivector,
    reply_numbers,
    reply_outputs,
    sparse,
)
from backend.tokenization import Encoded, TextTokenizer
from modelformat.outputs import (
    DenseOutput,
    MarkerSide,
    MultiVectorOutput,
    Outputs,
    SparseOutput,
)
from modelformat.sparse_idf import encode_queries, read_idf


def _encoded(ids: list[int]) -> Encoded:
    return Encoded(np.asarray(ids, dtype=np.int32), False, len(ids))


def test_token_weights_keep_the_max_per_id_and_drop_specials_and_non_positive() -> None:
    # [CLS]=0 a=7 b=8 a=7 [UNK]=3 c=9 [SEP]=2, then padding
    weights = np.asarray([[0.9, 0.2, 0.0, 0.5, 0.7, -0.1, 0.8, 0.3]], dtype=np.float32)
    (vector,) = sparse.from_token_weights(
        weights, [np.asarray([0, 7, 8, 7, 3, 9, 2])], (0, 1, 2, 3)
    )
    assert vector.indices.tolist() == [7]  # 8 weighs 0, 9 weighs < 0, specials dropped
    assert vector.values.tolist() == pytest.approx([0.5])


def test_token_weights_match_flagembeddings_rule() -> None:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 12, size=30)
    weights = np.maximum(rng.normal(size=(1, 30)), 0).astype(np.float32)
    drop = (0, 1, 2, 3)
    expected: dict[int, float] = {}  # FlagEmbedding's _process_token_weights, written out
    for token, weight in zip(ids.tolist(), weights[0].tolist(), strict=True):
        if token in drop or weight <= 0:
            continue
        expected[token] = max(expected.get(token, 0.0), weight)
    (vector,) = sparse.from_token_weights(weights, [ids], drop)
    assert dict(zip(vector.indices.tolist(), vector.values.tolist(), strict=True)) == (
        pytest.approx(expected)
    )
    assert list(vector.values) == sorted(vector.values, reverse=True)


def test_a_batch_of_token_weights_answers_each_text_as_alone() -> None:
    """The batch is post-processed at once (one sort over (text, id)): each text's vector is
    FlagEmbedding's rule on its own tokens, an all-special or all-zero text empty."""
    rng = np.random.default_rng(3)
    rows = [rng.integers(0, 250_002, size=n) for n in (9, 2, 14, 5)]
    rows[1][:] = [0, 2]  # specials only
    rows[2][3:6] = rows[2][0]  # a repeated id
    weights = np.maximum(rng.normal(size=(4, 16)), 0).astype(np.float32)
    weights[3] = 0.0
    batch = sparse.from_token_weights(weights, rows, (0, 1, 2, 3))
    for row, ids, got in zip(weights, rows, batch, strict=True):
        want: dict[int, float] = {}  # FlagEmbedding's _process_token_weights, written out
        for token, weight in zip(ids.tolist(), row.tolist(), strict=False):
            if token not in (0, 1, 2, 3) and weight > 0:
                want[token] = max(want.get(token, 0.0), weight)
        ranked = sorted(want.items(), key=lambda item: (-item[1], item[0]))
        assert got.indices.tolist() == [token for token, _ in ranked]
        assert got.values.tolist() == [weight for _, weight in ranked]
    assert batch[1].indices.size == batch[3].indices.size == 0 < batch[2].indices.size
    empty = sparse.merge([], [], 2)
    assert [v.indices.size for v in empty] == [0, 0]


def test_topk_drops_zeros_and_limits_apply_top_k_then_min_weight() -> None:
    (vector,) = sparse.from_topk(np.asarray([[5, 9, 2, 0]]), np.asarray([[0.3, 0.9, 0.3, 0.0]]))
    assert vector.indices.tolist() == [9, 2, 5]  # largest first, ties by smaller id
    assert sparse.limit(vector, 2, 0.0).indices.tolist() == [9, 2]
    assert sparse.limit(vector, None, 0.5).indices.tolist() == [9]


def test_windows_merge_by_the_max_per_id() -> None:
    a = sparse.SparseVector(np.asarray([4, 6]), np.asarray([0.5, 0.2], np.float32))
    b = sparse.SparseVector(np.asarray([6, 8]), np.asarray([0.7, 0.1], np.float32))
    merged = sparse.merge([a, b, a], [0, 0, 1], 2)
    assert dict(zip(merged[0].indices.tolist(), merged[0].values.tolist(), strict=True)) == (
        pytest.approx({4: 0.5, 6: 0.7, 8: 0.1})
    )
    assert merged[1].indices.tolist() == [4, 6]


def test_idf_queries_weigh_each_distinct_present_token_once() -> None:
    idf = read_idf({"7": 2.0, "8": 0.5, "2": 0.0}, vocab_size=10)
    (vector,) = sparse.from_idf([np.asarray([0, 7, 8, 7, 2])], idf)
    assert vector.indices.tolist() == [7, 8]
    assert vector.values.tolist() == [2.0, 0.5]
    ((indices, values),) = encode_queries([[0, 7, 8, 7, 2]], [[1] * 5], idf)  # export's rule
    assert indices.tolist() == vector.indices.tolist() and values.tolist() == [2.0, 0.5]


def test_sparse_answers_tokens_as_a_map_and_tei_by_index() -> None:
    vector = sparse.SparseVector(np.asarray([9, 2]), np.asarray([0.9, 0.3], np.float32))
    item = sparse.answer(vector, ["dog", "##s"])
    assert item["tokens"] == pytest.approx({"dog": 0.9, "##s": 0.3})
    assert [e["index"] for e in sparse.tei_answer(vector)] == [2, 9]


def test_after_cls_rows_drop_cls_and_keep_eos() -> None:
    spec = MultiVectorOutput(dim=4, rows="after_cls")
    assert multivector.positions(spec, _encoded([0, 5, 6, 2]), False).tolist() == [1, 2, 3]


def test_colbert_documents_drop_skiplist_ids_and_queries_keep_expansions() -> None:
    query = MarkerSide(prefix_id=50, length=8, expansion_id=4)
    spec = MultiVectorOutput(dim=4, rows="attention", skiplist_ids=(9,), score="sum",
                             query=query, document=MarkerSide(prefix_id=51, length=16))  # fmt: skip
    (doc,) = multivector.mark([_encoded([1, 7, 9, 8, 2])], spec.document, False)  # type: ignore[arg-type]
    assert doc.ids.tolist() == [1, 51, 7, 9, 8, 2]
    assert multivector.positions(spec, doc, False).tolist() == [0, 1, 2, 4, 5]
    (q,) = multivector.mark([_encoded([1, 7, 9, 2])], query, True)
    assert q.ids.tolist() == [1, 50, 7, 9, 2, 4, 4, 4]
    assert q.attention is not None and q.attention.tolist() == [1, 1, 1, 1, 1, 0, 0, 0]
    assert multivector.positions(spec, q, True).tolist() == list(range(8))


def test_maxsim_sums_for_colbert_and_averages_for_bge_m3() -> None:
    q = np.asarray([[1.0, 0.0], [0.0, 1.0]], np.float32)
    d = np.asarray([[1.0, 0.0], [0.6, 0.8]], np.float32)
    assert multivector.maxsim(q, d, "sum") == pytest.approx(1.8)
    assert multivector.maxsim(q, d, "mean") == pytest.approx(0.9)


def test_multivector_answer_bytes_count_rows_times_dims_per_type() -> None:
    spec = MultiVectorOutput(dim=8, rows="after_cls")
    floats = KINDS["multivector"].answer_bytes(spec, [5, 3], Options())
    both = KINDS["multivector"].answer_bytes(spec, [5, 3], Options(types=("float", "int8")))
    assert floats == (4 + 2) * 8 * 16
    assert both == floats + (4 + 2) * 8 * 5
    topk = SparseOutput(form="topk", top_k=64)
    assert KINDS["sparse"].answer_bytes(topk, [5, 300], Options(top_k=10)) == 2 * 10 * 26


def test_base64_answers_are_the_little_endian_bytes_and_counted_as_such() -> None:
    import base64

    from backend.outputs.base import encoded

    matrix = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    item = multivector.answer(matrix, ("float", "int8"), lambda m, t: (m * 100).astype(np.int8),
                              "base64")  # fmt: skip
    assert item["rows"] == 2
    back = np.frombuffer(base64.b64decode(item["vectors"]), "<f4").reshape(2, 3)
    np.testing.assert_array_equal(back, matrix)
    int8 = (matrix * 100).astype("i1")
    assert base64.b64decode(item["vectors_by_type"]["int8"]) == int8.tobytes()
    assert encoded(matrix, "float") is matrix  # orjson writes the array's numbers itself
    answer = {"embeddings": matrix, "embeddings_by_type": {"int8": matrix.astype(np.int8)}}
    dense.encode_answer(answer, "base64")
    assert [np.frombuffer(base64.b64decode(v), "<f4").tolist() for v in answer["embeddings"]] \
        == matrix.tolist()  # fmt: skip
    assert len(answer["embeddings_by_type"]["int8"]) == 2
    spec = MultiVectorOutput(dim=384, rows="after_cls")
    floats = KINDS["multivector"].answer_bytes(spec, [21], Options())
    packed = KINDS["multivector"].answer_bytes(spec, [21], Options(encoding="base64"))
    small = KINDS["multivector"].answer_bytes(spec, [21], Options(types=("int8",),
                                                                  encoding="base64"))  # fmt: skip
    assert packed == 20 * (512 * 4 + 4) and small == 20 * (128 * 4 + 4) and floats > 2.9 * packed


def test_shadow_agreement_is_one_for_the_same_outputs_and_less_for_others() -> None:
    rng = np.random.default_rng(1)
    outputs = {
        "embedding": rng.normal(size=(2, 4)).astype(np.float32),
        "token_weights": np.abs(rng.normal(size=(2, 6))).astype(np.float32),
        "token_vectors": rng.normal(size=(2, 6, 4)).astype(np.float32),
    }
    same = agreement(outputs, outputs)
    assert set(same) == {"cosine", "sparse_overlap", "maxsim"}
    assert all(v == pytest.approx(1.0) for values in same.values() for v in values)
    other = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in outputs.items()}
    assert min(agreement(outputs, other)["maxsim"]) < 0.99
    topk = {"sparse_indices": np.asarray([[3, 4, 5]]), "sparse_values": np.asarray([[3.0, 2, 1]])}
    moved = {"sparse_indices": np.asarray([[3, 9, 8]]), "sparse_values": np.asarray([[3.0, 2, 1]])}
    assert agreement(topk, moved)["sparse_overlap"] == pytest.approx([1 / 3])


def test_dense_pool_weighs_windows_by_their_tokens() -> None:
    vectors = np.asarray([[1.0, 0.0], [0.0, 1.0]], np.float32)
    pooled = dense.pool(vectors, [0, 0], np.asarray([3.0, 1.0], np.float32), 1)
    assert pooled.tolist() == [[0.75, 0.25]]


# -- ColBERT tokenization against PyLate -------------------------------------------------------

TEXTS = ["hello world", "my card was charged twice, and the refund is late!",
         "the quick brown fox jumps over the lazy dog " * 8, "a"]  # fmt: skip


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory: pytest.TempPathFactory, tiny_vocab_file: Path) -> Path:
    """Return a tiny BERT checkpoint with its fast tokenizer (what PyLate builds a ColBERT on)."""
    import transformers

    path = tmp_path_factory.mktemp("colbert") / "ckpt"
    config = transformers.BertConfig(
        vocab_size=len(tiny_vocab_file.read_text().splitlines()), hidden_size=16,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertModel(config).save_pretrained(path)
    transformers.BertTokenizerFast(vocab_file=str(tiny_vocab_file)).save_pretrained(path)
    return path


@pytest.mark.parametrize("expansion", [True, False])
@pytest.mark.parametrize("attend", [False, True])
def test_colbert_query_and_document_tokens_match_pylate(
    colbert_dir: Path, expansion: bool, attend: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from pylate import models as pylate
    from tokenizers import Tokenizer

    model = pylate.ColBERT(
        model_name_or_path=str(colbert_dir), device="cpu", query_length=12, document_length=20,
        do_query_expansion=expansion, attend_to_expansion_tokens=attend,
    )  # fmt: skip
    tokenizer = TextTokenizer(Tokenizer.from_file(str(colbert_dir / "tokenizer.json")),
                              max_seq_len=64)  # fmt: skip
    mask = model.tokenizer.mask_token_id
    spec = MultiVectorOutput(
        dim=16, rows="attention", score="sum",
        skiplist_ids=tuple(model.tokenizer.convert_tokens_to_ids(list(string.punctuation))),
        query=MarkerSide(model.query_prefix_id, 12, mask if expansion else None,
                         attend and expansion),
        document=MarkerSide(model.document_prefix_id, 20),
    )  # fmt: skip
    for is_query in (True, False):
        side = multivector.side_of(spec, is_query)
        assert side is not None
        ours = multivector.mark(
            tokenizer.encode(TEXTS, max_len=multivector.max_tokens(side, 64)), side, is_query
        )
        for text, mine in zip(TEXTS, ours, strict=True):
            theirs = model.tokenize([text], is_query=is_query)
            assert mine.ids.tolist() == theirs["input_ids"][0].tolist(), (text, is_query)
            attention = np.ones_like(mine.ids) if mine.attention is None else mine.attention
            assert attention.tolist() == theirs["attention_mask"][0].tolist(), (text, is_query)


M3_OUTPUTS = Outputs(
    dense=DenseOutput(1024),
    sparse=SparseOutput(form="token_weights"),
    multivector=MultiVectorOutput(dim=1024),
)
M3_SUBSETS = {"dense": ["embedding"], "sparse": ["token_weights"],
              "dense+sparse": ["embedding", "token_weights"]}  # fmt: skip


@pytest.mark.parametrize(
    ("transport", "wanted", "subsets", "holds"),
    [
        ("grpc", ("embedding",), None, ("embedding",)),  # output_filter
        ("rest", ("embedding",), M3_SUBSETS, ("embedding",)),  # serving_default.dense
        ("rest", ("embedding",), None, ("embedding", "token_weights", "token_vectors")),
        ("rest", ("embedding", "token_vectors"), M3_SUBSETS,
         ("embedding", "token_weights", "token_vectors")),  # no subset has both: every output
        ("local", ("embedding",), M3_SUBSETS, ("embedding", "token_weights", "token_vectors")),
        ("grpc", (), None, ("embedding", "token_weights", "token_vectors")),  # asked for all
    ],
)  # fmt: skip
def test_a_reply_holds_what_the_transport_can_narrow_it_to(
    transport: str, wanted: tuple[str, ...], subsets: Any, holds: tuple[str, ...]
) -> None:
    assert set(reply_outputs(M3_OUTPUTS, wanted, transport, subsets)) == set(holds)


def test_a_reply_row_counts_each_outputs_numbers_at_the_padded_length() -> None:
    splade = Outputs(sparse=SparseOutput(form="topk", top_k=64, vocab_size=30522))
    assert reply_numbers(M3_OUTPUTS, ("embedding",), 128) == 1024
    assert reply_numbers(M3_OUTPUTS, ("token_weights",), 128) == 128
    assert reply_numbers(M3_OUTPUTS, ("token_vectors",), 128) == 128 * 1024
    assert reply_numbers(splade, ("sparse_indices", "sparse_values"), 128) == 2 * 64
    # BGE-M3 at 128 tokens: the whole reply is 130x the dense vector's
    every = ("embedding", "token_weights", "token_vectors")
    assert reply_numbers(M3_OUTPUTS, every, 128) == 1024 + 128 + 128 * 1024
