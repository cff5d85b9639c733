"""The migration drill (ops/drills/migration.py), run short on tiny embedders of two spaces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.ops.test_drills import run_drill


def test_migration_drill_moves_the_label_once_and_default_traffic_with_it(
    embed_exports: Path, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    # Tiny models answer in milliseconds: a 1 s label cache (and reader wait) keeps it short.
    code, result, output = run_drill(
        "migration_drill.py", tmp_path / "drill.json", "--spawn", str(embed_exports),
        "--model", "tiny", "--from", "1", "--to", "2", "--clients", "2", "--unlabelled-clients",
        "1", "--corpus-rows", "200",
        "--warmup-s", "1", "--after-s", "2.5", "--reader-wait", "1",
        env={"GATEWAY_LABELS_CACHE_S": "1"},
    )  # fmt: skip
    record_property("migration_drill", {k: v for k, v in result.items() if k != "migration"})
    assert code == 0, output[-4000:]
    assert all(result["checks"].values()), result["checks"]
    assert result["failed"] == 0 and result["label_changes"] == [1, 2]
    # default traffic: pinned to v1 (as a refused canary leaves it) until the label moved, then
    # with the label (the entry removed: v2 is the newest version)
    assert result["checks"]["default traffic ended on the label's version"]
    assert result["unlabelled_by_version"]["v1"] > 0 and result["unlabelled_by_version"]["v2"] > 0
    assert result["wrong_unlabelled"] == 0 and result["routes"] == [1, None]
    assert result["migration"]["output"]["rows"] == 200
    assert result["migration"]["spaces"]["same_space"] is False
    assert result["events"] == ["start", "embedded", "checked", "spaces", "migrated"]
