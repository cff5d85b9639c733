"""heads_bench --quick: its whole code path once on tiny models (real modelserver + gunicorn).

No demo models under the base path and --quick: tiny random tag and cross-encoder models.
Speed is never asserted: only that every row was measured and is well-formed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import BenchContext
from benchmarks.heads_bench import max_len_parts, run


def test_max_len_parts_fill_three_texts_up_to_the_budget() -> None:
    texts = ["one two three four five", "six seven eight nine ten eleven twelve"]
    parts = max_len_parts(lambda text: len(text.split()), texts, budget=4)
    assert parts == ["one two three four", "five six seven eight", "nine ten eleven twelve"]


def test_max_len_parts_refuses_too_little_text() -> None:
    with pytest.raises(ValueError, match="fewer than 3"):
        max_len_parts(lambda text: len(text.split()), ["a b c"], budget=2)


@pytest.mark.slow  # two tiny exports + a stack: ~35 s idle, 71 s at load average 10
@pytest.mark.timeout(300)
def test_quick_run_gives_every_row_well_formed(tmp_path: Path) -> None:
    ctx = BenchContext(base_path=tmp_path / "no-demo-models", work_dir=tmp_path, quick=True)
    rows = {r.figure: r for r in run(ctx)}
    tag = rows[":tag 8 tickets/request, gateway vs direct gRPC"]
    rerank = rows[":rerank 1 query × 32 documents (cross-encoder), gateway vs direct gRPC"]
    for row in (tag, rerank):
        assert re.fullmatch(r"[\d.]+ vs [\d.]+ texts/s", row.value), row.value
        assert re.fullmatch(r"[\d.]+× direct; gateway's share -?[\d.]+%", row.ratio), row.ratio
        assert "tiny-" in row.how and "gRPC Predict" in row.how
    assert "token_type_ids" in rerank.how
    truncated = rows[":tag a 3× max_seq_len text: windows vs truncated to max_seq_len"]
    three = rows[":tag a 3× max_seq_len text: windows vs its 3 parts as 3 texts"]
    for row in (truncated, three):
        assert re.fullmatch(r"[\d.]+ vs [\d.]+ ms", row.value) and row.ratio.endswith("×")
    assert "read as 4 windows of 32" in truncated.how  # 90 tokens, windows of 30 stepping 23
