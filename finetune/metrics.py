"""Evaluation figures, pure functions over plain values (numpy; no TensorFlow).

Single-label classification: accuracy, macro-F1, confusion matrix. The other heads (issue 22):
entity-level F1 (span-exact, micro and per type, seqeval's BIO reading), multi-label micro/macro
F1 and per-label threshold tuning, and reranking MRR@10 / nDCG@10 from per-query scores.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def confusion(truth: Sequence[int], predicted: Sequence[int], n: int) -> np.ndarray:
    """Return the ``[n, n]`` confusion matrix: rows are true labels, columns predictions."""
    matrix = np.zeros((n, n), dtype=np.int64)
    np.add.at(matrix, (np.asarray(truth, dtype=np.int64), np.asarray(predicted, dtype=np.int64)), 1)
    return matrix


def macro_f1(matrix: np.ndarray) -> float:
    """Return the unweighted mean of the per-label F1 scores (0 for a label never hit)."""
    hits = np.diag(matrix).astype(np.float64)
    denominator = matrix.sum(axis=0) + matrix.sum(axis=1)  # predicted + true, per label
    f1 = np.divide(2 * hits, denominator, out=np.zeros_like(hits), where=denominator > 0)
    return float(f1.mean())


def scores(truth: Sequence[int], predicted: Sequence[int], labels: Sequence[str]) -> dict[str, Any]:
    """Return accuracy, macro-F1 and the confusion matrix (with its label order) as plain JSON."""
    matrix = confusion(truth, predicted, len(labels))
    total = int(matrix.sum())
    return {
        "examples": total,
        "accuracy": float(np.trace(matrix) / total) if total else 0.0,
        "macro_f1": macro_f1(matrix),
        "confusion_matrix": {
            "labels": list(labels),
            "rows_true_columns_predicted": matrix.tolist(),
        },
    }


# -- the other heads (issue 22) ----------------------------------------------------------------
Entity = tuple[int, int, str]  # (start, end, type): character offsets, end exclusive


def _prf(hits: int, predicted: int, true: int) -> dict[str, float]:
    """Return precision, recall and F1 from counts (0 where a denominator is 0)."""
    precision = hits / predicted if predicted else 0.0
    recall = hits / true if true else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_f1(
    gold: Sequence[Iterable[Entity]], predicted: Sequence[Iterable[Entity]]
) -> dict[str, Any]:
    """Return entity-level precision/recall/F1, micro over all types and per type.

    Span-exact, as seqeval and CoNLL score: a predicted entity counts only if a gold entity of
    the same text has the same type, start and end. ``gold[i]`` and ``predicted[i]`` are text i's
    entities. Per type: precision, recall, F1 and ``support`` (gold entities of that type).
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold texts but {len(predicted)} predicted")
    hits: Counter[str] = Counter()
    n_gold: Counter[str] = Counter()
    n_pred: Counter[str] = Counter()
    for true_set, pred_set in zip(gold, predicted, strict=True):
        true, pred = set(true_set), set(pred_set)
        n_gold.update(e[2] for e in true)
        n_pred.update(e[2] for e in pred)
        hits.update(e[2] for e in true & pred)
    types = sorted(set(n_gold) | set(n_pred))
    per_type = {t: {**_prf(hits[t], n_pred[t], n_gold[t]), "support": n_gold[t]} for t in types}
    micro = _prf(sum(hits.values()), sum(n_pred.values()), sum(n_gold.values()))
    return {
        "micro": {**micro, "support": sum(n_gold.values())},
        "per_type": per_type,
        "texts": len(gold),
    }


def bio_entities(tags: Sequence[str]) -> list[tuple[int, int, str]]:
    """Return the entities of a BIO tag sequence as (first, last, type), positions inclusive.

    seqeval's default (CoNLL) reading: an entity starts at ``B-X``, or at an ``I-X`` that does not
    continue an entity of type X (after ``O`` or another type); it runs while ``I-X`` follows.
    """
    out: list[tuple[int, int, str]] = []
    current: list[Any] | None = None  # [first, last, type]
    for i, tag in enumerate(tags):
        prefix, kind = (tag[:1], tag[2:]) if tag[1:2] == "-" else ("O", "")
        if prefix == "I" and current is not None and current[2] == kind:
            current[1] = i
            continue
        if current is not None:
            out.append((current[0], current[1], current[2]))
            current = None
        if prefix in ("B", "I"):
            current = [i, i, kind]
    if current is not None:
        out.append((current[0], current[1], current[2]))
    return out


def multi_label_f1(
    truth: np.ndarray, predicted: np.ndarray, labels: Sequence[str]
) -> dict[str, Any]:
    """Return micro and macro F1 (and per-label precision/recall/F1/support) of 0/1 matrices.

    ``truth`` and ``predicted`` are ``[texts, labels]``. Micro pools every (text, label) decision;
    macro is the unweighted mean of the per-label F1 (0 for a label never true nor predicted).
    """
    truth, predicted = np.asarray(truth, bool), np.asarray(predicted, bool)
    hits = (truth & predicted).sum(axis=0)
    n_true, n_pred = truth.sum(axis=0), predicted.sum(axis=0)
    per_label = {
        label: {**_prf(int(hits[j]), int(n_pred[j]), int(n_true[j])), "support": int(n_true[j])}
        for j, label in enumerate(labels)
    }
    micro = _prf(int(hits.sum()), int(n_pred.sum()), int(n_true.sum()))
    return {
        "examples": int(truth.shape[0]),
        "micro_f1": micro["f1"],
        "micro_precision": micro["precision"],
        "micro_recall": micro["recall"],
        "macro_f1": float(np.mean([v["f1"] for v in per_label.values()])) if labels else 0.0,
        "subset_accuracy": float(np.mean(np.all(truth == predicted, axis=1)))
        if len(truth)
        else 0.0,
        "per_label": per_label,
    }


def best_threshold(scores: np.ndarray, truth: np.ndarray, default: float = 0.5) -> float:
    """Return the threshold on ``scores`` (decide ``score >= t``) that maximises F1 on ``truth``.

    Candidates are ``default`` and the midpoints between consecutive distinct scores (a threshold
    between two scores generalises better than one equal to a score); ties go to the candidate
    nearest ``default``. With no positive in ``truth`` no threshold has a useful F1: ``default``.
    """
    scores, truth = np.asarray(scores, np.float64), np.asarray(truth, bool)
    if not truth.any():
        return default
    distinct = np.unique(scores)
    candidates = np.concatenate([[default], (distinct[:-1] + distinct[1:]) / 2,
                                 [distinct[0] - 1e-6]])  # fmt: skip
    best, best_key = default, (-1.0, 0.0)
    for t in candidates:
        chosen = scores >= t
        f1 = _prf(int((chosen & truth).sum()), int(chosen.sum()), int(truth.sum()))["f1"]
        key = (f1, -abs(t - default))
        if key > best_key:
            best, best_key = float(t), key
    return best


def mrr_at_k(ranked_relevance: Sequence[Sequence[float]], k: int = 10) -> float:
    """Return the mean reciprocal rank at ``k``: per query 1/rank of the first relevant document
    in the top ``k`` (0 if none), averaged over queries. ``ranked_relevance[q]`` is query q's
    relevance in ranked order (best first); any relevance > 0 counts as relevant."""
    if not ranked_relevance:
        return 0.0
    total = 0.0
    for relevance in ranked_relevance:
        for rank, rel in enumerate(relevance[:k], start=1):
            if rel > 0:
                total += 1.0 / rank
                break
    return total / len(ranked_relevance)


def ndcg_at_k(ranked_relevance: Sequence[Sequence[float]], k: int = 10) -> float:
    """Return the mean nDCG at ``k`` with linear gains (trec_eval's): per query
    ``DCG = Σ rel_i / log2(i + 1)`` over ranks i = 1..k, divided by the DCG of the ideal order
    (0 for a query with nothing relevant)."""
    if not ranked_relevance:
        return 0.0
    total = 0.0
    for relevance in ranked_relevance:
        rel = np.asarray(relevance, np.float64)
        discounts = 1.0 / np.log2(np.arange(2, min(k, len(rel)) + 2))
        ideal = float(np.sort(rel)[::-1][:k] @ discounts)
        total += float(rel[:k] @ discounts) / ideal if ideal > 0 else 0.0
    return total / len(ranked_relevance)


def rank_by_query(
    queries: Sequence[str], scores: Sequence[float], relevance: Sequence[float]
) -> list[list[float]]:
    """Return each query's relevance in the order its scores rank the documents (best first).

    Rows with the same query (``text_a``) form one query, in order of first appearance; ties in
    score keep file order (a stable sort), so equal scores never flatter a ranking by chance.
    """
    grouped: dict[str, list[tuple[float, float]]] = {}
    for query, score, rel in zip(queries, scores, relevance, strict=True):
        grouped.setdefault(query, []).append((float(score), float(rel)))
    return [
        [rel for _score, rel in sorted(rows, key=lambda row: -row[0])] for rows in grouped.values()
    ]


def rerank_scores(
    queries: Sequence[str], scores: Sequence[float], relevance: Sequence[float], k: int = 10
) -> dict[str, Any]:
    """Return MRR@k and nDCG@k over the queries that have at least one relevant document.

    A query with no relevant document scores 0 whatever the ranking, so it is left out (and
    counted), as MS MARCO and BEIR evaluation do.
    """
    ranked = [r for r in rank_by_query(queries, scores, relevance) if any(x > 0 for x in r)]
    everything = len(set(queries))
    return {
        f"mrr@{k}": mrr_at_k(ranked, k),
        f"ndcg@{k}": ndcg_at_k(ranked, k),
        "queries": len(ranked),
        "queries_without_relevant": everything - len(ranked),
        "documents_per_query": len(queries) / everything if everything else 0.0,
    }
