"""``models.config``: TF Serving's text-format ModelServerConfig, read and atomically rewritten.

The functions take the message to parse into: the gateway passes nothing and gets this package's
TF-free subset (``modelformat.protos.config_pb2``: names, base paths, version policies, labels;
unknown fields skipped), while writers pass ``tensorflow_serving``'s full ModelServerConfig so
that a rewrite keeps every field.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from modelformat.errors import FormatError


def parse(text: str, message: Any = None) -> Any:
    """Return ``message`` (default: the TF-free subset) parsed from text format.

    Raises FormatError with the parser's reason (line and column).
    """
    subset = message is None
    if subset:
        from modelformat.protos import config_pb2

        message = config_pb2.ModelServerConfig()
    try:
        return text_format.Parse(text, message, allow_unknown_field=subset)
    except text_format.ParseError as exc:
        raise FormatError(str(exc)) from exc


def read(path: str | Path, message: Any = None) -> Any:
    """Return the ModelServerConfig in ``path`` (see ``parse``)."""
    path = Path(path)
    if not path.is_file():
        raise FormatError(f"model config file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"cannot read {path}: {exc}") from exc
    return parse(text, message)


def render(config: Any) -> str:
    """Return ``config`` as the text format TF Serving reads."""
    return str(text_format.MessageToString(config))


def version_labels(config: Any) -> dict[str, dict[str, int]]:
    """Return model name → label → version."""
    return {entry.name: dict(entry.version_labels) for entry in config.model_config_list.config}


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


def write_atomic(path: Path, config: Any) -> None:
    """Replace ``path`` with ``config`` so a polling server never reads a half-written file."""
    write_text_atomic(path, leading_comments(path) + render(config))


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: temp file, fsync, rename, fsync of the directory."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)


def lock_path_for(config_path: Path) -> Path:
    """Return the lock file every writer of ``config_path`` takes (a hidden sibling)."""
    return config_path.with_name(f".{config_path.name}.lock")


@contextlib.contextmanager
def config_lock(
    config_path: Path, timeout_s: float, progress: Callable[[str], None] = print
) -> Iterator[None]:
    """Hold the exclusive lock on ``config_path`` across a read-modify-write-rename.

    Without it two writers both read the same config and the later rename drops the earlier
    one's change. The lock is a sibling file because the config itself is replaced by rename (a
    lock on the old inode would not stop the next writer); flock is released by the kernel if
    the holder dies, so a killed writer never leaves it held. The holder's pid is written in it.
    """
    path = lock_path_for(config_path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_flock(fd):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            progress(f"waiting for {path}: another push (pid {holder}) is changing the config")
            deadline = time.monotonic() + timeout_s
            while not _try_flock(fd):
                if time.monotonic() > deadline:
                    raise FormatError(
                        f"{path} still held by pid {holder} after {timeout_s:.0f}s; is another "
                        "push_model stuck? (the lock goes away when that process ends)"
                    )
                time.sleep(0.1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
