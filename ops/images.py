"""The project's container images, built with podman from the repository's Dockerfiles.

No registry is needed: the base is made from Debian's packages (debootstrap of bookworm, whose
python3 is the 3.11 of the Dockerfiles' default ``python:3.11-slim``), imported into podman and
tagged by a digest of its inputs, so a machine builds it once. The gateway and ops images are
built on it, unchanged, with ``--build-arg PYTHON_IMAGE=<base>`` and tagged with the project's
version, the tag deploy/k8s/base names. podman reads docker/podman/containers.conf (the reasons
are written there).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTAINERS_CONF = REPO / "docker" / "podman" / "containers.conf"
# Debian's bundle, which also holds any CA a site adds (update-ca-certificates): the base image's
# own copy from the ca-certificates package lacks those, and pip in a build must reach PyPI as
# the host does.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
APT_DIR = Path("/etc/apt")
FALLBACK_MIRROR = "http://deb.debian.org/debian"

BASE_NAME = "localhost/bert-gateway-base"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3.11", "python3-venv", "ca-certificates")
# A venv at /usr/local on top gives python:3.11-slim's layout: python and pip first on the PATH,
# packages installed outside Debian's own. An imported root file system has no PATH: set it.
BASE_VENV_CMD = ("python3.11", "-m", "venv", "/usr/local")
BASE_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageSpec:
    """One image of the project: its name (as the k8s base spells it) and its Dockerfile."""

    name: str
    dockerfile: str


GATEWAY = ImageSpec("bert-gateway", "docker/backend.Dockerfile")
OPS = ImageSpec("bert-gateway-ops", "docker/ops.Dockerfile")


def project_version() -> str:
    """Return pyproject.toml's version: the tag of every image."""
    with (REPO / "pyproject.toml").open("rb") as f:
        version: str = tomllib.load(f)["project"]["version"]
    return version


def image_ref(spec: ImageSpec, version: str | None = None) -> str:
    """Return the local reference of ``spec`` at the project's version."""
    return f"localhost/{spec.name}:{version or project_version()}"


def podman_env() -> dict[str, str]:
    """Return the environment podman runs in: this process's plus the project's containers.conf."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


def podman(*args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    """Run ``podman ARGS`` with the project's config; raise with podman's stderr on failure."""
    result = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout_s
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stderr}"
        )
    return result


def image_exists(ref: str) -> bool:
    """Whether podman's local store holds ``ref``."""
    result = subprocess.run(
        ["podman", "image", "exists", ref], env=podman_env(), capture_output=True
    )
    return result.returncode == 0


def image_size_bytes(ref: str) -> int:
    """Return the size podman reports for a local image (all its layers, uncompressed)."""
    out = podman("image", "inspect", "--format", "{{.Size}}", ref).stdout
    return int(out.strip())


def apt_mirror(apt_dir: Path = APT_DIR, suite: str = BASE_SUITE) -> str:
    """Return the Debian mirror apt uses for ``suite`` (deb822 .sources first, then one-line lists).

    debootstrap must fetch from where this machine's apt does (a site may reach only its own
    mirror); deb.debian.org only when apt names none.
    """
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text()):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, flags=re.M))
            if suite in fields.get("Suites", "").split() and "main" in fields.get("Components", ""):
                return fields["URIs"].split()[0]
    lists = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for path in (p for p in lists if p.is_file()):
        for line in path.read_text().splitlines():
            match = re.match(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s", line)
            if match and match.group(2) == suite:
                return match.group(1)
    return FALLBACK_MIRROR


def base_ref() -> str:
    """Return the base image's reference: tagged by a digest of everything that makes it."""
    inputs = {
        "suite": BASE_SUITE,
        "variant": "minbase",
        "packages": BASE_PACKAGES,
        "venv": BASE_VENV_CMD,
        "env": BASE_ENV,
    }
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:12]
    return f"{BASE_NAME}:{BASE_SUITE}-{digest}"


def ensure_base(log: Path | None = None) -> str:
    """Build the Debian base image unless podman already holds it; return its reference."""
    ref = base_ref()
    if image_exists(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="bert-gateway-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        packages = ",".join(BASE_PACKAGES)
        _run_logged(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={packages}",
                BASE_SUITE,
                str(rootfs),
                apt_mirror(),
            ],
            log,
        )
        _run_logged(["chroot", str(rootfs), *BASE_VENV_CMD], log)
        shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            subprocess.run(
                [
                    "podman",
                    "import",
                    "--change",
                    f"ENV {BASE_ENV}",
                    "--change",
                    'CMD ["python3"]',
                    "-",
                    ref,
                ],
                stdin=tar.stdout,
                env=podman_env(),
                check=True,
                capture_output=True,
            )
        finally:
            tar.wait()
    return ref


def _run_logged(cmd: list[str], log: Path | None) -> None:
    """Run a build step, its output appended to ``log`` (or discarded); raise on failure."""
    with open(log or os.devnull, "a") as out:
        result = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=podman_env())
    if result.returncode != 0:
        tail = "".join(Path(log).read_text().splitlines(True)[-30:]) if log else ""
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed ({result.returncode}); {log}:\n{tail}")


def build_args(spec: ImageSpec, base: str, version: str) -> list[str]:
    """Return the ``podman build`` arguments for ``spec`` on ``base``, tagged ``version``.

    Tagged ``latest`` too: the name docker/docker-compose.yml (and its podman override) runs.

    The host's CA bundle is mounted over the image's in every RUN step (it never enters a
    layer), and RUN steps use the host's network, as pip on the host does.
    """
    args = ["build", "--network=host", "--build-arg", f"PYTHON_IMAGE={base}"]
    if HOST_CA_BUNDLE.is_file():
        args += ["--volume", f"{HOST_CA_BUNDLE}:/etc/ssl/certs/ca-certificates.crt:ro"]
    ignore = REPO / f"{spec.dockerfile}.dockerignore"
    if ignore.is_file():
        args += ["--ignorefile", str(ignore)]
    tags = ["-t", image_ref(spec, version), "-t", image_ref(spec, "latest")]
    return [*args, "-f", str(REPO / spec.dockerfile), *tags, str(REPO)]


@dataclass(frozen=True)
class Built:
    """An image as built: its reference, seconds the build took, its size in bytes."""

    ref: str
    build_s: float
    size_bytes: int


def build_image(spec: ImageSpec, base: str, log: Path | None = None) -> Built:
    """Build ``spec`` on ``base`` (podman's layer cache makes an unchanged rebuild cheap)."""
    version = project_version()
    started = time.monotonic()
    _run_logged(["podman", *build_args(spec, base, version)], log)
    ref = image_ref(spec, version)
    return Built(ref, time.monotonic() - started, image_size_bytes(ref))
