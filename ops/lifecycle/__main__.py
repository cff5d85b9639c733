"""``python -m ops.lifecycle [flags]``: push a version, add a model, move or roll back a label."""

import sys

from ops.lifecycle.push import main

if __name__ == "__main__":
    sys.argv[0] = "python -m ops.lifecycle"  # argparse's prog: what the user typed
    raise SystemExit(main())
