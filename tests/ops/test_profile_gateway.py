"""profile_gateway: folding py-spy's collapsed stacks (pure; recording needs py-spy and a stack)."""

from __future__ import annotations

import pytest

from ops.load.profiler import fold


def test_fold_counts_self_and_total_shares_and_skips_process_and_thread_frames() -> None:
    lines = [
        'process 1:"gunicorn";thread (0x1);handle (gunicorn/workers/gthread.py:1);'
        "encode (/repo/backend/tokenization.py:9) 3",
        'process 1:"gunicorn";thread (0x1);handle (gunicorn/workers/gthread.py:1) 1',
        "not a stack line",
    ]
    samples, shares = fold(lines)
    assert samples == 4
    by_name = {s.name.split(" ")[0]: s for s in shares}
    assert set(by_name) == {"handle", "encode"}
    assert by_name["encode"].self_share == pytest.approx(0.75)
    assert by_name["handle"].self_share == pytest.approx(0.25)
    assert by_name["handle"].total_share == pytest.approx(1.0)
    assert shares[0].name.startswith("encode")  # ordered by self share


def test_fold_of_nothing_is_empty() -> None:
    assert fold([]) == (0, [])
