"""The evaluation figures of every head, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from finetune.metrics import (
    best_threshold,
    bio_entities,
    entity_f1,
    mrr_at_k,
    multi_label_f1,
    ndcg_at_k,
    rank_by_query,
    rerank_scores,
)


def test_entity_f1_is_span_exact_micro_and_per_type() -> None:
    gold = [{(0, 5, "ORDER"), (10, 14, "DATE")}, {(3, 8, "EMAIL")}]
    predicted = [
        {(0, 5, "ORDER"), (10, 13, "DATE")},  # DATE one character short: a miss and a false hit
        {(3, 8, "EMAIL"), (20, 25, "ORDER")},
    ]

    figures = entity_f1(gold, predicted)

    # 2 hits of 4 predicted and 3 gold: P 0.5, R 2/3, F1 4/7
    assert figures["micro"]["precision"] == pytest.approx(0.5)
    assert figures["micro"]["recall"] == pytest.approx(2 / 3)
    assert figures["micro"]["f1"] == pytest.approx(4 / 7)
    assert figures["micro"]["support"] == 3
    assert figures["per_type"]["ORDER"] == pytest.approx(
        {"precision": 0.5, "recall": 1.0, "f1": 2 / 3, "support": 1}
    )
    assert figures["per_type"]["DATE"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert figures["per_type"]["EMAIL"]["f1"] == 1.0


def test_entity_f1_counts_a_wrong_type_on_the_right_span_as_a_miss() -> None:
    figures = entity_f1([{(0, 5, "ORDER")}], [{(0, 5, "PRODUCT")}])

    assert figures["micro"]["f1"] == 0.0
    assert figures["per_type"]["PRODUCT"]["support"] == 0


@pytest.mark.parametrize(
    ("tags", "entities"),
    [
        (["B-A", "I-A", "O", "B-B"], [(0, 1, "A"), (3, 3, "B")]),
        (["I-A", "I-A", "O"], [(0, 1, "A")]),  # seqeval: a stray I- starts an entity
        (["B-A", "I-B", "I-B"], [(0, 0, "A"), (1, 2, "B")]),  # a type change starts another
        (["B-A", "B-A", "I-A"], [(0, 0, "A"), (1, 2, "A")]),
        (["O", "O"], []),
    ],
)
def test_bio_entities_read_tags_as_seqeval_does(tags: list[str], entities: list) -> None:  # type: ignore[type-arg]
    assert bio_entities(tags) == entities


def test_multi_label_micro_and_macro_f1() -> None:
    truth = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0]])
    predicted = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 0]])

    figures = multi_label_f1(truth, predicted, ["a", "b", "c"])

    # hits 3 (a twice, b once), predicted 4, true 5: micro P 3/4, R 3/5, F1 2/3
    assert figures["micro_f1"] == pytest.approx(2 / 3)
    # per label: a 1.0, b P 1 R 1/2 → 2/3, c P 0 R 0 → 0; macro = (1 + 2/3 + 0) / 3
    assert figures["per_label"]["b"]["f1"] == pytest.approx(2 / 3)
    assert figures["macro_f1"] == pytest.approx(5 / 9)
    assert figures["subset_accuracy"] == 0.0


def test_best_threshold_maximises_the_labels_f1_between_scores() -> None:
    scores = np.array([0.9, 0.35, 0.3, 0.1])
    truth = np.array([1, 1, 0, 0])

    # 0.5 would miss 0.35; the midpoint between 0.35 and 0.3 separates the classes
    assert best_threshold(scores, truth) == pytest.approx(0.325)
    assert best_threshold(scores, np.zeros(4)) == 0.5  # no positive: keep the default


def test_mrr_and_ndcg_at_10_by_hand() -> None:
    ranked = [[0, 1, 0], [1, 0, 1]]

    # query 1: first relevant at rank 2 → 1/2; query 2: rank 1 → 1
    assert mrr_at_k(ranked) == pytest.approx(0.75)
    # query 1: DCG 1/log2(3), ideal 1 → 0.6309; query 2: (1 + 1/log2(4)) / (1 + 1/log2(3))
    q1 = 1 / math.log2(3)
    q2 = (1 + 0.5) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(ranked) == pytest.approx((q1 + q2) / 2)


def test_metrics_at_k_ignore_documents_past_k() -> None:
    ranked = [[0, 0, 1]]

    assert mrr_at_k(ranked, k=2) == 0.0
    assert ndcg_at_k(ranked, k=2) == 0.0


def test_rerank_scores_group_rows_by_query_and_rank_by_score() -> None:
    queries = ["q1", "q1", "q1", "q2", "q2", "q3"]
    scores = [0.1, 0.9, 0.5, 0.2, 0.8, 0.7]
    relevance = [1, 0, 0, 1, 0, 0]

    assert rank_by_query(queries, scores, relevance) == [[0, 0, 1], [0, 1], [0]]
    figures = rerank_scores(queries, scores, relevance)

    assert figures["mrr@10"] == pytest.approx((1 / 3 + 1 / 2) / 2)  # q3 has nothing relevant
    assert figures["queries"] == 2 and figures["queries_without_relevant"] == 1
