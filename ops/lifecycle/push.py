"""Push a model version into serving and move version labels, safely, against a live server.

  push_model.py --checkpoint ckpt/ --name minilm-intent --label canary  # export as next version
  push_model.py --from-dir exported/7 --name minilm-intent --label canary  # copy an exported dir
  push_model.py --name minilm-intent --promote canary stable  # stable := canary's version
  push_model.py --name minilm-intent --rollback stable        # stable := its previous value
  push_model.py --add --name my-model --checkpoint ckpt/ --task classify  # a new model
  Add --dry-run to any of them to see the plan and the models.config diff, changing nothing.
  Arguments after `--` go to `python -m export build` (e.g. `-- --task embed --precision bf16`).

The order is what TF Serving and the gateway need: publish the version atomically (temp dir +
rename), let the server load it (a ``specific`` policy is widened: nothing leaves it), wait until
it reports AVAILABLE, and only then point a label at it, because a label may not name a version
that is not loaded yet. A version leaves the policy last, in a separate write made only once
every reader has seen the labels that stopped naming it: the gateway re-reads labels from this
file at most GATEWAY_LABELS_CACHE_S after it changes, and a request that resolved the old label
calls the model server within GATEWAY_TIMEOUT_S, so ``--reader-wait`` (default: the larger
cache TTL plus the timeout, from the same GATEWAY_* variables) must have passed since the file
last changed. models.config is rewritten atomically before each HandleReloadConfigRequest, so
the server, its config poll and the gateway agree; a refused reload restores the old file. A
``latest``/``all`` policy that would unload a labelled version once the new one lands is pinned
to ``specific`` (what is served now) before publishing. The whole read-modify-write runs under
an exclusive lock on ``.<config>.lock`` beside the config, so concurrent pushes take turns
instead of losing each other's labels. Each label move is also appended, under that lock, to
the label history beside the config (``ops.lifecycle.labelhistory``), which ``--rollback`` undoes.

Several replicas (``--server`` repeated, comma-separated, or a name resolving to several
addresses) read the same models.config: each gets every reload (one that refuses it undoes it
on the others), and a label moves only once every replica reports its version AVAILABLE, each
wait bounded by ``--timeout`` and reported per replica.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.settings import SettingsError, load_settings
from backend.versions import label_staleness_bound_s
from modelformat import layout, serverconfig
from modelformat.errors import FormatError
from modelformat.heads import TASKS
from modelformat.publish import copy_in
from ops import modelconfig
from ops.demo.stack import stack_grpc_target
from ops.lifecycle import addmodel, labelhistory
from ops.modelconfig import OpsError
from ops.procs import REPO
from ops.server import ModelServer, ReplicaSet, wait_available_everywhere


@dataclass
class Plan:
    """What one invocation will do: an optional new version, then the label changes."""

    model: str
    new_version: int | None = None
    source: str = ""
    labels: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # the label history once the labels moved (None: leave the history file as it is)
    history: labelhistory.History | None = None
    # --add: the entry the config gets (None: the model is in the config already)
    entry: Any = None
    # versions to wait for besides the new one and the label targets (--add of one on disk)
    wait_for: list[int] = field(default_factory=list)


# the committed serving config (docker layout), and the running `make run` stack's copy of it
COMMITTED_CONFIG = REPO / "serving_config" / "models.config"
STACK_CONFIG = REPO / ".stack" / "models.config"


def default_config_path() -> Path:
    """Return the config the local stack runs with (``.stack/``) or else the committed one."""
    return STACK_CONFIG if STACK_CONFIG.is_file() else COMMITTED_CONFIG


def plan_push(
    model: Any, model_dir: Path, source: str, label: str | None, version: int | None
) -> Plan:
    """Return the plan for publishing ``source`` as a new version (and labelling it)."""
    new_version = version if version is not None else layout.next_version(model_dir)
    if new_version in layout.list_versions(model_dir) or (model_dir / str(new_version)).exists():
        raise OpsError(f"version {new_version} of {model.name} already exists; pick another")
    plan = Plan(model=model.name, new_version=new_version, source=source)
    if label:
        plan.labels[label] = new_version
    return plan


def plan_promote(model: Any, source_label: str, target_label: str) -> Plan:
    """Return the plan that points ``target_label`` at ``source_label``'s version."""
    labels = dict(model.version_labels)
    if source_label not in labels:
        raise OpsError(f"{model.name} has no label {source_label!r} (labels: {labels or 'none'})")
    plan = Plan(model=model.name, labels={target_label: labels[source_label]})
    plan.notes.append(
        f"{target_label}: {labels.get(target_label, 'unset')} -> {labels[source_label]}"
    )
    return plan


def plan_set_label(model: Any, label: str, version: int) -> Plan:
    """Return the plan that points ``label`` at ``version`` (how a rollout promotes its version)."""
    before = dict(model.version_labels).get(label, "unset")
    plan = Plan(model=model.name, labels={label: version})
    plan.notes.append(f"{label}: {before} -> {version}")
    return plan


def plan_rollback(
    model: Any, history: labelhistory.History, label: str, to: int | None = None
) -> Plan:
    """Return the plan that points ``label`` back at its previous value (or at ``to``).

    The previous value comes from the label history push_model keeps beside models.config, not
    from the versions on disk: the newest older version may be a canary never promoted.
    """
    labels = dict(model.version_labels)
    if label not in labels:
        raise OpsError(f"{model.name} has no label {label!r} to roll back")
    if to is not None:
        target = to
        after = labelhistory.record(history, model.name, labels, {label: to})
    else:
        target, after = labelhistory.previous(history, model.name, label, labels[label])
    plan = Plan(model=model.name, labels={label: target}, history=after)
    plan.notes.append(f"{label}: {labels[label]} -> {target}")
    return plan


def export_checkpoint(
    checkpoint: Path, name: str, base_path: Path, version: int, extra: list[str]
) -> None:
    """Run ``python -m export build`` for ``version`` (it publishes atomically itself)."""
    cmd = [
        sys.executable, "-m", "export", "build", "--checkpoint", str(checkpoint),
        "--name", name, "--base-path", str(base_path), "--version", str(version), *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    if subprocess.run(cmd, cwd=REPO, env=env).returncode != 0:
        raise OpsError(f"export of {checkpoint} failed (command: {' '.join(cmd)})")


@dataclass(frozen=True)
class Writes:
    """The models.config states one invocation goes through, in order (unchanged ones are skipped).

    pin:    a latest/all policy that would unload a labelled version once the new one is on disk,
            pinned to what is served now (written before publishing)
    load:   the policy also serves the new version and every label target; labels unchanged
    label:  the labels moved (their targets are AVAILABLE by then); the policy serves all it did
    shrink: the policy drops what no label names and is not among the ``keep`` newest; written
            once every reader has seen ``label``, so no label a reader still holds names a
            version being unloaded
    """

    pin: Any
    load: Any
    label: Any
    shrink: Any

    def in_order(self) -> list[tuple[str, Any]]:
        """Return (name, config) for each write."""
        return [
            ("pin", self.pin),
            ("load", self.load),
            ("label", self.label),
            ("shrink", self.shrink),
        ]


def plan_writes(config: Any, model: Any, plan: Plan, on_disk: list[int], keep: int) -> Writes:
    """Return the config writes for ``plan`` (pure: raises OpsError before anything changes).

    A new version under a ``latest``/``all`` policy is always published pinned: with the policy
    as it is, every replica that polls the file system would load it the moment it is on disk,
    so a push that then fails would still have put it live. The pin lists what is served now;
    the load write adds the new version, and the last write gives the policy back once the
    labels moved (unless the policy would then drop a labelled version: that pin stays).
    """
    future_disk = sorted({*on_disk, *([plan.new_version] if plan.new_version else [])})
    pinned = modelconfig.pin_labelled_versions(model, on_disk, future_disk, plan.labels)
    restore_policy = False
    if pinned is not None:
        plan.notes.append(
            f"policy {modelconfig.policy_kind(model)} -> specific: "
            "it would unload a labelled version"
        )
    elif plan.new_version is not None and modelconfig.policy_kind(model) != "specific":
        pinned = modelconfig.pin_served(model, on_disk)
        restore_policy = True
        plan.notes.append(
            f"policy {modelconfig.policy_kind(model)} -> specific while v{plan.new_version} "
            "is published (a failed push leaves it unserved), back once the labels moved"
        )
    base = pinned if pinned is not None else model
    targets = {*plan.labels.values(), *([plan.new_version] if plan.new_version else [])}
    loading = modelconfig.widen_policy(base, targets)
    modelconfig.check_labels_served(loading, future_disk)
    labelled = modelconfig.move_labels(loading, future_disk, plan.labels)
    if restore_policy:
        shrunk = modelconfig.with_policy_of(labelled, model)
        modelconfig.check_labels_served(shrunk, future_disk)
    else:
        shrunk = modelconfig.shrink_policy(labelled, future_disk, keep)
    return Writes(
        *(modelconfig.replace_model(config, m) for m in (base, loading, labelled, shrunk))
    )


def served(config: Any, name: str, on_disk: list[int]) -> set[int]:
    """Return the versions of ``name`` that ``config``'s policy serves with ``on_disk``."""
    return modelconfig.policy_versions(modelconfig.find_model(config, name), on_disk)


def default_reader_wait_s() -> float:
    """Return how long after a label change no gateway request still uses the old labels.

    A gateway worker sees a rewritten config within ``label_staleness_bound_s`` (it re-reads
    the file's content every GATEWAY_LABELS_CACHE_S, so an NFS/EFS attribute cache cannot hide
    the change longer; version states: GATEWAY_STATUS_CACHE_S), and a request that resolved a
    version just before makes its last call to the model server within GATEWAY_TIMEOUT_S (past
    it the gateway answers 504). The values come from the same GATEWAY_* variables and defaults
    the gateway uses.
    """
    settings = load_settings()
    seen_s = max(label_staleness_bound_s(settings.labels_cache_s), settings.status_cache_s)
    return seen_s + settings.request_timeout_s


def wait_for_readers(config_path: Path, reader_wait_s: float, versions: list[int]) -> float:
    """Sleep until ``reader_wait_s`` has passed since ``config_path`` last changed; return the wait.

    The readers (gateway workers) see the labels of the file as it is now, including labels a
    previous push moved moments ago; nothing can be observed per worker, so the bound is waited.
    """
    age = time.time() - config_path.stat().st_mtime
    remaining = min(reader_wait_s, reader_wait_s - age)  # an mtime in the future waits it all
    if remaining > 0:
        print(
            f"waiting {remaining:.1f}s for every reader to see the labels before unloading "
            f"{', '.join(f'v{v}' for v in versions)} (--reader-wait {reader_wait_s:g}s)",
            flush=True,
        )
        time.sleep(remaining)
    return max(0.0, remaining)


def pause_for_tests(config_path: Path, timeout_s: float) -> None:
    """Wait, between reading the config and writing it, until $BERTGW_PUSH_PAUSE_FILE exists.

    Only for tests: it makes two concurrent pushes overlap for certain (tests/ops).
    """
    flag = os.environ.get("BERTGW_PUSH_PAUSE_FILE")
    if not flag:
        return
    print(f"paused after reading {config_path} until {flag} exists", flush=True)
    deadline = time.monotonic() + timeout_s
    while not Path(flag).exists():
        if time.monotonic() > deadline:
            raise OpsError(f"{flag} did not appear within {timeout_s:.0f}s")
        time.sleep(0.05)


def apply_config(
    server: ModelServer | ReplicaSet, config_path: Path, old: Any, new: Any, timeout_s: float
) -> bool:
    """Write ``new`` atomically, then ask the server to reload it; restore ``old`` if refused.

    Return False when there was nothing to change.
    """
    if serverconfig.render(new) == serverconfig.render(old):
        return False
    serverconfig.write_atomic(config_path, new)
    try:
        server.reload(new, timeout_s=timeout_s)
    except OpsError:
        serverconfig.write_atomic(config_path, old)
        raise
    return True


def restore_config(server: ReplicaSet, config_path: Path, config: Any, timeout_s: float) -> None:
    """Write ``config`` back and send it to every replica that takes it, whatever the others do.

    The file is what a replica that is down now reads when it comes back, so it is written
    even when a replica refuses; an all-or-nothing reload would undo the restore on the live
    replicas because of a dead one.
    """
    try:
        serverconfig.write_atomic(config_path, config)
    except OSError as exc:
        print(f"push_model: could not restore {config_path}: {exc}", file=sys.stderr)
        return
    for target, error in server.reload_each(config, timeout_s).items():
        print(f"push_model: {target} did not take the restored config: {error}", file=sys.stderr)


def record_history(path: Path, history: labelhistory.History) -> None:
    """Write the label history; a failure is reported, not raised (the labels did move)."""
    try:
        labelhistory.write_atomic(path, history)
    except OSError as exc:
        print(
            f"push_model: the labels moved, but the label history {path} could not be written "
            f"({exc}): a later --rollback may need --to VERSION",
            file=sys.stderr,
        )


@dataclass
class Outcome:
    """What one invocation did, for callers that time it (the reload drill)."""

    labels_moved_at: float | None = None  # time.monotonic() once the label write was applied
    unloaded: list[int] = field(default_factory=list)  # versions the shrink write dropped
    reader_wait_s: float = 0.0  # seconds waited for readers before a version left the policy
    new_version: int | None = None  # the version published (a rollout goes on with it)


def run(args: argparse.Namespace, extra: list[str]) -> Outcome:
    """Carry out (or, with --dry-run, show) one push / promote / rollback."""
    if args.dry_run:
        return execute(args, extra)
    try:
        with serverconfig.config_lock(args.config, args.lock_timeout):
            return execute(args, extra)
    except FormatError as exc:  # the lock held too long, or the version could not be copied in
        raise OpsError(str(exc)) from exc


def execute(args: argparse.Namespace, extra: list[str]) -> Outcome:
    """Plan from the config as it is now and carry the plan out (the caller holds the lock)."""
    config_path: Path = args.config
    config = modelconfig.load_config(config_path)
    if not args.dry_run:
        pause_for_tests(config_path, args.timeout)
    entry = None
    if args.add and not addmodel.has_model(config, args.name):
        entry = addmodel.new_entry(config, args.name, str(args.base_path.resolve()))
    model = entry if entry is not None else modelconfig.find_model(config, args.name)
    model_dir = modelconfig.model_dir_on_host(model, args.base_path)
    on_disk = layout.list_versions(model_dir)
    history_path = labelhistory.history_path_for(config_path)
    history = labelhistory.load(history_path)
    add_plan = plan_add(args, model, entry, model_dir, on_disk) if args.add else None
    if args.add and add_plan is None:  # already served: only the other configs may lack it
        if not args.dry_run:
            copy_entry_to(args.also_config, config, args.name, args)
        return Outcome()

    if add_plan is not None:
        plan = add_plan
    elif args.promote:
        plan = plan_promote(model, *args.promote)
    elif args.rollback:
        plan = plan_rollback(model, history, args.rollback, args.to)
    elif getattr(args, "set_label", None):  # (label, version): ops.rollout.engine's promotion
        plan = plan_set_label(model, *args.set_label)
    else:
        source = str(args.checkpoint or args.from_dir)
        plan = plan_push(model, model_dir, source, args.label, args.version)
    if plan.history is None:
        plan.history = labelhistory.record(
            history, model.name, dict(model.version_labels), plan.labels
        )
    future_disk = sorted({*on_disk, *([plan.new_version] if plan.new_version else [])})
    if plan.entry is not None:
        writes = plan_add_writes(config, plan, future_disk)
    else:
        writes = plan_writes(config, model, plan, on_disk, args.keep)
    unloads = sorted(
        served(writes.label, plan.model, future_disk)
        - served(writes.shrink, plan.model, future_disk)
    )

    print(f"model {plan.model}: {model_dir} (on disk: {on_disk or 'none'}), config {config_path}")
    if plan.new_version is not None:
        print(f"publish {plan.source} as version {plan.new_version}")
    for note in plan.notes:
        print(note)
    if unloads:
        print(
            f"then, {args.reader_wait:g}s after the labels moved, unload "
            f"{', '.join(f'v{v}' for v in unloads)}"
        )
    diff = modelconfig.config_diff(config, writes.shrink, str(config_path))
    print(diff or "models.config unchanged")
    outcome = Outcome()
    if args.dry_run:
        print("dry run: nothing changed")
        return outcome
    if args.offline:  # --add of a model no server serves yet: publish, then one write
        if plan.new_version is not None:
            publish(args, plan, model_dir, extra)
            outcome.new_version = plan.new_version
        serverconfig.write_atomic(config_path, writes.shrink)
        copy_entry_to(args.also_config, writes.shrink, plan.model, args)
        print(f"{config_path}: {plan.model} added; a server reading it loads it at its next poll")
        return outcome

    server = ReplicaSet(args.server)
    server.applied = config
    if len(server.servers) > 1:
        print(f"replicas: {', '.join(s.target for s in server.servers)}")
    try:
        started = time.monotonic()
        # Before anything is written: a replica that is down now would fail the push after the
        # version was published, and a retry would publish another number.
        server.check_reachable(plan.model)
        apply_config(server, config_path, config, writes.pin, args.timeout)
        if plan.new_version is not None:
            # Under latest/all the new version itself makes the server unload the oldest one.
            pinned = writes.pin
            gone = (
                []
                if plan.entry is not None  # an added model is not in the config yet
                else sorted(
                    served(pinned, plan.model, on_disk) - served(pinned, plan.model, future_disk)
                )
            )
            if gone:
                outcome.reader_wait_s += wait_for_readers(config_path, args.reader_wait, gone)
            publish(args, plan, model_dir, extra)
            outcome.new_version = plan.new_version
        try:
            apply_config(server, config_path, writes.pin, writes.load, args.timeout)
            waits = {*plan.labels.values(), *plan.wait_for, plan.new_version or 0} - {0}
            for version in sorted(waits):
                took = wait_available_everywhere(server, plan.model, version, args.timeout)
                print(f"{plan.model} v{version} AVAILABLE ({max(took.values()):.1f}s)")
            if apply_config(server, config_path, writes.load, writes.label, args.timeout):
                outcome.labels_moved_at = time.monotonic()
        except OpsError as exc:
            # Put the config back to the pin: with the new version on disk, the old policy
            # would unload a labelled version or (latest/all) serve the new one; the published
            # version stays on disk, unserved.
            restore_config(server, config_path, writes.pin, args.timeout)
            if plan.entry is None:
                raise
            raise OpsError(
                f"{plan.model} was not added (the config is as it was; what was published stays "
                f"on disk, and the same command uses it once the cause is fixed): {exc}"
            ) from exc
        if plan.history is not None and plan.history != history:
            record_history(history_path, plan.history)  # under the lock, right after the move
        if unloads:
            outcome.reader_wait_s += wait_for_readers(config_path, args.reader_wait, unloads)
        try:
            apply_config(server, config_path, writes.label, writes.shrink, args.timeout)
        except OpsError as exc:
            what = f"unloading {unloads}" if unloads else "the policy's last write"
            raise OpsError(
                f"the labels moved, but {what} was refused (the config stays as it was after "
                f"the label write): {exc}"
            ) from exc
        if unloads:
            outcome.unloaded = unloads
            print(f"policy: {', '.join(f'v{v}' for v in unloads)} unloading")
        labels = modelconfig.find_model(writes.label, plan.model).version_labels
        moved = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))
        copy_entry_to(args.also_config, writes.shrink, plan.model, args)
        print(f"done in {time.monotonic() - started:.1f}s; labels: {moved or 'none'}")
    finally:
        server.close()
    return outcome


def plan_add(
    args: argparse.Namespace, model: Any, entry: Any, model_dir: Path, on_disk: list[int]
) -> Plan | None:
    """Return the plan of ``--add``, or None when the model already serves this source.

    Adding what is already served changes nothing (the command may be run again); a model in
    the config with another checkpoint gets it as its next version, as any push; one not in
    the config gets the entry, and version 1 unless a version exported from the same source
    is on disk already (an earlier ``--add`` whose reload failed).
    """
    source = addmodel.source_of(args.checkpoint, args.from_dir, args.task)
    same = addmodel.served_as(model_dir, source, on_disk)
    if same is not None and entry is None:
        print(f"{model.name} v{same} was exported from {args.checkpoint or args.from_dir}: "
              "already in the config, nothing to do")  # fmt: skip
        return None
    if entry is not None and same is not None:
        plan = Plan(model=model.name, entry=entry, wait_for=[same])
        plan.notes.append(f"add {model.name} to the config: v{same} is on disk already")
        if args.label:
            plan.labels[args.label] = same
    else:
        if entry is None and args.offline:
            raise OpsError(
                f"{model.name} is in the config already: push its new version to the running "
                "model server (drop --offline)"
            )
        plan = plan_push(model, model_dir, str(args.checkpoint or args.from_dir), args.label,
                         args.version)  # fmt: skip
        plan.entry = entry
        if entry is not None:
            plan.notes.append(f"add {model.name} to the config (base path {entry.base_path})")
    return plan


def plan_add_writes(config: Any, plan: Plan, future_disk: list[int]) -> Writes:
    """Return the writes of ``--add`` for a model not in ``config``: nothing to pin (no server
    watches its directory yet), then the entry with its labels in one write."""
    entry = modelconfig.move_labels(plan.entry, future_disk, plan.labels)
    added = addmodel.with_entry(config, entry)
    return Writes(pin=config, load=added, label=added, shrink=added)


def copy_entry_to(paths: list[Path], config: Any, name: str, args: argparse.Namespace) -> None:
    """Add ``name``'s entry of ``config`` to each of ``paths`` that lacks it (its base path
    beside that file's models), each under its own lock and written atomically."""
    source = modelconfig.find_model(config, name)
    for path in paths:
        with serverconfig.config_lock(path, args.lock_timeout):
            other = modelconfig.load_config(path)
            if addmodel.has_model(other, name):
                continue
            entry = addmodel.new_entry(other, name, addmodel.CONTAINER_MODELS)
            base_path = entry.base_path
            entry.CopyFrom(source)
            entry.base_path = base_path
            serverconfig.write_atomic(path, addmodel.with_entry(other, entry))
        print(f"{path}: {name} added (base path {base_path})")


def publish(args: argparse.Namespace, plan: Plan, model_dir: Path, extra: list[str]) -> None:
    """Publish the plan's new version: export the checkpoint or copy the exported directory."""
    assert plan.new_version is not None
    if args.checkpoint:
        export_checkpoint(args.checkpoint, plan.model, model_dir.parent, plan.new_version, extra)
    else:
        copy_in(args.from_dir, model_dir, plan.new_version)
    print(f"published {model_dir / str(plan.new_version)}")


def split_exporter_args(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """Return (our arguments, the exporter's): ``argv`` (default: the command line's) cut at
    the first ``--``; what follows goes to ``python -m export build``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def check_add_args(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> None:
    """Check --add, --task, --also-config and --offline; pass --task on to the exporter."""
    if args.add:
        try:
            addmodel.check_name(args.name)
        except OpsError as exc:
            parser.error(str(exc))
        if args.promote or args.rollback:
            parser.error("--add goes with --checkpoint or --from-dir")
        if args.checkpoint and not args.task and "--task" not in extra:
            parser.error(f"--add --checkpoint needs --task ({', '.join(TASKS)})")
    elif args.offline or args.also_config:
        parser.error("--offline and --also-config go with --add")
    if args.task:
        if not args.checkpoint:
            parser.error("--task goes with --checkpoint (an exported directory has its task)")
        if "--task" in extra:
            parser.error("--task is given twice (before and after --)")
        extra[:0] = ["--task", args.task]
    if args.add and args.config.resolve() == STACK_CONFIG.resolve():
        args.also_config.append(COMMITTED_CONFIG)
    args.also_config = [
        p for p in dict.fromkeys(args.also_config) if p.resolve() != args.config.resolve()
    ]


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """Return the parsed arguments and the extra ones (after ``--``) meant for the exporter."""
    argv, extra = split_exporter_args(argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True, help="model name in models.config")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", type=Path, help="export this checkpoint as the next version")
    what.add_argument("--from-dir", type=Path, help="copy this exported version directory in")
    what.add_argument("--promote", nargs=2, metavar=("FROM", "TO"), help="TO := FROM's version")
    what.add_argument(
        "--rollback", metavar="LABEL",
        help="LABEL := the version it named before its last move (from the label history kept "
        "beside the config in .<config>.labels.json)",
    )  # fmt: skip
    parser.add_argument(
        "--to", type=int, metavar="VERSION",
        help="with --rollback: point LABEL at VERSION instead (when the history has no earlier "
        "value, or to go further back)",
    )  # fmt: skip
    parser.add_argument(
        "--add", action="store_true",
        help="the model may be new: add its entry to the config (beside the other models) once "
        "the checkpoint is published as version 1; run again, it changes nothing while the "
        "newest version comes from the same checkpoint and task (a changed checkpoint is "
        "pushed as the next version)",
    )  # fmt: skip
    parser.add_argument(
        "--task", choices=TASKS,
        help="with --checkpoint: what to export (classify, embed, tag; passed to `python -m "
        "export build --task`); required with --add",
    )  # fmt: skip
    parser.add_argument(
        "--also-config", type=Path, action="append", default=[],
        help="with --add: another serving config that gets the entry too (its base path beside "
        "that file's models; no server is told); by default, when --config is the running "
        "`make run` stack's copy, serving_config/models.config, so the model stays served by "
        "the next `make run`, docker compose and the k8s seed",
    )  # fmt: skip
    parser.add_argument(
        "--offline", action="store_true",
        help="with --add: no model server is told (none runs yet): publish the version and "
        "write the config; a server started on it, or polling it, loads the model",
    )  # fmt: skip
    parser.add_argument("--label", help="point this label at the new version once it is loaded")
    parser.add_argument("--version", type=int, help="version number (default: next free)")
    parser.add_argument(
        "--config", type=Path, default=default_config_path(),
        help="models.config the server reads (default: .stack/ copy of a running `make run`, "
        "else serving_config/)",
    )  # fmt: skip
    parser.add_argument(
        "--base-path", type=Path, default=REPO / "models",
        help="host directory holding <name>/<version>/ (the config may use container paths)",
    )  # fmt: skip
    parser.add_argument(
        "--server", action="append",
        help="model server gRPC host:port (default: the `make run` stack's running on --config, "
        "else 127.0.0.1:8500); repeat it or separate with "
        "commas for several replicas; a name (or dns:///name:port) stands for every address "
        "it resolves to, e.g. a headless Service: each gets the config reload, and a label "
        "moves only once every one reports the version AVAILABLE",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait per step")
    parser.add_argument(
        "--keep", type=int, default=2, help="newest versions a specific policy keeps (>= 1)"
    )
    parser.add_argument(
        "--reader-wait", type=float, default=None,
        help="seconds after the last config change before a version may leave the policy "
        "(default: max(GATEWAY_LABELS_CACHE_S + 1, GATEWAY_STATUS_CACHE_S) + GATEWAY_TIMEOUT_S, "
        "from this environment or the gateway's defaults: 2 + 10 s; the + 1 covers a "
        "worker's read of the file)",
    )  # fmt: skip
    parser.add_argument(
        "--lock-timeout", type=float, default=600.0,
        help="seconds to wait for another push holding the config's lock",
    )  # fmt: skip
    parser.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    args = parser.parse_args(argv)
    if args.label and (args.promote or args.rollback):
        parser.error("--label goes with --checkpoint or --from-dir")
    if args.to is not None and not args.rollback:
        parser.error("--to goes with --rollback")
    if args.keep < 1:
        parser.error("--keep must be at least 1: the newest version is always served")
    check_add_args(parser, args, extra)
    args.server = args.server or [stack_grpc_target(args.config) or "127.0.0.1:8500"]
    if args.reader_wait is None:
        try:
            args.reader_wait = default_reader_wait_s()
        except SettingsError as exc:
            parser.error(f"--reader-wait: cannot derive it from the gateway settings: {exc}")
    return args, extra


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(argv)
    try:
        run(args, extra)
    except OpsError as exc:
        print(f"push_model: error: {exc}", file=sys.stderr)
        return 1
    return 0
