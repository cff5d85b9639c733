"""Publishing: numbered directories appear complete or not at all, and are never overwritten."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from export import warmup as warmup_module
from export.build import build
from modelformat.errors import FormatError
from modelformat.layout import MODEL_JSON, SAVED_MODEL_FILE, WARMUP_FILE
from modelformat.publish import remove_stale_temps, temp_version
from ops.procs import child_env, python_cmd

IS_ROOT = os.geteuid() == 0


def _entries(model_dir: Path) -> list[str]:
    return sorted(p.name for p in model_dir.iterdir()) if model_dir.exists() else []


def test_versions_default_to_newest_plus_one(hf_classify: Path, tmp_path: Path) -> None:
    (tmp_path / "m" / "7").mkdir(parents=True)  # an incomplete number still counts as taken
    first = build(hf_classify, "m", tmp_path, max_seq_len=16, warmup=False)
    second = build(hf_classify, "m", tmp_path, max_seq_len=16, warmup=False)
    assert (first.version, second.version) == (8, 9)
    assert _entries(tmp_path / "m") == ["7", "8", "9"]


def test_existing_version_is_never_overwritten(
    classify_v1, hf_classify: Path, models: Path
) -> None:  # type: ignore[no-untyped-def]
    before = (classify_v1.path / SAVED_MODEL_FILE).stat().st_mtime_ns
    with pytest.raises(FormatError, match="already exists"):
        build(hf_classify, "cls", models, version=1)
    assert (classify_v1.path / SAVED_MODEL_FILE).stat().st_mtime_ns == before
    assert not [n for n in _entries(models / "cls") if n.startswith(".tmp-")]


def test_base_path_that_is_a_file(hf_classify: Path, tmp_path: Path) -> None:
    (tmp_path / "models").write_text("oops")
    with pytest.raises(FormatError, match="is a file"):
        build(hf_classify, "m", tmp_path / "models")


@pytest.mark.parametrize("name", ["../escape", "", ".hidden", "a/b"])
def test_model_names_that_would_leave_the_base_are_refused(
    name: str, hf_classify: Path, tmp_path: Path
) -> None:
    with pytest.raises(FormatError, match="model name"):
        build(hf_classify, name, tmp_path)


@pytest.fixture()
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A model directory nobody can write to: chmod for users, the immutable flag for root."""
    model_dir = tmp_path / "locked"
    model_dir.mkdir()
    if IS_ROOT:
        # chattr is e2fsprogs, part of every Debian system: missing, it fails. Root without the
        # right to set the immutable flag (a container without CAP_LINUX_IMMUTABLE) skips.
        assert shutil.which("chattr"), "as root, an unwritable directory needs chattr (e2fsprogs)"
        refused = subprocess.run(["chattr", "+i", str(model_dir)], capture_output=True)
        if refused.returncode:
            why = refused.stderr.decode().strip()
            pytest.skip(f"needs root with the right to chattr +i: {why}")
        yield model_dir
        subprocess.run(["chattr", "-i", str(model_dir)], check=True)
    else:
        model_dir.chmod(stat.S_IRUSR | stat.S_IXUSR)
        yield model_dir
        model_dir.chmod(stat.S_IRWXU)


def test_no_write_permission_is_a_clear_error(
    unwritable: Path, hf_classify: Path, tmp_path: Path
) -> None:
    with pytest.raises(FormatError, match=r"permission|cannot write"):
        build(hf_classify, "locked", tmp_path, max_seq_len=16)
    assert _entries(unwritable) == []


def test_write_failure_midway_removes_temp_dir(
    hf_classify: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk-full style OSError after the SavedModel is written: error, no version, no temp dir.

    The directory is made read-only when the warmup step starts; root ignores permission bits,
    so as root the same failure is injected into the warmup writer (a fault we cannot cause).
    """
    real_write = warmup_module.write_warmup

    def read_only_then_write(version_path, model_name, batches, signature_names=None):  # type: ignore[no-untyped-def]
        if IS_ROOT:
            raise OSError(errno.ENOSPC, "No space left on device", str(version_path))
        Path(version_path).chmod(stat.S_IRUSR | stat.S_IXUSR)
        return real_write(version_path, model_name, batches, signature_names)

    monkeypatch.setattr(warmup_module, "write_warmup", read_only_then_write)
    with pytest.raises(FormatError, match="failed") as info:
        build(hf_classify, "m", tmp_path, max_seq_len=16)
    assert ".tmp-" in str(info.value)
    assert _entries(tmp_path / "m") == []


@pytest.fixture()
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A real tmpfs of ``request.param`` bytes: needs root with mount rights, skips without them.

    A real ENOSPC can't be made otherwise (CI runs as root and runs these); mount(8) is part of
    every Debian system (util-linux), so its absence is a failure, not a skip.
    """
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    if not IS_ROOT:
        pytest.skip("needs root: mounting a small tmpfs (a real ENOSPC) is root's")
    assert shutil.which("mount"), "mount(8) is missing (util-linux)"
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={request.param}", "tmpfs", str(mount_point)]
    if subprocess.run(cmd, capture_output=True).returncode:
        pytest.skip(f"needs root with mount rights: {' '.join(cmd)} was refused here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.mark.parametrize("small_disk", ["64k", "300k"], indirect=True)
def test_disk_full_is_a_clean_error_with_nothing_left(small_disk: Path, hf_classify: Path) -> None:
    """A real ENOSPC (64k fails inside the variables write, 300k at saved_model.pb)."""
    with pytest.raises(FormatError, match="No space left on device"):
        build(hf_classify, "m", small_disk, max_seq_len=64)
    assert _entries(small_disk / "m") == []


@pytest.mark.parametrize("small_disk", ["16m"], indirect=True)
def test_filesystem_going_read_only_midway(small_disk: Path, hf_classify: Path) -> None:
    """A real EROFS while writing warmup: clean error, no version; the next export cleans up."""

    def remount_read_only(message: str) -> None:
        if "warmup records" in message:
            cmd = ["mount", "-o", "remount,ro", str(small_disk)]
            subprocess.run(cmd, check=True)

    with pytest.raises(FormatError, match="Read-only file system"):
        build(hf_classify, "m", small_disk, max_seq_len=64, progress=remount_read_only)
    assert not [n for n in _entries(small_disk / "m") if n.isdigit()]
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    result = build(hf_classify, "m", small_disk, max_seq_len=16, warmup=False)
    assert _entries(small_disk / "m") == [str(result.version)]


def _complete(version: Path) -> bool:
    return all((version / p).is_file() for p in (SAVED_MODEL_FILE, MODEL_JSON, WARMUP_FILE))


def _kill_build_at(stage: str, checkpoint: Path, base: Path) -> list[str]:
    """Run ``python -m export build`` and SIGKILL its process group when ``stage`` is printed."""
    cmd = python_cmd(
        "-m", "export", "build", "--checkpoint", str(checkpoint), "--name", "k",
        "--base-path", str(base), "--max-seq-len", "64",
    )  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(), text=True,
        start_new_session=True,
    )  # fmt: skip
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        if stage in line:
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["writing SavedModel", "warmup records", "publishing"])
def test_sigkill_mid_export_leaves_no_numbered_directory(
    stage: str, hf_classify: Path, tmp_path: Path
) -> None:
    _kill_build_at(stage, hf_classify, tmp_path)
    numbered = [p for p in (tmp_path / "k").iterdir() if p.name.isdigit()]
    temps = [p for p in (tmp_path / "k").iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
    assert all(_complete(p) for p in numbered), numbered
    if stage == "publishing":
        # SIGKILL runs no cleanup: before the rename the complete temp dir is left, after it the
        # complete version, never both and never neither (that would be lost or half-moved work).
        assert (len(numbered), len(temps)) in {(1, 0), (0, 1)}, (numbered, temps)
        assert all(_complete(p) for p in temps), temps
    else:
        assert numbered == [] and len(temps) == 1, (numbered, temps)
    result = build(hf_classify, "k", tmp_path, max_seq_len=16, warmup=False)
    assert [p.name for p in (tmp_path / "k").iterdir() if p.name.startswith(".tmp-")] == []
    assert (result.path / SAVED_MODEL_FILE).is_file()


def test_killed_while_verifying_then_next_export_removes_leftovers(
    hf_classify: Path, tmp_path: Path
) -> None:
    _kill_build_at("verifying", hf_classify, tmp_path)
    assert not [p for p in (tmp_path / "k").iterdir() if p.name.isdigit()]
    assert [p.name for p in (tmp_path / "k").iterdir() if p.name.startswith(".tmp-")]
    result = build(hf_classify, "k", tmp_path, max_seq_len=16, warmup=False)
    assert _entries(tmp_path / "k") == [str(result.version)]


def test_live_export_temp_dir_is_not_treated_as_stale(tmp_path: Path) -> None:
    with temp_version(tmp_path, 5) as live:
        assert remove_stale_temps(tmp_path) == []
        assert live.is_dir()
    assert _entries(tmp_path) == []  # not published: the directory and its lock are gone


def test_orphan_lock_files_are_removed_but_held_ones_kept(tmp_path: Path) -> None:
    (tmp_path / ".tmp-3-dead.lock").touch()
    with temp_version(tmp_path, 4) as live:
        remove_stale_temps(tmp_path)
        assert _entries(tmp_path) == sorted([live.name, f"{live.name}.lock"])
