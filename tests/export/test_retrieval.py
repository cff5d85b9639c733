"""Retrieval layouts (export/retrieval.py) give what their own libraries give, on tiny checkpoints.

The parity matrix: layout × architecture × precision. Each tiny random checkpoint is saved by its
own library (export/tiny_retrieval.py: transformers + ``torch.save`` for FlagEmbedding's BGE-M3
heads, PyLate's ``ColBERT.save``, Stanford's ``HF_ColBERT`` files), read by export's readers and
built into export's module in-process (fp32, every architecture), and one checkpoint per layout is
also exported end to end (SavedModel, model.json, the conversion gate; fp32, bf16 and fp16; each
output-subset signature answering its base's outputs), against:

- FlagEmbedding's ``BGEM3FlagModel`` (PyPI ``FlagEmbedding``): dense cosine 1.0; lexical weights
  with the same keys after its rules (max per token id, its special tokens dropped, weights > 0,
  applied here to the ``token_weights`` output with model.json's ``drop_ids``) and values within
  1e-4; ColBERT vectors within 1e-4 (model.json's ``rows: after_cls``);
- PyLate's ``ColBERT`` (PyPI ``pylate``), queries and documents: the same vectors, on the ids its
  own ``tokenize`` gives (prefix, [MASK] expansion); rows as model.json says (a query with
  expansion keeps all of them, a document its attended tokens outside ``skiplist_ids``), and
  model.json's markers equal to PyLate's own (prefix ids, expansion id, skiplist ids, lengths);
- sentence-transformers 6's ``MultiVectorEncoder`` (PyLate absorbed; requirements-st6.txt, run in
  a child process beside the pinned 5.x: tests/export/st6.py), saved by itself: the same
  vectors on the ids its own ``preprocess`` gives, those ids the gateway's (``mark`` on model.json's
  markers), model.json's markers its own; and a PyLate directory written over in 6.x's layout
  (``as_multivector_layout``) reads as the same model wherever 5.x is installed.

bf16 and fp16 rows are held to the dense gate's tolerance (cosine 0.999), not to 1e-4.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from export.errors import ExportError
from export.tiny_retrieval import (
    ARCHITECTURES,
    as_multivector_layout,
    save_m3_checkpoint,
    save_pylate_checkpoint,
    save_stanford_checkpoint,
)

TEXTS = ["where is my order? it is three days late.", "refund, please!",
         "the quick brown fox jumps over the lazy dog; my card was charged twice"]  # fmt: skip
QUERIES = ["where is my order?", "refund"]
SEQ = 32
COLBERT_DIM = 16


def _save_multivector(dest: Path, arch: str) -> Path:
    """Save a MultiVectorEncoder with sentence-transformers 6 itself (tests/export/st6.py)."""
    from tests.export.st6 import answers

    answers("save_multivector", st6=True, dest=str(dest), arch=arch)
    return dest


@pytest.fixture(scope="session")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """Return a function saving (once per session) a layout's tiny checkpoint of ``arch``."""
    where = tmp_path_factory.mktemp("retrieval")
    made: dict[tuple[str, str], Path] = {}
    savers = {"bge-m3": save_m3_checkpoint, "pylate": save_pylate_checkpoint,
              "colbert-v2": save_stanford_checkpoint,
              "multi-vector-encoder": _save_multivector}  # fmt: skip

    def get(layout: str, arch: str) -> Path:
        if (layout, arch) not in made:
            made[layout, arch] = savers[layout](where / f"{layout}-{arch}", arch)
        return made[layout, arch]

    return get


def in_process(path: Path, precision: str = "fp32") -> tuple[Any, Callable[..., dict]]:
    """Return (the layout export reads at ``path``, a function running its serving graph)."""
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run
    from export.retrieval import read_retrieval, retrieval_head

    ckpt = read_checkpoint(path)
    layout = read_retrieval(path, ckpt, "embed", None, 64)
    assert layout is not None
    module = EncoderModule(ckpt.config, ckpt.weights, task="embed", precision=precision,
                           retrieval=retrieval_head(layout))  # fmt: skip

    def serve(input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> dict:
        ids = np.asarray(input_ids)
        types = np.zeros_like(ids) if token_type_ids is None else np.asarray(token_type_ids)
        return run(module.serve, {"input_ids": ids, "attention_mask": np.asarray(attention_mask),
                                  "token_type_ids": types})  # fmt: skip

    return layout, serve


def lexical(weights: np.ndarray, ids: np.ndarray, drop: set[int]) -> dict[str, float]:
    """Return one text's lexical weights by FlagEmbedding's rules (the gateway's, per model.json:
    max per token id, ``drop_ids`` out, weights > 0)."""
    out: dict[str, float] = {}
    for token, weight in zip(ids.tolist(), weights.tolist(), strict=True):
        if token not in drop and weight > 0:
            out[str(token)] = max(out.get(str(token), 0.0), float(weight))
    return out


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1),
                                        1e-12)  # fmt: skip


def m3_figures(path: Path, serve: Callable[..., dict], drop: set[int],
               strict: bool = True) -> dict[str, float]:  # fmt: skip
    """Return the worst differences of ``serve``'s outputs to FlagEmbedding's on TEXTS
    (``strict``: the same lexical keys; else a bf16 graph's weights near 0 may differ)."""
    from FlagEmbedding import BGEM3FlagModel

    model = BGEM3FlagModel(str(path), use_fp16=False, colbert_dim=COLBERT_DIM, devices="cpu",
                           normalize_embeddings=True)  # fmt: skip
    want = model.encode(TEXTS, max_length=SEQ, return_dense=True, return_sparse=True,
                        return_colbert_vecs=True)  # fmt: skip
    enc = model.tokenizer(TEXTS, padding=True, truncation=True, max_length=SEQ,
                          return_tensors="np")  # fmt: skip
    got = serve(enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"))
    figures = {"dense_cos": float(_cosine(got["embedding"], want["dense_vecs"]).min()),
               "lexical_diff": 0.0, "lexical_cos": 1.0,
               "colbert_diff": 0.0, "colbert_cos": 1.0}  # fmt: skip
    keys = 0
    for row in range(len(TEXTS)):
        ours = lexical(got["token_weights"][row], enc["input_ids"][row], drop)
        theirs = {k: float(v) for k, v in want["lexical_weights"][row].items()}
        if strict:
            assert sorted(ours) == sorted(theirs)
        union = sorted(set(ours) | set(theirs))
        a = np.array([ours.get(k, 0.0) for k in union])
        b = np.array([theirs.get(k, 0.0) for k in union])
        keys += len(theirs)
        if union:
            figures["lexical_diff"] = max(figures["lexical_diff"], float(np.abs(a - b).max()))
            figures["lexical_cos"] = min(figures["lexical_cos"], float(_cosine(a, b)))
        n = int(enc["attention_mask"][row].sum())
        rows = got["token_vectors"][row, 1:n]  # rows: after_cls
        assert rows.shape == want["colbert_vecs"][row].shape
        diff = float(np.abs(rows - want["colbert_vecs"][row]).max())
        figures["colbert_diff"] = max(figures["colbert_diff"], diff)
        cos = float(_cosine(rows, want["colbert_vecs"][row]).min())
        figures["colbert_cos"] = min(figures["colbert_cos"], cos)
    assert keys >= len(TEXTS)  # the tiny heads give some positive weights to compare
    return figures


def colbert_figures(path: Path, serve: Callable[..., dict], layout: Any) -> dict[str, float]:
    """Return the worst differences of ``serve``'s outputs to PyLate's (queries, documents), and
    check model.json's markers against PyLate's own."""
    from pylate import models

    model = models.ColBERT(str(path), device="cpu")
    multi = layout.outputs.multivector
    assert set(multi.skiplist_ids) == set(model.skiplist)
    assert multi.query.prefix_id == model.query_prefix_id
    assert multi.document.prefix_id == model.document_prefix_id
    assert multi.query.expansion_id == model.tokenizer.pad_token_id == model.tokenizer.mask_token_id
    assert multi.query.length == model.query_length
    assert multi.document.length == model.document_length
    assert multi.query.attend_to_expansion == model.attend_to_expansion_tokens
    assert (multi.rows, multi.score) == ("attention", "sum")
    figures = {}
    for side, texts in (("query", QUERIES), ("document", TEXTS)):
        is_query = side == "query"
        enc = {k: v.numpy() for k, v in model.tokenize(texts, is_query=is_query).items()}
        want = model.encode(texts, is_query=is_query, convert_to_numpy=True)
        got = serve(enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"))
        worst, cos = 0.0, 1.0
        for row in range(len(texts)):
            if is_query:  # expansion: every position, [MASK]s included
                keep = np.ones(enc["input_ids"].shape[1], bool)
            else:
                keep = enc["attention_mask"][row].astype(bool) & ~np.isin(
                    enc["input_ids"][row], multi.skiplist_ids
                )
            rows = got["token_vectors"][row][keep]
            assert rows.shape == want[row].shape
            worst = max(worst, float(np.abs(rows - want[row]).max()))
            cos = min(cos, float(_cosine(rows, want[row]).min()))
        figures[f"{side}_diff"], figures[f"{side}_cos"] = worst, cos
    return figures


def multivector_figures(path: Path, serve: Callable[..., dict], layout: Any) -> dict[str, float]:
    """Return the worst differences of ``serve``'s outputs to sentence-transformers 6's
    ``MultiVectorEncoder`` (queries, documents: tests/export/st6.py), after checking model.json's
    markers against its own and the gateway's ids (``mark`` on those markers) against its
    ``preprocess``."""
    from tokenizers import Tokenizer

    from backend.outputs import multivector
    from backend.tokenization import TextTokenizer
    from tests.export.st6 import answers

    theirs = answers("multivector", st6=True, path=str(path), queries=QUERIES, documents=TEXTS)
    multi = layout.outputs.multivector
    assert set(multi.skiplist_ids) == set(theirs["skiplist_ids"].tolist())
    assert multi.query.prefix_id == int(theirs["query_prefix_id"])
    assert multi.document.prefix_id == int(theirs["document_prefix_id"])
    assert multi.query.expansion_id == int(theirs["mask_id"])
    assert multi.query.length == int(theirs["query_length"])
    assert multi.query.attend_to_expansion == bool(theirs["attend"])
    assert multi.document.length == int(theirs["document_length"])
    assert str(theirs["score"]) == "maxsim" and (multi.rows, multi.score) == ("attention", "sum")
    gateway = TextTokenizer(Tokenizer.from_file(str(path / "tokenizer.json")), max_seq_len=64)
    figures = {}
    for side, texts in (("query", QUERIES), ("document", TEXTS)):
        is_query = side == "query"
        marker = multivector.side_of(multi, is_query)
        assert marker is not None
        ours = multivector.mark(gateway.encode(texts, max_len=multivector.max_tokens(marker, 64)),
                                marker, is_query)  # fmt: skip
        for i, mine in enumerate(ours):
            assert mine.ids.tolist() == theirs[f"{side}_ids_{i}"].tolist(), (texts[i], side)
            attention = np.ones_like(mine.ids) if mine.attention is None else mine.attention
            assert attention.tolist() == theirs[f"{side}_attention_{i}"].tolist(), (texts[i], side)
        ids, mask = theirs[f"{side}_input_ids"], theirs[f"{side}_attention_mask"]
        got = serve(ids, mask, theirs.get(f"{side}_token_type_ids"))
        worst, cos = 0.0, 1.0
        for row in range(len(texts)):
            if is_query:  # expansion: every position, [MASK]s included
                keep = np.ones(ids.shape[1], bool)
            else:
                keep = mask[row].astype(bool) & ~np.isin(ids[row], multi.skiplist_ids)
            rows, want = got["token_vectors"][row][keep], theirs[f"{side}_want_{row}"]
            assert rows.shape == want.shape
            worst = max(worst, float(np.abs(rows - want).max()))
            cos = min(cos, float(_cosine(rows, want).min()))
        figures[f"{side}_diff"], figures[f"{side}_cos"] = worst, cos
    return figures


M3_ARCHITECTURES = sorted(ARCHITECTURES)
# the multi-vector encoder's matrix: one WordPiece, one BPE and one Unigram tokenizer (the prompt
# is text before the query, so each tokenizer kind must split it off as PyLate inserts its id)
MULTIVECTOR_ARCHITECTURES = ["bert", "modernbert", "xlm-roberta"]


@pytest.mark.parametrize("arch", M3_ARCHITECTURES)
def test_m3_layout_matches_flagembedding(saved: Callable[[str, str], Path], arch: str) -> None:
    path = saved("bge-m3", arch)
    layout, serve = in_process(path)
    figures = m3_figures(path, serve, set(layout.outputs.sparse.drop_ids))
    print(f"parity bge-m3 {arch} fp32 {figures}")
    assert figures["dense_cos"] > 1 - 1e-6
    assert figures["lexical_diff"] <= 1e-4
    assert figures["colbert_diff"] <= 1e-4


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_pylate_layout_matches_pylate(saved: Callable[[str, str], Path], arch: str) -> None:
    path = saved("pylate", arch)
    layout, serve = in_process(path)
    figures = colbert_figures(path, serve, layout)
    print(f"parity pylate {arch} fp32 {figures}")
    assert max(figures["query_diff"], figures["document_diff"]) <= 1e-4


def test_stanford_layout_matches_pylate(saved: Callable[[str, str], Path]) -> None:
    path = saved("colbert-v2", "bert")
    layout, serve = in_process(path)
    assert layout.layout == "colbert-v2"
    figures = colbert_figures(path, serve, layout)
    print(f"parity colbert-v2 bert fp32 {figures}")
    assert max(figures["query_diff"], figures["document_diff"]) <= 1e-4


@pytest.mark.parametrize("arch", MULTIVECTOR_ARCHITECTURES)
def test_multivector_encoder_layout_matches_sentence_transformers(
    saved: Callable[[str, str], Path], arch: str
) -> None:
    path = saved("multi-vector-encoder", arch)
    layout, serve = in_process(path)
    assert layout.layout == "multi-vector-encoder"
    figures = multivector_figures(path, serve, layout)
    print(f"parity multi-vector-encoder {arch} fp32 {figures}")
    assert max(figures["query_diff"], figures["document_diff"]) <= 1e-4


def test_a_pylate_directory_in_the_6x_layout_reads_as_the_same_model(
    saved: Callable[[str, str], Path], tmp_path: Path
) -> None:
    source = saved("pylate", "bert")
    path = as_multivector_layout(source, tmp_path / "st6")
    pylate, serve_pylate = in_process(source)
    layout, serve = in_process(path)
    assert (pylate.layout, layout.layout) == ("pylate", "multi-vector-encoder")
    a, b = pylate.outputs.multivector, layout.outputs.multivector
    assert (a.query, a.document, a.dim, a.score) == (b.query, b.document, b.dim, b.score)
    # PyLate maps a skiplist word that is no token to [UNK]; sentence-transformers 6 drops it
    from tokenizers import Tokenizer

    unk = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id("[UNK]")
    assert set(b.skiplist_ids) == set(a.skiplist_ids) - {unk} and unk in a.skiplist_ids
    ids = np.array([[2, 40, 50, 60, 3], [2, 41, 3, 0, 0]])
    mask = (ids > 0).astype(np.int64)
    np.testing.assert_array_equal(serve(ids, mask)["token_vectors"],
                                  serve_pylate(ids, mask)["token_vectors"])  # fmt: skip
    figures = multivector_figures(path, serve, layout)  # and as sentence-transformers 6 reads it
    assert max(figures["query_diff"], figures["document_diff"]) <= 1e-4


def test_multivector_encoder_settings_that_are_not_served_are_refused(
    saved: Callable[[str, str], Path], tmp_path: Path
) -> None:
    import json
    import shutil

    from export.build import build

    source = as_multivector_layout(saved("pylate", "bert"), tmp_path / "st6")

    def edit(name: str, file: str, change: Callable[[Any], Any]) -> Path:
        dest = tmp_path / name
        shutil.copytree(source, dest)
        (dest / file).write_text(json.dumps(change(json.loads((dest / file).read_text()))))
        return dest

    cases = [
        (edit("min", "sentence_bert_config.json",
              lambda c: {**c, "query_expansion": {**c["query_expansion"], "strategy": "min"}}),
         r"query_expansion .* is not served \(served: strategy fixed"),
        (edit("no-normalize", "modules.json", lambda m: m[:3]),
         r"without its Dense, MultiVectorMask and Normalize is not served"),
        (edit("pooled", "modules.json",
              lambda m: [*m[:3], {**m[3], "type": "sentence_transformers.sentence_transformer."
                                              "modules.pooling.Pooling"}]),
         r"Pooling' after .* is not served in a MultiVectorEncoder"),
        (edit("query-skip", "2_MultiVectorMask/config.json",
              lambda c: {**c, "skiplist_tasks": ["query", "document"]}),
         r"skiplist_tasks \['query', 'document'\] is not served"),
        (edit("text-prompt", "config_sentence_transformers.json",
              lambda c: {**c, "prompts": {"query": "search_query: ", "document": "[D] "}}),
         r"query prefix 'search_query: ' is not a token"),
    ]  # fmt: skip
    for path, message in cases:
        with pytest.raises(ExportError, match=message):
            build(path, "m", tmp_path / "models", task="embed", max_seq_len=SEQ)


def exported(path: Path, base: Path, precision: str) -> tuple[dict, Callable[..., dict]]:
    """Export ``path`` as ``python -m export build`` does; return (model.json, a function running
    its ``seq_32`` bucket signature, padded to 32, after checking serving_default agrees)."""
    import tensorflow as tf

    from export.build import build
    from export.gates import Tolerance
    from export.model import run

    # bf16 where the CPU has no native bf16 (AVX2: TensorFlow's emulated kernels) moves the tiny
    # random PyLate model's worst token vector of the gate's probe to cosine 0.9988 (>= 0.999
    # on AVX-512 with avx512_bf16): these random weights' gate, as test_architectures.py's
    # 16-bit rows have theirs; the parity below still holds each kind to 0.999
    tolerance = Tolerance(min_cosine=0.998) if precision == "bf16" else None
    result = build(path, "m", base, task="embed", precision=precision, max_seq_len=SEQ,
                   warmup=False, tolerance=tolerance)  # fmt: skip
    loaded = tf.saved_model.load(str(result.path))

    def serve(input_ids: Any, attention_mask: Any, token_type_ids: Any = None) -> dict:
        ids = np.asarray(input_ids)
        pad = SEQ - ids.shape[1]
        feeds = {"input_ids": ids, "attention_mask": np.asarray(attention_mask),
                 "token_type_ids": np.zeros_like(ids) if token_type_ids is None
                 else np.asarray(token_type_ids)}  # fmt: skip
        padded = {k: np.pad(v, [(0, 0), (0, pad)]) for k, v in feeds.items()}
        plain = run(loaded.signatures["serving_default"], feeds)
        bucket = run(loaded.signatures["seq_32"], padded)
        for suffix, names in result.model_info.get("kind_signatures", {}).items():
            for base, fed, full in (("serving_default", feeds, plain), ("seq_32", padded, bucket)):
                narrow = run(loaded.signatures[f"{base}.{suffix}"], fed)  # its outputs, the same
                assert sorted(narrow) == sorted(names), (suffix, sorted(narrow))
                for name in names:
                    np.testing.assert_array_equal(narrow[name], full[name])
        for name, value in plain.items():  # the bucket answers the same on the real positions
            cut = value if name == "embedding" else bucket[name][:, : ids.shape[1]]
            np.testing.assert_allclose(bucket[name] if name == "embedding" else cut, value,
                                       atol=2e-5 if precision == "fp32" else 2e-2)  # fmt: skip
        return plain

    return result.model_info, serve


# an export's precisions: each held to the dense conversion gate's bounds (cosine 0.999) on
# every kind beside fp32's 1e-4 (the dense fp16/bf16 exports' tolerances: test_architectures.py)
PRECISIONS = ("fp32", "bf16", "fp16")


@pytest.mark.parametrize("precision", PRECISIONS)
def test_m3_export(saved: Callable[[str, str], Path], tmp_path: Path, precision: str) -> None:
    from modelformat.outputs import parse_outputs

    path = saved("bge-m3", "xlm-roberta")
    layout, _ = in_process(path)
    info, serve = exported(path, tmp_path, precision)
    assert info["retrieval_layout"] == "bge-m3" and info["pooling"] == "cls"
    assert parse_outputs(info) == layout.outputs
    assert info["outputs"]["sparse"]["drop_ids"] == [0, 1, 2, 3]  # <s> <pad> </s> <unk>
    assert info["kind_signatures"] == {  # each signature narrowed to each subset of the kinds
        "dense": ["embedding"], "sparse": ["token_weights"], "multivector": ["token_vectors"],
        "dense+sparse": ["embedding", "token_weights"],
        "dense+multivector": ["embedding", "token_vectors"],
        "sparse+multivector": ["token_weights", "token_vectors"],
    }  # fmt: skip
    conversion = info["conversion"]
    assert {"min_cosine", "min_token_cosine", "min_token_weight_cosine"} <= set(conversion)
    figures = m3_figures(path, serve, set(layout.outputs.sparse.drop_ids),
                         strict=precision == "fp32")  # fmt: skip
    print(f"parity bge-m3 xlm-roberta {precision} (SavedModel) {figures}")
    if precision == "fp32":
        assert figures["dense_cos"] > 1 - 1e-6
        assert max(figures["lexical_diff"], figures["colbert_diff"]) <= 1e-4
    else:  # the conversion gate's bounds, on each kind
        assert min(figures["dense_cos"], figures["colbert_cos"]) >= 0.999
        assert figures["lexical_cos"] >= 0.99


@pytest.mark.parametrize("precision", PRECISIONS)
def test_pylate_export(saved: Callable[[str, str], Path], tmp_path: Path, precision: str) -> None:
    from modelformat.outputs import parse_outputs

    path = saved("pylate", "bert")
    layout, _ = in_process(path)
    info, serve = exported(path, tmp_path, precision)
    assert info["retrieval_layout"] == "pylate" and info["pooling"] == "none"
    assert "embedding_dim" not in info and "dense" not in info["outputs"]
    assert "kind_signatures" not in info  # one kind: nothing to narrow
    assert parse_outputs(info) == layout.outputs
    figures = colbert_figures(path, serve, layout)
    print(f"parity pylate bert {precision} (SavedModel) {figures}")
    if precision == "fp32":
        assert max(figures["query_diff"], figures["document_diff"]) <= 1e-4
    else:
        assert min(figures["query_cos"], figures["document_cos"]) >= 0.999


def test_a_drifting_conversion_is_refused(saved: Callable[[str, str], Path]) -> None:
    from export.gates import Tolerance, measure, within

    path = saved("bge-m3", "xlm-roberta")
    _, serve = in_process(path)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (4, 12))
    want = serve(ids, np.ones_like(ids))
    assert within(measure(want, want), Tolerance())
    for name, scale in (("token_vectors", 0.05), ("token_weights", 0.3), ("embedding", 0.05)):
        drifted = {**want, name: want[name] + rng.normal(0, scale, want[name].shape)}
        figures = measure(want, drifted.copy())
        assert not within(figures, Tolerance()), (name, figures)


def _copy(path: Path, dest: Path, skip: str) -> Path:
    import shutil

    shutil.copytree(path, dest, ignore=shutil.ignore_patterns(skip))
    return dest


def test_broken_layouts_are_refused(saved: Callable[[str, str], Path], tmp_path: Path) -> None:
    import torch

    from export.build import build

    m3 = saved("bge-m3", "bert")
    for name in ("sparse_linear.pt", "colbert_linear.pt"):
        broken = _copy(m3, tmp_path / f"without-{name}", name)
        with pytest.raises(ExportError, match=rf"{name} missing.*needs both"):
            build(broken, "m", tmp_path / "models", task="embed")
    wrong = _copy(m3, tmp_path / "wrong-shape", "sparse_linear.pt")
    torch.save(torch.nn.Linear(32, 2).state_dict(), wrong / "sparse_linear.pt")
    with pytest.raises(ExportError, match=r"sparse_linear.pt: weight has shape \[2, 32\]"):
        build(wrong, "m", tmp_path / "models", task="embed")
    code = _copy(m3, tmp_path / "a-module", "colbert_linear.pt")
    torch.save(torch.nn.Linear(32, 16), code / "colbert_linear.pt")  # a pickled module, not data
    with pytest.raises(ExportError, match=r"colbert_linear.pt: refused: global torch.nn"):
        build(code, "m", tmp_path / "models", task="embed")
    with pytest.raises(ExportError, match=r"--outputs asks for dense but its pylate layout"):
        build(saved("pylate", "bert"), "m", tmp_path / "models", task="embed", outputs="dense")
    plain = _copy(m3, tmp_path / "plain", "*.pt")
    with pytest.raises(ExportError, match=r"--outputs asks for sparse but no sparse_linear.pt"):
        build(plain, "m", tmp_path / "models", task="embed", outputs="dense,sparse")
    with pytest.raises(ExportError, match=r"not --pooling mean"):
        build(m3, "m", tmp_path / "models", task="embed", pooling="mean")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_state_dicts_are_read_without_torch(tmp_path: Path, dtype: str) -> None:
    import torch

    from export.torch_pickle import read_state_dict

    linear = torch.nn.Linear(8, 3)
    state = {"weight": linear.weight.detach().to(getattr(torch, dtype)),
             "bias": linear.bias.detach().to(getattr(torch, dtype)),
             "strided": linear.weight.detach().t().to(getattr(torch, dtype))}  # fmt: skip
    torch.save(state, tmp_path / "h.pt")
    got = read_state_dict(tmp_path / "h.pt")
    for name, value in state.items():
        np.testing.assert_array_equal(got[name].astype(np.float32), value.float().numpy())


def test_outputs_narrow_what_the_graph_answers(saved: Callable[[str, str], Path]) -> None:
    from export.checkpoint import read_checkpoint
    from export.model import EncoderModule, run
    from export.retrieval import read_retrieval, retrieval_head

    path = saved("bge-m3", "bert")
    ckpt = read_checkpoint(path)
    layout = read_retrieval(path, ckpt, "embed", ("dense", "multivector"), 64)
    assert layout is not None and layout.outputs.kinds == ("dense", "multivector")
    module = EncoderModule(ckpt.config, ckpt.weights, task="embed",
                           retrieval=retrieval_head(layout))  # fmt: skip
    ids = np.array([[2, 40, 50, 3]])
    out = run(module.serve, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                             "token_type_ids": np.zeros_like(ids)})  # fmt: skip
    assert sorted(out) == ["embedding", "token_vectors"]
