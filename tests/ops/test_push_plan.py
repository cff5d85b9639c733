"""push_model's pure planning: which versions a policy serves and where labels may go."""

from __future__ import annotations

import itertools
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from backend.versions import label_staleness_bound_s
from modelformat import layout, serverconfig
from modelformat.errors import FormatError
from modelformat.publish import copy_in
from ops import modelconfig
from ops.lifecycle import labelhistory, push
from ops.modelconfig import OpsError


def model_config(policy: str, labels: dict[str, int] | None = None) -> Any:
    """Return one ModelConfig with ``policy`` (text format) and ``labels``."""
    label_text = " ".join(
        f'version_labels {{ key: "{k}" value: {v} }}' for k, v in (labels or {}).items()
    )
    text = f"""model_config_list {{ config {{
        name: "m" base_path: "/models/m" model_platform: "tensorflow"
        model_version_policy {{ {policy} }} {label_text} }} }}"""
    return modelconfig.find_model(modelconfig.full_config(text), "m")


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ("latest { num_versions: 2 }", {3, 4}),
        ("latest { }", {4}),
        ("all { }", {1, 2, 3, 4}),
        ("specific { versions: 1 versions: 3 versions: 9 }", {1, 3}),
    ],
)
def test_policy_versions_follow_tf_serving_rules(policy: str, served: set[int]) -> None:
    assert modelconfig.policy_versions(model_config(policy), [1, 2, 3, 4]) == served


def test_widening_a_specific_policy_never_drops_a_version() -> None:
    model = model_config("specific { versions: 1 versions: 3 }", {"stable": 1})
    widened = modelconfig.widen_policy(model, [4])
    assert list(widened.model_version_policy.specific.versions) == [1, 3, 4]


def test_shrinking_keeps_labelled_and_newest_versions_and_adds_none() -> None:
    model = model_config(
        "specific { versions: 1 versions: 2 versions: 4 }", {"stable": 1, "canary": 4}
    )
    shrunk = modelconfig.shrink_policy(model, [1, 2, 3, 4], keep=2)
    # 3 is among the two newest on disk but was not served: shrinking never loads anything.
    assert list(shrunk.model_version_policy.specific.versions) == [1, 4]


def test_moving_labels_keeps_the_policy() -> None:
    model = model_config("specific { versions: 1 versions: 2 }", {"stable": 1})
    moved = modelconfig.move_labels(model, [1, 2], {"stable": 2})
    assert dict(moved.version_labels) == {"stable": 2}
    assert list(moved.model_version_policy.specific.versions) == [1, 2]


def test_label_on_a_version_a_latest_policy_unloads_is_refused() -> None:
    model = model_config("latest { num_versions: 2 }", {"stable": 1})
    with pytest.raises(OpsError, match="does not serve it"):
        modelconfig.check_labels_served(model, [1, 2, 3])


def test_promote_points_target_at_source_version() -> None:
    model = model_config("all { }", {"stable": 1, "canary": 3})
    assert push.plan_promote(model, "canary", "stable").labels == {"stable": 3}


def test_promote_from_unknown_label_names_the_labels() -> None:
    with pytest.raises(OpsError, match="no label 'beta'"):
        push.plan_promote(model_config("all { }", {"stable": 1}), "beta", "stable")


def test_rollback_goes_to_the_labels_previous_value_not_the_newest_older_version() -> None:
    # v1 stable, v2 a canary never promoted, v3 promoted: stable's previous value is 1, not 2.
    history = labelhistory.record({}, "m", {"stable": 1}, {"canary": 2})
    history = labelhistory.record(history, "m", {"stable": 1, "canary": 2}, {"stable": 3})
    model = model_config("all { }", {"stable": 3, "canary": 2})
    plan = push.plan_rollback(model, history, "stable")
    assert plan.labels == {"stable": 1}
    assert plan.history == {"m": {"canary": [2], "stable": [1]}}


def test_repeated_rollbacks_walk_the_history_back_then_stop_clearly() -> None:
    history: labelhistory.History = {}
    for before, after in ((1, 2), (2, 3), (3, 4)):  # three promotions of stable
        history = labelhistory.record(history, "m", {"stable": before}, {"stable": after})
    assert history == {"m": {"stable": [1, 2, 3, 4]}}
    current, seen = 4, []
    for _ in range(3):
        plan = push.plan_rollback(model_config("all { }", {"stable": current}), history, "stable")
        current, history = plan.labels["stable"], plan.history or {}
        seen.append(current)
    assert seen == [3, 2, 1]
    with pytest.raises(OpsError, match=r"no value of m's 'stable' before 1.*--to VERSION"):
        push.plan_rollback(model_config("all { }", {"stable": 1}), history, "stable")


def test_rollback_of_a_label_moved_by_hand_goes_to_its_value_before_that_move() -> None:
    history = {"m": {"stable": [1, 2]}}
    plan = push.plan_rollback(model_config("all { }", {"stable": 5}), history, "stable")
    assert plan.labels == {"stable": 2}


def test_rollback_without_a_history_is_a_clear_error_and_to_is_the_explicit_way() -> None:
    model = model_config("all { }", {"stable": 3})
    with pytest.raises(OpsError, match="--rollback LABEL --to VERSION"):
        push.plan_rollback(model, {}, "stable")
    plan = push.plan_rollback(model, {}, "stable", to=1)
    assert plan.labels == {"stable": 1}
    assert plan.history == {"m": {"stable": [3, 1]}}


def test_to_goes_only_with_rollback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        push.parse_args(["--name", "m", "--promote", "canary", "stable", "--to", "1"])
    assert "--to goes with --rollback" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"format": 2, "models": {}}',
        '{"format": 1, "models": []}',
        '{"format": 1, "models": {"m": {"stable": [1, "2"]}}}',
        '{"format": 1, "models": {"m": {"stable": [0]}}}',
    ],
)
def test_a_corrupt_label_history_is_a_clear_error(tmp_path: Path, text: str) -> None:
    path = labelhistory.history_path_for(tmp_path / "models.config")
    path.write_text(text)
    with pytest.raises(OpsError, match=re.escape(f"label history {path} is unreadable")):
        labelhistory.load(path)


def test_a_missing_label_history_is_empty_and_writes_round_trip(tmp_path: Path) -> None:
    path = labelhistory.history_path_for(tmp_path / "models.config")
    assert path.name == ".models.config.labels.json"
    assert labelhistory.load(path) == {}
    history = {"m": {"stable": [1, 3], "canary": [2]}}
    labelhistory.write_atomic(path, history)
    assert labelhistory.load(path) == history
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temp file left


def test_publish_copy_is_atomic_and_never_overwrites(tmp_path: Path) -> None:
    src = tmp_path / "export"
    (src / "variables").mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"pb")
    (src / "variables" / "variables.index").write_bytes(b"idx")
    model_dir = tmp_path / "models" / "m"
    assert copy_in(src, model_dir, 1) == model_dir / "1"
    assert sorted(p.name for p in model_dir.iterdir()) == ["1"]  # no temp dir left behind
    assert layout.next_version(model_dir) == 2
    with pytest.raises(FormatError, match="never overwritten"):
        copy_in(src, model_dir, 1)


def test_config_round_trips_through_atomic_write(tmp_path: Path) -> None:
    model = model_config("specific { versions: 1 }", {"stable": 1})
    config = modelconfig.full_config("model_config_list { }")
    config.model_config_list.config.add().CopyFrom(model)
    path = tmp_path / "models.config"
    serverconfig.write_atomic(path, config)
    assert serverconfig.render(modelconfig.load_config(path)) == serverconfig.render(config)
    assert [p.name for p in tmp_path.iterdir()] == ["models.config"]


def test_latest_policy_is_pinned_when_a_push_would_unload_a_labelled_version() -> None:
    model = model_config("latest { num_versions: 2 }", {"stable": 1, "canary": 2})
    pinned = modelconfig.pin_labelled_versions(model, [1, 2], [1, 2, 3], {"canary": 3})
    assert pinned is not None
    assert modelconfig.policy_kind(pinned) == "specific"
    assert list(pinned.model_version_policy.specific.versions) == [1, 2]


def test_latest_policy_is_left_alone_when_labels_stay_served() -> None:
    model = model_config("latest { num_versions: 2 }", {"stable": 2})
    assert modelconfig.pin_labelled_versions(model, [1, 2], [1, 2, 3], {"canary": 3}) is None


def test_config_rewrite_keeps_the_header_comments(tmp_path: Path) -> None:
    path = tmp_path / "models.config"
    path.write_text('# what this file is\n# why\nmodel_config_list { config { name: "m" } }\n')
    config = modelconfig.load_config(path)
    config.model_config_list.config[0].version_labels["stable"] = 1
    serverconfig.write_atomic(path, config)
    text = path.read_text()
    assert text.startswith("# what this file is\n# why\nmodel_config_list {")
    assert modelconfig.load_config(path).model_config_list.config[0].version_labels["stable"] == 1


# ---------------------------------------------------------------------------------------------
# the order of the config writes: labels move first, a version leaves the policy last


def writes_for(
    policy: str, labels: dict[str, int], on_disk: list[int], how: str
) -> tuple[Any, push.Plan, push.Writes]:
    """Return the config, the plan and push_model's writes for ``how`` (keep=1)."""
    config = modelconfig.full_config("model_config_list { }")
    config.model_config_list.config.add().CopyFrom(model_config(policy, labels))
    model = modelconfig.find_model(config, "m")
    if how == "promote":
        plan = push.plan_promote(model, "canary", "stable")
    elif how == "rollback":  # stable's previous value: the version below it
        history = {"m": {"stable": [labels["stable"] - 1, labels["stable"]]}}
        plan = push.plan_rollback(model, history, "stable")
    else:  # push the next version to canary
        new = max(on_disk) + 1
        plan = push.Plan(model="m", new_version=new, labels={"canary": new})
    return config, plan, push.plan_writes(config, model, plan, on_disk, keep=1)


@pytest.mark.parametrize(
    ("policy", "labels", "on_disk", "how"),
    [
        # the drill's promote: stable 2 -> 4 leaves 2 unlabelled
        ("specific { versions: 2 versions: 3 versions: 4 }", {"stable": 2, "canary": 4},
         [2, 3, 4], "promote"),
        # the drill's rollback as the old plan had it: stable 4 -> 3 while 2 is still served
        ("specific { versions: 2 versions: 3 versions: 4 }", {"stable": 4, "canary": 4},
         [2, 3, 4], "rollback"),
        ("specific { versions: 1 versions: 2 }", {"stable": 1, "canary": 2}, [1, 2], "push"),
        ("latest { num_versions: 2 }", {"stable": 1, "canary": 2}, [1, 2], "push"),
        # pinned only while publishing: `latest {2}` comes back in the last write, dropping 1
        ("latest { num_versions: 2 }", {"stable": 2}, [1, 2], "push"),
        ("all { }", {"stable": 3, "canary": 4}, [1, 2, 3, 4], "rollback"),
        ("all { }", {"stable": 3}, [1, 2, 3], "push"),
    ],
)  # fmt: skip
def test_only_the_last_write_drops_versions_and_it_moves_no_label(
    policy: str, labels: dict[str, int], on_disk: list[int], how: str
) -> None:
    config, plan, writes = writes_for(policy, labels, on_disk, how)
    future = sorted({*on_disk, *([plan.new_version] if plan.new_version else [])})
    states = [("now", config), *writes.in_order()]
    for (_, before), (name, after) in itertools.pairwise(states):
        disk = on_disk if name == "pin" else future  # the pin is written before publishing
        gone = push.served(before, "m", disk) - push.served(after, "m", disk)
        assert not gone or name == "shrink", f"the {name} write drops {gone}"
        before_labels = dict(modelconfig.find_model(before, "m").version_labels)
        after_labels = dict(modelconfig.find_model(after, "m").version_labels)
        assert before_labels == after_labels or name == "label", f"the {name} write moves labels"
        served = push.served(after, "m", disk)
        assert set(after_labels.values()) <= served, f"the {name} write labels an unserved version"
    # What the shrink drops, no label names once they moved: readers that have seen the label
    # write (push_model waits for them before the shrink) never resolve to a dropped version.
    label_write = modelconfig.find_model(writes.label, "m")
    dropped = push.served(writes.label, "m", future) - push.served(writes.shrink, "m", future)
    assert not dropped & set(label_write.version_labels.values())


def test_promote_keeps_the_old_stable_version_until_the_shrink() -> None:
    policy = "specific { versions: 2 versions: 3 versions: 4 }"
    _, _, writes = writes_for(policy, {"stable": 2, "canary": 4}, [2, 3, 4], "promote")
    assert push.served(writes.label, "m", [2, 3, 4]) == {2, 3, 4}
    assert dict(modelconfig.find_model(writes.label, "m").version_labels)["stable"] == 4
    assert push.served(writes.shrink, "m", [2, 3, 4]) == {4}


def test_reader_wait_defaults_to_the_gateways_label_staleness_bound_plus_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("GATEWAY_LABELS_CACHE_S", "GATEWAY_STATUS_CACHE_S", "GATEWAY_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    # The gateway's defaults: labels re-read every 1 s (+ 1 s for the read itself), 10 s timeout.
    assert push.default_reader_wait_s() == label_staleness_bound_s(1.0) + 10.0 == 12.0
    monkeypatch.setenv("GATEWAY_LABELS_CACHE_S", "2")
    monkeypatch.setenv("GATEWAY_STATUS_CACHE_S", "0.5")
    monkeypatch.setenv("GATEWAY_TIMEOUT_S", "5")
    assert push.default_reader_wait_s() == 8.0
    args, _ = push.parse_args(["--name", "m", "--promote", "canary", "stable"])
    assert args.reader_wait == 8.0


def test_reader_wait_counts_from_the_configs_last_change(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text("model_config_list { }\n")
    now = time.time()
    os.utime(config, (now - 60, now - 60))
    assert push.wait_for_readers(config, 5.0, [1]) == 0.0  # changed long ago: no wait
    os.utime(config, (now + 60, now + 60))
    assert push.wait_for_readers(config, 0.2, [1]) == 0.2  # mtime ahead: the whole bound
    os.utime(config, None)
    started = time.monotonic()
    waited = push.wait_for_readers(config, 0.5, [1])
    assert 0.0 < waited <= 0.5 and time.monotonic() - started >= waited


def test_a_held_config_lock_makes_the_next_writer_wait_and_then_give_up(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text("model_config_list { }\n")
    said: list[str] = []
    with serverconfig.config_lock(config, timeout_s=5):
        assert serverconfig.lock_path_for(config).read_text().strip() == str(os.getpid())
        second = serverconfig.config_lock(config, timeout_s=0.2, progress=said.append)
        with pytest.raises(FormatError, match=f"held by pid {os.getpid()} after 0s"), second:
            pass
    assert said and "another push" in said[0]
    with serverconfig.config_lock(config, timeout_s=0.2):  # released: taken at once
        pass


@pytest.mark.parametrize(
    ("policy", "on_disk", "served_after"),
    [
        ("latest { num_versions: 2 }", [1, 2], {2, 3}),
        ("latest { num_versions: 3 }", [1, 2], {1, 2, 3}),
        ("all { }", [1, 2], {1, 2, 3}),
    ],
)
def test_a_new_version_is_published_pinned_under_latest_and_all_then_the_policy_comes_back(
    policy: str, on_disk: list[int], served_after: set[int]
) -> None:
    # Published unpinned, every replica's file-system poll loads it at once: a push that then
    # fails has put it live anyway. Pinned, a failed push (restored to the pin) never serves it.
    config, _, writes = writes_for(policy, {"stable": 2}, on_disk, "push")
    future = [*on_disk, 3]
    pin = modelconfig.find_model(writes.pin, "m")
    assert modelconfig.policy_kind(pin) == "specific"
    assert 3 not in push.served(writes.pin, "m", future)
    assert push.served(writes.load, "m", future) == {*push.served(config, "m", on_disk), 3}
    shrink = modelconfig.find_model(writes.shrink, "m")
    assert shrink.model_version_policy == modelconfig.find_model(config, "m").model_version_policy
    assert push.served(writes.shrink, "m", future) == served_after
