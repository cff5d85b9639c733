"""``python -m ops.load COMMAND [flags]``: a load test or a profile (``COMMAND --help``)."""

import sys

from ops.commands import dispatch

COMMANDS = {
    "protocols": ("ops.load.protocols", "gRPC vs REST, at the model server and via the gateway"),
    "profile": ("ops.load.profiler", "where the gateway's workers' CPU goes under load (py-spy)"),
}

if __name__ == "__main__":
    raise SystemExit(dispatch("ops.load", COMMANDS, sys.argv[1:]))
