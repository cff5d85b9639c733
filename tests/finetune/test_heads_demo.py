"""``python -m finetune.heads_demo`` end to end on tiny checkpoints: export each head, score it on
the real test splits the way the gateway serves it, print the tables (training is the finetune
suite's business: ``--reuse`` exports kept checkpoints)."""

from __future__ import annotations

from pathlib import Path

import pytest

from export.tiny import export_tiny_model, write_hf_checkpoint
from finetune import heads_demo
from finetune.demo import minilm_dir

TOPICS = ["account", "billing", "delivery", "refund", "technical"]


def test_the_demo_exports_and_scores_every_head(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep, base = tmp_path / "keep", tmp_path / "models"
    # MiniLM's vocabulary so tickets tokenize as in the demo (a ticket fits a tiny model's length)
    vocab = (minilm_dir() / "vocab.txt").read_text(encoding="utf-8").splitlines()
    write_hf_checkpoint(keep / "pairs", labels=["relevant"], text_pair=True, seed=1, vocab=vocab)
    write_hf_checkpoint(keep / "ner", task="tag", seed=2, vocab=vocab)
    write_hf_checkpoint(keep / "topics", labels=TOPICS, seed=3, vocab=vocab,
                        problem_type="multi_label_classification")  # fmt: skip
    export_tiny_model(base, "minilm", task="embed", warmup=False, vocab=vocab)
    assert max(h.max_seq_len for h in heads_demo.HEADS.values()) <= 128  # tiny models' positions

    assert heads_demo.main(["--base-path", str(base), "--keep", str(keep), "--reuse"]) == 0

    out = capsys.readouterr().out
    for model in ("minilm-pairs", "minilm-ner", "minilm-topics"):
        assert (base / model / "1" / "assets" / "model.json").is_file()
    # at 64 tokens five test tickets alone fill max_seq_len: their pairs are left out, counted
    assert "minilm-pairs on data/pairs/test.tsv (743 pairs): accuracy" in out
    assert "21 pairs left out: the ticket alone fills max_seq_len" in out
    assert "ranking all 63 articles for 181 test tickets" in out
    assert (
        "| minilm embeddings, cosine |" in out
        and "| cosine top 20 reranked by minilm-pairs |" in out
    )
    assert "minilm-ner on data/entities/test.jsonl (225 tickets)" in out and "| **micro** |" in out
    assert "minilm-topics on data/tickets-multilabel/test.tsv (200 tickets" in out


def test_reuse_needs_keep() -> None:
    with pytest.raises(SystemExit):
        heads_demo.main(["--reuse"])
