"""Retrieval layouts: BGE-M3's dense + sparse + multi-vector heads, and ColBERT's token vectors.

An ``embed`` export of one of these layouts answers the kinds of modelformat/outputs.py from one
forward pass (one signature: ``serving_default`` and every ``seq_<L>`` bucket):

- ``bge-m3`` (FlagEmbedding's ``BGEM3FlagModel``): the encoder directory with
  ``sparse_linear.pt`` (``nn.Linear(hidden, 1)``'s state_dict) and ``colbert_linear.pt``
  (``nn.Linear(hidden, d)``) beside it, read without torch (export/torch_pickle.py). Both must be
  there with the right shapes: FlagEmbedding leaves *both* heads random, with an info-level log
  line, when either is missing; export refuses instead. Outputs: ``embedding`` (CLS,
  L2-normalized), ``token_weights`` ``relu(sparse_linear(h)) * mask`` and ``token_vectors``
  ``l2normalize(colbert_linear(h) * mask)`` at every position (model.json's ``rows: after_cls``:
  the gateway drops CLS and keeps the final EOS, FlagEmbedding's rows).
- ``pylate`` (a PyLate ``ColBERT`` directory: export/sentence_modules.py reads its Dense
  projections and settings) and ``colbert-v2`` (Stanford's ``HF_ColBERT``: ``linear.weight`` in
  the encoder's own weights file, ``artifact.metadata`` for the markers): ``token_vectors``
  ``l2normalize(projection(h))`` at every position, not masked (a query's ``[MASK]`` expansion
  positions have attention 0 yet keep their vectors), no dense vector; model.json says the
  markers (prefix ids, lengths, expansion id) the gateway tokenizes with, the skiplist, and that
  MaxSim sums.
- ``multi-vector-encoder`` (sentence-transformers 6's ``MultiVectorEncoder``, PyLate absorbed:
  export/sentence_modules.py reads it): the same outputs as ``pylate``, its markers the
  ``query``/``document`` prompts (each one token of the tokenizer, as PyLate's prefixes), its
  lengths and expansion the Transformer's, its skiplist the MultiVectorMask's (words that are not
  a token dropped, as it resolves them), MaxSim summed (``maxsim``) or averaged (``meanmaxsim``).

The layout is found from the checkpoint's own files (as modules.json decides an embedding's
pooling); ``--outputs`` narrows the kinds served, and names what a checkpoint must give (an
export asked for ``sparse`` of a directory without FlagEmbedding's heads is refused, never served
as a plain encoder).
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from export.checkpoint import Checkpoint
from export.errors import ExportError
from export.sentence_modules import (
    DenseLayer,
    is_multivector_encoder,
    is_pylate,
    read_multivector_modules,
    read_pylate_modules,
)
from modelformat.outputs import (
    KINDS,
    DenseOutput,
    MarkerSide,
    MultiVectorOutput,
    Outputs,
    SparseOutput,
)

SPARSE_FILE = "sparse_linear.pt"
COLBERT_FILE = "colbert_linear.pt"
STANFORD_METADATA = "artifact.metadata"
# FlagEmbedding's lexical weights drop these special tokens' ids (m3.py _process_token_weights)
M3_DROPPED = ("cls_token", "eos_token", "pad_token", "unk_token")
# Stanford ColBERT's defaults (colbert/infra/config/settings.py) where artifact.metadata is silent
STANFORD_DEFAULTS: dict[str, Any] = {
    "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 32,
    "doc_maxlen": 220, "attend_to_mask_tokens": False, "mask_punctuation": True,
}  # fmt: skip


@dataclass
class RetrievalLayout:
    """A retrieval checkpoint's heads and model.json's ``outputs`` entry."""

    layout: str  # bge-m3, pylate, multi-vector-encoder, colbert-v2
    outputs: Outputs
    sparse: DenseLayer | None = None  # bge-m3: hidden -> 1, relu
    projection: list[DenseLayer] = field(default_factory=list)  # hidden -> d (ColBERT's linear)
    mask_vectors: bool = False  # bge-m3: token vectors times the attention mask
    files: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """Return the progress line's description."""
        dims = " -> ".join(str(d.kernel.shape[1]) for d in self.projection)
        kinds = "+".join(self.outputs.kinds)
        vectors = f", token vectors {dims}" if dims else ""
        return f"{self.layout} layout ({', '.join(self.files)}): outputs {kinds}{vectors}"


def parse_kinds(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """Return the kinds of an ``--outputs`` value (comma-separated), None when not given."""
    if text is None:
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    kinds = tuple(k.strip() for k in items if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ExportError(f"--outputs must list some of {list(KINDS)}, got {text!r}")
    return tuple(k for k in KINDS if k in kinds)


def read_retrieval(
    checkpoint: str | Path, ckpt: Checkpoint, task: str, kinds: Sequence[str] | None,
    max_seq_len: int,
) -> RetrievalLayout | None:  # fmt: skip
    """Return the retrieval layout of ``checkpoint`` (None: a plain encoder, dense only).

    ``kinds`` (``--outputs``) narrows what is served and must be what the layout has.
    """
    path = Path(checkpoint)
    if task != "embed" or not path.is_dir():
        if kinds is not None and tuple(kinds) != ("dense",):
            raise ExportError(f"--outputs {','.join(kinds)} needs --task embed and a checkpoint "
                              "directory (FlagEmbedding's BGE-M3 or a ColBERT)")  # fmt: skip
        return None
    found: RetrievalLayout | None
    if (path / SPARSE_FILE).exists() or (path / COLBERT_FILE).exists():
        found = _read_m3(path, ckpt)
    elif is_pylate(path):
        found = _read_pylate(path, ckpt, max_seq_len)
    elif is_multivector_encoder(path):
        found = _read_multivector(path, ckpt, max_seq_len)
    elif "HF_ColBERT" in (ckpt.head_config.get("architectures") or []):
        found = _read_stanford(path, ckpt, max_seq_len)
    else:
        found = None
    if kinds is None:
        return found
    have = found.outputs.kinds if found is not None else ("dense",)
    missing = [k for k in kinds if k not in have]
    if missing:
        what = (f"its {found.layout} layout gives {'+'.join(have)}" if found is not None else
                f"no {SPARSE_FILE} / {COLBERT_FILE} (FlagEmbedding's BGE-M3 heads) and no "
                "ColBERT projection (PyLate's modules.json, Stanford's HF_ColBERT) were found: "
                "dense only")  # fmt: skip
        raise ExportError(f"{path}: --outputs asks for {'+'.join(missing)} but {what}")
    if found is None:
        return None
    picked = {k: getattr(found.outputs, k) if k in kinds else None for k in KINDS}
    return replace(found, outputs=Outputs(**picked))


def _linear(path: Path, width: int, out: int | None) -> DenseLayer:
    """Return the ``nn.Linear`` state_dict at ``path`` (input ``width``; ``out`` outputs if
    given) as a DenseLayer; ExportError naming the file for anything else."""
    from export.torch_pickle import read_state_dict

    state = read_state_dict(path)
    weight, bias = state.get("weight"), state.get("bias")
    if weight is None or set(state) - {"weight", "bias"}:
        raise ExportError(f"{path}: expected an nn.Linear state_dict (weight, bias), got "
                          f"{sorted(state)}")  # fmt: skip
    rows = out if out is not None else (weight.shape[0] if weight.ndim == 2 else -1)
    if weight.shape != (rows, width) or (bias is not None and bias.shape != (rows,)):
        raise ExportError(
            f"{path}: weight has shape {list(weight.shape)}"
            + (f" and bias {list(bias.shape)}" if bias is not None else "")
            + f", expected [{'d' if out is None else out}, {width}] (nn.Linear({width}, "
            f"{'d' if out is None else out}))"
        )
    return DenseLayer(kernel=np.ascontiguousarray(weight.T, np.float32),
                      bias=None if bias is None else np.asarray(bias, np.float32),
                      activation="identity")  # fmt: skip


def _tokenizer(ckpt: Checkpoint) -> Any:
    from tokenizers import Tokenizer

    if ckpt.tokenizer is None:
        raise ExportError("a retrieval layout needs the checkpoint's tokenizer")
    return Tokenizer.from_str(ckpt.tokenizer.json_text)


def _special_id(ckpt: Checkpoint, tokenizer: Any, key: str) -> int | None:
    """Return the id of the special token ``key`` (``mask_token`` ...), None if it has none."""
    assert ckpt.tokenizer is not None
    name = ckpt.tokenizer.entry.get("special_tokens", {}).get(key)
    return None if name is None else tokenizer.token_to_id(name)


def _read_m3(path: Path, ckpt: Checkpoint) -> RetrievalLayout:
    missing = [n for n in (SPARSE_FILE, COLBERT_FILE) if not (path / n).is_file()]
    if missing:
        raise ExportError(
            f"{path}: {' and '.join(missing)} missing beside config.json: FlagEmbedding's BGE-M3 "
            f"layout needs both {SPARSE_FILE} and {COLBERT_FILE} (without either, FlagEmbedding "
            "leaves both heads random); not exported"
        )
    hidden = ckpt.config.hidden_size
    sparse = _linear(path / SPARSE_FILE, hidden, 1)
    colbert = _linear(path / COLBERT_FILE, hidden, None)
    if sparse.bias is None:
        raise ExportError(f"{path / SPARSE_FILE}: missing tensor bias")
    tokenizer = _tokenizer(ckpt)
    drop = sorted({i for k in M3_DROPPED if (i := _special_id(ckpt, tokenizer, k)) is not None})
    dim = int(colbert.kernel.shape[1])
    outputs = Outputs(
        dense=DenseOutput(dim=hidden, normalized=True),
        sparse=SparseOutput(form="token_weights", drop_ids=tuple(drop)),
        multivector=MultiVectorOutput(dim=dim, normalized=True, rows="after_cls", score="mean"),
    )
    return RetrievalLayout("bge-m3", outputs, sparse=sparse, projection=[colbert],
                           mask_vectors=True, files=[SPARSE_FILE, COLBERT_FILE])  # fmt: skip


def _token_id(tokenizer: Any, token: str | None, where: Path, what: str) -> int | None:
    """Return the id of a marker token (None for no marker); ExportError if the tokenizer lacks
    it (PyLate adds its prefixes to the tokenizer it saves)."""
    if not token:
        return None
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ExportError(f"{where}: {what} {token!r} is not a token of the checkpoint's "
                          "tokenizer.json")  # fmt: skip
    return int(found)


def _skiplist(tokenizer: Any, words: Sequence[str], unk: int | None) -> tuple[int, ...]:
    """Return the skiplist's ids as PyLate computes them (``convert_tokens_to_ids``: a word that
    is not a token maps to the unknown token's id; ``unk`` None: it is dropped, as
    sentence-transformers 6's MultiVectorMask drops it)."""
    ids = {found if (found := tokenizer.token_to_id(w)) is not None else unk for w in words}
    return tuple(sorted(int(i) for i in ids if i is not None))


def _colbert_outputs(ckpt: Checkpoint, tokenizer: Any, where: Path, dim: int, *,
                     query_prefix: str | None, document_prefix: str | None, query_length: int,
                     document_length: int, expansion: bool, attend: bool,
                     skiplist: Sequence[str], max_seq_len: int,
                     expansion_token: str | None = None, score: str = "sum",
                     unknown_skipped: bool = True) -> Outputs:  # fmt: skip
    if query_length > max_seq_len:
        raise ExportError(
            f"{where}: query length {query_length} exceeds max_seq_len {max_seq_len}: export "
            f"with --max-seq-len {query_length} or more"
        )
    mask = _special_id(ckpt, tokenizer, "mask_token")
    if expansion_token is not None:
        mask = _token_id(tokenizer, expansion_token, where, "query expansion token")
    elif mask is None:  # PyLate pads queries with EOS when there is no mask token
        mask = _special_id(ckpt, tokenizer, "eos_token")
    if expansion and mask is None:
        raise ExportError(f"{where}: query expansion needs a mask (or EOS) token in the tokenizer")
    unk = _special_id(ckpt, tokenizer, "unk_token")
    query = MarkerSide(
        prefix_id=_token_id(tokenizer, query_prefix, where, "query prefix"), length=query_length,
        expansion_id=mask if expansion else None, attend_to_expansion=attend,
    )  # fmt: skip
    document = MarkerSide(
        prefix_id=_token_id(tokenizer, document_prefix, where, "document prefix"),
        length=min(document_length, max_seq_len),
    )  # fmt: skip
    return Outputs(multivector=MultiVectorOutput(
        dim=dim, normalized=True, rows="attention", score=score,
        skiplist_ids=_skiplist(tokenizer, skiplist, unk if unknown_skipped else None),
        query=query, document=document,
    ))  # fmt: skip


def _read_pylate(path: Path, ckpt: Checkpoint, max_seq_len: int) -> RetrievalLayout:
    modules = read_pylate_modules(path, ckpt.config.hidden_size)
    s = modules.settings
    outputs = _colbert_outputs(
        ckpt, _tokenizer(ckpt), path / "config_sentence_transformers.json",
        int(modules.dense[-1].kernel.shape[1]), query_prefix=s["query_prefix"],
        document_prefix=s["document_prefix"], query_length=int(s["query_length"]),
        document_length=int(s["document_length"]), expansion=bool(s["do_query_expansion"]),
        attend=bool(s["attend_to_expansion_tokens"]), skiplist=s["skiplist_words"],
        max_seq_len=max_seq_len,
    )  # fmt: skip
    return RetrievalLayout("pylate", outputs, projection=modules.dense,
                           files=["modules.json", "config_sentence_transformers.json"])  # fmt: skip


def _read_multivector(path: Path, ckpt: Checkpoint, max_seq_len: int) -> RetrievalLayout:
    modules = read_multivector_modules(path, ckpt.config.hidden_size)
    s = modules.settings
    outputs = _colbert_outputs(
        ckpt, _tokenizer(ckpt), path / "config_sentence_transformers.json",
        int(modules.dense[-1].kernel.shape[1]), query_prefix=s["query_prefix"],
        document_prefix=s["document_prefix"], query_length=s["query_length"] or max_seq_len,
        document_length=s["document_length"] or max_seq_len,
        expansion=bool(s["do_query_expansion"]), attend=bool(s["attend_to_expansion_tokens"]),
        skiplist=s["skiplist_words"], max_seq_len=max_seq_len,
        expansion_token=s["expansion_token"], score=s["score"], unknown_skipped=False,
    )  # fmt: skip
    files = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"]
    return RetrievalLayout("multi-vector-encoder", outputs, projection=modules.dense,
                           files=files)  # fmt: skip


def _read_stanford(path: Path, ckpt: Checkpoint, max_seq_len: int) -> RetrievalLayout:
    from safetensors import safe_open

    weights = path / "model.safetensors"
    with safe_open(str(weights), framework="numpy") as handle:
        if "linear.weight" not in set(handle.keys()):
            raise ExportError(f"{weights}: missing tensor linear.weight (HF_ColBERT's projection)")
        kernel = np.asarray(handle.get_tensor("linear.weight"), np.float32)
    hidden = ckpt.config.hidden_size
    if kernel.ndim != 2 or kernel.shape[1] != hidden:
        raise ExportError(f"{weights}: linear.weight has shape {list(kernel.shape)}, expected "
                          f"[dim, {hidden}]")  # fmt: skip
    meta_path = path / STANFORD_METADATA
    meta: dict[str, Any] = {}
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportError(f"cannot read {meta_path}: {exc}") from exc
        if not isinstance(meta, dict):
            raise ExportError(f"{meta_path}: expected a JSON object")
    m: dict[str, Any] = {k: meta[k] if meta.get(k) is not None else v
                         for k, v in STANFORD_DEFAULTS.items()}  # fmt: skip
    layer = DenseLayer(kernel=np.ascontiguousarray(kernel.T), bias=None, activation="identity")
    outputs = _colbert_outputs(
        ckpt, _tokenizer(ckpt), meta_path, int(kernel.shape[0]),
        query_prefix=str(m["query_token_id"]), document_prefix=str(m["doc_token_id"]),
        query_length=int(m["query_maxlen"]), document_length=int(m["doc_maxlen"]),
        expansion=True, attend=bool(m["attend_to_mask_tokens"]),
        skiplist=list(string.punctuation) if m["mask_punctuation"] else [],
        max_seq_len=max_seq_len,
    )  # fmt: skip
    files = ["model.safetensors linear.weight", STANFORD_METADATA]
    return RetrievalLayout("colbert-v2", outputs, projection=[layer], files=files)


def retrieval_head(layout: RetrievalLayout) -> Any:
    """Return the graph's head for ``layout`` (a ``tf.Module``: hidden, mask -> outputs)."""
    import tensorflow as tf

    from export.sentence_head import apply_dense

    outputs = layout.outputs

    class RetrievalHead(tf.Module):
        """The retrieval outputs of the last hidden states, in float32 (like SentenceHead)."""

        def __init__(self) -> None:
            super().__init__(name="retrieval_head")
            self.sparse = None if layout.sparse is None or outputs.sparse is None else (
                tf.Variable(layout.sparse.kernel, trainable=False, name="sparse_kernel"),
                tf.Variable(layout.sparse.bias, trainable=False, name="sparse_bias"),
            )  # fmt: skip
            self.projection = [
                (tf.Variable(d.kernel, trainable=False, name=f"colbert_{i}_kernel"),
                 None if d.bias is None else tf.Variable(d.bias, trainable=False,
                                                         name=f"colbert_{i}_bias"),
                 d.activation)
                for i, d in enumerate(layout.projection if outputs.multivector else [])
            ]  # fmt: skip

        def __call__(self, hidden: Any, attention_mask: Any) -> dict[str, Any]:
            mask = tf.cast(attention_mask, tf.float32)
            out: dict[str, Any] = {}
            if outputs.dense is not None:  # FlagEmbedding: CLS, normalized
                out["embedding"] = tf.math.l2_normalize(hidden[:, 0], axis=-1, epsilon=1e-24)
            if self.sparse is not None:
                kernel, bias = self.sparse
                weights = tf.nn.relu(tf.einsum("bsh,ho->bso", hidden, kernel) + bias)
                out["token_weights"] = weights[:, :, 0] * mask
            if self.projection:
                x = apply_dense(hidden, self.projection)
                if layout.mask_vectors:
                    x = x * mask[:, :, tf.newaxis]
                out["token_vectors"] = tf.math.l2_normalize(x, axis=-1, epsilon=1e-24)
            return out

    return RetrievalHead()
