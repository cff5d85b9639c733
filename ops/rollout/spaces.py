"""Whether two versions of an embedder share one vector space: the check before a weighted step.

A classifier's answers stand alone, so a canary can serve a share of the traffic. An embedder's
can't: a query vector is only worth something against document vectors of the same space, and
during a weighted canary a share of the queries would come from a space the corpus they search
was never embedded in. So before any weighted step of an embedder the rollout embeds a sample
with both versions (``compare``), once per output kind the two versions have (model.json's
``outputs``: dense, sparse, multi-vector; each asked alone, so the model server returns only
that kind's outputs), and measures per kind:

- ``agreement``, the same text's two answers: dense, the mean cosine of its two vectors (another
  dimension: 0); sparse, the mean share of its 10 largest-weight token ids both versions give it;
  multi-vector, the mean MaxSim agreement of its two sets of token vectors (each row's best cosine
  with the other version's rows, both ways averaged; another dimension: 0);
- ``overlap``: the mean share of the top-10 neighbours of each sample query, over the sample
  corpus, that both versions find, each version's neighbours in its own space and by the kind's
  own score (dense cosine, sparse lexical dot product, multi-vector MaxSim); the queries are
  embedded as queries (``is_query``: ColBERT's query marker and expansion, inference-free SPLADE's
  IDF table), the corpus as documents.

One space needs every kind's agreement and overlap at or above its threshold (``MIN_AGREEMENT``:
dense cosine 0.95, sparse top-10 ids 0.7, MaxSim 0.95; ``MIN_OVERLAP`` 0.7), and the new version
to keep every kind the stable one has. A re-export gives 1.0 throughout; a precision change (bf16,
fp16) keeps cosines above 0.99 and almost every neighbour and top id; two independently trained
(or differently pooled) spaces give a cosine near 0 and an overlap near chance (10 / corpus size).
The thresholds sit well between the two, and the neighbour overlap guards against the one case
the same-text measure misses: a version close on average whose ranking changed, which is what a
search index feels. A version of BGE-M3 whose sparse or ColBERT head alone changed is two spaces
even though its dense vectors are the same: a hybrid index holds the corpus in each kind. Two
spaces: the weighted canary is refused (the rollout rolls back before the step) and the message
names ``python -m ops.rollout migrate``, which re-embeds the corpus with the new version and moves
the label in one step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from backend.outputs.multivector import maxsim
from backend.outputs.sparse import SparseVector
from backend.outputs.sparse import overlap as top_ids_overlap

MIN_COSINE = 0.95
MIN_OVERLAP = 0.7
# the same text's agreement one space needs, per kind
MIN_AGREEMENT = {"dense": MIN_COSINE, "sparse": 0.7, "multivector": 0.95}
TOP_K = 10
KINDS = ("dense", "sparse", "multivector")
SAMPLE_CALL_TEXTS = 32  # texts per embed call of the check (bounds a multi-vector answer)

# (version, texts, kind, is_query) -> each text's answer of that kind: dense float32
# [texts, dim]; sparse a SparseVector per text; multi-vector a [rows, dim] unit matrix per text
Embed = Callable[[int, Sequence[str], str, bool], Any]

_WORDS = str.split(
    "invoice payment refund card account password login error crash update install network "
    "printer email calendar meeting delivery order shipping address battery screen keyboard "
    "license subscription cancel upgrade price discount warranty repair backup restore sync "
    "phone laptop tablet server database report export import slow broken missing locked"
)
_AGREEMENT_WORDS = {
    "dense": "mean cosine of the same text",
    "sparse": f"share of the same text's top-{TOP_K} token ids",
    "multivector": "MaxSim agreement of the same text's token vectors",
}
_SCORE_WORDS = {"dense": "cosine", "sparse": "lexical score", "multivector": "MaxSim"}


def sample_texts(count: int = 120, seed: int = 0) -> list[str]:
    """Return ``count`` short support-ticket-like texts (seeded): the built-in sample."""
    rng = random.Random(seed)
    starts = ("my", "the", "our", "why is my", "how do I fix the", "cannot open the")
    return [
        f"{rng.choice(starts)} {' '.join(rng.choices(_WORDS, k=rng.randint(2, 8)))}"
        for _ in range(count)
    ]


def read_sample(path: Path, text_field: str = "text") -> list[str]:
    """Return the texts of ``path``: JSONL rows (``text_field``) or one text per line."""
    import orjson

    texts = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith(b"{"):
            texts.append(str(orjson.loads(line)[text_field]))
        else:
            texts.append(line.decode())
    return texts


def unit(vectors: np.ndarray) -> np.ndarray:
    """Return ``vectors`` scaled to unit norm (rows of norm 0 stay 0)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def top_neighbours(scores: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Return the column indices of each row's top-``k`` scores, best first (ties: lower index)."""
    return np.argsort(-scores, axis=1, kind="stable")[:, : min(k, scores.shape[1])]


def neighbours(queries: np.ndarray, corpus: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Return the indices of each query's top-``k`` corpus rows by cosine, best first."""
    return top_neighbours(unit(queries) @ unit(corpus).T, k)


def shared_neighbours(
    scores_a: np.ndarray, scores_b: np.ndarray, k: int = TOP_K, matches_only: bool = False
) -> float:
    """Return the mean share of each query's top-``k`` corpus rows that two score matrices
    ([queries, corpus], each version's own) agree on. ``matches_only``: a row scoring 0 or less
    is no neighbour (a sparse query shares no token with it: the zeros' order is no ranking);
    a query both versions match with nothing counts as agreeing."""
    a, b = top_neighbours(scores_a, k), top_neighbours(scores_b, k)
    shared = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if matches_only:
            x, y = x[scores_a[i, x] > 0], y[scores_b[i, y] > 0]
        most = max(x.shape[0], y.shape[0])
        shared.append(len(set(x.tolist()) & set(y.tolist())) / most if most else 1.0)
    return float(np.mean(shared)) if shared and a.shape[1] else 0.0


def neighbour_overlap(
    queries_a: np.ndarray, corpus_a: np.ndarray, queries_b: np.ndarray, corpus_b: np.ndarray,
    k: int = TOP_K,
) -> float:  # fmt: skip
    """Return the mean share of top-``k`` neighbours two dense spaces agree on (each in its own)."""
    return shared_neighbours(unit(queries_a) @ unit(corpus_a).T,
                             unit(queries_b) @ unit(corpus_b).T, k)  # fmt: skip


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Return the mean cosine of ``a[i]`` and ``b[i]`` (0 when the dimensions differ)."""
    if a.shape != b.shape:
        return 0.0
    return float(np.mean(np.sum(unit(a) * unit(b), axis=1)))


def lexical_scores(queries: Sequence[SparseVector], corpus: Sequence[SparseVector]) -> np.ndarray:
    """Return the lexical score (the shared ids' weights multiplied, summed) of each query
    against each corpus text, [queries, corpus]: both as dense rows over the ids they use."""
    every = [v.indices for v in (*queries, *corpus)]
    ids = np.unique(np.concatenate(every)) if every else np.zeros(0, np.int64)

    def rows(vectors: Sequence[SparseVector]) -> np.ndarray:
        out = np.zeros((len(vectors), ids.shape[0]), np.float64)
        for i, v in enumerate(vectors):
            out[i, np.searchsorted(ids, v.indices)] = v.values
        return out

    return rows(queries) @ rows(corpus).T


def maxsim_scores(queries: Sequence[np.ndarray], corpus: Sequence[np.ndarray]) -> np.ndarray:
    """Return MaxSim (summed over the query's rows) of each query against each corpus text."""
    return np.asarray([[maxsim(q, d, "sum") for d in corpus] for q in queries], np.float64)


def maxsim_agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Return how alike one text's two sets of unit token vectors are: each row's best cosine
    with the other set's rows, averaged, both ways averaged (0 when the dimensions differ)."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        return 0.0
    return (maxsim(a, b, "mean") + maxsim(b, a, "mean")) / 2.0


@dataclass(frozen=True)
class KindCheck:
    """One output kind of two versions compared on a sample: the figures and thresholds."""

    kind: str
    agreement: float
    overlap: float
    dims: tuple[int, int]  # dense and multi-vector dimensions (sparse: 0, 0)
    min_agreement: float
    min_overlap: float = MIN_OVERLAP

    @property
    def same_space(self) -> bool:
        return self.agreement >= self.min_agreement and self.overlap >= self.min_overlap

    def describe(self) -> str:
        """Return the figures in words."""
        dims = f", dimensions {self.dims[0]} / {self.dims[1]}" if any(self.dims) else ""
        return (
            f"{self.kind}: {_AGREEMENT_WORDS[self.kind]} {self.agreement:.3f} (one space needs "
            f">= {self.min_agreement:g}), top-{TOP_K} neighbour overlap by "
            f"{_SCORE_WORDS[self.kind]} {self.overlap:.2f} (needs >= {self.min_overlap:g}){dims}"
        )


@dataclass(frozen=True)
class SpaceCheck:
    """Two versions' spaces compared on a sample, kind by kind, and the verdict."""

    stable: int
    new: int
    kinds: tuple[KindCheck, ...]
    queries: int
    corpus: int
    missing: tuple[str, ...] = ()  # kinds the stable version has and the new one lacks

    @property
    def same_space(self) -> bool:
        return not self.missing and all(k.same_space for k in self.kinds)

    def kind(self, name: str) -> KindCheck:
        """Return the comparison of kind ``name``; KeyError if it was not compared."""
        for check in self.kinds:
            if check.kind == name:
                return check
        raise KeyError(name)

    def describe(self) -> str:
        """Return the figures in words."""
        missing = (
            f"; v{self.new} has no {', '.join(self.missing)} output (v{self.stable} has)"
            if self.missing
            else ""
        )
        return (
            f"v{self.new} against v{self.stable} on {self.queries} queries over {self.corpus} "
            f"texts: " + "; ".join(k.describe() for k in self.kinds) + missing
        )

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["kinds"] = [{**asdict(k), "dims": list(k.dims), "same_space": k.same_space}
                         for k in self.kinds]  # fmt: skip
        data["missing"] = list(self.missing)
        return {**data, "same_space": self.same_space}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SpaceCheck:
        """Return the check ``to_json`` wrote (or a dense-only one recorded before kinds)."""
        if "kinds" not in data:  # a state file of a rollout started by an older release
            dense = KindCheck("dense", float(data["cosine"]), float(data["overlap"]),
                              (int(data["dims"][0]), int(data["dims"][1])),
                              float(data.get("min_cosine", MIN_COSINE)),
                              float(data.get("min_overlap", MIN_OVERLAP)))  # fmt: skip
            return cls(int(data["stable"]), int(data["new"]), (dense,), int(data["queries"]),
                       int(data["corpus"]))  # fmt: skip
        kinds = tuple(
            KindCheck(k["kind"], float(k["agreement"]), float(k["overlap"]),
                      (int(k["dims"][0]), int(k["dims"][1])), float(k["min_agreement"]),
                      float(k["min_overlap"]))
            for k in data["kinds"]
        )  # fmt: skip
        return cls(int(data["stable"]), int(data["new"]), kinds, int(data["queries"]),
                   int(data["corpus"]), tuple(data.get("missing", ())))  # fmt: skip


def _dense(embed: Embed, version: int, texts: Sequence[str], queries: int) -> tuple[Any, ...]:
    vectors = np.asarray(embed(version, texts, "dense", False), np.float32)
    return vectors, vectors[:queries], unit(vectors[:queries]) @ unit(vectors[queries:]).T


def compare_kind(
    embed: Embed, kind: str, stable: int, new: int, texts: Sequence[str], queries: int
) -> KindCheck:
    """Return the comparison of ``kind``'s answers of ``stable`` and ``new`` on ``texts`` (the
    first ``queries`` of them the queries, embedded as queries; every text as a document)."""
    docs, scores, dims = [], [], []
    for version in (stable, new):
        answers = embed(version, texts, kind, False)
        if kind == "dense":
            answers = np.asarray(answers, np.float32)
            query_side = answers[:queries]  # a dense vector has no query side of its own
            scores.append(unit(query_side) @ unit(answers[queries:]).T)
            dims.append(int(answers.shape[1]))
        else:
            query_side = embed(version, texts[:queries], kind, True)
            if kind == "sparse":
                scores.append(lexical_scores(query_side, answers[queries:]))
                dims.append(0)
            else:
                scores.append(maxsim_scores(query_side, answers[queries:]))
                dims.append(int(answers[0].shape[1]) if answers and answers[0].ndim == 2 else 0)
        docs.append(answers)
    a, b = docs
    if kind == "dense":
        agreement = mean_cosine(a, b)
    elif kind == "sparse":
        agreement = float(np.mean([top_ids_overlap(x.indices, y.indices, TOP_K)
                                   for x, y in zip(a, b, strict=True)]))  # fmt: skip
    else:
        agreement = float(np.mean([maxsim_agreement(x, y) for x, y in zip(a, b, strict=True)]))
    overlap = (
        shared_neighbours(scores[0], scores[1], matches_only=kind == "sparse")
        if dims[0] == dims[1]
        else 0.0
    )
    return KindCheck(kind, agreement, overlap, (dims[0], dims[1]), MIN_AGREEMENT[kind])


def compare(
    embed: Embed, stable: int, new: int, texts: Sequence[str], queries: int = 20,
    kinds: Sequence[str] = ("dense",), missing: Sequence[str] = (),
) -> SpaceCheck:  # fmt: skip
    """Return the comparison of ``stable``'s and ``new``'s spaces on ``texts``, kind by kind.

    The first ``queries`` texts are the queries, the rest the corpus; the agreement is over all.
    ``missing``: kinds the stable version has and the new one lacks (two spaces).
    """
    if len(texts) < queries + TOP_K:
        raise ValueError(f"a space check needs at least {queries + TOP_K} texts, got {len(texts)}")
    if not kinds:
        raise ValueError("a space check needs an output kind both versions have")
    checks = tuple(compare_kind(embed, kind, stable, new, texts, queries) for kind in kinds)
    return SpaceCheck(stable, new, checks, queries, len(texts) - queries, tuple(missing))


def refusal(model: str, check: SpaceCheck, label: str = "stable") -> str:
    """Return why a weighted canary of ``check.new`` is refused, naming the migration."""
    return (
        f"v{check.new} of {model} embeds into another vector space than v{check.stable} "
        f"({check.describe()}): a weighted canary would answer a share of the queries with "
        f"vectors that the corpus they search was never embedded in. Migrate instead: re-embed "
        f"the corpus with v{check.new} and move {label} in one step: python -m ops.rollout "
        f"migrate {model} --to {check.new} --corpus FILE (docs/guides/re-embedding.md)"
    )


def gateway_embed(
    tfs_target: str, base_path: Path, config_file: Path
) -> tuple[Any, Callable[[str], Embed]]:
    """Return an in-process gateway (close it after) and, per model, an ``Embed`` of it: the
    :embed path with one output kind asked, so the model server returns only its outputs."""
    from backend.schemas import EmbedRequest
    from backend.service import Gateway
    from backend.settings import load_settings

    settings = load_settings({
        "tfs_grpc_target": tfs_target, "model_base_path": str(base_path),
        "model_config_file": str(config_file), "group_in_flight": 0,
        "max_request_rows": 1 << 20, "max_request_tokens": 1 << 30,
        "max_answer_bytes": 1 << 40,
    })  # fmt: skip
    gateway = Gateway(settings)

    def embed_for(model: str) -> Embed:
        def embed(version: int, texts: Sequence[str], kind: str, is_query: bool) -> Any:
            answers: list[Any] = []
            for start in range(0, len(texts), SAMPLE_CALL_TEXTS):
                part = list(texts[start : start + SAMPLE_CALL_TEXTS])
                request = EmbedRequest.model_validate(
                    {"texts": part, "version": version, "outputs": [kind], "is_query": is_query}
                )
                answers.append(answer_of(gateway.embed(model, request), kind))
            if kind == "dense":
                return np.concatenate(answers) if answers else np.zeros((0, 0), np.float32)
            return [item for part in answers for item in part]

        return embed

    return gateway, embed_for


def answer_of(answer: Mapping[str, Any], kind: str) -> Any:
    """Return ``kind``'s part of an :embed answer as ``Embed`` returns it."""
    if kind == "dense":
        return np.asarray(answer["embeddings"], np.float32)
    if kind == "sparse":
        return [SparseVector(np.asarray(s["indices"], np.int64), np.asarray(s["values"],
                                                                            np.float32))
                for s in answer["sparse"]]  # fmt: skip
    return [np.asarray(m["vectors"], np.float32) for m in answer["multivectors"]]


def is_embedder(gateway: Any, model: str, version: int) -> bool:
    """Return whether ``model``'s ``version`` is an embedder (its assets' task)."""
    return bool(gateway.assets.get(model, version).task == "embed")


def output_kinds(gateway: Any, model: str, version: int) -> tuple[str, ...]:
    """Return the output kinds ``model``'s ``version`` has (model.json; dense without one)."""
    outputs = gateway.assets.get(model, version).outputs
    return tuple(outputs.kinds) if outputs is not None else ("dense",)


def compared_kinds(
    gateway: Any, model: str, stable: int, new: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Return the kinds both versions have (compared) and those only ``stable`` has (missing)."""
    old, now = output_kinds(gateway, model, stable), output_kinds(gateway, model, new)
    return tuple(k for k in old if k in now), tuple(k for k in old if k not in now)
