"""Embedders' rollouts: the vector-space check before a weighted step (ops/rollout/spaces.py), and
``python -m ops.rollout migrate`` (ops/rollout/migrate.py) against a real model server of tiny
embedders: v1, v2 (another seed: another space), v3 (v1 in bf16: the same space)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from modelformat import serverconfig
from ops.rollout import cli as rolloutcli
from ops.rollout import migrate
from ops.rollout.metrics import GatewayMetrics
from ops.rollout.spaces import (
    MIN_AGREEMENT,
    KindCheck,
    SpaceCheck,
    compare,
    mean_cosine,
    neighbour_overlap,
    sample_texts,
)
from ops.rollout.state import load_states, state_path_for
from tests.ops import test_rollout as scripted
from tests.ops.conftest import OpsServer
from tests.ops.test_rollout import FakeGateway, Promotions, log_lines, make_rollout

serving, gateway = scripted.serving, scripted.gateway  # the scripted gateway's fixtures

# ---------------------------------------------------------------------------------------------
# the measures, on vectors made for them


def spaces(seed: int = 0, rows: int = 120, dim: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)


def versions(old: np.ndarray, new: np.ndarray) -> Any:
    """Return an ``Embed`` answering ``old`` for v1 and ``new`` for v2, whatever the texts."""
    return lambda version, texts, kind, is_query: old if version == 1 else new


def test_a_reexport_and_a_precision_change_are_one_space() -> None:
    a = spaces()
    bf16 = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)  # truncated to bfloat16
    for b in (a, bf16):
        check = compare(versions(a, b), 1, 2, sample_texts())
        assert check.same_space, check.describe()
        dense = check.kind("dense")
        assert dense.agreement > 0.99 and dense.overlap > 0.9


def test_another_space_is_two_spaces_even_when_its_neighbours_agree() -> None:
    a = spaces()
    rotation = np.linalg.qr(np.random.default_rng(1).standard_normal((32, 32)))[0]
    rotated = (a @ rotation).astype(np.float32)  # the same neighbours, other coordinates
    assert neighbour_overlap(a[:20], a[20:], rotated[:20], rotated[20:]) == 1.0
    assert not compare(versions(a, rotated), 1, 2, sample_texts()).same_space
    check = compare(versions(a, spaces(seed=2)), 1, 2, sample_texts())
    dense = check.kind("dense")
    assert not check.same_space and dense.overlap < 0.3 and abs(dense.agreement) < 0.2
    assert mean_cosine(a, spaces(dim=16)) == 0.0  # another dimension: nothing in common


# ---------------------------------------------------------------------------------------------
# the engine: refused before any weighted step, recorded


def dense_check(stable: int, new: int, cosine: float, overlap: float) -> SpaceCheck:
    kind = KindCheck("dense", cosine, overlap, (32, 32), MIN_AGREEMENT["dense"])
    return SpaceCheck(stable, new, (kind,), 20, 100)


def two_spaces(model: str, stable: int, new: int) -> SpaceCheck:
    return dense_check(stable, new, 0.02, 0.08)


def one_space(model: str, stable: int, new: int) -> SpaceCheck:
    return dense_check(stable, new, 0.999, 0.95)


def test_two_spaces_refuse_the_weighted_canary_naming_the_migration(
    serving: Path, gateway: FakeGateway
) -> None:
    promotions = Promotions()
    rollout = make_rollout(serving, GatewayMetrics([gateway.url]), promotions)
    rollout.check_spaces = two_spaces
    assert rollout.run() == "rolled back"
    assert promotions.calls == []
    assert not any(r is not None and 2 in dict(r.weights) for r in gateway.routes_seen)
    events = log_lines(serving)
    assert [e["event"] for e in events] == ["start", "spaces", "rolled_back"]
    assert events[1]["spaces"]["same_space"] is False
    reason = events[-1]["reason"]
    assert "another vector space" in reason
    assert "python -m ops.rollout migrate tiny --to 2 --corpus FILE" in reason
    assert not state_path_for(serving / "routing.yaml").exists()


@pytest.mark.parametrize(
    ("check", "steps", "calls"),
    [(one_space, "shadow:100,50,100", 1), (lambda m, s, n: None, "50,100", 1),
     (two_spaces, "shadow:100", 0)],
    ids=["one-space", "not-an-embedder", "shadow-only"],
)  # fmt: skip
def test_one_space_a_classifier_or_no_weighted_step_rolls_out_as_before(
    serving: Path, gateway: FakeGateway, check: Any, steps: str, calls: int
) -> None:
    seen: list[tuple[str, int, int]] = []

    def recorded(model: str, stable: int, new: int) -> SpaceCheck | None:
        seen.append((model, stable, new))
        return check(model, stable, new)  # type: ignore[no-any-return]

    promotions = Promotions()
    rollout = make_rollout(serving, GatewayMetrics([gateway.url]), promotions, steps=steps)
    rollout.check_spaces = recorded
    assert rollout.run() == "promoted"
    assert promotions.calls == [("tiny", "stable", 2)]
    assert seen == [("tiny", 1, 2)] * calls


# ---------------------------------------------------------------------------------------------
# against a real model server: the check, the migration and its rollback


def cli_args(server: OpsServer, *more: str) -> Any:
    return rolloutcli.parse_args([
        "--name", "tiny", "--version", "2", "--gateway", "http://127.0.0.1:1",
        "--server", server.grpc_target, "--config", str(server.config),
        "--base-path", str(server.base_path), "--reader-wait", "0", *more,
    ])  # fmt: skip


def test_the_space_check_tells_a_precision_change_from_another_space(
    embed_server: OpsServer,
) -> None:
    check = rolloutcli.spaces_checker(cli_args(embed_server))
    same, other = check("tiny", 1, 3), check("tiny", 1, 2)
    assert same is not None and other is not None
    print(same.describe(), other.describe(), sep="\n")
    assert same.same_space and not other.same_space


def write_corpus(path: Path, rows: int = 60) -> Path:
    texts = sample_texts(rows, seed=7)
    path.write_bytes(b"".join(orjson.dumps({"id": f"d{i}", "text": t}) + b"\n"
                              for i, t in enumerate(texts)))  # fmt: skip
    return path


def migrate_args(server: OpsServer, tmp_path: Path, *more: str) -> list[str]:
    return [
        "tiny", "--server", server.grpc_target, "--config", str(server.config),
        "--base-path", str(server.base_path), "--reader-wait", "0", "--timeout", "60",
        "--log", str(tmp_path / "rollouts.jsonl"), *more,
    ]  # fmt: skip


def served(server: OpsServer) -> list[int]:
    config = serverconfig.read(server.config).model_config_list.config[0]
    return sorted(config.model_version_policy.specific.versions)


def stable_of(server: OpsServer) -> int:
    return serverconfig.version_labels(serverconfig.read(server.config))["tiny"]["stable"]


def test_migrate_embeds_checks_moves_the_label_once_and_rolls_back(
    embed_server: OpsServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "v2"
    args = migrate_args(embed_server, tmp_path, "--to", "2", "--corpus", str(corpus),
                        "--output", str(out))  # fmt: skip
    assert rolloutcli.main(["migrate", *args]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["output"]["rows"] == 60 and report["output"]["dim"] > 0
    assert report["spaces"]["same_space"] is False and report["label"] == {"stable": 2, "was": 1}
    assert stable_of(embed_server) == 2
    assert served(embed_server) == [1, 2, 3]  # nothing unloaded: v1 stays until it is retired
    events = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "embedded", "checked", "spaces", "migrated"]
    assert not load_states(state_path_for(embed_server.config.with_name("routing.yaml")))
    # Again: v2 is stable already, nothing moves.
    assert migrate.main(args) == 1
    # The rollback moves the label back and keeps the output.
    assert migrate.main(migrate_args(embed_server, tmp_path, "--rollback")) == 0
    assert stable_of(embed_server) == 1 and (out / "manifest.json").exists()
    assert served(embed_server) == [1, 2, 3]
    assert migrate.main(migrate_args(embed_server, tmp_path, "--rollback")) == 1  # done once


def test_migrate_refuses_an_incomplete_output(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from ops.batch import parts
    from ops.modelconfig import OpsError

    (tmp_path / "errors.jsonl").write_bytes(b"")
    vectors = np.ones((2, 4), np.float32)
    vectors[1] = 0.0
    pq.write_table(parts.dense_table(["a", "a"], vectors, ["tiny"] * 2, [2, 2]),
                   tmp_path / "part-00000.parquet")  # fmt: skip
    with pytest.raises(OpsError) as err:
        migrate.check_output(tmp_path, ["a", "b"], "tiny", 2, {"dense": 8})
    message = str(err.value)
    for part in ("dimension 4, v2 answers 8", "1 rows missing", "1 rows twice", "norm 0"):
        assert part in message
