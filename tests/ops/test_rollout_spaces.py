"""Embedders' rollouts: the vector-space check before a weighted step (ops/rollout/spaces.py), and
``python -m ops.rollout migrate`` (ops/rollout/migrate.py) against a real model server of tiny
embedders: v1, v2 (another seed: another space), v3 (v1 in bf16: the same space)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from modelformat import serverconfig
from ops.rollout import cli as rolloutcli
from ops.rollout import engine as rollout
from ops.rollout import migrate
from ops.rollout.metrics import GatewayMetrics
from ops.rollout.spaces import (
    MIN_AGREEMENT,
    KindCheck,
    SpaceCheck,
    compare,
    gateway_embed,
    mean_cosine,
    neighbour_overlap,
    sample_texts,
)
from ops.rollout.state import load_states, state_path_for, write_route
from tests.ops import test_rollout as scripted
from tests.ops.conftest import OpsServer, start_ops_server
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


def test_a_dense_check_recorded_before_kinds_reads_back_as_its_dense_kind() -> None:
    # a rollout's state file written by the release before kinds, resumed by this one
    recorded = {"stable": 1, "new": 2, "cosine": 0.02, "overlap": 0.08, "dims": [32, 32],
                "queries": 20, "corpus": 100, "min_cosine": 0.95, "min_overlap": 0.7,
                "same_space": False}  # fmt: skip
    check = SpaceCheck.from_json(recorded)
    assert check == dense_check(1, 2, 0.02, 0.08) and not check.same_space


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


def cli_args_list(server: OpsServer, *more: str, model: str = "tiny") -> list[str]:
    return [
        "--name", model, "--version", "2", "--gateway", "http://127.0.0.1:1",
        "--server", server.grpc_target, "--config", str(server.config),
        "--base-path", str(server.base_path), "--reader-wait", "0", *more,
    ]  # fmt: skip


def cli_args(server: OpsServer, *more: str, model: str = "tiny") -> Any:
    return rolloutcli.parse_args(cli_args_list(server, *more, model=model))


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


def default_version(server: OpsServer, model: str = "tiny") -> int:
    """Return the version a request naming no version or label gets now (a fresh in-process
    gateway: it reads the labels and the routing file beside models.config as it starts)."""
    gateway, _ = gateway_embed(server.grpc_target, server.base_path, server.config)
    try:
        done, _ = gateway.embeddings(model, ["which version answers"], None, None)
        return int(done.served)
    finally:
        gateway.close()


def observed_migration(args: list[str], server: OpsServer, seen: list[int]) -> Any:
    """Return the migration of ``args`` noting in ``seen`` the version default traffic gets
    just before its label moves (the re-embedded corpus checked, the label not moved yet)."""
    migration = migrate.Migration(migrate.parse_args(args))
    promote = migration.promote

    def observed(model: str, label: str, version: int) -> None:
        seen.append(default_version(server))
        promote(model, label, version)

    migration.promote = observed
    return migration


def test_migrate_embeds_checks_moves_the_label_once_and_rolls_back(
    embed_server: OpsServer, tmp_path: Path
) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    out = tmp_path / "v2"
    args = migrate_args(embed_server, tmp_path, "--to", "2", "--corpus", str(corpus),
                        "--output", str(out))  # fmt: skip
    # No routing entry: default traffic goes to the newest AVAILABLE version (v3, v1's space).
    assert default_version(embed_server) == 3
    during: list[int] = []
    report = observed_migration(args, embed_server, during).run()
    assert during == [1]  # pinned to the label's version until the label moved
    assert report["output"]["rows"] == 60 and report["output"]["dim"] > 0
    assert report["spaces"]["same_space"] is False and report["label"] == {"stable": 2, "was": 1}
    assert stable_of(embed_server) == 2
    assert served(embed_server) == [1, 2, 3]  # nothing unloaded: v1 stays until it is retired
    # Default traffic follows the label (v3, newer, is in the policy: v2 pinned).
    assert default_version(embed_server) == 2
    events = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start", "embedded", "checked", "spaces", "migrated"]
    assert not load_states(state_path_for(embed_server.config.with_name("routing.yaml")))
    # Again: v2 is stable already, nothing moves.
    assert migrate.main(args) == 1
    # The rollback moves the label back, default traffic with it, and keeps the output.
    assert migrate.main(migrate_args(embed_server, tmp_path, "--rollback")) == 0
    assert stable_of(embed_server) == 1 and (out / "manifest.json").exists()
    assert default_version(embed_server) == 1
    assert served(embed_server) == [1, 2, 3]
    assert migrate.main(migrate_args(embed_server, tmp_path, "--rollback")) == 1  # done once


def test_after_a_refused_canary_a_migration_moves_default_traffic_with_the_label(
    embed_server: OpsServer, tmp_path: Path
) -> None:
    routing = embed_server.config.with_name("routing.yaml")
    write_route(routing, "tiny", None)
    assert stable_of(embed_server) == 1
    log = str(tmp_path / "rollouts.jsonl")
    refused = rolloutcli.main([*cli_args_list(embed_server), "--steps", "50,100", "--log", log])
    assert refused == rollout.EXIT_ROLLED_BACK
    assert default_version(embed_server) == 1  # the refusal pinned default traffic to v1
    corpus = write_corpus(tmp_path / "corpus.jsonl", rows=40)
    args = migrate_args(embed_server, tmp_path, "--to", "2", "--corpus", str(corpus),
                        "--output", str(tmp_path / "v2"))  # fmt: skip
    during: list[int] = []
    observed_migration(args, embed_server, during).run()
    assert during == [1] and stable_of(embed_server) == 2
    assert default_version(embed_server) == 2  # not v1 of the refusal's pin: the label's
    assert migrate.main(migrate_args(embed_server, tmp_path, "--rollback")) == 0
    assert stable_of(embed_server) == 1 and default_version(embed_server) == 1


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


def test_migrate_checks_each_kinds_columns(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from ops.batch import parts
    from ops.modelconfig import OpsError

    def record(i: int, rows: int, weight: float) -> dict[str, Any]:
        return {
            "id": f"d{i}",
            "embedding": np.ones(4, np.float32),
            "sparse_indices": np.array([7, 9]),
            "sparse_values": np.array([weight, 0.5]),
            "token_vectors": np.ones((rows, 3), np.float32),
            "model": "m3",
            "version": 2,
        }

    kinds = ("dense", "sparse", "multivector")
    (tmp_path / "errors.jsonl").write_bytes(b"")
    good = parts.table([record(0, 2, 1.0), record(1, 1, 2.0)], kinds, with_input=False)
    pq.write_table(good, tmp_path / "part-00000.parquet")
    dims = {"dense": 4, "sparse": 0, "multivector": 3}
    figures = migrate.check_output(tmp_path, ["d0", "d1"], "m3", 2, dims)
    assert figures["kinds"] == list(kinds) and figures["multivector_dim"] == 3
    bad = parts.table([record(2, 0, float("nan"))], kinds, with_input=False)
    pq.write_table(bad, tmp_path / "part-00001.parquet")
    with pytest.raises(OpsError) as err:
        migrate.check_output(tmp_path, ["d0", "d1", "d2"], "m3", 2, {**dims, "multivector": 5})
    message = str(err.value)
    for part in ("multi-vector dimension 3, v2 answers 5", "1 multi-vectors without a row",
                 "1 sparse or multi-vector values not finite"):  # fmt: skip
        assert part in message


# ---------------------------------------------------------------------------------------------
# every output kind: tiny BGE-M3-, SPLADE- and ColBERT-like versions on one model server

M3, SPLADE, COLBERT = "tiny-m3", "tiny-splade", "tiny-colbert"


@pytest.fixture(scope="module")
def retrieval_server(
    retrieval_exports: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpsServer]:
    """Start ``python -m modelserver`` on the tiny retrieval versions, stable=1 each."""
    work = tmp_path_factory.mktemp("retrieval-server")
    base = work / "models"
    shutil.copytree(retrieval_exports, base)
    entries = "".join(
        f'config {{ name: "{name}" base_path: "{base / name}" model_platform: "tensorflow" '
        f"model_version_policy {{ specific {{ {' '.join(f'versions: {v}' for v in versions)} "
        f'}} }} version_labels {{ key: "stable" value: 1 }} }} '
        for name, versions in ((M3, (1, 2, 3, 4)), (SPLADE, (1, 2)), (COLBERT, (1, 2)))
    )
    server = start_ops_server(work, base, f"model_config_list {{ {entries}}}\n")
    try:
        yield server
    finally:
        server.proc.stop()


@pytest.mark.parametrize(
    ("model", "new", "changed"),
    [(M3, 4, ()), (M3, 2, ("sparse",)), (M3, 3, ("multivector",)), (SPLADE, 2, ("sparse",)),
     (COLBERT, 2, ("multivector",))],
    ids=["bge-m3-reexport", "bge-m3-sparse-head", "bge-m3-token-vectors", "splade-new-space",
         "colbert-new-space"],
)  # fmt: skip
def test_the_space_check_compares_every_output_kind(
    retrieval_server: OpsServer, model: str, new: int, changed: tuple[str, ...]
) -> None:
    check = rolloutcli.spaces_checker(cli_args(retrieval_server, model=model))(model, 1, new)
    assert check is not None
    print(check.describe())
    assert check.same_space == (not changed)
    kinds = {k.kind: k.same_space for k in check.kinds}
    expected = {M3: ("dense", "sparse", "multivector"), SPLADE: ("sparse",),
                COLBERT: ("multivector",)}[model]  # fmt: skip
    assert kinds == {kind: kind not in changed for kind in expected}
    # what the state file records reads back the same (a resumed rollout's refusal)
    assert SpaceCheck.from_json(check.to_json()) == check


def test_migrate_a_sparse_only_model_re_embeds_its_sparse_vectors(
    retrieval_server: OpsServer, tmp_path: Path
) -> None:
    import pyarrow.parquet as pq

    corpus = write_corpus(tmp_path / "corpus.jsonl", rows=40)
    out = tmp_path / "v2"
    args = migrate_args(retrieval_server, tmp_path, "--to", "2", "--corpus", str(corpus),
                        "--output", str(out))  # fmt: skip
    args[0] = SPLADE
    report = migrate.Migration(migrate.parse_args(args)).run()
    assert report["output"]["rows"] == 40 and report["output"]["kinds"] == ["sparse"]
    assert [k["kind"] for k in report["spaces"]["kinds"]] == ["sparse"]
    assert report["spaces"]["same_space"] is False
    labels = serverconfig.version_labels(serverconfig.read(retrieval_server.config))
    assert labels[SPLADE]["stable"] == 2
    table = pq.read_table(sorted(out.glob("part-*.parquet"))[0])
    assert "sparse_values" in table.column_names and "embedding" not in table.column_names


def test_the_space_check_asks_the_model_only_for_the_kind_it_compares(
    retrieval_server: OpsServer,
) -> None:
    gateway, embed_for = gateway_embed(retrieval_server.grpc_target, retrieval_server.base_path,
                                       retrieval_server.config)  # fmt: skip
    asked: list[Any] = []
    predict = gateway.client.predict

    def recorded(*args: Any, **kwargs: Any) -> Any:
        asked.append(tuple(kwargs.get("output_filter") or ()))
        return predict(*args, **kwargs)

    gateway.client.predict = recorded
    try:
        embed = embed_for(M3)
        for kind, names in (("dense", ("embedding",)), ("sparse", ("token_weights",)),
                            ("multivector", ("token_vectors",))):  # fmt: skip
            asked.clear()
            answers = embed(1, sample_texts(40), kind, False)
            assert len(answers) == 40
            assert asked and set(asked) == {names}, (kind, asked)
    finally:
        gateway.close()
