"""Fixtures shared by the images, compose and kube-play tests: images built once per suite.

The images are built the way `python scripts/build_images.py` builds them (ops/images.py): the
Debian base once per machine (tagged by its inputs), then the gateway and ops images from the
repository's Dockerfiles, where podman's layer cache makes an unchanged rebuild take seconds.
Their sizes and the build and start times are printed at the end of the run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ops import images
from tests import summary
from tests.deploy.containers import share_with_containers

CLASSIFY, EMBED = "tiny-classify", "tiny-embed"


@dataclass(frozen=True)
class BuiltImages:
    """The references of the project's images as built for this run."""

    base: str
    gateway: str
    ops: str


def record(what: str, figure: str) -> None:
    """Keep a figure for the summary at the end of the run (tests/summary.py)."""
    summary.add("container images (tests/deploy)", f"{what}: {figure}")


@pytest.fixture(scope="session")
def built_images(tmp_path_factory: pytest.TempPathFactory) -> BuiltImages:
    """Build (or find in podman's cache) the base, gateway and ops images; record the costs."""
    log = tmp_path_factory.mktemp("images") / "build.log"
    started = time.monotonic()
    base = images.ensure_base(log)
    record(
        "base image (debootstrap + import, once per machine)", f"{time.monotonic() - started:.0f} s"
    )
    refs = {}
    for spec in (images.GATEWAY, images.OPS):
        built = images.build_image(spec, base, log)
        record(f"{built.ref} build", f"{built.build_s:.0f} s")
        record(f"{built.ref} size", f"{built.size_bytes / 1e6:.0f} MB")
        refs[spec.name] = built.ref
    return BuiltImages(base, refs[images.GATEWAY.name], refs[images.OPS.name])


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a models tree the images' user reads: tiny classify and embed models, version 1."""
    from export.tiny import export_tiny_model

    base = tmp_path_factory.mktemp("container-models")
    export_tiny_model(base, CLASSIFY, task="classify", version=1, seed=0, max_seq_len=32)
    export_tiny_model(base, EMBED, task="embed", version=1, seed=1, max_seq_len=32)
    return share_with_containers(base)


def models_config(names: list[str], labels: dict[str, dict[str, int]] | None = None) -> str:
    """Return a models.config serving each of ``names`` from /models/<name> (the images' layout)."""
    labels = labels or {}
    entries = []
    for name in names:
        pairs = "".join(
            f' version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.get(name, {}).items()
        )
        entries.append(
            f'  config {{ name: "{name}" base_path: "/models/{name}" model_platform: "tensorflow"'
            f" model_version_policy {{ latest {{ num_versions: 2 }} }}{pairs} }}\n"
        )
    return "model_config_list {\n" + "".join(entries) + "}\n"
