"""Compile our own TF Serving .proto subset into modelformat/protos/*_pb2.py (no TensorFlow).

Run as `python -m modelformat.protos.build` (the Makefile's `protos` target). Needs grpcio-tools at
build time only; the gateway at run time needs nothing but protobuf and grpcio.
"""

from __future__ import annotations

import os
import sys
import tempfile
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROTO_DIR.parent.parent


def proto_files() -> list[Path]:
    """Return the .proto sources of the gateway, sorted by name."""
    return sorted(PROTO_DIR.glob("*.proto"))


def build(out_dir: Path = REPO_ROOT) -> list[Path]:
    """Compile every .proto into `*_pb2.py` + `.pyi` next to its source; return the outputs.

    protoc writes into a scratch directory; each output then replaces its file only when its bytes
    differ, by a rename. A process importing the modules meanwhile (`make -j`, a test worker) reads
    the old file or the new one, never a half-written one, and an unchanged file keeps its mtime.
    """
    from grpc_tools import protoc  # build-time only dependency

    # The include root is the repository: generated modules import `modelformat.protos.x_pb2`.
    well_known = resources.files("grpc_tools") / "_proto"
    sources = [str(p.relative_to(REPO_ROOT)) for p in proto_files()]
    package = PROTO_DIR.relative_to(REPO_ROOT)  # modelformat/protos, under any root
    target = out_dir / package
    with tempfile.TemporaryDirectory(prefix=".protoc-", dir=out_dir) as scratch:
        args = [
            "protoc",
            f"-I{REPO_ROOT}",
            f"-I{well_known}",
            f"--python_out={scratch}",
            f"--pyi_out={scratch}",
            *sources,
        ]
        code = protoc.main(args)
        if code != 0:
            raise RuntimeError(f"protoc failed with exit code {code}: {' '.join(args)}")
        for made in sorted((Path(scratch) / package).iterdir()):
            final = target / made.name
            if final.exists() and final.read_bytes() == made.read_bytes():
                continue
            os.replace(made, final)
    return sorted(target.glob("*_pb2.py"))


def main() -> int:
    """Build the protos and print what was written."""
    outputs = build()
    for path in outputs:
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
