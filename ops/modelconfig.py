"""models.config edits for the ops scripts: where versions and labels go, planned without I/O.

Pure planning functions (which versions a policy serves, where labels go) take and return
``ModelConfig`` messages so they can be tested without servers; reading and atomically writing
the file is ``modelformat.serverconfig``'s job, and talking to the server ``ops.server``'s.
The messages are ``tensorflow_serving``'s full ModelServerConfig, so a rewrite keeps every field.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from modelformat import serverconfig
from modelformat.errors import FormatError


class OpsError(RuntimeError):
    """A failed ops step, with a message meant for the person running the script."""


# ---------------------------------------------------------------------------------------------
# models.config: parse, plan, write


def full_config(text: str | None = None) -> Any:
    """Return an empty (or ``text`` parsed into a) ModelServerConfig of tensorflow_serving."""
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    if text is None:
        return config
    try:
        return serverconfig.parse(text, config)
    except FormatError as exc:
        raise OpsError(f"models.config does not parse: {exc}") from exc


def load_config(path: Path) -> Any:
    """Return the full ModelServerConfig in ``path``; OpsError naming what is wrong."""
    try:
        return serverconfig.read(path, full_config())
    except FormatError as exc:
        raise OpsError(
            f"models.config does not parse: {exc}" if path.is_file() else str(exc)
        ) from exc


def say(text: str) -> None:
    """Print ``text`` at once (the scripts' output is often a pipe or a log file)."""
    print(text, flush=True)


def config_diff(old: Any, new: Any, path: str = "models.config") -> str:
    """Return a unified diff between two configs ('' when equal)."""
    lines = difflib.unified_diff(
        serverconfig.render(old).splitlines(keepends=True),
        serverconfig.render(new).splitlines(keepends=True),
        fromfile=f"{path} (now)",
        tofile=f"{path} (after)",
    )
    return "".join(lines)


def find_model(config: Any, name: str) -> Any:
    """Return the ``ModelConfig`` named ``name``; raise OpsError listing the known names."""
    for model in config.model_config_list.config:
        if model.name == name:
            return model
    known = ", ".join(m.name for m in config.model_config_list.config) or "none"
    raise OpsError(f"model {name!r} is not in the model config (known: {known})")


def policy_kind(model: Any) -> str:
    """Return 'latest', 'all' or 'specific' (no policy means TF Serving's latest{1})."""
    kind = model.model_version_policy.WhichOneof("policy_choice")
    return str(kind or "latest")


def policy_versions(model: Any, on_disk: Iterable[int]) -> set[int]:
    """Return the versions the model's version policy asks the server to serve."""
    disk = sorted(set(on_disk))
    kind = policy_kind(model)
    if kind == "all":
        return set(disk)
    if kind == "specific":
        return set(model.model_version_policy.specific.versions) & set(disk)
    keep = model.model_version_policy.latest.num_versions or 1
    return set(disk[-keep:])


def widen_policy(model: Any, versions: Iterable[int]) -> Any:
    """Return a copy whose ``specific`` policy also lists ``versions``; nothing leaves it.

    The first write of a push: the new version and every label target load while everything
    served now stays served. ``latest`` and ``all`` policies are left alone.
    """
    new = copy.deepcopy(model)
    if policy_kind(new) == "specific":
        wanted = set(new.model_version_policy.specific.versions) | set(versions)
        del new.model_version_policy.specific.versions[:]
        new.model_version_policy.specific.versions.extend(sorted(wanted))
    return new


def move_labels(model: Any, on_disk: Iterable[int], labels: dict[str, int]) -> Any:
    """Return a copy with ``labels`` set; raise OpsError if the policy does not serve one.

    The policy is not changed: a version a label moved away from stays served until every
    reader has seen the move (see ``shrink_policy``).
    """
    new = copy.deepcopy(model)
    for label, version in labels.items():
        new.version_labels[label] = version
    check_labels_served(new, on_disk)
    return new


def shrink_policy(model: Any, on_disk: Iterable[int], keep: int) -> Any:
    """Return a copy whose ``specific`` policy keeps only labelled versions and the ``keep`` newest.

    The last write of a push, made only once every reader has seen the labels: what it drops
    no label names any more. It never adds a version (loading is the first write's job).
    ``latest`` and ``all`` policies are left alone.
    """
    new = copy.deepcopy(model)
    if policy_kind(new) == "specific":
        disk = sorted(set(on_disk))
        kept = set(new.version_labels.values()) | set(disk[-keep:] if keep > 0 else [])
        wanted = set(new.model_version_policy.specific.versions) & kept
        del new.model_version_policy.specific.versions[:]
        new.model_version_policy.specific.versions.extend(sorted(wanted))
    check_labels_served(new, on_disk)
    return new


def check_labels_served(model: Any, on_disk: Iterable[int]) -> None:
    """Raise OpsError naming the first label whose version the policy does not serve."""
    served = policy_versions(model, on_disk)
    for label, version in sorted(model.version_labels.items()):
        if version not in served:
            raise OpsError(
                f"label {label!r} -> version {version}, but the {policy_kind(model)} version "
                f"policy of {model.name!r} does not serve it (served: {sorted(served)}); use a "
                "`specific` policy or a larger `latest { num_versions }`"
            )


def pin_labelled_versions(
    model: Any, on_disk_now: Iterable[int], future_disk: Iterable[int], labels: dict[str, int]
) -> Any | None:
    """Return a copy with a ``specific`` policy if ``latest``/``all`` would drop a labelled version.

    Example: ``latest { num_versions: 2 }`` with stable=1, canary=2; publishing 3 would make the
    server unload 1 on its next file-system poll while ``stable`` still names it. Pinning what is
    served now, before the new version is published, keeps every label answering. None when the
    policy is already ``specific`` or keeps every labelled version anyway.
    """
    if policy_kind(model) == "specific":
        return None
    targets = set(model.version_labels.values()) | set(labels.values())
    if targets <= policy_versions(model, future_disk):
        return None
    return pin_served(model, on_disk_now)


def pin_served(model: Any, on_disk: Iterable[int]) -> Any:
    """Return a copy whose policy is ``specific``: the versions served from ``on_disk`` now."""
    pinned = copy.deepcopy(model)
    pinned.model_version_policy.specific.versions.extend(sorted(policy_versions(model, on_disk)))
    return pinned


def with_policy_of(model: Any, source: Any) -> Any:
    """Return a copy of ``model`` with ``source``'s version policy (labels stay ``model``'s)."""
    new = copy.deepcopy(model)
    new.model_version_policy.CopyFrom(source.model_version_policy)
    return new


def replace_model(config: Any, model: Any) -> Any:
    """Return a copy of ``config`` with the model of the same name replaced by ``model``."""
    new = copy.deepcopy(config)
    for entry in new.model_config_list.config:
        if entry.name == model.name:
            entry.CopyFrom(model)
            return new
    raise OpsError(f"model {model.name!r} is not in the model config")


# ---------------------------------------------------------------------------------------------
# the version directories on disk


def model_dir_on_host(model: Any, base_path: Path | None) -> Path:
    """Return the host directory holding the model's versions.

    ``--base-path`` wins: the committed config uses the container layout (``/models/<name>``)
    while the script runs on the host. Without it the config's own base path is used.
    """
    if base_path is not None:
        return base_path.resolve() / model.name
    return Path(model.base_path)


def localize_config(config: Any, base_path: Path) -> Any:
    """Return a copy of ``config`` with every base path at ``base_path/<name>`` (absolute).

    The committed config uses the container layout; TF Serving needs absolute paths.
    """
    new = copy.deepcopy(config)
    for model in new.model_config_list.config:
        model.base_path = str(base_path.resolve() / model.name)
    return new
