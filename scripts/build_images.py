"""Build the project's container images with podman: the Debian base, the gateway, the ops image.

    python scripts/build_images.py            # base (once per machine), gateway and ops images
    python scripts/build_images.py --only gateway

Each image is tagged with the project's version (pyproject.toml), as deploy/k8s/base names them;
push them to your registry with ``podman push`` (docs/guides/kubernetes.md, step 1). Prints each
image's build seconds and size.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ops import images

SPECS = {"gateway": images.GATEWAY, "ops": images.OPS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=sorted(SPECS), action="append", help="build only this image (repeatable)"
    )
    parser.add_argument("--log", type=Path, help="append the builds' output to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build the base when missing, then each asked image; print references, seconds, sizes."""
    args = parse_args(argv)
    base = images.ensure_base(args.log)
    print(f"base {base}")
    for name in args.only or list(SPECS):
        built = images.build_image(SPECS[name], base, args.log)
        print(f"{name} {built.ref} built in {built.build_s:.0f} s, {built.size_bytes / 1e6:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
