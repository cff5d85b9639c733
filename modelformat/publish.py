"""Atomic publishing of a version directory (docs/architecture.md, contract 1).

A version is written under ``<base>/<name>/.tmp-<version>-<random>`` (non-numeric, so TF Serving
ignores it), fsynced, then renamed to ``<base>/<name>/<version>`` on the same filesystem: the
numbered directory appears complete or not at all, even if the process is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from modelformat.errors import FormatError
from modelformat.layout import SAVED_MODEL_FILE, numbered_entries
from modelformat.names import MODEL_NAME_RULE, valid_model_name

TEMP_PREFIX = ".tmp-"
LOCK_SUFFIX = ".lock"
STALE_UNLOCKED_S = 600.0


def model_dir_for(base_path: str | Path, name: str) -> Path:
    """Return ``<base>/<name>`` after checking it can be written; nothing is created yet."""
    if not valid_model_name(name):
        raise FormatError(f"model name {name!r} {MODEL_NAME_RULE}")
    base = Path(base_path)
    if base.exists() and not base.is_dir():
        raise FormatError(f"base path {base} is a file, not a directory")
    model_dir = base / name
    if model_dir.exists() and not model_dir.is_dir():
        raise FormatError(f"model path {model_dir} is a file, not a directory")
    existing = model_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the directory that will hold what we create
    if not existing.is_dir():
        raise FormatError(f"{existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise FormatError(f"no write permission on {existing}")
    return model_dir


def _make_dirs(path: Path) -> list[Path]:
    """Create ``path`` and missing parents; return those created, deepest first."""
    created = []
    probe = path
    while not probe.exists():
        created.append(probe)
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FormatError(f"cannot create model directory {path}: {exc.strerror}") from exc
    return created


def choose_version(model_dir: Path, version: int | None) -> int:
    """Return ``version`` if it is free, or newest + 1 when it is None."""
    taken = numbered_entries(model_dir)
    if version is None:
        return (taken[-1] + 1) if taken else 1
    if version < 0:
        raise FormatError(f"version must be a non-negative integer, got {version}")
    if version in taken:
        raise FormatError(
            f"version {version} already exists at {model_dir / str(version)}; "
            "versions are never overwritten (omit --version to use the next number)"
        )
    return version


@contextlib.contextmanager
def temp_version(model_dir: Path, version: int) -> Iterator[Path]:
    """Yield a fresh non-numeric working directory next to the versions; remove it unless renamed.

    A sibling ``<temp>.lock`` file is flock-ed for the life of the export, so a later export can
    tell the leftovers of a killed one (lock free) from a live one (lock held) and delete them.
    """
    created = _make_dirs(model_dir)
    remove_stale_temps(model_dir)
    path = model_dir / f"{TEMP_PREFIX}{version}-{secrets.token_hex(4)}"
    lock_path = Path(f"{path}{LOCK_SUFFIX}")
    try:
        # read-only descriptor: flock does not need write access, and an fd open for writing
        # would keep the filesystem from being remounted read-only
        lock = os.open(lock_path, os.O_RDONLY | os.O_CREAT, 0o644)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.mkdir()
    except OSError as exc:
        _remove_empty(created)
        raise FormatError(f"cannot write under {model_dir}: {exc.strerror}") from exc
    try:
        yield path
    finally:
        try:
            remove_tree(path)  # a no-op after a successful publish renamed it away
            lock_path.unlink(missing_ok=True)
        except OSError:  # e.g. the filesystem went read-only: the next export cleans up
            pass
        os.close(lock)  # releases the flock, which marks any leftover as stale
        _remove_empty(created)  # a failed first export leaves no empty model directory


def _remove_empty(created: list[Path]) -> None:
    for directory in created:  # deepest first; stops at the first one that is not empty
        try:
            directory.rmdir()
        except OSError:
            return


def remove_stale_temps(model_dir: Path) -> list[Path]:
    """Delete working directories left by killed exports; return what was removed.

    A temp dir is stale when its lock file can be locked (the owner is gone), or, lacking a lock
    file, when it has not changed for ``STALE_UNLOCKED_S``. Failures are ignored: cleanup is
    best effort and TF Serving ignores these non-numeric names anyway.
    """
    removed = []
    for temp in model_dir.glob(f"{TEMP_PREFIX}*"):
        if temp.name.endswith(LOCK_SUFFIX) or not temp.is_dir():
            continue
        lock_path = Path(f"{temp}{LOCK_SUFFIX}")
        try:
            if lock_path.exists():
                with open(lock_path, "rb") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while it is held
                    remove_tree(temp)
                lock_path.unlink(missing_ok=True)
            elif time.time() - temp.stat().st_mtime > STALE_UNLOCKED_S:
                remove_tree(temp)
            else:
                continue
        except OSError:
            continue
        removed.append(temp)
    for lock_path in model_dir.glob(f"{TEMP_PREFIX}*{LOCK_SUFFIX}"):  # killed before its mkdir
        if Path(str(lock_path).removesuffix(LOCK_SUFFIX)).exists():
            continue
        try:
            with open(lock_path, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                lock_path.unlink()
        except OSError:
            continue
    return removed


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (directories last, bottom-up)."""
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            _fsync(Path(dirpath) / name, os.O_RDONLY)
        _fsync(Path(dirpath), os.O_RDONLY | os.O_DIRECTORY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temp_dir: Path, model_dir: Path, version: int) -> Path:
    """Rename ``temp_dir`` to ``<model_dir>/<version>`` and return it; never replaces anything."""
    target = model_dir / str(version)
    if target.exists():  # someone published the same number meanwhile
        raise FormatError(f"version {version} appeared at {target} while exporting; not replaced")
    os.rename(temp_dir, target)
    _fsync(model_dir, os.O_RDONLY | os.O_DIRECTORY)  # make the rename itself durable
    return target


def remove_tree(path: Path) -> None:
    """Delete ``path`` recursively, making read-only parts writable first; ignore what is gone."""

    def fix_and_retry(func, failed, _exc_info):  # type: ignore[no-untyped-def]
        parent = os.path.dirname(failed)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
        func(failed)

    if path.exists():
        os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
        shutil.rmtree(path, onerror=fix_and_retry)


def tree_size(path: Path) -> int:
    """Return the total size in bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def copy_in(src: Path, model_dir: Path, version: int | None) -> Path:
    """Copy an exported version directory in as ``version`` (None: the next) and publish it.

    The copy goes to a non-numeric temp sibling (TF Serving ignores it), is fsynced, then
    renamed: half-copied variables would otherwise load "successfully" (tensorflow/serving#1086).
    """
    if not (src / SAVED_MODEL_FILE).is_file():
        raise FormatError(f"{src} is not an exported version (no {SAVED_MODEL_FILE})")
    model_dir = model_dir_for(model_dir.parent, model_dir.name)
    version = choose_version(model_dir, version)
    with temp_version(model_dir, version) as tmp:  # removed unless published
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        fsync_tree(tmp)
        return publish(tmp, model_dir, version)
