"""``push_model.py --add``: a model that is not in the serving config yet, planned without I/O.

TF Serving has no "add a model" call: a model is an entry of models.config (name, base path,
version policy), sent whole with HandleReloadConfigRequest and re-read at the server's config
poll; KServe's InferenceService is applied declaratively, and applying it again changes nothing.
``--add`` is both: the push tool (same locking, replicas, labels and dry run as every push)
publishes the checkpoint as version 1 of a new directory the server does not watch yet, then
writes the entry and reloads, and running the same command again finds the same checkpoint
already served and changes nothing. The entry's base path sits beside the other models' in each
file (``/models/<name>`` in the committed, container-layout config; this machine's absolute
path in the running local stack's copy).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from modelformat import layout
from modelformat.heads import TASKS
from modelformat.names import MODEL_NAME_RULE, valid_model_name
from ops.modelconfig import OpsError

# The version policy of an added model, as the demo models': the previous version stays loaded,
# warm for a rollback, once a second one is pushed.
KEEP_VERSIONS = 2
# Where the container layout keeps models when a config lists none to sit beside.
CONTAINER_MODELS = "/models"


def check_name(name: str) -> str:
    """Return ``name`` if it can be a model's directory and URL segment; OpsError otherwise."""
    if not valid_model_name(name):
        raise OpsError(f"--name {name!r}: a model name {MODEL_NAME_RULE}")
    return name


def check_task(task: str) -> str:
    """Return ``task`` if the exporter builds it; OpsError listing the tasks otherwise."""
    if task not in TASKS:
        raise OpsError(f"--task {task!r}: must be one of {', '.join(TASKS)}")
    return task


def has_model(config: Any, name: str) -> bool:
    """Return True when ``config`` lists a model called ``name``."""
    return any(m.name == name for m in config.model_config_list.config)


def models_dir(config: Any, fallback: str) -> str:
    """Return the directory the config's models sit in (their base paths' common parent).

    ``fallback`` when the config lists none, or they sit in different directories.
    """
    parents = {str(Path(m.base_path).parent) for m in config.model_config_list.config}
    return parents.pop() if len(parents) == 1 else fallback


def new_entry(config: Any, name: str, fallback_dir: str) -> Any:
    """Return a ModelConfig for ``name`` beside ``config``'s models (TF Serving's full message)."""
    from tensorflow_serving.config import model_server_config_pb2

    entry = model_server_config_pb2.ModelConfig()
    entry.name = name
    entry.base_path = str(Path(models_dir(config, fallback_dir)) / name)
    entry.model_platform = "tensorflow"
    entry.model_version_policy.latest.num_versions = KEEP_VERSIONS
    return entry


def with_entry(config: Any, entry: Any) -> Any:
    """Return a copy of ``config`` with ``entry`` appended."""
    new = copy.deepcopy(config)
    new.model_config_list.config.add().CopyFrom(entry)
    return new


def file_sha256(path: Path) -> str:
    """Return the hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def source_of(checkpoint: Path | None, from_dir: Path | None, task: str | None) -> dict[str, str]:
    """Return what identifies the push's source: its weights' sha256 and (if known) its task.

    A checkpoint's is the sha256 of its ``model.safetensors``, which export records in
    model.json as ``source.sha256``; an exported directory's is the one its model.json records.
    """
    if checkpoint is not None:
        weights = checkpoint / "model.safetensors"
        found = {"sha256": file_sha256(weights)} if weights.is_file() else {}
        return {**found, **({"task": task} if task else {})}
    info = layout.read_model_info(from_dir) if from_dir is not None else None
    if not info:
        return {}
    return {"sha256": str(info.get("source", {}).get("sha256", "")), "task": str(info["task"])}


def served_as(model_dir: Path, source: dict[str, str], on_disk: Iterable[int]) -> int | None:
    """Return the newest version on disk if it was exported from ``source``, else None."""
    versions = sorted(on_disk)
    if not versions or not source.get("sha256"):
        return None
    info = layout.read_model_info(model_dir / str(versions[-1])) or {}
    recorded = {"sha256": str(info.get("source", {}).get("sha256", "")), "task": info.get("task")}
    same = recorded["sha256"] == source["sha256"]
    return (
        versions[-1] if same and source.get("task", recorded["task"]) == recorded["task"] else None
    )
