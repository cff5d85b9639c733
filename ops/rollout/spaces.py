"""Whether two versions of an embedder share one vector space: the check before a weighted step.

A classifier's answers stand alone, so a canary can serve a share of the traffic. An embedder's
can't: a query vector is only worth something against document vectors of the same space, and
during a weighted canary a share of the queries would come from a space the corpus they search
was never embedded in. So before any weighted step of an embedder the rollout embeds a sample
with both versions (``compare``) and measures:

- ``cosine``: the mean cosine of the same text's two vectors (another dimension: 0);
- ``overlap``: the mean share of the top-10 neighbours of each sample query, over the sample
  corpus, that both versions find, each version's neighbours in its own space.

One space needs both: cosine >= ``MIN_COSINE`` (0.95) and overlap >= ``MIN_OVERLAP`` (0.7). A
re-export gives 1.0 and 1.0; a precision change (bf16, fp16) keeps cosine above 0.99 and almost
every neighbour; two independently trained (or differently pooled) spaces give a cosine near 0
and an overlap near chance (10 / corpus size). The thresholds sit well between the two, and the
neighbour overlap guards against the one case cosine misses: a version close on average whose
ranking changed, which is what a search index feels. Two spaces: the weighted canary is refused
(the rollout rolls back before the step) and the message names ``python -m ops.rollout migrate``,
which re-embeds the corpus with the new version and moves the label in one step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

MIN_COSINE = 0.95
MIN_OVERLAP = 0.7
TOP_K = 10

Embed = Callable[[int, Sequence[str]], np.ndarray]  # (version, texts) -> [texts, dim]

_WORDS = str.split(
    "invoice payment refund card account password login error crash update install network "
    "printer email calendar meeting delivery order shipping address battery screen keyboard "
    "license subscription cancel upgrade price discount warranty repair backup restore sync "
    "phone laptop tablet server database report export import slow broken missing locked"
)


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


def neighbours(queries: np.ndarray, corpus: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Return the indices of each query's top-``k`` corpus rows by cosine, best first."""
    scores = unit(queries) @ unit(corpus).T
    return np.argsort(-scores, axis=1, kind="stable")[:, : min(k, corpus.shape[0])]


def neighbour_overlap(
    queries_a: np.ndarray, corpus_a: np.ndarray, queries_b: np.ndarray, corpus_b: np.ndarray,
    k: int = TOP_K,
) -> float:  # fmt: skip
    """Return the mean share of top-``k`` neighbours two spaces agree on (each in its own)."""
    a = neighbours(queries_a, corpus_a, k)
    b = neighbours(queries_b, corpus_b, k)
    shared = [
        len(set(x.tolist()) & set(y.tolist())) / a.shape[1] for x, y in zip(a, b, strict=True)
    ]
    return float(np.mean(shared)) if shared else 0.0


def mean_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Return the mean cosine of ``a[i]`` and ``b[i]`` (0 when the dimensions differ)."""
    if a.shape != b.shape:
        return 0.0
    return float(np.mean(np.sum(unit(a) * unit(b), axis=1)))


@dataclass(frozen=True)
class SpaceCheck:
    """Two versions' spaces compared on a sample, and the verdict."""

    stable: int
    new: int
    cosine: float
    overlap: float
    dims: tuple[int, int]
    queries: int
    corpus: int
    min_cosine: float = MIN_COSINE
    min_overlap: float = MIN_OVERLAP

    @property
    def same_space(self) -> bool:
        return self.cosine >= self.min_cosine and self.overlap >= self.min_overlap

    def describe(self) -> str:
        """Return the figures in words."""
        return (
            f"v{self.new} against v{self.stable} on {self.queries} queries over {self.corpus} "
            f"texts: mean cosine of the same text {self.cosine:.3f} (one space needs >= "
            f"{self.min_cosine:g}), top-{TOP_K} neighbour overlap {self.overlap:.2f} (needs >= "
            f"{self.min_overlap:g}), dimensions {self.dims[0]} / {self.dims[1]}"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "dims": list(self.dims), "same_space": self.same_space}


def compare(
    embed: Embed, stable: int, new: int, texts: Sequence[str], queries: int = 20
) -> SpaceCheck:
    """Return the comparison of ``stable``'s and ``new``'s spaces on ``texts``.

    The first ``queries`` texts are the queries, the rest the corpus; the cosine is over all.
    """
    if len(texts) < queries + TOP_K:
        raise ValueError(f"a space check needs at least {queries + TOP_K} texts, got {len(texts)}")
    a = np.asarray(embed(stable, texts), np.float32)
    b = np.asarray(embed(new, texts), np.float32)
    overlap = neighbour_overlap(a[:queries], a[queries:], b[:queries], b[queries:])
    return SpaceCheck(stable, new, mean_cosine(a, b), overlap, (a.shape[1], b.shape[1]),
                      queries, len(texts) - queries)  # fmt: skip


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
    """Return an in-process gateway (close it after) and, per model, an ``Embed`` of it."""
    from backend.service import Gateway
    from backend.settings import load_settings

    settings = load_settings({
        "tfs_grpc_target": tfs_target, "model_base_path": str(base_path),
        "model_config_file": str(config_file), "group_in_flight": 0,
        "max_request_rows": 1 << 20, "max_request_tokens": 1 << 30,
    })  # fmt: skip
    gateway = Gateway(settings)

    def embed_for(model: str) -> Embed:
        def embed(version: int, texts: Sequence[str]) -> np.ndarray:
            return gateway.embeddings(model, list(texts), version, None)[1]

        return embed

    return gateway, embed_for


def is_embedder(gateway: Any, model: str, version: int) -> bool:
    """Return whether ``model``'s ``version`` is an embedder (its assets' task)."""
    return bool(gateway.assets.get(model, version).task == "embed")
