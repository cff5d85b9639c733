"""``python -m modelserver``: parse TF Serving's flags and run the server."""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    """Run the model server; return the process exit status."""
    from modelserver.flags import parse_flags

    flags = parse_flags(sys.argv[1:])  # before importing TensorFlow: --help stays instant
    from export.lean_tf import import_tensorflow

    import_tensorflow()
    from modelserver.server import serve

    logging.basicConfig(
        level=os.environ.get("MODELSERVER_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname).1s %(name)s] %(message)s",
        stream=sys.stderr,
    )
    return serve(flags)


if __name__ == "__main__":
    raise SystemExit(main())
