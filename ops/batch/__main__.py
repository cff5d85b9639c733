"""``python -m ops.batch INPUT --output DIR [flags]``: a batch job (``--help``: its flags)."""

import sys

from ops.batch.job import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
