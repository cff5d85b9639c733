"""Run a batch job: embed a corpus with the gateway's stages straight to TF Serving.

Entry point of ``ops.batch.job`` (its code), the same as ``python -m ops.batch``; ``--help``
shows the flags.
"""

import sys

from ops.batch.job import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
