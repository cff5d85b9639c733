"""What an embedder answers: its output kinds (dense, sparse, multi-vector) as model.json says.

An ``embed`` version answers one or more kinds from one forward pass; export writes model.json's
``outputs`` entry and the signature outputs it names, the gateway reads them (backend/outputs/):

- ``dense``: one vector per text, signature output ``embedding`` ``[batch, dim]`` (every embed
  version has it unless ``outputs`` leaves it out: a ColBERT or SPLADE model has no dense vector).
- ``sparse``, in one of two forms:

  - ``token_weights`` (BGE-M3's lexical weights): output ``token_weights`` ``[batch, seq]``, each
    token's weight (``relu`` of the sparse linear), 0 on padding. The gateway keeps, per text, the
    max weight per token id, drops ``drop_ids`` (the tokenizer's CLS/EOS/PAD/UNK: FlagEmbedding's
    rule) and weights ≤ 0.
  - ``topk`` (SPLADE): the graph pools the masked-LM logits over the tokens (``pooling`` max or
    sum of ``activation`` relu / log1p_relu, sentence-transformers' ``SpladePooling``) and returns
    the ``top_k`` largest per text: ``sparse_indices`` int32 ``[batch, top_k]`` and
    ``sparse_values`` float32 ``[batch, top_k]``, values descending, 0 where a text has fewer
    non-zero entries. Never ``[batch, seq, vocab]`` on the wire. ``query`` (optional) says how
    queries are encoded when they differ: ``{"form": "idf", "asset": "sparse_idf.json"}`` for an
    inference-free query side (each present token id weighs its stored value; no model call).

- ``multivector`` (ColBERT / BGE-M3's colbert_vecs): output ``token_vectors``
  ``[batch, seq, dim]`` float32, one vector per position (L2-normalized when ``normalized``).
  ``rows`` says which positions a text keeps: ``after_cls`` (BGE-M3: positions 1 .. n-1 of its
  n real tokens: CLS out, the final EOS in), ``attention`` (PyLate/ColBERT documents: every real
  token whose id is not in ``skiplist_ids``) — a query with expansion keeps all ``query.length``.
  ``score`` is MaxSim's reduction over query rows: ``mean`` (BGE-M3) or ``sum`` (ColBERT).
  ``query`` / ``document`` (ColBERT only): the marker token id put at position 1 after CLS
  (``prefix_id``), the length a query is padded to with ``expansion_id`` (``[MASK]``; attention 0
  unless ``attend_to_expansion``), the document's max length.

Output-subset signatures (``kind_signatures``): a version with more than one kind also has, beside
each signature ``B`` (``serving_default`` and every ``seq_<L>``), one signature per proper subset
of its kinds, named ``B.<kinds joined by +>`` (``serving_default.dense``, ``seq_64.dense+sparse``),
that returns only those kinds' outputs: the same traced function, called, its other outputs left
out. model.json's ``kind_signatures`` maps each suffix to its output names. TF Serving's gRPC has
``output_filter``; its REST API has none, so a REST client asks the narrowest such signature
(``narrowest_signature``) and a dense-only call never receives the token outputs.

No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("dense", "sparse", "multivector")
DENSE_OUTPUT = "embedding"
TOKEN_WEIGHTS_OUTPUT = "token_weights"
SPARSE_INDICES_OUTPUT = "sparse_indices"
SPARSE_VALUES_OUTPUT = "sparse_values"
TOKEN_VECTORS_OUTPUT = "token_vectors"
SPARSE_FORMS = ("token_weights", "topk")
SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
ROW_RULES = ("after_cls", "attention")
SUBSET_SEPARATOR = "."  # B.<kinds>: signature B's outputs narrowed to <kinds>
SCORE_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class DenseOutput:
    """The dense vector: ``embedding [batch, dim]``."""

    dim: int
    normalized: bool = False


@dataclass(frozen=True)
class SparseOutput:
    """Sparse lexical weights, per text, in ``form`` (see the module's doc)."""

    form: str
    drop_ids: tuple[int, ...] = ()  # token_weights: ids never answered (special tokens)
    top_k: int = 0  # topk: the graph's k (a request may ask for fewer)
    vocab_size: int = 0
    pooling: str = "max"
    activation: str = "relu"
    query_form: str | None = None  # "idf": inference-free queries
    query_asset: str | None = None  # the idf table under assets/ ({token_id: weight} JSON)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Return the signature outputs this kind reads."""
        if self.form == "topk":
            return (SPARSE_INDICES_OUTPUT, SPARSE_VALUES_OUTPUT)
        return (TOKEN_WEIGHTS_OUTPUT,)


@dataclass(frozen=True)
class MarkerSide:
    """ColBERT's query or document side: the marker after CLS and the length."""

    prefix_id: int | None = None
    length: int = 0  # queries: padded to it with expansion_id; documents: the max length
    expansion_id: int | None = None  # queries only: None = no expansion
    attend_to_expansion: bool = False


@dataclass(frozen=True)
class MultiVectorOutput:
    """Per-token vectors: ``token_vectors [batch, seq, dim]`` and which rows a text keeps."""

    dim: int
    normalized: bool = True
    rows: str = "after_cls"
    skiplist_ids: tuple[int, ...] = ()
    score: str = "mean"
    query: MarkerSide | None = None
    document: MarkerSide | None = None


@dataclass(frozen=True)
class Outputs:
    """An embed version's output kinds (at least one)."""

    dense: DenseOutput | None = None
    sparse: SparseOutput | None = None
    multivector: MultiVectorOutput | None = None
    kinds: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        kinds = tuple(k for k in KINDS if getattr(self, k) is not None)
        object.__setattr__(self, "kinds", kinds)

    def default_kinds(self) -> tuple[str, ...]:
        """Return what ``:embed`` answers when the request names no outputs: dense where the
        model has it (today's answer), else its one other kind."""
        return ("dense",) if self.dense is not None else self.kinds[:1]

    def to_info(self) -> dict[str, Any]:
        """Return model.json's ``outputs`` entry."""
        info: dict[str, Any] = {}
        if self.dense is not None:
            info["dense"] = {"output": DENSE_OUTPUT, "dim": self.dense.dim,
                             "normalized": self.dense.normalized}  # fmt: skip
        if self.sparse is not None:
            s = self.sparse
            entry: dict[str, Any] = {"form": s.form, "outputs": list(s.outputs)}
            if s.form == "token_weights":
                entry["drop_ids"] = list(s.drop_ids)
            else:
                entry.update(top_k=s.top_k, vocab_size=s.vocab_size, pooling=s.pooling,
                             activation=s.activation)  # fmt: skip
                if s.query_form is not None:
                    entry["query"] = {"form": s.query_form, "asset": s.query_asset}
            info["sparse"] = entry
        if self.multivector is not None:
            m = self.multivector
            entry = {
                "output": TOKEN_VECTORS_OUTPUT, "dim": m.dim, "normalized": m.normalized,
                "rows": m.rows, "skiplist_ids": list(m.skiplist_ids), "score": m.score,
            }  # fmt: skip
            for side in ("query", "document"):
                marker: MarkerSide | None = getattr(m, side)
                if marker is not None:
                    entry[side] = {
                        "prefix_id": marker.prefix_id, "length": marker.length,
                        "expansion_id": marker.expansion_id,
                        "attend_to_expansion": marker.attend_to_expansion,
                    }  # fmt: skip
            info["multivector"] = entry
        return info


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise ValueError(f"model.json {what} must be a list of token ids")
    return tuple(int(v) for v in value)


def _choice(value: Any, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise ValueError(f"model.json {what} must be one of {list(allowed)}, got {value!r}")
    return str(value)


def _side(entry: Any, what: str) -> MarkerSide | None:
    if entry is None:
        return None
    if not isinstance(entry, Mapping):
        raise ValueError(f"model.json {what} must be an object")
    prefix, expansion = entry.get("prefix_id"), entry.get("expansion_id")
    return MarkerSide(
        prefix_id=None if prefix is None else int(prefix), length=int(entry.get("length", 0)),
        expansion_id=None if expansion is None else int(expansion),
        attend_to_expansion=bool(entry.get("attend_to_expansion", False)),
    )  # fmt: skip


def parse_outputs(info: Mapping[str, Any]) -> Outputs | None:
    """Return an embed version's output kinds from model.json (None for other tasks).

    A version whose ``outputs`` is absent or the signature's output names (every export before
    the kinds, and every plain embedder since) answers dense only. Raises ValueError for a
    malformed entry (the gateway's unreadable assets, never a guess).
    """
    if info.get("task", "classify") != "embed":
        return None
    entry = info.get("outputs")
    if entry is None or (isinstance(entry, list) and DENSE_OUTPUT in entry):
        # before the kinds, ``outputs`` listed the signature's output names (["embedding"])
        dim = info.get("embedding_dim") or info.get("dim") or 0
        return Outputs(dense=DenseOutput(dim=int(dim)))
    if not isinstance(entry, Mapping) or not entry:
        raise ValueError("model.json outputs must be a non-empty object")
    unknown = sorted(set(entry) - set(KINDS))
    if unknown:
        raise ValueError(f"model.json outputs: unknown kind {unknown[0]!r} (known: {list(KINDS)})")
    dense = sparse = multi = None
    if "dense" in entry:
        d = entry["dense"]
        dense = DenseOutput(dim=int(d.get("dim", 0)), normalized=bool(d.get("normalized")))
    if "sparse" in entry:
        s = entry["sparse"]
        form = _choice(s.get("form"), SPARSE_FORMS, "outputs.sparse.form")
        query = s.get("query") or {}
        sparse = SparseOutput(
            form=form, drop_ids=_ints(s.get("drop_ids", ()), "outputs.sparse.drop_ids"),
            top_k=int(s.get("top_k", 0)), vocab_size=int(s.get("vocab_size", 0)),
            pooling=_choice(s.get("pooling", "max"), SPLADE_POOLINGS, "outputs.sparse.pooling"),
            activation=_choice(s.get("activation", "relu"), SPLADE_ACTIVATIONS,
                               "outputs.sparse.activation"),
            query_form=query.get("form"), query_asset=query.get("asset"),
        )  # fmt: skip
        if form == "topk" and sparse.top_k < 1:
            raise ValueError("model.json outputs.sparse.top_k must be at least 1")
    if "multivector" in entry:
        m = entry["multivector"]
        multi = MultiVectorOutput(
            dim=int(m.get("dim", 0)), normalized=bool(m.get("normalized", True)),
            rows=_choice(m.get("rows", "after_cls"), ROW_RULES, "outputs.multivector.rows"),
            skiplist_ids=_ints(m.get("skiplist_ids", ()), "outputs.multivector.skiplist_ids"),
            score=_choice(m.get("score", "mean"), SCORE_REDUCTIONS, "outputs.multivector.score"),
            query=_side(m.get("query"), "outputs.multivector.query"),
            document=_side(m.get("document"), "outputs.multivector.document"),
        )  # fmt: skip
    return Outputs(dense=dense, sparse=sparse, multivector=multi)


def kind_outputs(outputs: Outputs) -> dict[str, tuple[str, ...]]:
    """Return each kind the version has with the signature outputs it reads."""
    names: dict[str, tuple[str, ...]] = {}
    if outputs.dense is not None:
        names["dense"] = (DENSE_OUTPUT,)
    if outputs.sparse is not None:
        names["sparse"] = outputs.sparse.outputs
    if outputs.multivector is not None:
        names["multivector"] = (TOKEN_VECTORS_OUTPUT,)
    return names


def kind_signatures(outputs: Outputs) -> dict[str, tuple[str, ...]]:
    """Return the suffix (kinds joined by +) and output names of each proper, non-empty subset of
    the version's kinds: the output-subset signatures export writes beside each signature."""
    names = kind_outputs(outputs)
    kinds = list(names)
    out: dict[str, tuple[str, ...]] = {}
    for mask in range(1, (1 << len(kinds)) - 1):
        chosen = [k for i, k in enumerate(kinds) if mask >> i & 1]
        out["+".join(chosen)] = tuple(n for k in chosen for n in names[k])
    return out


def subset_signature(base: str, suffix: str) -> str:
    """Return the name of signature ``base`` narrowed to the kinds of ``suffix``."""
    return f"{base}{SUBSET_SEPARATOR}{suffix}"


def narrowest_signature(
    base: str, signatures: Mapping[str, Sequence[str]], wanted: Sequence[str]
) -> str:
    """Return the signature with the fewest outputs that has every one of ``wanted``, among
    ``base`` and its output-subset signatures (``signatures``: name -> output names, as the
    model server's metadata lists them); ``base`` when none narrower has them."""
    best, fewest = base, len(signatures.get(base, ())) or 1 << 30
    need = set(wanted)
    prefix = base + SUBSET_SEPARATOR
    for name, names in signatures.items():
        if name.startswith(prefix) and need <= set(names) and len(names) < fewest:
            best, fewest = name, len(names)
    return best
