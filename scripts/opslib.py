"""Shared pieces of the ops scripts: models.config edits, atomic publishing, model-server RPCs.

Pure planning functions (which versions a policy serves, where labels go) are kept apart from
the I/O (files, gRPC) so they can be tested without servers. The gRPC side uses the stock
``tensorflow_serving.apis`` stubs, so the same code drives the real ``tensorflow_model_server``
and ``modelserver/``.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import fcntl
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the stubs import TensorFlow: keep it quiet

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from modelformat.layout import SAVED_MODEL_FILE, parse_version  # noqa: E402


class OpsError(RuntimeError):
    """A failed ops step, with a message meant for the person running the script."""


# ---------------------------------------------------------------------------------------------
# models.config: parse, plan, write


def parse_config(text: str) -> Any:
    """Return a ``ModelServerConfig`` parsed from text format."""
    from tensorflow_serving.config import model_server_config_pb2

    try:
        return text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as exc:
        raise OpsError(f"models.config does not parse: {exc}") from exc


def load_config(path: Path) -> Any:
    """Return the ``ModelServerConfig`` in ``path``."""
    if not path.is_file():
        raise OpsError(f"model config file not found: {path}")
    return parse_config(path.read_text())


def render_config(config: Any) -> str:
    """Return ``config`` as the text format TF Serving reads."""
    return str(text_format.MessageToString(config))


def leading_comments(path: Path) -> str:
    """Return the ``#`` comment block at the top of ``path`` ('' if none or no file).

    Text format has no place for comments in the message, so a rewrite keeps the file's header
    (what the file is, why the flags) and loses only comments inside entries.
    """
    if not path.is_file():
        return ""
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line + "\n")
    return "".join(header)


def write_config_atomic(path: Path, config: Any) -> None:
    """Replace ``path`` with ``config`` so a polling server never reads a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    header = leading_comments(path)
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(header + render_config(config))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def lock_path_for(config_path: Path) -> Path:
    """Return the lock file every writer of ``config_path`` takes (a hidden sibling)."""
    return config_path.with_name(f".{config_path.name}.lock")


@contextlib.contextmanager
def config_lock(
    config_path: Path, timeout_s: float, progress: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Hold the exclusive lock on ``config_path`` across a read-modify-write-rename.

    Without it two pushes both read the same config and the later rename drops the earlier
    one's label. The lock is a sibling file because the config itself is replaced by rename (a
    lock on the old inode would not stop the next writer); flock is released by the kernel if
    the holder dies, so a killed push never leaves it held. The holder's pid is written in it.
    """
    path = lock_path_for(config_path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_flock(fd):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            (progress or say)(
                f"waiting for {path}: another push (pid {holder}) is changing the config"
            )
            deadline = time.monotonic() + timeout_s
            while not _try_flock(fd):
                if time.monotonic() > deadline:
                    raise OpsError(
                        f"{path} still held by pid {holder} after {timeout_s:.0f}s; is another "
                        "push_model stuck? (the lock goes away when that process ends)"
                    )
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def say(text: str) -> None:
    """Print ``text`` at once (the scripts' output is often a pipe or a log file)."""
    print(text, flush=True)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def config_diff(old: Any, new: Any, path: str = "models.config") -> str:
    """Return a unified diff between two configs ('' when equal)."""
    lines = difflib.unified_diff(
        render_config(old).splitlines(keepends=True),
        render_config(new).splitlines(keepends=True),
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
    pinned = copy.deepcopy(model)
    pinned.model_version_policy.specific.versions.extend(
        sorted(policy_versions(model, on_disk_now))
    )
    return pinned


def replace_model(config: Any, model: Any) -> Any:
    """Return a copy of ``config`` with the model of the same name replaced by ``model``."""
    new = copy.deepcopy(config)
    for entry in new.model_config_list.config:
        if entry.name == model.name:
            entry.CopyFrom(model)
            return new
    raise OpsError(f"model {model.name!r} is not in the model config")


def previous_version(on_disk: Iterable[int], current: int) -> int:
    """Return the newest version on disk older than ``current``; raise when there is none."""
    older = [v for v in on_disk if v < current]
    if not older:
        raise OpsError(f"no version older than {current} on disk to roll back to")
    return max(older)


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


def disk_versions(model_dir: Path) -> list[int]:
    """Return the complete versions (numeric dirs with saved_model.pb) under ``model_dir``."""
    if not model_dir.is_dir():
        return []
    found = [parse_version(p.name) for p in model_dir.iterdir() if (p / SAVED_MODEL_FILE).is_file()]
    return sorted(v for v in found if v is not None)


def next_version(model_dir: Path) -> int:
    """Return one more than the highest numeric name under ``model_dir`` (complete or not)."""
    names = [parse_version(p.name) for p in model_dir.iterdir()] if model_dir.is_dir() else []
    return max([v for v in names if v is not None], default=0) + 1


def publish_copy(src: Path, model_dir: Path, version: int) -> Path:
    """Copy an exported version directory in as ``version`` with export's atomic publish.

    The copy goes to a non-numeric temp sibling (TF Serving ignores it), is fsynced, then
    renamed: half-copied variables would otherwise load "successfully" (tensorflow/serving#1086).
    """
    from export.errors import ExportError
    from modelformat import publish

    if not (src / SAVED_MODEL_FILE).is_file():
        raise OpsError(f"{src} is not an exported version (no {SAVED_MODEL_FILE})")
    try:
        model_dir = publish.model_dir_for(model_dir.parent, model_dir.name)
        version = publish.choose_version(model_dir, version)
        with publish.temp_version(model_dir, version) as tmp:  # removed unless published
            shutil.copytree(src, tmp, dirs_exist_ok=True)
            publish.fsync_tree(tmp)
            return publish.publish(tmp, model_dir, version)
    except ExportError as exc:
        raise OpsError(str(exc)) from exc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# the model server, over the stock gRPC ModelService


@dataclass(frozen=True)
class VersionState:
    """One entry of GetModelStatus."""

    version: int
    state: str
    error: str = ""


class ModelServer:
    """ModelService calls (status, reload) against a TF-Serving-compatible server."""

    def __init__(self, target: str, timeout_s: float = 10.0):
        import grpc
        from tensorflow_serving.apis import model_service_pb2_grpc

        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target)
        self._stub = model_service_pb2_grpc.ModelServiceStub(self._channel)

    def status(self, name: str) -> list[VersionState]:
        """Return the server's version states for ``name`` (empty when it knows no version)."""
        import grpc
        from tensorflow_serving.apis import get_model_status_pb2

        State = get_model_status_pb2.ModelVersionStatus.State
        request = get_model_status_pb2.GetModelStatusRequest()
        request.model_spec.name = name
        try:
            reply = self._stub.GetModelStatus(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                return []
            raise OpsError(f"GetModelStatus({name}) at {self.target}: {_rpc_text(exc)}") from exc
        return [
            VersionState(s.version, State.Name(s.state), s.status.error_message)
            for s in reply.model_version_status
        ]

    def reload(self, config: Any, timeout_s: float = 60.0) -> None:
        """Send ``config`` with HandleReloadConfigRequest; raise OpsError with the reason."""
        import grpc
        from tensorflow_serving.apis import model_management_pb2

        request = model_management_pb2.ReloadConfigRequest()
        request.config.CopyFrom(config)
        try:
            self._stub.HandleReloadConfigRequest(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise OpsError(f"HandleReloadConfigRequest refused: {_rpc_text(exc)}") from exc

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _rpc_text(exc: Any) -> str:
    return f"{exc.code().name}: {exc.details()}"


def wait_available(
    server: ModelServer,
    name: str,
    version: int,
    timeout_s: float,
    progress: Callable[[str], None] = print,
    poll_s: float = 0.2,
) -> float:
    """Wait until ``version`` of ``name`` is AVAILABLE; return the seconds it took.

    Fails fast when the server reports the load ended with an error, and with a clear timeout
    error naming the last state seen otherwise.
    """
    started = time.monotonic()
    last = "not reported yet"
    shown = ""
    while True:
        states = {s.version: s for s in server.status(name)}
        entry = states.get(version)
        if entry is not None:
            last = entry.state + (f" ({entry.error})" if entry.error else "")
            if entry.state == "AVAILABLE":
                return time.monotonic() - started
            if entry.state == "END" and entry.error:
                raise OpsError(f"{name} version {version} failed to load: {entry.error}")
        if last != shown:
            progress(f"  {name} v{version}: {last}")
            shown = last
        if time.monotonic() - started > timeout_s:
            raise OpsError(
                f"{name} version {version} not AVAILABLE after {timeout_s:.0f}s at "
                f"{server.target} (last state: {last}); is the server polling {name}'s base path?"
            )
        time.sleep(poll_s)


def localize_config(config: Any, base_path: Path) -> Any:
    """Return a copy of ``config`` with every base path at ``base_path/<name>`` (absolute).

    The committed config uses the container layout; TF Serving needs absolute paths.
    """
    new = copy.deepcopy(config)
    for model in new.model_config_list.config:
        model.base_path = str(base_path.resolve() / model.name)
    return new
