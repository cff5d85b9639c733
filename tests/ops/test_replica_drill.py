"""The replica drill, run short on tiny exports (real processes), and its pure checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from ops import tfs_metrics
from ops.drills import replica as replica_drill
from ops.drills.common import Answer
from ops.drills.replica import ReplicaMonitor, Window
from tests.ops.conftest import MODEL
from tests.ops.test_drills import run_drill

METRICS = """# TYPE :tensorflow:serving:request_count counter
:tensorflow:serving:request_count{model_name="tiny",status="OK"} 120
:tensorflow:serving:request_count{model_name="tiny",status="NOT_FOUND"} 2
:tensorflow:serving:request_count{model_name="other",status="OK"} 7
"""


def test_request_counts_read_one_models_counter_by_status() -> None:
    assert tfs_metrics.request_counts(METRICS, "tiny") == {"OK": 120, "NOT_FOUND": 2}
    assert tfs_metrics.request_counts(METRICS) == {"OK": 127, "NOT_FOUND": 2}  # every model's


@pytest.mark.parametrize(
    ("served", "within"), [((100, 110, 95), True), ((100, 130, 70), False), ((5, 1, 9), None)]
)
def test_a_window_is_judged_against_its_mean_when_it_holds_enough_requests(
    served: tuple[int, int, int], within: bool | None
) -> None:
    names = ["r0", "r1", "r2"]
    window = Window("w", 0.0, 1.0, names, before={n: {"OK": 10} for n in names})
    window.after = {n: {"OK": 10 + c} for n, c in zip(names, served, strict=True)}
    row = replica_drill.judge_windows([window], 0.2)["rows"][0]
    assert row["within_bound"] is within


def test_an_answer_must_be_available_on_every_replica_seen_up_meanwhile() -> None:
    monitor = ReplicaMonitor([], MODEL)
    monitor.seen = [
        (1.0, "r0", frozenset({1, 2})),
        (1.0, "r1", frozenset({1})),
        (1.0, "r2", None),  # down: not a replica that could have served it
    ]
    assert monitor.unavailable_on_live_replica(Answer(0, "", 0.9, 1.1, 200, 1)) == []
    assert monitor.unavailable_on_live_replica(Answer(0, "", 0.9, 1.1, 200, 2)) == ["r1"]


@pytest.mark.slow
@pytest.mark.parametrize("upstream", ["grpc"])
def test_replica_drill_kill_push_promote_has_no_failed_request(
    tiny_exports: Path, tmp_path: Path, upstream: str
) -> None:
    code, result, output = run_drill(
        "replica_drill.py", tmp_path / "replicas.json", "--spawn", str(tiny_exports),
        "--model", MODEL, "--clients", "6", "--pace", "0.05", "--duration", "8", "--down", "5",
        "--upstream", upstream,
    )  # fmt: skip
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed, f"{failed}\n{output[-4000:]}"
    assert code == 0
    assert "failed" not in result["counts"]
    # v2 (copied in) answered, then the pushed v3 once every replica had it.
    assert {"version 2", "version 3"} <= set(result["counts"])
    assert any(row["judged"] for row in result["windows"])
    assert all(step["ok"] for step in result["steps"].values())
    assert "Predict calls each replica answered" in output
